"""Pack: concatenate documents into ``seq_len`` samples, TorchTitan style."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from zephon_nodes.operators.documents import DocBatch

__all__ = ["IGNORE_INDEX", "SOURCE_FIELDS", "ConcatPacker", "Sample"]

IGNORE_INDEX = -100
#: Fields a traced sample adds (each token's shard and record); never part of a digest.
SOURCE_FIELDS = ("source_shard", "source_record")
# Tokens packed at a time: bounds the packer's working memory (about 60 bytes per token)
# whatever the length of a document.
CHUNK_TOKENS = 1 << 18
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
        chunk_tokens: Tokens packed at a time (memory, never output).
        trace: Also emit ``source_shard`` and ``source_record``: each token's shard (its
            index in the dataset) and record number, -1 on padding and where unknown (for
            batch dumps; :data:`SOURCE_FIELDS` are left out of digests).
    """

    def __init__(
        self,
        seq_len: int,
        pad_id: int,
        provenance: bool = False,
        document_ids: bool = False,
        chunk_tokens: int = CHUNK_TOKENS,
        trace: bool = False,
    ) -> None:
        if chunk_tokens < 1:
            raise ValueError(f"{chunk_tokens=} must be >= 1")
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.provenance = provenance
        self.document_ids = document_ids
        self.chunk_tokens = chunk_tokens
        self.trace = trace
        # The extra columns, after input, labels and positions, in this order.
        self._extra = [
            name
            for name, on in (
                ("dataset_ids", provenance),
                ("document_ids", document_ids),
                (SOURCE_FIELDS[0], trace),
                (SOURCE_FIELDS[1], trace),
            )
            if on
        ]
        self._parts: list[tuple[np.ndarray, ...]] = []
        self._held = 0
        self._docs = 0

    def feed(self, batch: DocBatch) -> list[Sample]:
        """Add a batch of documents; return the samples that are full."""
        return list(self.feed_lazily(batch))

    def feed_lazily(self, batch: DocBatch) -> Iterator[Sample]:
        """Like :meth:`feed`, but pack ``chunk_tokens`` tokens at a time, as samples are taken.

        Memory beyond the batch itself stays proportional to ``chunk_tokens``, whatever the
        length of a document. The generator must be drained before the next feed or flush.
        """
        lengths = batch.lengths
        tokens = batch.tokens  # int32; widened once, when copied into the output block
        keep = lengths > 0
        if not keep.any():
            return
        ends = np.cumsum(lengths)
        starts = ends - lengths
        last = ends[keep] - 1  # each document's last token: an input of no pair
        total = int(ends[-1])
        has_pairs = lengths > 1
        first_doc = self._docs  # document numbers of this batch's documents with pairs
        doc_rank = np.cumsum(has_pairs) - 1 + first_doc
        self._docs += int(has_pairs.sum())
        for t0 in range(0, total, self.chunk_tokens):
            t1 = min(t0 + self.chunk_tokens, total)
            # Documents overlapping [t0, t1) and each token's document start.
            d0 = int(np.searchsorted(ends, t0, side="right"))
            d1 = int(np.searchsorted(ends, t1 - 1, side="right")) + 1
            seg = np.minimum(ends[d0:d1], t1) - np.maximum(starts[d0:d1], t0)
            doc_start = np.repeat(starts[d0:d1], seg)
            is_input = np.ones(t1 - t0, dtype=bool)
            lo, hi = np.searchsorted(last, [t0, t1])
            is_input[last[lo:hi] - t0] = False
            # Boolean selections of the chunk (one pass each, no index arrays): inputs,
            # their labels (the next token; past the batch's end only when the chunk's
            # last token is a document's last, which is no input) and positions.
            inputs = tokens[t0:t1][is_input]
            if not len(inputs):
                continue
            nxt = slice(t0 + 1, t1 + 1)
            with_next = is_input[: len(tokens[nxt])]
            labels = tokens[nxt][with_next]
            if batch.mask is not None:
                labels = np.where(batch.mask[nxt][with_next], labels, IGNORE_INDEX).astype(
                    labels.dtype
                )
            offsets = np.arange(t0, t1, dtype=np.int64)
            offsets -= doc_start
            positions = offsets[is_input]
            part: tuple[np.ndarray, ...] = (inputs, labels, positions)
            if self.provenance:
                part += (np.full(len(inputs), batch.dataset, dtype=np.int64),)
            if self.document_ids:
                doc_of = np.repeat(doc_rank[d0:d1], seg)
                part += (doc_of[is_input].astype(np.int64),)
            if self.trace:
                recs = batch.records if batch.records is not None else np.full(len(lengths), -1)
                rec_of = np.repeat(np.asarray(recs, dtype=np.int64)[d0:d1], seg)[is_input]
                part += (np.full(len(inputs), batch.shard, dtype=np.int64), rec_of)
            del offsets, doc_start, is_input, with_next
            self._parts.append(part)
            self._held += len(part[0])
            if self._held >= self.seq_len:
                yield from self._emit(final=False)

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
        for name, block in zip(self._extra, blocks[3:], strict=True):
            for i, row in enumerate(block.reshape(rows, s)):
                ids = row.copy()
                if name == "document_ids":
                    real = ids >= 0
                    ids[real] -= ids[0]  # documents of a sample count from 0
                out[i][name] = ids
        return out
