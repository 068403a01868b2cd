"""Huge documents are tokenized in pieces and packed in chunks: same output, bounded memory.

The memory bound itself (under 8 bytes of RSS per document byte) is held by
``tests/fault/test_resource_limits.py::test_big_document`` in a fresh process.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_nodes.operators import tokenize as tokmod
from zephon_nodes.operators.documents import DocBatch, TextBatch
from zephon_nodes.operators.pack import IGNORE_INDEX, ConcatPacker
from zephon_nodes.operators.tokenize import Tokenize
from zephon_nodes.recipe import TokenizerSpec


def _reference(
    batches: list[list[list[int]]], masks: list[list[list[bool]]], seq_len: int, pad: int
) -> list[tuple]:
    """Pack by hand, one pair at a time (TorchTitan's rule, written out)."""
    pairs = []
    doc_no = 0
    for batch, batch_mask in zip(batches, masks, strict=True):
        for doc, mask in zip(batch, batch_mask, strict=True):
            for j in range(len(doc) - 1):
                label = doc[j + 1] if mask[j + 1] else IGNORE_INDEX
                pairs.append((doc[j], label, j, doc_no))
            doc_no += len(doc) > 1
    rows = []
    for lo in range(0, len(pairs), seq_len):
        row = pairs[lo : lo + seq_len]
        if row and row[0][2] > 0:  # a continued document restarts its positions at 0
            first = row[0][2]
            k = 0
            while k < len(row) and row[k][2] != 0:
                row[k] = (row[k][0], row[k][1], row[k][2] - first, row[k][3])
                k += 1
        first_doc = row[0][3]
        row = [(a, b, c, d - first_doc) for a, b, c, d in row]  # documents count from 0
        row += [(pad, IGNORE_INDEX, 0, -1)] * (seq_len - len(row))
        rows.append(tuple(tuple(col) for col in zip(*row, strict=True)))
    return rows


docs = st.lists(st.integers(3, 300), min_size=0, max_size=40)
batches = st.lists(st.lists(docs, max_size=5), min_size=1, max_size=4)


@settings(max_examples=60)
@given(
    batches=batches,
    seq_len=st.integers(1, 17),
    chunk=st.integers(1, 9),
    lazy=st.booleans(),
    masked=st.booleans(),
    data=st.data(),
)
def test_chunked_packing_matches_the_pair_by_pair_reference(
    batches: list[list[list[int]]],
    seq_len: int,
    chunk: int,
    lazy: bool,
    masked: bool,
    data: st.DataObject,
) -> None:
    packer = ConcatPacker(seq_len, pad_id=0, provenance=True, document_ids=True, chunk_tokens=chunk)
    masks = [
        [[data.draw(st.booleans()) if masked else True for _ in d] for d in b] for b in batches
    ]
    out = []
    for k, (batch, batch_mask) in enumerate(zip(batches, masks, strict=True)):
        tokens = np.asarray([t for d in batch for t in d], dtype=np.int32)
        lengths = np.asarray([len(d) for d in batch], dtype=np.int64)
        mask = np.asarray([m for d in batch_mask for m in d], dtype=bool) if masked else None
        fed = DocBatch(tokens, lengths, dataset=k, mask=mask)
        out += list(packer.feed_lazily(fed)) if lazy else packer.feed(fed)
    out += packer.flush()
    fields = ("input", "labels", "positions", "document_ids")
    got = [tuple(tuple(s[f].tolist()) for f in fields) for s in out]
    assert got == _reference(batches, masks, seq_len, pad=0)
    # provenance: the dataset of each real token, -1 on padding
    expected_ids = [k for k, b in enumerate(batches) for d in b for _ in range(len(d) - 1)]
    ids = [i for s in out for i in s["dataset_ids"].tolist() if i != -1]
    assert ids == expected_ids


@settings(max_examples=30)
@given(
    texts=st.lists(st.text(max_size=40), max_size=6),
    piece=st.integers(1, 5),
    bos=st.booleans(),
    eos=st.booleans(),
)
def test_byte_tokenizer_in_pieces(texts: list[str], piece: int, bos: bool, eos: bool) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tokmod, "PIECE_CHARS", piece)
        got = Tokenize(TokenizerSpec(kind="bytes", add_bos=bos, add_eos=eos))(
            TextBatch(texts, "t", 3, (("x", 1),))
        )
    expected = []
    for t in texts:
        expected.append([1] * bos + [b + 3 for b in t.encode("utf-8")] + [2] * eos)
    assert got.tokens.dtype == np.int32
    assert got.tokens.tolist() == [t for doc in expected for t in doc]
    assert got.lengths.tolist() == [len(doc) for doc in expected]
    assert (got.dataset, got.skipped) == (3, (("x", 1),))
    assert tokmod.ByteTokenizer().encode_batch(texts) == [
        [b + 3 for b in t.encode("utf-8")] for t in texts
    ]
