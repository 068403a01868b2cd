"""Build a small corpus, tokenizers and recipe for the TorchTitan tests (no network).

The corpus is cut from Python's own stdlib sources. The recipe's tokenizer is a
sentencepiece unigram model trained on it; TorchTitan gets the same vocabulary as an HF
``tokenizer.json`` (a Unigram model with the same pieces and scores) in an ``hf_assets``
folder, with ``tokenizer_config.json`` naming bos/eos, as TorchTitan 0.3.0 expects.
"""

from __future__ import annotations

import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon_nodes.integrations.torchtitan.hf_assets import write_hf_assets

__all__ = ["Assets", "build_assets", "write_hf_assets", "write_recipe"]

VOCAB_SIZE = 512


@dataclass(frozen=True)
class Assets:
    """Paths of the built test assets."""

    root: Path
    corpus: Path
    sp_model: Path
    hf_assets: Path


def stdlib_documents(limit: int = 400) -> list[str]:
    """Deterministic documents: top-level blocks of stdlib modules, 80..3000 characters."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    docs: list[str] = []
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        for block in text.split("\n\n\n"):
            block = block.strip()
            if 80 <= len(block) <= 3000:
                docs.append(block)
                if len(docs) >= limit:
                    return docs
    return docs


def write_corpus(path: Path, docs: list[str]) -> Path:
    """Write documents as jsonl records ``{"text": ...}``."""
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    return path


def train_sentencepiece(docs: list[str], prefix: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """Train a small unigram sentencepiece model (unk 0, bos 1, eos 2; no pad)."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(docs),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
        max_sentence_length=1 << 16,
    )
    return prefix.with_suffix(".model")


def build_assets(root: Path, num_docs: int = 400) -> Assets:
    """Build corpus, sentencepiece model and hf_assets under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    docs = stdlib_documents(num_docs)
    corpus = write_corpus(root / "corpus.jsonl", docs)
    sp_model = train_sentencepiece(docs, root / "tok")
    hf = write_hf_assets(sp_model, root / "hf_assets")
    return Assets(root=root, corpus=corpus, sp_model=sp_model, hf_assets=hf)


def write_recipe(path: Path, assets: Assets, **overrides: Any) -> Path:
    """Write a recipe TOML over the assets; ``overrides`` replace top-level scalars.

    ``epochs`` (default ``"inf"``) sets ``work.epochs``; ``tokenizer=(kind, path)`` replaces
    the sentencepiece model.
    """
    epochs = overrides.pop("epochs", "inf")
    tok_kind, tok_path = overrides.pop("tokenizer", ("sentencepiece", assets.sp_model))
    top: dict[str, Any] = {
        "seed": 7,
        "num_lanes": 4,
        "global_batch_size": 8,
        "seq_len": 64,
        "flush_every": 2,
    }
    top.update(overrides)
    lines = [f"{k} = {json.dumps(v)}" for k, v in top.items()]
    lines += [
        "",
        "[tokenizer]",
        f"kind = {json.dumps(tok_kind)}",
        f"path = {json.dumps(str(tok_path))}",
        "",
        "[[datasets]]",
        'name = "stdlib"',
        f"paths = [{json.dumps(str(assets.corpus))}]",
        "",
        "[work]",
        "chunk_size = 4",
        f"epochs = {json.dumps(epochs)}",
        "",
        "[shuffle]",
        "buffer_size = 4",
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


if __name__ == "__main__":  # build assets by hand: python -m tests.integrations.assets DIR
    import sys

    a = build_assets(Path(sys.argv[1]))
    print(write_recipe(a.root / "recipe.toml", a))
