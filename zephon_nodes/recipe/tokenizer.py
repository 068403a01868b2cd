"""The recipe's ``[tokenizer]`` table: which tokenizer turns text into token ids."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.recipe.registry import lookup

__all__ = ["TOKENIZER_KINDS", "TokenizerSpec"]

TOKENIZER_KINDS = ("sentencepiece", "bytes", "hf", "custom")


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class TokenizerSpec:
    """Which tokenizer turns text into token ids.

    Args:
        kind: ``"sentencepiece"`` (a ``.model`` file), ``"hf"`` (a Hugging Face ``tokenizers``
            ``tokenizer.json`` file), ``"custom"`` (an object registered in Python with
            :func:`~zephon_nodes.register_tokenizer`) or ``"bytes"`` (UTF-8 bytes + 3;
            ids 0/1/2 are pad/bos/eos; needs no file, meant for tests and examples).
        path: Tokenizer file, resolved relative to the recipe file (optional for
            ``"custom"``: when given, its digest joins the fingerprint).
        add_bos: Prepend the beginning-of-sequence id to every document.
        add_eos: Append the end-of-sequence id to every document.
        name: Registered name of a ``"custom"`` tokenizer.
    """

    kind: str = "sentencepiece"
    path: Path | None = None
    add_bos: bool = True
    add_eos: bool = True
    name: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in TOKENIZER_KINDS:
            raise RecipeError(f"tokenizer.kind={self.kind!r} must be one of {TOKENIZER_KINDS}")
        if self.kind in ("sentencepiece", "hf") and self.path is None:
            raise RecipeError(f"tokenizer.path is required for kind={self.kind!r}")
        if self.kind == "custom" and not self.name:
            raise RecipeError(
                "tokenizer.name is required for kind='custom' (the name given to "
                "zephon_nodes.register_tokenizer)"
            )
        if self.kind != "custom" and self.name is not None:
            raise RecipeError(f"tokenizer.name is only used with kind='custom', not {self.kind!r}")

    def canonical(self, sha256: str | None = None) -> dict[str, Any]:
        """Data-defining fields: the kind, the file's SHA-256 (not its path) and bos/eos.

        Args:
            sha256: The file's SHA-256 when the caller holds it (the content a tokenizer was
                loaded from): the file is then not read again.
        """
        digest = sha256
        if digest is None and self.path is not None:
            if not Path(self.path).is_file():
                raise RecipeError(f"tokenizer file not found: {self.path}")
            digest = _file_sha256(Path(self.path))
        out: dict[str, Any] = {
            "kind": self.kind,
            "sha256": digest,
            "add_bos": self.add_bos,
            "add_eos": self.add_eos,
        }
        if self.kind == "custom":
            assert self.name is not None
            out["name"] = self.name
            out["version"] = lookup("tokenizer", self.name).version
        return out
