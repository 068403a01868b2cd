"""``NodeCache.discard_if``: a damaged entry is judged and removed once no other reader pins it.

Every reader that found an entry damaged calls it; the first to hold the key alone removes
it, a later one finds it removed or made again and keeps it; it never removes an entry
another reader still pins, and never waits without a bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from zephon_nodes.core.errors import DataError
from zephon_nodes.io.nodecache.cache import NodeCache


def _fetch(blob: bytes) -> Callable[[Path], None]:
    def fetch(dest: Path) -> None:
        dest.write_bytes(blob)

    return fetch


def test_waits_for_other_readers_then_removes(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path, 1 << 20)
    other = NodeCache(tmp_path, 1 << 20)  # another process's reader of the same directory
    with cache.open("k", 8, _fetch(b"damaged!")):
        pass
    judged: list[float] = []
    released = threading.Event()

    def bad(path: Path) -> bool:
        judged.append(time.monotonic())
        assert released.is_set(), "judged while another reader pinned the entry"
        return path.read_bytes() == b"damaged!"

    with other.open("k", 8, _fetch(b"never")):
        found: list[bool] = []
        t = threading.Thread(target=lambda: found.append(cache.discard_if("k", bad)))
        t.start()
        time.sleep(0.3)
        assert t.is_alive() and not judged  # still waiting for the other reader's pin
        released.set()
    t.join(10)
    assert found == [True] and len(judged) == 1
    assert not cache.contains("k")
    with cache.open("k", 8, _fetch(b"made new")) as path:
        assert path.read_bytes() == b"made new"
    cache.close()
    other.close()


def test_a_sound_or_missing_entry_is_kept(tmp_path: Path) -> None:
    """A later reader finds the entry made again (sound) or gone: nothing removed."""
    cache = NodeCache(tmp_path, 1 << 20)
    with cache.open("k", 8, _fetch(b"made new")):
        pass
    assert cache.discard_if("k", lambda p: p.read_bytes() != b"made new") is False
    assert cache.contains("k")
    calls: list[Path] = []

    def bad(path: Path) -> bool:
        calls.append(path)
        return True

    assert cache.discard_if("gone", bad) is False
    assert calls == []  # nothing to judge
    cache.close()


def test_a_reader_that_never_lets_go_is_an_error(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path, 1 << 20, wait_s=0.2)
    other = NodeCache(tmp_path, 1 << 20)
    with cache.open("k", 8, _fetch(b"damaged!")):
        pass
    with other.open("k", 8, _fetch(b"never")), pytest.raises(DataError, match="stayed in use"):
        cache.discard_if("k", lambda p: True)
    assert cache.contains("k")
    cache.close()
    other.close()
