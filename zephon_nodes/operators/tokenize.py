"""Tokenize: texts -> token ids, with the tokenizers a recipe can name."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from zephon_nodes.errors import RecipeError
from zephon_nodes.operators.documents import DocBatch, TextBatch
from zephon_nodes.recipe import TokenizerSpec

__all__ = ["ByteTokenizer", "SentencePieceTokenizer", "Tokenize", "Tokenizer", "load_tokenizer"]


class Tokenizer(Protocol):
    """What the tokenize operator needs from a tokenizer."""

    bos_id: int
    eos_id: int
    pad_id: int
    vocab_size: int

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Return the ids of each text, without bos/eos."""
        ...


class ByteTokenizer:
    """UTF-8 bytes shifted by 3; ids 0, 1, 2 are pad, bos, eos. Needs no file."""

    pad_id = 0
    bos_id = 1
    eos_id = 2
    vocab_size = 259

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Return the shifted UTF-8 bytes of each text."""
        return [
            (np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int32) + 3).tolist()
            for t in texts
        ]


class SentencePieceTokenizer:
    """A sentencepiece model file (releases the GIL while encoding).

    Args:
        path: The ``.model`` file.
    """

    def __init__(self, path: str | Path) -> None:
        import sentencepiece as spm

        self.path = str(path)
        try:
            self.sp = spm.SentencePieceProcessor(model_file=self.path)
        except (OSError, RuntimeError) as e:
            raise RecipeError(f"cannot load sentencepiece model {self.path}: {e}") from None
        self.bos_id = int(self.sp.bos_id())
        self.eos_id = int(self.sp.eos_id())
        self.pad_id = int(self.sp.pad_id())
        self.vocab_size = int(self.sp.get_piece_size())
        if self.bos_id < 0 or self.eos_id < 0:
            raise RecipeError(f"{self.path}: the sentencepiece model needs bos and eos pieces")

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Return the ids of each text."""
        return self.sp.encode(texts, out_type=int, num_threads=1)


_TOKENIZERS: dict[tuple[str, str | None], Any] = {}
_LOCK = threading.Lock()


def load_tokenizer(spec: TokenizerSpec) -> Tokenizer:
    """Load (once per process) the tokenizer a spec names."""
    key = (spec.kind, str(spec.path) if spec.path is not None else None)
    tok = _TOKENIZERS.get(key)
    if tok is None:
        with _LOCK:
            tok = _TOKENIZERS.get(key)
            if tok is None:
                if spec.kind == "bytes":
                    tok = ByteTokenizer()
                elif spec.kind == "sentencepiece":
                    assert spec.path is not None
                    tok = SentencePieceTokenizer(spec.path)
                else:
                    raise RecipeError(f"unknown tokenizer kind {spec.kind!r}")
                _TOKENIZERS[key] = tok
    return tok


@dataclass(frozen=True)
class Tokenize:
    """Stateless operator: ``TextBatch -> DocBatch`` with optional bos/eos per document.

    Args:
        spec: The recipe's tokenizer spec (the tokenizer itself is loaded in each worker).
    """

    spec: TokenizerSpec
    name: str = "tokenize"

    def __call__(self, batch: TextBatch) -> DocBatch:
        """Tokenize every text of the batch."""
        tok = load_tokenizer(self.spec)
        ids = tok.encode_batch(batch.texts) if batch.texts else []
        extra = int(self.spec.add_bos) + int(self.spec.add_eos)
        lengths = np.fromiter((len(x) + extra for x in ids), dtype=np.int64, count=len(ids))
        tokens = np.empty(int(lengths.sum()), dtype=np.int32)
        pos = 0
        for x, n in zip(ids, lengths.tolist(), strict=True):
            if self.spec.add_bos:
                tokens[pos] = tok.bos_id
            body_start = pos + int(self.spec.add_bos)
            tokens[body_start : body_start + len(x)] = x
            if self.spec.add_eos:
                tokens[pos + n - 1] = tok.eos_id
            pos += n
        return DocBatch(tokens, lengths)
