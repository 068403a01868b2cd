"""Seeded randomness is a fixed, documented algorithm (SplitMix64), not NumPy's stream."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from zephon_nodes.core.seeding import SplitMix64, mix64, permutation


def test_splitmix64_reference_values():
    """The mixer equals the published SplitMix64 outputs for state 0 (Vigna's reference)."""
    state, out = 0, []
    for _ in range(3):
        state = (state + 0x9E3779B97F4A7C15) & (2**64 - 1)
        out.append(mix64(state))
    assert out == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


@given(n=st.integers(0, 300), seed=st.integers(0, 2**40), epoch=st.integers(0, 9))
def test_permutation_is_a_permutation(n, seed, epoch):
    """Every index appears exactly once."""
    assert sorted(permutation(n, seed, epoch).tolist()) == list(range(n))


def test_permutation_changes_with_seed_and_epoch():
    """Different seeds or epochs give different orders."""
    a = permutation(100, 1, 0).tolist()
    assert a != permutation(100, 2, 0).tolist()
    assert a != permutation(100, 1, 1).tolist()
    assert a == permutation(100, 1, 0).tolist()


def test_below_is_in_range_and_deterministic():
    """SplitMix64.below stays in range and repeats for the same seed."""
    r1, r2 = SplitMix64(5, 6), SplitMix64(5, 6)
    xs = [r1.below(7) for _ in range(200)]
    assert xs == [r2.below(7) for _ in range(200)]
    assert set(xs) == set(range(7))


class TestRememberedPermutations:
    """Long permutations come back from the cache directory unchanged, or are recomputed."""

    def test_cache_hit_and_corrupt_file(self, tmp_path, monkeypatch):
        """The second call loads the first's result; a damaged file is recomputed, not used."""
        import numpy as np

        from zephon_nodes.core import seeding

        monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path))
        n = seeding._REMEMBER + 17
        first = seeding.permutation(n, 3, 4)
        assert sorted(first.tolist()) == list(range(n))
        files = list(tmp_path.glob("perm-*.npy"))
        assert len(files) == 1
        real = np.argsort

        def no_sort(*a, **k):
            raise AssertionError("sorted again despite the remembered permutation")

        monkeypatch.setattr(np, "argsort", no_sort)
        assert np.array_equal(seeding.permutation(n, 3, 4), first)
        monkeypatch.setattr(np, "argsort", real)
        blob = bytearray(files[0].read_bytes())
        blob[-8:] = bytes(8)  # a flipped tail: the checksum no longer matches
        files[0].write_bytes(bytes(blob))
        sorts = []
        monkeypatch.setattr(np, "argsort", lambda *a, **k: sorts.append(1) or real(*a, **k))
        assert np.array_equal(seeding.permutation(n, 3, 4), first)
        assert sorts == [1]
        assert not np.array_equal(seeding.permutation(n, 3, 5), first)
