"""A small seeded mutation fuzzer (no dependency): random JSON values and mutations of valid
inputs, run for a time budget. Used by ``test_fuzz_budget.py``; Hypothesis drives the shrinking
property tests in ``test_hostile_inputs.py``."""

from __future__ import annotations

import copy
import random
import string
from typing import Any

SPECIAL_INTS = (0, 1, -1, 2, 3, 4, 7, 8, 2**31, 2**62 - 1, 2**62, 2**63, -(2**63), 10**30)
SPECIAL_STRS = ("", "0", "1", "-1", "01", "x", "inf", "nan", "zephon-nodes/1", "../etc/passwd")
SPECIAL_FLOATS = (0.0, -0.0, 0.5, 1e308, float("inf"), float("-inf"), float("nan"))


def random_scalar(rng: random.Random) -> Any:
    """A random JSON scalar, biased to edge values."""
    k = rng.randrange(8)
    if k == 0:
        return None
    if k == 1:
        return rng.random() < 0.5
    if k == 2:
        return rng.choice(SPECIAL_INTS)
    if k == 3:
        return rng.randint(-1000, 1000)
    if k == 4:
        return rng.choice(SPECIAL_FLOATS)
    if k == 5:
        return rng.choice(SPECIAL_STRS)
    n = rng.randint(0, 12)
    return "".join(rng.choice(string.printable + "é☃\x00") for _ in range(n))


def random_json(rng: random.Random, depth: int = 3) -> Any:
    """A random JSON-like value (nested lists and dicts up to ``depth``)."""
    if depth <= 0 or rng.random() < 0.5:
        return random_scalar(rng)
    if rng.random() < 0.5:
        return [random_json(rng, depth - 1) for _ in range(rng.randint(0, 4))]
    return {str(random_scalar(rng)): random_json(rng, depth - 1) for _ in range(rng.randint(0, 4))}


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.extend(_paths(v, (*prefix, i)))
    return out


def mutate(rng: random.Random, obj: Any, rounds: int = 3) -> Any:
    """Return a copy of ``obj`` with a few random edits: replace, delete, add, swap type."""
    obj = copy.deepcopy(obj)
    for _ in range(rng.randint(1, rounds)):
        paths = _paths(obj)
        path = rng.choice(paths)
        if not path:
            if rng.random() < 0.1:
                obj = random_json(rng)
            continue
        parent = obj
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        op = rng.randrange(4)
        if op == 0:
            parent[key] = random_json(rng, 2)
        elif op == 1:
            if isinstance(parent, dict):
                del parent[key]
            else:
                parent.pop(key)
        elif op == 2 and isinstance(parent, dict):
            parent[str(random_scalar(rng))] = random_json(rng, 1)
        else:
            value = parent[key]
            if isinstance(value, int) and not isinstance(value, bool):
                parent[key] = rng.choice((value + 1, value - 1, -value, str(value), float(value)))
            else:
                parent[key] = random_scalar(rng)
    return obj


def mutate_bytes(rng: random.Random, blob: bytes) -> bytes:
    """Flip, delete, insert or truncate bytes."""
    b = bytearray(blob)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(4)
        if not b:
            b.extend(rng.randbytes(rng.randint(1, 8)))
            continue
        i = rng.randrange(len(b))
        if op == 0:
            b[i] = rng.randrange(256)
        elif op == 1:
            del b[i : i + rng.randint(1, 8)]
        elif op == 2:
            b[i:i] = rng.choice([b"[", b"{", b'"', b"\\", b"9" * 20, b"\n", rng.randbytes(3)])
        else:
            del b[i:]
    return bytes(b)
