"""The multimodal packer: a worked example and properties against an independent replay."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from zephon_nodes.multimodal.pack import MultimodalPacker
from zephon_nodes.multimodal.tokenize import MMDocBatch, PlacedImage
from zephon_nodes.recipe.image import ImageSpec

P = 999  # placeholder id
PAD = 0


def image(rows: int, cols: int, value: int, start: int, merge: int = 1, patch: int = 2):
    patches = np.full((rows * cols, patch, patch, 3), value % 256, dtype=np.uint8)
    patches[:, 0, 0, 0] = np.arange(rows * cols)  # every patch distinct
    return PlacedImage(start, rows * cols // merge**2, rows, cols, patches)


def batch(docs):
    """``docs``: lists of ints and ("img", rows, cols, value) items -> MMDocBatch."""
    tokens, lengths, images = [], [], []
    for doc in docs:
        ids, placed = [], []
        for part in doc:
            if isinstance(part, tuple):
                _, r, c, v = part
                placed.append(image(r, c, v, len(ids)))
                ids.extend([P] * (r * c))
            else:
                ids.append(part)
        tokens.extend(ids)
        lengths.append(len(ids))
        images.append(tuple(placed))
    return MMDocBatch(
        np.asarray(tokens, dtype=np.int32), np.asarray(lengths, dtype=np.int64), tuple(images)
    )


def test_worked_example() -> None:
    spec = ImageSpec(mode="patches", patch_size=2, max_patches=4, max_images=2)
    packer = MultimodalPacker(8, PAD, spec, P)
    a = [1, ("img", 1, 2, 50), 10, 11, 2]  # 6 tokens, 5 pairs
    b = [1, 20, 21, 22, 2]  # 4 pairs: does not fit the 3 left, starts a new sample
    out = packer.feed(batch([a, b]))
    assert len(out) == 1
    s = out[0]
    assert s["input"].tolist() == [1, P, P, 10, 11, 0, 0, 0]
    assert s["labels"].tolist() == [-100, -100, 10, 11, 2, -100, -100, -100]
    assert s["positions"].tolist() == [0, 1, 2, 3, 4, 0, 0, 0]
    assert s["document_ids"].tolist() == [0, 0, 0, 0, 0, -1, -1, -1]
    assert s["image_offsets"].tolist() == [1, -1]
    assert s["image_patch_offsets"].tolist() == [0, -1]
    assert s["image_grids"].tolist() == [[1, 2], [0, 0]]
    assert s["patches"].shape == (8, 2, 2, 3)  # 2 images x 4 patches
    assert (s["patches"][:2, 1, 1] == 50).all() and (s["patches"][2:] == 0).all()
    (t,) = packer.flush()
    assert t["input"].tolist() == [1, 20, 21, 22, 0, 0, 0, 0]
    assert t["labels"].tolist() == [20, 21, 22, 2, -100, -100, -100, -100]
    assert t["image_offsets"].tolist() == [-1, -1]
    assert packer.flush() == []


def test_long_document_is_cut_between_images() -> None:
    spec = ImageSpec(mode="patches", patch_size=2, max_patches=4, max_images=4)
    packer = MultimodalPacker(6, PAD, spec, P)
    # Inputs 1 5 P P 6 P P 7 8: a cut at 6 would split the second image, so it is at 5.
    doc = [1, 5, ("img", 1, 2, 3), 6, ("img", 1, 2, 4), 7, 8, 2]
    out = packer.feed(batch([doc])) + packer.flush()
    assert [s["input"].tolist() for s in out] == [[1, 5, P, P, 6, 0], [P, P, 7, 8, 0, 0]]
    assert [s["labels"].tolist() for s in out] == [
        [5, -100, -100, 6, -100, -100],
        [-100, 7, 8, 2, -100, -100],
    ]
    assert [s["image_offsets"].tolist()[:2] for s in out] == [[2, -1], [0, -1]]
    assert [s["positions"].tolist() for s in out] == [[0, 1, 2, 3, 4, 0], [0, 1, 2, 3, 0, 0]]


@st.composite
def documents(draw: st.DrawFn, max_tokens: int):
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            r, c = draw(st.integers(1, 2)), draw(st.integers(1, 2))
            if r * c <= max_tokens:
                parts.append(("img", r, c, draw(st.integers(1, 250))))
        else:
            parts.extend(draw(st.lists(st.integers(3, 300), min_size=1, max_size=12)))
    parts.append(2)  # a document never ends on a placeholder
    return parts


@given(
    seq_len=st.integers(5, 24),
    max_images=st.integers(1, 3),
    data=st.data(),
)
def test_packing_properties(seq_len: int, max_images: int, data: st.DataObject) -> None:
    spec = ImageSpec(mode="patches", patch_size=2, max_patches=4, max_images=max_images)
    docs = data.draw(st.lists(documents(seq_len - 1), min_size=1, max_size=10))
    groups = data.draw(st.integers(1, 3))
    packer = MultimodalPacker(seq_len, PAD, spec, P)
    out = []
    for g in range(groups):
        out += packer.feed(batch(docs[g::groups]))
    out += packer.flush()
    order = [d for g in range(groups) for d in docs[g::groups]]
    whole = batch(order)
    # Replay: every pair, in order, once.
    expected_in, expected_lab, expected_imgs = [], [], []
    for d, doc in enumerate(whole.documents()):
        expected_in += doc[:-1].tolist()
        expected_lab += [(-100 if x == P else int(x)) for x in doc[1:]]
        expected_imgs += [(i.rows, i.cols, i.patches) for i in whole.images[d]]
    got_in, got_lab, got_imgs = [], [], []
    for s in out:
        real = s["document_ids"] >= 0
        used = int(real.sum())
        assert real[:used].all() and not real[used:].any()  # padding only at the end
        assert (s["input"][used:] == PAD).all() and (s["labels"][used:] == -100).all()
        got_in += s["input"][:used].tolist()
        got_lab += s["labels"][:used].tolist()
        docs_in = s["document_ids"][:used]
        assert (np.diff(docs_in) >= 0).all() and (np.diff(docs_in) <= 1).all()
        for j in np.unique(docs_in):
            assert s["positions"][:used][docs_in == j].tolist() == list(
                range(int((docs_in == j).sum()))
            )
        n_img = int((s["image_offsets"] >= 0).sum())
        assert n_img <= max_images and (s["image_offsets"][n_img:] == -1).all()
        q = 0
        for k in range(n_img):
            r, c = s["image_grids"][k].tolist()
            o = int(s["image_offsets"][k])
            assert int(s["image_patch_offsets"][k]) == q
            assert s["input"][o : o + r * c].tolist() == [P] * (r * c)  # never cut
            assert len(set(docs_in[o : o + r * c].tolist())) == 1
            got_imgs.append((r, c, s["patches"][q : q + r * c]))
            q += r * c
        assert (s["patches"][q:] == 0).all()
    assert got_in == expected_in and got_lab == expected_lab
    # A document that fits an empty sample is never split.
    pairs = [max(int(n) - 1, 0) for n in whole.lengths]
    starts = np.cumsum([0, *pairs])
    g = 0
    for s in out:
        docs_in = s["document_ids"][s["document_ids"] >= 0]
        for j in np.unique(docs_in):
            m = int((docs_in == j).sum())
            d = int(np.searchsorted(starts, g, side="right")) - 1
            while pairs[d] == 0:
                d += 1
            imgs = whole.images[d]
            fits = (
                pairs[d] <= seq_len
                and len(imgs) <= max_images
                and sum(i.rows * i.cols for i in imgs) <= spec.patches_per_sample
            )
            if fits:
                assert (g, m) == (int(starts[d]), pairs[d]), f"document {d} was split"
            g += m
    assert len(got_imgs) == len(expected_imgs)
    for (r, c, p), (er, ec, ep) in zip(got_imgs, expected_imgs, strict=True):
        assert (r, c) == (er, ec) and (p == ep).all()
    # Every placeholder of the input belongs to exactly one listed image.
    assert sum(int((s["input"] == P).sum()) for s in out) == sum(r * c for r, c, _ in got_imgs)
