"""Version-stable pseudo-random numbers derived from integer tuples.

NumPy documents that ``Generator`` streams may change between releases, which would silently
change a recipe's data order after an upgrade. Everything order-defining in zephon-nodes is
therefore derived from SplitMix64, a tiny, fully specified mixer implemented here.
"""

from __future__ import annotations

import numpy as np

from zephon_nodes.core._permcache import recall, remember

__all__ = ["SplitMix64", "derive_seed", "mix64", "permutation"]

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15


def mix64(x: int) -> int:
    """Return the SplitMix64 finalizer of ``x`` (a bijection on 64-bit integers)."""
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def derive_seed(*parts: int) -> int:
    """Hash a tuple of integers into a 64-bit seed (order-sensitive).

    Args:
        *parts: Non-negative integers such as ``(seed, lane, window, tag)``.

    Returns:
        A 64-bit integer that changes with any part.
    """
    h = 0x243F6A8885A308D3
    for p in parts:
        h = mix64(h ^ mix64((int(p) + _GAMMA) & _MASK))
    return h


class SplitMix64:
    """A small deterministic random generator (SplitMix64) seeded from integers.

    Args:
        *parts: Integers the seed is derived from (see :func:`derive_seed`).
    """

    __slots__ = ("_state",)

    def __init__(self, *parts: int) -> None:
        self._state = derive_seed(*parts)

    def next_u64(self) -> int:
        """Return the next 64-bit output."""
        self._state = (self._state + _GAMMA) & _MASK
        return mix64(self._state)

    def below(self, n: int) -> int:
        """Return an integer uniform in ``[0, n)`` (n > 0; bias below 2**-40 for n < 2**24)."""
        return self.next_u64() % n


def _mix64_array(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def permutation(n: int, *parts: int) -> np.ndarray:
    """Return a seeded permutation of ``range(n)`` as an int64 array.

    The permutation sorts indices by a SplitMix64 hash of ``(seed parts, index)``, so it is
    identical on every platform and NumPy version.

    Args:
        n: Length of the permutation.
        *parts: Integers the permutation is seeded from.
    """
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    key = np.uint64(derive_seed(*parts))
    if n >= _REMEMBER:
        known = recall(n, int(key))
        if known is not None:
            return known
    with np.errstate(over="ignore"):
        idx = np.arange(n, dtype=np.uint64) * np.uint64(_GAMMA) + key
    perm = np.argsort(_mix64_array(idx), kind="stable").astype(np.int64)
    if n >= _REMEMBER:
        remember(n, int(key), perm)
    return perm


# Permutations at least this long are remembered in the cache directory (sorting 100,000
# keys costs milliseconds at every start-up; loading the result, a fraction of one).
_REMEMBER = 1 << 16
