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
    for row in pos:
        first = int(row[0])
        if first > 0:
            zeros = np.flatnonzero(row == 0)
            end = int(zeros[0]) if len(zeros) else len(row)
            row[:end] -= first


class ConcatPacker:
    """Accumulator: documents -> samples of ``seq_len`` (input, labels, positions).

    Matches TorchTitan 0.3.0's text loader: each document (with its bos/eos) contributes
    ``tokens[:-1]`` as inputs and ``tokens[1:]`` as labels, so no target crosses a document
    boundary; positions restart at 0 for every document (and for the continuation of a
    document split across samples). At a flush the partial sample is padded: inputs with
    ``pad_id``, labels with -100, positions with 0.

    Args:
        seq_len: Tokens per sample.
        pad_id: Input id for padding at a flush.
        provenance: Also emit ``dataset_ids`` (each token's dataset index, -1 on padding),
            for statistics; off in training, so digests are unaffected.
    """

    def __init__(self, seq_len: int, pad_id: int, provenance: bool = False) -> None:
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.provenance = provenance
        self._parts: list[tuple[np.ndarray, ...]] = []
        self._held = 0

    def feed(self, batch: DocBatch) -> list[Sample]:
        """Add a batch of documents; return the samples that are full."""
        lengths = batch.lengths
        tokens = batch.tokens.astype(np.int64, copy=False)
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
        pairs = np.maximum(lengths - 1, 0)
        offsets = np.cumsum(pairs) - pairs
        positions = np.arange(len(inputs), dtype=np.int64) - np.repeat(offsets, pairs)
        if len(inputs):
            part: tuple[np.ndarray, ...] = (inputs, labels, positions)
            if self.provenance:
                part += (np.full(len(inputs), batch.dataset, dtype=np.int64),)
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
        cols = [np.concatenate(x) for x in zip(*self._parts, strict=True)]
        inputs, labels, positions = cols[:3]
        used = min(rows * s, self._held)
        if final:
            self._parts, self._held = [], 0
        else:
            rest = tuple(c[used:] for c in cols)
            self._parts = [rest] if len(rest[0]) else []
            self._held -= used
        pad = rows * s - used
        inp = np.concatenate([inputs[:used], np.full(pad, self.pad_id, dtype=np.int64)])
        lab = np.concatenate([labels[:used], np.full(pad, IGNORE_INDEX, dtype=np.int64)])
        pos = np.concatenate([positions[:used], np.zeros(pad, dtype=np.int64)])
        inp, lab, pos = inp.reshape(rows, s), lab.reshape(rows, s), pos.reshape(rows, s)
        _normalize_positions(pos)
        out = [{"input": inp[i], "labels": lab[i], "positions": pos[i]} for i in range(rows)]
        if self.provenance:
            ds = np.concatenate([cols[3][:used], np.full(pad, -1, dtype=np.int64)])
            for i, row in enumerate(ds.reshape(rows, s)):
                out[i]["dataset_ids"] = row
        return out
