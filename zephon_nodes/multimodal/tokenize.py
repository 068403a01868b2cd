"""Tokenize a sample's text and put one placeholder token per image patch block before it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon_nodes.multimodal.decode import DecodedImage
from zephon_nodes.multimodal.records import MMBatch
from zephon_nodes.operators.documents import Skipped
from zephon_nodes.operators.tokenize import load_tokenizer
from zephon_nodes.recipe import TokenizerSpec

__all__ = ["MMDocBatch", "PlacedImage", "TokenizeMultimodal"]


@dataclass(frozen=True, slots=True)
class PlacedImage:
    """An image inside a document.

    Attributes:
        start: Index in the document's tokens of the image's first placeholder.
        tokens: Number of placeholder tokens.
        rows: Patch rows.
        cols: Patch columns.
        patches: uint8 ``[rows * cols, patch, patch, 3]``.
    """

    start: int
    tokens: int
    rows: int
    cols: int
    patches: np.ndarray


@dataclass(frozen=True, slots=True)
class MMDocBatch:
    """The documents of one work item: token ids (with placeholders) and their images.

    Attributes:
        tokens: All documents' ids, one after another (int32).
        lengths: Length of each document (int64).
        images: Per document, its images in order.
        dataset: Index of the dataset in the recipe.
        skipped: Samples dropped so far, by reason.
    """

    tokens: np.ndarray
    lengths: np.ndarray
    images: tuple[tuple[PlacedImage, ...], ...]
    dataset: int = -1
    skipped: Skipped = ()

    def documents(self) -> list[np.ndarray]:
        """Split the token ids back into one array per document."""
        return np.split(self.tokens, np.cumsum(self.lengths)[:-1]) if len(self.lengths) else []


@dataclass(frozen=True)
class TokenizeMultimodal:
    """Stateless operator: ``MMBatch`` of decoded images -> :class:`MMDocBatch`.

    Each document is ``[bos] placeholders(image 1) ... placeholders(image n) text [eos]``:
    an image of ``rows x cols`` patches brings ``(rows / merge) * (cols / merge)``
    placeholder tokens (id ``placeholder_id``). A document always ends with a text or eos
    token, so every placeholder is an input position of the packed sample.

    Args:
        spec: The recipe's tokenizer spec.
        placeholder_id: Id of the image placeholder token.
        merge: Patches per placeholder along each side.
        tokenizer: A tokenizer object to use instead of loading ``spec`` (custom tokenizers).
        sha256: The SHA-256 of the tokenizer file the pipeline was built with (see
            :func:`~zephon_nodes.operators.tokenize.load_tokenizer`; None: its content when
            it is loaded).
    """

    spec: TokenizerSpec
    placeholder_id: int
    merge: int = 1
    name: str = "tokenize_multimodal"
    tokenizer: Any = field(default=None, compare=False, repr=False)
    sha256: str | None = None

    def __call__(self, batch: MMBatch) -> MMDocBatch:
        """Tokenize every sample of the batch."""
        tok = self.tokenizer
        if tok is None:
            tok = load_tokenizer(self.spec, self.sha256)
        texts = [r.text for r in batch.records]
        ids = tok.encode_batch(texts) if texts else []
        m2 = self.merge * self.merge
        docs: list[np.ndarray] = []
        images: list[tuple[PlacedImage, ...]] = []
        for rec, body in zip(batch.records, ids, strict=True):
            parts: list[np.ndarray] = []
            at = 0
            if self.spec.add_bos:
                parts.append(np.asarray([tok.bos_id], dtype=np.int32))
                at = 1
            placed = []
            for img in rec.images:
                assert isinstance(img, DecodedImage)
                n = img.rows * img.cols // m2
                parts.append(np.full(n, self.placeholder_id, dtype=np.int32))
                placed.append(PlacedImage(at, n, img.rows, img.cols, img.patches))
                at += n
            tail = list(body)
            if self.spec.add_eos or not tail:
                # A document never ends on a placeholder (it would have no input position).
                tail.append(tok.eos_id if self.spec.add_eos or tok.eos_id >= 0 else tok.pad_id)
            parts.append(np.asarray(tail, dtype=np.int32))
            docs.append(np.concatenate(parts))
            images.append(tuple(placed))
        lengths = np.asarray([len(d) for d in docs], dtype=np.int64)
        tokens = np.concatenate(docs) if docs else np.zeros(0, dtype=np.int32)
        return MMDocBatch(tokens, lengths, tuple(images), batch.dataset, batch.skipped)
