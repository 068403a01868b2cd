"""Tokenize: texts -> token ids, with the tokenizers a recipe can name."""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.operators.documents import DocBatch, TextBatch
from zephon_nodes.recipe import TokenizerSpec
from zephon_nodes.recipe.registry import lookup

__all__ = [
    "ByteTokenizer",
    "HFTokenizer",
    "SentencePieceTokenizer",
    "Tokenize",
    "Tokenizer",
    "load_tokenizer",
    "loaded_sha256",
]


_EMPTY = np.empty(0, dtype=np.int32)


class Tokenizer(Protocol):
    """What the tokenize operator needs from a tokenizer (the protocol custom ones implement).

    ``pad_id`` may be -1 (no pad piece: the eos id pads). ``encode_batch`` must be a pure
    function of its input, and thread-safe when the thread runner is used. A tokenizer may
    also have ``encode_pieces(text) -> Iterator[np.ndarray]``, the ids of one text as
    consecutive int32 arrays (it may be called twice for a text of several pieces):
    :class:`Tokenize` then never holds a Python list, or two copies, of a huge document's
    ids (the byte tokenizer does this). With an int attribute ``piece_threshold``, only a
    batch holding a text longer than that many characters is encoded that way (the
    sentencepiece and HF tokenizers: ``encode_batch`` is faster for ordinary documents).
    """

    bos_id: int
    eos_id: int
    pad_id: int
    vocab_size: int

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Return the ids of each text, without bos/eos."""
        ...


# Characters encoded at a time by tokenizers that work in pieces (the byte tokenizer).
PIECE_CHARS = 1 << 20
# Sentencepiece and HF tokenizers: a text longer than PIECE_CHARS is cut into pieces of about
# that size, each cut checked on CUT_WINDOW characters either side (see _cut_pieces).
CUT_WINDOW = 1000
_CUT_TRIES = 16
_SEPARATOR = re.compile(r"\s")


def _cut_pieces(
    text: str, encode: Callable[[str], list[int]], divisor: int = 1
) -> Iterator[np.ndarray]:
    """Yield the ids of ``text`` as int32 arrays, encoding pieces of ~``PIECE_CHARS / divisor``.

    A cut goes just before or after a newline (else a space) near the end of the piece, and
    only where the tokenizer agrees: the ``2 x CUT_WINDOW`` characters around the cut give
    the same ids encoded whole as encoded in two parts, and each side's window holds the
    whole word next to the cut (so a cut never splits a word, a whitespace run, a
    normalization or a pre-token, and a tokenizer that prefixes every call's text, as some
    do, is never cut). Where no such place is found the rest of the
    text is encoded whole: the ids are those of the whole text, pieces only bound memory.
    """
    size = max(1, PIECE_CHARS // divisor)
    lo, n = 0, len(text)
    while n - lo > size:
        cut = _find_cut(text, lo, size, encode)
        if cut is None:
            break
        yield np.asarray(encode(text[lo:cut]), dtype=np.int32)
        lo = cut
    yield np.asarray(encode(text[lo:]), dtype=np.int32)


def _find_cut(text: str, lo: int, size: int, encode: Callable[[str], list[int]]) -> int | None:
    end = lo + size
    floor = lo + size // 2
    tries = 0
    for sep in ("\n", " "):
        at = end
        while tries < _CUT_TRIES:
            at = text.rfind(sep, floor, at)
            if at < 0:
                break
            for cut in (at + 1, at):
                tries += 1
                left = text[max(lo, cut - CUT_WINDOW) : cut]
                right = text[cut : cut + CUT_WINDOW]
                # Each window must also hold the whole word at the cut (a separator beyond
                # it): a word longer than the window could merge across the cut in the
                # whole text (byte-level BPE's "Ġword") and agree in the windows only.
                if (
                    _SEPARATOR.search(left, 0, len(left) - 1)
                    and _SEPARATOR.search(right, 1)
                    and encode(left) + encode(right) == encode(left + right)
                ):
                    return cut
    return None


class ByteTokenizer:
    """UTF-8 bytes shifted by 3; ids 0, 1, 2 are pad, bos, eos. Needs no file."""

    pad_id = 0
    bos_id = 1
    eos_id = 2
    vocab_size = 259

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Return the shifted UTF-8 bytes of each text."""
        return [np.concatenate(list(self.encode_pieces(t)) or [_EMPTY]).tolist() for t in texts]

    def encode_pieces(self, text: str) -> Iterator[np.ndarray]:
        """Yield the ids of ``text`` as int32 arrays of at most :data:`PIECE_CHARS` characters.

        UTF-8 encodes each character on its own, so the pieces are the whole text's ids.
        """
        for lo in range(0, len(text), PIECE_CHARS):
            raw = np.frombuffer(text[lo : lo + PIECE_CHARS].encode("utf-8"), dtype=np.uint8)
            piece = raw.astype(np.int32)
            piece += 3
            yield piece


