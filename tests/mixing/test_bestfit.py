"""Best-fit packing: documents whole, per-document positions and document ids."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tests.mixing.helpers import base_recipe, memory_dataset, run_batches, texts
from zephon_nodes import Pipeline
from zephon_nodes.operators.bestfit import BestFitPacker, LongDocuments
from zephon_nodes.operators.documents import DocBatch
from zephon_nodes.recipe import PackSpec

PAD = 0


def doc_batch(docs: list[list[int]], dataset: int = 0) -> DocBatch:
    tokens = np.asarray([t for d in docs for t in d], dtype=np.int32)
    return DocBatch(tokens, np.asarray([len(d) for d in docs], dtype=np.int64), dataset)


def unpack(sample: dict[str, np.ndarray]) -> list[list[int]]:
    """Rebuild the documents of a sample from its document ids (independent of the packer)."""
    docs = []
    ids = sample["document_ids"]
    for k in sorted(set(ids.tolist()) - {-1}):
        where = np.flatnonzero(ids == k)
        assert (np.diff(where) == 1).all(), "a document is not contiguous"
        assert sample["positions"][where].tolist() == list(range(len(where)))
        inputs = sample["input"][where].tolist()
        labels = sample["labels"][where].tolist()
        assert inputs[1:] == labels[:-1], "labels are not the inputs shifted inside a document"
        docs.append([*inputs, labels[-1]])
    pad = ids == -1
    assert (sample["labels"][pad] == -100).all() and (sample["input"][pad] == PAD).all()
    assert (sample["positions"][pad] == 0).all()
    if pad.any():
        assert pad[np.argmax(pad) :].all(), "padding only at the end"
    return docs


documents = st.lists(st.integers(3, 250), min_size=2, max_size=33)


class TestBestFitPacker:
    """Every document lands whole in exactly one sample."""

    @given(
        docs=st.lists(documents, min_size=0, max_size=40),
        seq_len=st.integers(32, 64),
        bins=st.integers(1, 6),
        cut=st.integers(1, 7),
    )
    def test_documents_are_never_split(self, docs, seq_len, bins, cut):
        """Unpacking the samples gives back exactly the input documents."""
        docs = [d for d in docs if len(d) - 1 <= seq_len]
        packer = BestFitPacker(seq_len, PAD, bins)
        samples = []
        for i in range(0, len(docs), cut):
            samples += packer.feed(doc_batch(docs[i : i + cut]))
        samples += packer.flush()
        got = [d for s in samples for d in unpack(s)]
        assert sorted(got) == sorted(docs)
        for s in samples:
            assert all(len(s[k]) == seq_len for k in s)

    def test_best_fit_picks_the_tightest_open_sample(self):
        """A document goes to the open sample with the least room that fits it."""
        packer = BestFitPacker(10, PAD, bins=3)
        assert packer.feed(doc_batch([[5] * 7, [6] * 6])) == []  # bins with 6 and 5 pairs
        out = packer.feed(doc_batch([[7] * 5]))  # 4 pairs: fit both; the 6-pair bin is tighter
        assert len(out) == 1
        assert out[0]["input"].tolist() == [5] * 6 + [7] * 4
        assert out[0]["document_ids"].tolist() == [0] * 6 + [1] * 4
        rest = packer.flush()
        assert [s["input"].tolist() for s in rest] == [[6] * 5 + [PAD] * 5]

    def test_fullest_sample_is_evicted_when_bins_are_full(self):
        """With every bin open and none fitting, the fullest one is emitted padded."""
        packer = BestFitPacker(10, PAD, bins=2)
        assert packer.feed(doc_batch([[1] * 9, [2] * 7])) == []  # 8 and 6 pairs
        out = packer.feed(doc_batch([[3] * 6]))  # 5 pairs fit neither
        assert [s["input"].tolist() for s in out] == [[1] * 8 + [PAD] * 2]


class TestLongDocuments:
    """Documents longer than seq_len are split into pieces or dropped and counted."""

    @given(n=st.integers(2, 300), seq_len=st.integers(1, 40))
    def test_split_keeps_every_pair_once(self, n, seq_len):
        doc = list(range(100, 100 + n))
        out = LongDocuments(seq_len, "split")(doc_batch([doc]))
        pieces = out.documents()
        assert all(len(p) - 1 <= seq_len for p in pieces)
        pairs = [(int(p[i]), int(p[i + 1])) for p in pieces for i in range(len(p) - 1)]
        assert pairs == [(doc[i], doc[i + 1]) for i in range(n - 1)]

    def test_drop_counts_too_long(self):
        out = LongDocuments(4, "drop")(doc_batch([[1] * 5, [2] * 6, [3] * 9, [4] * 2]))
        assert [p.tolist() for p in out.documents()] == [[1] * 5, [4] * 2]
        assert out.skipped == (("too_long", 2),)


def test_pipeline_samples_carry_document_ids_and_less_padding_with_more_bins():
    """A best-fit recipe's batches hold whole documents with ids; more bins, less padding."""
    data = [
        memory_dataset("a", texts("abcdefgh", 300, 3, 100, 1)),
    ]
    pads = []
    for bins in (1, 16):
        recipe = base_recipe(data, pack=PackSpec(mode="bestfit", bins=bins), seq_len=128)
        batches = run_batches(Pipeline(recipe), 8)
        for mb in batches:
            for row in range(mb["input"].shape[0]):
                sample = {k: v[row].numpy() for k, v in mb.items() if k != "lane"}
                for d in unpack(sample):
                    assert len(d) >= 2
        pads.append(sum(int((mb["labels"] == -100).sum()) for mb in batches))
    assert pads[1] < pads[0]
