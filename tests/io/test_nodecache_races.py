"""Races between the processes (and threads) that share a node cache's directory.

A node's ranks and a loader's worker processes open the same cache directory; each test
holds the window of one race open with events or hooks, so the interleaving that lost it
before happens on every run, with real processes where the race is between processes.
"""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import multiprocessing.synchronize
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zephon_nodes.io.nodecache import plans, prefetch
from zephon_nodes.io.nodecache.cache import NodeCache
from zephon_nodes.io.nodecache.entries import entry_name
from zephon_nodes.io.nodecache.tokenstore import Entry, TokenStore

KEY = "t-race"


def _compute(calls: list[str], who: str) -> Callable[[], Entry]:
    def compute() -> Entry:
        calls.append(who)
        return Entry(np.arange(10, dtype=np.int32), np.array([4, 6]))

    return compute


def _late_dropper(
    root: Path, events: dict[str, mp.synchronize.Event], out: mp.Queue[tuple[Any, ...]]
) -> None:
    """Read the damaged entry in a child process and drop it only once the other has stored
    a sound one (its pin gone, just before it drops the entry)."""

    def held(real: Any) -> Any:
        def drop(self: NodeCache, *args: Any) -> Any:
            events["found"].set()
            events["stored"].wait(10)
            return real(self, *args)

        return drop

    NodeCache.discard = held(NodeCache.discard)  # type: ignore[method-assign]
    NodeCache.discard_if = held(NodeCache.discard_if)  # type: ignore[method-assign]
    store = TokenStore(root, 1 << 20)
    calls: list[str] = []
    entry = store.get(KEY, _compute(calls, "late"))
    out.put((calls, entry.tokens.tolist(), store.stats()["damaged"]))


def test_a_late_reader_of_a_damaged_entry_keeps_the_sound_one_stored_meanwhile(
    tmp_path: Path,
) -> None:
    """Two processes find one token-store entry damaged: it is computed and counted once.

    Before, the late one dropped the key unconditionally once its pin was gone, removing the
    sound entry the other had just stored, and computed it again (both counted it damaged).
    """
    root = tmp_path / "tokens"
    TokenStore(root, 1 << 20).get(KEY, _compute([], "first"))
    (path,) = (root / "data").iterdir()
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 1  # a flipped bit in the token ids
    path.write_bytes(bytes(blob))
    ctx = mp.get_context("fork")
    events = {name: ctx.Event() for name in ("found", "stored")}
    out: mp.Queue[tuple[Any, ...]] = ctx.Queue()
    late = ctx.Process(target=_late_dropper, args=(root, events, out))
    late.start()
    try:
        assert events["found"].wait(10)
        store = TokenStore(root, 1 << 20)
        calls: list[str] = []
        assert store.get(KEY, _compute(calls, "early")).tokens.tolist() == list(range(10))
        events["stored"].set()
        late_calls, tokens, late_damaged = out.get(timeout=30)
    finally:
        late.join(10)
        if late.is_alive():
            late.kill()
    assert tokens == list(range(10))
    assert calls + late_calls == ["early"]
    assert store.stats()["damaged"] + late_damaged == 1
    assert len(os.listdir(root / "data")) == 1 and store.lengths(KEY) is not None


def _read_plan_in_another_process(path: Path) -> list[str]:
    """What another process of the node reads of the plan at ``path`` (its eviction's view)."""
    ctx = mp.get_context("fork")
    out: mp.Queue[list[str]] = ctx.Queue()
    reader = ctx.Process(target=lambda: out.put(plans.read_plan(path)))
    reader.start()
    try:
        return out.get(timeout=30)
    finally:
        reader.join(10)
        if reader.is_alive():
            reader.kill()


class _ReadBeforeLock:
    """``fcntl`` for plans.py: another process reads the plan just before it is locked."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.read: list[list[str]] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(fcntl, name)

    def flock(self, fd: int, op: int) -> None:
        if self.read is None and op == fcntl.LOCK_EX:
            self.read = [_read_plan_in_another_process(self.path)]
        fcntl.flock(fd, op)


def test_a_plan_is_never_seen_unlocked_by_another_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process reading the node's plans as another publishes its first never removes it.

    Before, the plan file was created and only then locked: a reader in between found it
    unlocked, took its owner for dead and unlinked it, and the owner went on publishing into
    the unlinked file, its plan unseen by the node's eviction for the rest of the run.
    """
    owner = NodeCache(tmp_path, 1 << 20)
    hook = _ReadBeforeLock(owner._plan.path)
    monkeypatch.setattr(plans, "fcntl", hook)
    owner.set_future(["shard-a", "shard-b", "shard-c"])
    monkeypatch.undo()
    assert hook.read is not None  # the other process did read in the window
    assert owner._plan.path.exists()
    seen = _read_plan_in_another_process(owner._plan.path)
    assert seen == [entry_name(k) for k in ("shard-a", "shard-b", "shard-c")]
    owner.close()
    assert not owner._plan.path.exists()


def _hold_global_lock(root: Path, held: mp.synchronize.Event, let_go: mp.synchronize.Event) -> None:
    """Hold the node cache's global lock in another process until told to let go."""
    fd = os.open(root / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    held.set()
    let_go.wait(10)


def test_close_leaves_the_global_lock_to_a_prefetch_still_fetching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefetch that outlives ``close``'s bounded wait installs its entry under the lock.

    Before, ``close`` closed the global lock's fd while the prefetch thread was still
    fetching: the process's next open file took the fd's number, and the thread locked that
    unrelated file and installed its entry while another process held the node's lock.
    """
    monkeypatch.setattr(prefetch, "STOP_WAIT_S", 0.05)
    cache = NodeCache(tmp_path, 1 << 20, "belady")
    fetching, release, installed = threading.Event(), threading.Event(), threading.Event()

    def fetch(dest: Path) -> None:
        fetching.set()
        release.wait(10)
        dest.write_bytes(b"x" * 100)

    touch = cache._touch

    def touched(data: Path) -> None:
        installed.set()
        touch(data)

    monkeypatch.setattr(cache, "_touch", touched)
    cache.start_prefetch(lambda key: (100, fetch), depth=1)
    cache.set_future(["k1"])
    assert fetching.wait(10)
    lock_fd = cache._lock._fd
    cache.close()  # returns while the prefetch still fetches
    thread = cache._prefetch._thread  # type: ignore[union-attr]
    assert thread.is_alive()
    opened = [os.open(tmp_path / "unrelated", os.O_RDWR | os.O_CREAT)]
    while opened[-1] < lock_fd:  # the process goes on opening files: the lowest free numbers
        opened.append(os.open(tmp_path / "unrelated", os.O_RDWR))
    ctx = mp.get_context("fork")
    held, let_go = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_global_lock, args=(tmp_path, held, let_go))
    holder.start()
    try:
        assert held.wait(10)
        release.set()
        assert not installed.wait(0.5), "installed while another process held the lock"
        let_go.set()
        thread.join(10)
    finally:
        let_go.set()
        holder.join(10)
        for fd in opened:
            os.close(fd)
    assert installed.is_set() and not thread.is_alive()
    assert cache._prefetch.error is None  # type: ignore[union-attr]
    assert os.listdir(tmp_path / "data") == [entry_name("k1")]
    with pytest.raises(OSError):  # closed by the thread when it ended
        os.fstat(lock_fd)