class SentencePieceTokenizer:
    """A sentencepiece model file (releases the GIL while encoding).

    Args:
        path: The ``.model`` file.
        data: The file's bytes, already read (None: read from ``path``).

    Attributes:
        sha256: The SHA-256 of the model it was loaded from.
    """

    def __init__(self, path: str | Path, data: bytes | None = None) -> None:
        import sentencepiece as spm

        self.path = str(path)
        try:
            if data is None:
                data = Path(self.path).read_bytes()
            self.sha256 = hashlib.sha256(data).hexdigest()
            self.sp = spm.SentencePieceProcessor(model_proto=data)
        except (OSError, RuntimeError) as e:
            raise RecipeError(f"cannot load sentencepiece model {self.path}: {e}") from None
        self.bos_id = int(self.sp.bos_id())
        self.eos_id = int(self.sp.eos_id())
        self.pad_id = int(self.sp.pad_id())
        self.vocab_size = int(self.sp.get_piece_size())
        if self.bos_id < 0 or self.eos_id < 0:
            raise RecipeError(f"{self.path}: the sentencepiece model needs bos and eos pieces")

    # Texts longer than this go through encode_pieces (a batch of them holds no huge list).
    piece_threshold = PIECE_CHARS

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Return the ids of each text."""
        return self.sp.encode(texts, out_type=int, num_threads=1)

    def encode_pieces(self, text: str) -> Iterator[np.ndarray]:
        """Yield the ids of ``text`` as int32 arrays, a long text in pieces (see ``Tokenize``)."""
        return _cut_pieces(text, self._encode_one)

    def _encode_one(self, text: str) -> list[int]:
        return self.sp.encode(text, out_type=int)


# Special tokens looked up (first match wins) in a tokenizer.json without bos/eos settings.
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "[BOS]", "<|startoftext|>", "[CLS]")
_EOS_NAMES = ("<|end_of_text|>", "</s>", "<eos>", "[EOS]", "<|endoftext|>", "[SEP]")
_PAD_NAMES = ("<pad>", "[PAD]", "<|pad|>", "<|finetune_right_pad_id|>")


class HFTokenizer:
    """A Hugging Face ``tokenizers`` file (``tokenizer.json``).

    Encodes groups of documents with ``encode_batch`` (Rust, without the GIL; per-document
    ``encode`` holds it). Special ids are found by name in the file's vocabulary:
    bos among ``<|begin_of_text|>``, ``<s>``, ``<bos>``, ``[BOS]``, ...; eos among
    ``<|end_of_text|>``, ``</s>``, ``<eos>``, ``<|endoftext|>``, ...; pad among ``<pad>``,
    ``[PAD]``, ... (the file is hashed into the fingerprint, so these are recipe-defined).

    Args:
        path: The ``tokenizer.json`` file.
        data: The file's bytes, already read (None: read from ``path``).

    Attributes:
        sha256: The SHA-256 of the file it was loaded from.
    """

    def __init__(self, path: str | Path, data: bytes | None = None) -> None:
        try:
            from tokenizers import Tokenizer as _HF
        except ImportError:  # pragma: no cover - tokenizers is in the torchtitan extra
            raise RecipeError(
                "tokenizer kind 'hf' needs the `tokenizers` package: pip install tokenizers"
            ) from None
        self.path = str(path)
        try:
            if data is None:
                data = Path(self.path).read_bytes()
            self.sha256 = hashlib.sha256(data).hexdigest()
            self.tok = _HF.from_buffer(data)
        except Exception as e:
            raise RecipeError(f"cannot load tokenizer file {self.path}: {e}") from None
        vocab = self.tok.get_vocab(with_added_tokens=True)

        def find(names: tuple[str, ...]) -> int:
            return next((int(vocab[n]) for n in names if n in vocab), -1)

        self.bos_id = find(_BOS_NAMES)
        self.eos_id = find(_EOS_NAMES)
        self.pad_id = find(_PAD_NAMES)
        self.vocab_size = int(self.tok.get_vocab_size(with_added_tokens=True))

    # Texts longer than this go through encode_pieces (a batch of them holds no huge list).
    piece_threshold = PIECE_CHARS

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Return the ids of each text (no special tokens added)."""
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def encode_pieces(self, text: str) -> Iterator[np.ndarray]:
        """Yield the ids of ``text`` as int32 arrays, a long text in pieces (see ``Tokenize``).

        Pieces are a quarter of the other tokenizers': an ``Encoding`` holds ~100 bytes per
        token (the token strings, offsets and masks) until its ids are copied out.
        """
        return _cut_pieces(text, self._encode_one, divisor=4)

    def _encode_one(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids)


