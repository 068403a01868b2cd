"""Write TorchTitan's ``--hf-assets-path`` folder for a recipe's sentencepiece tokenizer.

TorchTitan 0.3.0 reads its tokenizer from a Hugging Face folder (``tokenizer.json`` and
``tokenizer_config.json``). The loader checks at launch that it describes the recipe
tokenizer's vocabulary (size, bos and eos ids); this module writes such a folder from a
sentencepiece ``.model``: a ``tokenizers`` Unigram model with the same pieces and scores,
and a config naming the bos, eos and unk pieces. TorchTitan never tokenizes with it (the
recipe's tokenizer produces every token id), so only the vocabulary has to agree.

Command line::

    python -m zephon_nodes.integrations.torchtitan.hf_assets tok.model hf_assets/

Needs ``sentencepiece`` and ``tokenizers`` (the ``torchtitan`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zephon_nodes.core.errors import RecipeError

__all__ = ["main", "write_hf_assets"]


def write_hf_assets(
    sp_model: str | os.PathLike[str],
    folder: str | os.PathLike[str],
    *,
    vocab_size: int | None = None,
) -> Path:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` with a sentencepiece vocabulary.

    Args:
        sp_model: The sentencepiece model file.
        folder: Output folder (TorchTitan's ``--hf-assets-path``), created if missing.
        vocab_size: Keep only this many pieces (to build a deliberately mismatched one).

    Returns:
        The folder.

    Raises:
        RecipeError: If the model file is missing or not a sentencepiece model.
    """
    import sentencepiece as spm
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    path = Path(sp_model)
    if not path.is_file():
        raise RecipeError(f"{path}: sentencepiece model not found")
    try:
        sp = spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as e:
        raise RecipeError(f"{path}: not a sentencepiece model: {e}") from None
    n = sp.get_piece_size() if vocab_size is None else vocab_size
    vocab = [(sp.id_to_piece(i), float(sp.get_score(i))) for i in range(n)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=max(sp.unk_id(), 0), byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config: dict[str, Any] = {
        "bos_token": sp.id_to_piece(sp.bos_id()) if sp.bos_id() >= 0 else None,
        "eos_token": sp.id_to_piece(sp.eos_id()) if sp.eos_id() >= 0 else None,
        "unk_token": sp.id_to_piece(sp.unk_id()) if sp.unk_id() >= 0 else None,
        "add_bos_token": True,
        "add_eos_token": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m zephon_nodes.integrations.torchtitan.hf_assets MODEL FOLDER``."""
    parser = argparse.ArgumentParser(
        prog="python -m zephon_nodes.integrations.torchtitan.hf_assets",
        description="Write TorchTitan's --hf-assets-path folder for a sentencepiece model.",
    )
    parser.add_argument("model", help="sentencepiece .model file (the recipe's tokenizer)")
    parser.add_argument("folder", help="output folder, passed to TorchTitan as --hf-assets-path")
    args = parser.parse_args(argv)
    try:
        print(write_hf_assets(args.model, args.folder))
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
