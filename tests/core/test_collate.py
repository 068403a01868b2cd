"""collate: one tensor per key, exactly what ``np.stack`` of the samples' arrays gives."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_nodes.operators.batch import collate

CASES = {
    "rows of one packer": [np.arange(8) + i for i in range(4)],
    "2-d": [np.arange(6).reshape(2, 3) * i for i in range(3)],
    "0-d": [np.array(i) for i in range(3)],
    "one sample": [np.arange(5)],
    "empty rows": [np.zeros(0, dtype=np.int64)] * 2,
    "first narrower dtype (promoted)": [
        np.array([2**40, 1], dtype=np.int64)[::-1].astype(np.int32),
        np.array([2**40, 1], dtype=np.int64),
    ],
    "later narrower dtype": [np.arange(3), np.arange(3, dtype=np.int32)],
    "non-contiguous view": [np.arange(10)[::2], np.arange(5)],
    "big-endian": [np.arange(4).astype(">i8"), np.arange(4)],
    "lists": [[1, 2, 3], [4, 5, 6]],
}


@pytest.mark.parametrize("name", list(CASES))
def test_same_as_np_stack(name):
    arrays = CASES[name]
    want = np.stack(arrays)
    got = collate([{"x": a, "y": a} for a in arrays])
    assert list(got) == ["x", "y"]
    for t in got.values():
        arr = t.numpy()
        assert arr.dtype == want.dtype and arr.shape == want.shape
        assert arr.tobytes() == want.tobytes()
        assert not any(np.shares_memory(arr, a) for a in arrays if isinstance(a, np.ndarray))


@pytest.mark.parametrize(
    "arrays",
    [[np.arange(5), np.arange(6)], [np.arange(4), np.arange(4).reshape(2, 2)]],
    ids=["lengths", "ranks"],
)
def test_mismatched_shapes_raise_as_np_stack(arrays):
    with pytest.raises(ValueError) as want:
        np.stack(arrays)
    with pytest.raises(ValueError) as got:
        collate([{"x": a} for a in arrays])
    assert str(got.value) == str(want.value)


def test_empty_list_refused():
    with pytest.raises(ValueError, match="empty list"):
        collate([])