def _custom_tokenizer(name: str) -> Tokenizer:

    obj = lookup("tokenizer", name).obj
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "encode_batch")):
        obj = obj()  # a class or factory
    missing = [a for a in ("bos_id", "eos_id", "pad_id", "encode_batch") if not hasattr(obj, a)]
    if missing:
        raise RecipeError(
            f"custom tokenizer {name!r} ({type(obj).__name__}) lacks {missing}; it must "
            f"implement zephon_nodes.operators.tokenize.Tokenizer"
        )
    return obj


def _check_special(spec: TokenizerSpec, tok: Tokenizer) -> None:
    where = spec.path if spec.path is not None else spec.name
    if spec.add_bos and tok.bos_id < 0:
        raise RecipeError(f"tokenizer {where}: add_bos is set but it has no bos token")
    if spec.add_eos and tok.eos_id < 0:
        raise RecipeError(f"tokenizer {where}: add_eos is set but it has no eos token")


# (kind, path, SHA-256 of the bytes it was loaded from) -> the tokenizer. Keyed by content,
# not by path alone: a file retrained in place is another tokenizer, and its ids must never be
# those of the one a process loaded from that path before (nor be stored in the token cache
# under the new file's digest).
_TOKENIZERS: dict[tuple[str, str | None, str], Any] = {}
_LOCK = threading.Lock()


def _read(kind: str, path: str) -> tuple[str, bytes]:
    """The SHA-256 and the bytes of the tokenizer file at ``path``.

    Raises:
        RecipeError: The file cannot be read.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        what = "sentencepiece model" if kind == "sentencepiece" else "tokenizer file"
        raise RecipeError(f"cannot load {what} {path}: {e}") from None
    return hashlib.sha256(data).hexdigest(), data


def _same_file(path: str, digest: str, expected: str | None) -> None:
    """Raise unless the file's SHA-256 ``digest`` is ``expected`` (None: anything is)."""
    if expected is not None and digest != expected:
        raise RecipeError(
            f"tokenizer file {path} changed since the pipeline was built (its SHA-256 is now "
            f"{digest[:16]}..., it was {expected[:16]}...): its ids would not be the recipe's; "
            "build the pipeline again (restart the run)"
        )


def _load(kind: str, path: str, data: bytes) -> SentencePieceTokenizer | HFTokenizer:
    if kind == "sentencepiece":
        return SentencePieceTokenizer(path, data)
    return HFTokenizer(path, data)


def load_tokenizer(spec: TokenizerSpec, sha256: str | None = None) -> Tokenizer:
    """Load the tokenizer a spec names: once per process per content of its file.

    Args:
        spec: The tokenizer spec.
        sha256: The SHA-256 its file had when the pipeline was built (what the operators
            that tokenize hold): the tokenizer loaded from those bytes, without reading the
            file again once it is loaded. None: the file's content now (read and hashed).

    Raises:
        RecipeError: The file cannot be loaded, or no longer has the SHA-256 ``sha256``
            (it changed since the pipeline was built: the ids would not be the recipe's).
    """
    if spec.kind == "custom":
        # Never cached: the registration may change between recipes.
        assert spec.name is not None
        custom = _custom_tokenizer(spec.name)
        _check_special(spec, custom)
        return custom
    if spec.kind not in ("bytes", "sentencepiece", "hf"):
        raise RecipeError(f"unknown tokenizer kind {spec.kind!r}")
    path = str(spec.path) if spec.path is not None else None
    data = b""
    digest = sha256 or ""
    if spec.kind != "bytes" and (sha256 is None or (spec.kind, path, sha256) not in _TOKENIZERS):
        assert path is not None
        digest, data = _read(spec.kind, path)
        _same_file(path, digest, sha256)
    key = (spec.kind, path, digest)
    tok = _TOKENIZERS.get(key)
    if tok is None:
        with _LOCK:
            tok = _TOKENIZERS.get(key)
            if tok is None:
                if spec.kind == "bytes":
                    tok = ByteTokenizer()
                else:
                    assert path is not None
                    if not data:  # found loaded above, and dropped since (_TOKENIZERS.clear())
                        found, data = _read(spec.kind, path)
                        _same_file(path, found, digest)
                    tok = _load(spec.kind, path, data)
                _TOKENIZERS[key] = tok
    if spec.kind == "hf":
        _check_special(spec, tok)
    return tok


