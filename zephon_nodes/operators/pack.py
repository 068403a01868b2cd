"""Pack: concatenate documents into ``seq_len`` samples, TorchTitan style."""

from __future__ import annotations

import numpy as np

from zephon_nodes.operators.documents import DocBatch

__all__ = ["IGNORE_INDEX", "ConcatPacker", "Sample"]

IGNORE_INDEX = -100
Sample = dict[str, np.ndarray]


def _normalize_positions(pos: np.ndarray) -> None:
    """Rebase, in place, each row's leading run of a document continued from the row before.

    Matches TorchTitan 0.3.0's ``_normalize_positions``: the run before the first 0 starts at
    0, so positions stay below ``seq_len`` (RoPE cache).
    """
    first = pos[:, 0]
    rows = np.flatnonzero(first > 0)
    if not len(rows):
        return
    sub = pos[rows]
    zero = sub == 0
    end = np.where(zero.any(axis=1), zero.argmax(axis=1), pos.shape[1])
    lead = np.arange(pos.shape[1]) < end[:, None]
    sub -= lead * first[rows][:, None]
    pos[rows] = sub


class ConcatPacker:
    """Accumulator: documents -> samples of ``seq_len`` (input, labels, positions).

    Matches TorchTitan 0.3.0's text loader: each document (with its bos/eos) contributes
    ``tokens[:-1]`` as inputs and ``tokens[1:]`` as labels, so no target crosses a document
    boundary; positions restart at 0 for every document (and for the continuation of a
    document split across samples). At a flush the partial sample is padded: inputs with
    ``pad_id``, labels with -100, positions with 0.

    A batch with a ``mask`` (chat recipes) gets label -100 on the tokens the mask leaves
    out. With ``document_ids`` samples also hold ``document_ids``: 0, 1, ... for the
    documents (or pieces of documents) of the sample, -1 on padding, so that
    ``document_ids[i] == document_ids[j]`` is the block-diagonal attention mask.

    Args:
        seq_len: Tokens per sample.
        pad_id: Input id for padding at a flush.
        provenance: Also emit ``dataset_ids`` (each token's dataset index, -1 on padding),
            for statistics; off in training, so digests are unaffected.
        document_ids: Also emit ``document_ids``.
    """

    def __init__(
        self, seq_len: int, pad_id: int, provenance: bool = False, document_ids: bool = False
    ) -> None:
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.provenance = provenance
        self.document_ids = document_ids
        self._parts: list[tuple[np.ndarray, ...]] = []
        self._held = 0
        self._docs = 0

    def feed(self, batch: DocBatch) -> list[Sample]:
        """Add a batch of documents; return the samples that are full."""
        lengths = batch.lengths
        tokens = batch.tokens  # int32; widened once, when copied into the output block
        keep = lengths > 0
        if not keep.any():
            return []
        ends = np.cumsum(lengths)
        starts = ends - lengths
        drop_last = np.ones(len(tokens), dtype=bool)
        drop_last[ends[keep] - 1] = False
        drop_first = np.ones(len(tokens), dtype=bool)
        drop_first[starts[keep]] = False
        inputs = tokens[drop_last]
        labels = tokens[drop_first]
        if batch.mask is not None:
            labels = np.where(batch.mask[drop_first], labels, IGNORE_INDEX).astype(labels.dtype)
        pairs = np.maximum(lengths - 1, 0)
        offsets = np.cumsum(pairs) - pairs
        positions = np.arange(len(inputs), dtype=np.int64) - np.repeat(offsets, pairs)
        if len(inputs):
            part: tuple[np.ndarray, ...] = (inputs, labels, positions)
            if self.provenance:
                part += (np.full(len(inputs), batch.dataset, dtype=np.int64),)
            if self.document_ids:
                kept = pairs[pairs > 0]
                part += (np.repeat(np.arange(len(kept), dtype=np.int64) + self._docs, kept),)
                self._docs += len(kept)
            self._parts.append(part)
            self._held += len(inputs)
        return self._emit(final=False)

    def flush(self) -> list[Sample]:
        """Return the remaining full samples and the padded partial one."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> list[Sample]:
        s = self.seq_len
        rows = self._held // s
        if final and self._held % s:
            rows += 1
        if rows == 0:
            return []
        # Copy the parts once, straight into the output block; the rest stays as views.
        used = min(rows * s, self._held)
        blocks = [np.empty(rows * s, dtype=np.int64) for _ in self._parts[0]]
        rest: list[tuple[np.ndarray, ...]] = []
        filled = 0
        for part in self._parts:
            n = len(part[0])
            take = min(n, used - filled)
            if take > 0:
                for block, col in zip(blocks, part, strict=True):
                    block[filled : filled + take] = col[:take]
                filled += take
            if take < n:
                rest.append(tuple(col[take:] for col in part))
        self._parts = rest
        self._held -= used
        fills = [self.pad_id, IGNORE_INDEX, 0] + [-1] * (len(blocks) - 3)
        if rows * s > used:
            for block, fill in zip(blocks, fills, strict=True):
                block[used:] = fill
        inp, lab, pos = (b.reshape(rows, s) for b in blocks[:3])
        _normalize_positions(pos)
        # Each sample owns its memory: a shuffle buffer holding one row must not keep the
        # whole block of rows alive.
        out = [
            {"input": inp[i].copy(), "labels": lab[i].copy(), "positions": pos[i].copy()}
            for i in range(rows)
        ]
        if self.provenance:
            for i, row in enumerate(blocks[3].reshape(rows, s)):
                out[i]["dataset_ids"] = row.copy()
        if self.document_ids:
            for i, row in enumerate(blocks[-1].reshape(rows, s)):
                ids = row.copy()
                real = ids >= 0
                ids[real] -= ids[0]  # documents of a sample count from 0
                out[i]["document_ids"] = ids
        return out
