"""Best-fit packing: whole documents into ``seq_len`` samples, with per-token document ids."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zephon_nodes.operators.documents import DocBatch, add_skipped
from zephon_nodes.operators.pack import IGNORE_INDEX, Sample

__all__ = ["DOCUMENT_IDS", "BestFitPacker", "LongDocuments"]

DOCUMENT_IDS = "document_ids"
DATASET_IDS = "dataset_ids"


@dataclass(frozen=True)
class LongDocuments:
    """Stateless operator: ``DocBatch -> DocBatch`` making every document fit ``seq_len``.

    A document of ``n`` tokens yields ``n - 1`` (input, label) pairs. One with more than
    ``seq_len`` pairs is cut into pieces of ``seq_len + 1`` tokens overlapping by one token
    (``"split"``: every pair appears once, positions restart per piece), or dropped and
    counted under ``"too_long"`` (``"drop"``).

    Args:
        seq_len: Tokens per sample.
        mode: ``"split"`` or ``"drop"``.
    """

    seq_len: int
    mode: str = "split"
    name: str = "long_documents"

    def __call__(self, batch: DocBatch) -> DocBatch:
        """Split or drop the documents longer than ``seq_len`` pairs."""
        s = self.seq_len
        lengths = batch.lengths
        if not len(lengths) or int(lengths.max()) - 1 <= s:
            return batch
        ends = np.cumsum(lengths)
        starts = ends - lengths
        index: list[np.ndarray] = []
        new_lengths: list[int] = []
        of_doc: list[int] = []  # the input document of each output document
        dropped = 0
        for d, (start, n) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
            if n - 1 <= s:
                index.append(np.arange(start, start + n))
                new_lengths.append(n)
                of_doc.append(d)
            elif self.mode == "drop":
                dropped += 1
            else:
                for a in range(0, n - 1, s):
                    piece = np.arange(start + a, start + min(a + s + 1, n))
                    index.append(piece)
                    new_lengths.append(len(piece))
                    of_doc.append(d)
        take = np.concatenate(index) if index else np.zeros(0, dtype=np.int64)
        return DocBatch(
            batch.tokens[take],
            np.asarray(new_lengths, dtype=np.int64),
            batch.dataset,
            add_skipped(batch.skipped, "too_long", dropped),
            batch.mask[take] if batch.mask is not None else None,
            batch.shard,
            batch.records[np.asarray(of_doc, dtype=np.int64)]
            if batch.records is not None
            else None,
        )


class _Bin:
    __slots__ = ("docs", "order", "used")

    def __init__(self, order: int) -> None:
        self.order = order
        self.used = 0
        self.docs: list[tuple[np.ndarray, int, np.ndarray | None]] = []


class BestFitPacker:
    """Accumulator: documents -> samples, each document whole in one sample (best fit).

    Keeps up to ``bins`` samples open. Each document (``n - 1`` pairs, at most ``seq_len``;
    see :class:`LongDocuments`) goes into the open sample with the least room that still
    fits it (the oldest on ties); a sample that becomes full is emitted at once. When no
    open sample fits and ``bins`` are open, the fullest one is emitted (padded) to make room.
    At a flush every open sample is emitted, oldest first, padded. Everything is
    single-threaded and ordered, so the samples depend only on the lane's documents.

    Samples hold ``input``, ``labels`` (shifted inside each document, -100 on padding and
    on the tokens a batch's ``mask`` leaves out),
    ``positions`` (0.. per document, 0 on padding) and ``document_ids`` (0, 1, ... per
    document within the sample, -1 on padding: ``document_ids[i] == document_ids[j]`` is
    the block-diagonal attention mask). With ``provenance`` they also hold ``dataset_ids``
    (the recipe index of each token's dataset, -1 on padding).

    Args:
        seq_len: Tokens per sample.
        pad_id: Input id of padding.
        bins: Samples held open at once.
        provenance: Add the ``dataset_ids`` field.
    """

    def __init__(self, seq_len: int, pad_id: int, bins: int = 16, provenance: bool = False):
        if bins < 1:
            raise ValueError(f"{bins=} must be >= 1")
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.bins = bins
        self.provenance = provenance
        self._open: list[_Bin] = []
        self._made = 0

    def feed(self, batch: DocBatch) -> list[Sample]:
        """Place the batch's documents; return the samples completed or evicted."""
        out: list[Sample] = []
        tokens = batch.tokens.astype(np.int64, copy=False)
        ends = np.cumsum(batch.lengths)
        for start, n in zip((ends - batch.lengths).tolist(), batch.lengths.tolist(), strict=True):
            pairs = n - 1
            if pairs <= 0:
                continue
            if pairs > self.seq_len:
                raise ValueError(
                    f"a document of {pairs} pairs does not fit seq_len={self.seq_len}; run "
                    f"LongDocuments before BestFitPacker"
                )
            target = self._best(pairs)
            if target is None:
                if len(self._open) >= self.bins:
                    fullest = max(self._open, key=lambda b: (b.used, -b.order))
                    self._open.remove(fullest)
                    out.append(self._sample(fullest))
                target = _Bin(self._made)
                self._made += 1
                self._open.append(target)
            mask = batch.mask[start : start + n] if batch.mask is not None else None
            target.docs.append((tokens[start : start + n], batch.dataset, mask))
            target.used += pairs
            if target.used == self.seq_len:
                self._open.remove(target)
                out.append(self._sample(target))
        return out

    def _best(self, pairs: int) -> _Bin | None:
        best: _Bin | None = None
        room = self.seq_len + 1
        for b in self._open:  # oldest first, so ties keep the oldest
            free = self.seq_len - b.used
            if pairs <= free < room:
                best, room = b, free
        return best

    def flush(self) -> list[Sample]:
        """Emit every open sample, oldest first, padded."""
        out = [self._sample(b) for b in sorted(self._open, key=lambda b: b.order)]
        self._open = []
        return out

    def _sample(self, b: _Bin) -> Sample:
        s, pad = self.seq_len, self.seq_len - b.used
        pairs = np.fromiter((len(t) - 1 for t, _, _ in b.docs), dtype=np.int64, count=len(b.docs))
        starts = np.cumsum(pairs) - pairs
        inp = np.concatenate([*(t[:-1] for t, _, _ in b.docs), np.full(pad, self.pad_id)])
        lab = np.concatenate(
            [
                *(
                    t[1:] if m is None else np.where(m[1:], t[1:], IGNORE_INDEX)
                    for t, _, m in b.docs
                ),
                np.full(pad, IGNORE_INDEX),
            ]
        )
        pos = np.zeros(s, dtype=np.int64)
        pos[: b.used] = np.arange(b.used) - np.repeat(starts, pairs)
        doc = np.full(s, -1, dtype=np.int64)
        doc[: b.used] = np.repeat(np.arange(len(pairs)), pairs)
        sample = {
            "input": inp.astype(np.int64, copy=False),
            "labels": lab.astype(np.int64, copy=False),
            "positions": pos,
            DOCUMENT_IDS: doc,
        }
        if self.provenance:
            ds = np.full(s, -1, dtype=np.int64)
            ds[: b.used] = np.repeat(np.asarray([d for _, d, _ in b.docs], dtype=np.int64), pairs)
            sample[DATASET_IDS] = ds
        return sample