def loaded_sha256(spec: TokenizerSpec, tokenizer: Tokenizer) -> str | None:
    """The SHA-256 of the file ``tokenizer`` was loaded from, for the operators to carry.

    Every worker then tokenizes with that content (and the token cache keys its entries by
    it). None for a custom tokenizer (it travels with the operator) and the byte tokenizer.
    """
    if spec.kind == "custom":
        return None
    return getattr(tokenizer, "sha256", None)


@dataclass(frozen=True)
class Tokenize:
    """Stateless operator: ``TextBatch -> DocBatch`` with optional bos/eos per document.

    Args:
        spec: The recipe's tokenizer spec (the tokenizer itself is loaded in each worker).
        tokenizer: A tokenizer object to use instead of loading ``spec`` (custom tokenizers:
            it travels with the operator, so it must pickle for the process runner).
        sha256: The SHA-256 of the tokenizer file the pipeline was built with: each worker
            loads that content, or refuses a file that has changed since (None: the file's
            content when it is loaded; the token cache keys entries by it).
    """

    spec: TokenizerSpec
    name: str = "tokenize"
    tokenizer: Any = field(default=None, compare=False, repr=False)
    sha256: str | None = None

    def __call__(self, batch: TextBatch | DocBatch) -> DocBatch:
        """Tokenize every text of the batch (a pre-tokenized ``DocBatch`` passes through)."""
        if isinstance(batch, DocBatch):
            return batch
        tok = self.tokenizer
        if tok is None:
            tok = load_tokenizer(self.spec, self.sha256)
        if getattr(tok, "encode_pieces", None) is not None:
            # Sentencepiece and HF tokenizers encode a batch faster as a whole; only a batch
            # with a huge text goes piece by piece (the byte tokenizer always does).
            limit = getattr(tok, "piece_threshold", 0)
            if not limit or any(len(t) > limit for t in batch.texts):
                return self._by_pieces(tok, batch)
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
        return DocBatch(
            tokens, lengths, batch.dataset, batch.skipped, None, batch.shard, batch.records
        )

    def _by_pieces(self, tok: Any, batch: TextBatch) -> DocBatch:
        """Tokenize with ``encode_pieces``: int32 pieces copied once into the output.

        A document of one piece keeps it until the copy; a longer one is only counted, then
        encoded again piece by piece straight into the output, so a huge document never
        exists twice (freed small arrays stay in the allocator's heap, not returned).
        """
        bos, eos = self.spec.add_bos, self.spec.add_eos
        extra = int(bos) + int(eos)
        kept: list[np.ndarray | None] = []
        lengths = np.empty(len(batch.texts), dtype=np.int64)
        for k, text in enumerate(batch.texts):
            n, first = 0, None
            for i, piece in enumerate(tok.encode_pieces(text)):
                n += len(piece)
                first = piece if i == 0 else None
            kept.append(first)
            lengths[k] = n + extra
        # Untouched pages of the output cost no memory until they are written.
        tokens = np.empty(int(lengths.sum()), dtype=np.int32)
        pos = 0
        for k, text in enumerate(batch.texts):
            if bos:
                tokens[pos] = tok.bos_id
                pos += 1
            first = kept[k]
            kept[k] = None
            for piece in [first] if first is not None else tok.encode_pieces(text):
                tokens[pos : pos + len(piece)] = piece
                pos += len(piece)
            del first
            if eos:
                tokens[pos] = tok.eos_id
                pos += 1
        return DocBatch(
            tokens, lengths, batch.dataset, batch.skipped, None, batch.shard, batch.records
        )
