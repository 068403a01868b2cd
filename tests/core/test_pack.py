"""ConcatPacker against a plain-Python reference of TorchTitan 0.3.0's text packing."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from zephon_nodes.operators import IGNORE_INDEX, ConcatPacker, DocBatch


def reference_pack(docs: list[list[int]], seq_len: int, pad_id: int, flush: bool):
    """TorchTitan's HuggingFaceTextDataset loop, written from its source with lists."""
    inputs, labels, positions, out = [], [], [], []
    for d in docs:
        inputs += d[:-1]
        labels += d[1:]
        positions += list(range(len(d) - 1))
        while len(inputs) >= seq_len:
            pos = positions[:seq_len]
            if pos[0] > 0:
                off = pos[0]
                for i, p in enumerate(pos):
                    if p == 0:
                        break
                    pos[i] = p - off
            out.append((inputs[:seq_len], labels[:seq_len], pos))
            inputs, labels, positions = inputs[seq_len:], labels[seq_len:], positions[seq_len:]
    if flush and inputs:
        pad = seq_len - len(inputs)
        pos = positions + [0] * pad
        if pos[0] > 0:
            off = pos[0]
            for i, p in enumerate(pos):
                if p == 0:
                    break
                pos[i] = p - off
        out.append((inputs + [pad_id] * pad, labels + [IGNORE_INDEX] * pad, pos))
    return out


token_docs = st.lists(st.lists(st.integers(3, 50), min_size=0, max_size=40), max_size=12)


@given(batches=st.lists(token_docs, min_size=1, max_size=4), seq_len=st.integers(1, 20))
def test_matches_torchtitan_reference(batches, seq_len):
    """Feeding work items one by one and flushing equals the reference over all documents."""
    packer = ConcatPacker(seq_len, pad_id=0)
    got = []
    for docs in batches:
        tokens = np.asarray([t for d in docs for t in d], dtype=np.int32)
        lengths = np.asarray([len(d) for d in docs], dtype=np.int64)
        got += packer.feed(DocBatch(tokens, lengths))
    got += packer.flush()
    expected = reference_pack([d for docs in batches for d in docs], seq_len, 0, flush=True)
    assert len(got) == len(expected)
    for sample, (inp, lab, pos) in zip(got, expected, strict=True):
        assert sample["input"].tolist() == inp
        assert sample["labels"].tolist() == lab
        assert sample["positions"].tolist() == pos
        assert sample["positions"].max() < seq_len


def test_flush_pads_partial_sample():
    """At a flush the partial sample is padded with pad_id, labels -100, positions 0."""
    packer = ConcatPacker(6, pad_id=9)
    assert packer.feed(DocBatch(np.asarray([1, 5, 6, 2], np.int32), np.asarray([4]))) == []
    (sample,) = packer.flush()
    assert sample["input"].tolist() == [1, 5, 6, 9, 9, 9]
    assert sample["labels"].tolist() == [5, 6, 2, -100, -100, -100]
    assert sample["positions"].tolist() == [0, 1, 2, 0, 0, 0]
    assert packer.flush() == []
