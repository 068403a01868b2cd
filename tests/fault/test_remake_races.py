"""Readers that find the same bad cache entry at once make it again once, and lose nothing.

A node's ranks and a loader's worker processes share the cache directory
(``ZEPHON_CACHE_DIR``), and a process's lanes read in threads: several readers can find one
bad entry (a decompressed copy with its record index and sums, or a tar shard's member
index) at the same time. Each remakes it under the entry's file lock and only if it is still
bad, so no reader drops the files another has just made, every read is the shard's, and
the bad entry is counted once. The windows between the steps are held open by events in
the readers, so the interleavings that lost the race before happen on every run.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import multiprocessing.synchronize
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

from tests.multimodal.helpers import write_tar
from zephon_nodes.core.errors import DataError
from zephon_nodes.core.work_item import WorkItem
from zephon_nodes.io.formats import copies, entrysums, shards
from zephon_nodes.io.formats import tar as tarmod
from zephon_nodes.io.formats.shards import FileShard, open_shard
from zephon_nodes.io.formats.tar import open_tar_shard
from zephon_nodes.io.index import index
from zephon_nodes.io.nodecache import itemsizes, wholeshard
from zephon_nodes.io.nodecache.nodecache import set_cache_limit
from zephon_nodes.io.nodecache.wholeshard import open_whole_shard
from zephon_nodes.operators.parse import ParseJsonl

# How long the first reader holds its remake open for the second to step in: the second
# cannot while the first holds the entry's lock, so a run of the fixed code waits this once.
HOLD_S = 1.5


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))
    index.forget()
    yield
    index.forget()


def _zst_shard(path: Path, n: int) -> list[str]:
    """Write a ``.jsonl.zst`` shard of ``n`` records; return its lines."""
    lines = [json.dumps({"text": f"document {k} " * 20}) for k in range(n)]
    path.write_bytes(zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode()))
    return lines


def _copy_reader(
    role: str,
    shard: FileShard,
    events: dict[str, mp.synchronize.Event],
    out: mp.Queue[tuple[str, Any, int]],
) -> None:
    """Read a shard whose cache copy is bad, in a child process, as ``role`` "P" or "Q".

    P remakes the copy first and, once its new sums are written (before its index and copy
    are in place), waits for Q to drop the entry. Q reads once P's sums are written, drops
    the entry (then tells P) and waits for P's read before writing sums of its own.
    """
    real_write_sums, real_drop = copies.write_sums, copies._drop

    def write_sums_p(*args: Any, **kwargs: Any) -> None:
        real_write_sums(*args, **kwargs)
        events["p_sums"].set()
        events["q_dropped"].wait(HOLD_S)  # never set while P holds the entry's lock

    def drop_q(*args: Any, **kwargs: Any) -> None:
        real_drop(*args, **kwargs)
        events["q_dropped"].set()

    def write_sums_q(*args: Any, **kwargs: Any) -> None:
        events["p_read"].wait(10)
        real_write_sums(*args, **kwargs)

    if role == "P":
        copies.write_sums = write_sums_p
    else:
        copies.write_sums, copies._drop = write_sums_q, drop_q
        events["p_sums"].wait(10)
    try:
        got: Any = [raw.decode() for _, raw in shard.read(0, shard.num_records)]
    except Exception as e:  # reported by the test's assertion
        got = f"{type(e).__name__}: {e}"
    if role == "P":
        events["p_read"].set()
    out.put((role, got, entrysums.bad_entries()))


def _run_as_a_and_b(fn: Callable[[], None]) -> None:
    """Run ``fn`` on two threads named ``A`` and ``B`` (its events order them); join both."""
    threads = [threading.Thread(target=fn, name=name) for name in "AB"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)


def test_processes_remake_a_bad_copy_once(tmp_path: Path) -> None:
    """Two processes find a ``.zst`` copy without sums: both read the shard, one counts it.

    Before, the remake was serialised per process only: the second process dropped the
    entry (the first's new sums with it) while the first installed its copy, and the first
    process's read after its remake failed with "no readable checksums" (under
    ``on_error = "skip"``: its work item's records skipped as a missing file); both counted
    a bad entry.
    """
    path = tmp_path / "shard.jsonl.zst"
    want = _zst_shard(path, 200)
    shard = open_shard(path)
    _, index_path = copies.artifacts(shard.checksum)
    entrysums.sums_path(index_path).unlink()  # an older cache's copy: no sums
    copies._INDEX_CACHE.clear()
    entrysums._SUMS.clear()
    before = entrysums.bad_entries()  # each child starts counting from it
    ctx = mp.get_context("fork")
    events = {name: ctx.Event() for name in ("p_sums", "q_dropped", "p_read")}
    out: mp.Queue[tuple[str, Any, int]] = ctx.Queue()
    procs = [ctx.Process(target=_copy_reader, args=(r, shard, events, out)) for r in "PQ"]
    for p in procs:
        p.start()
    try:
        got = sorted(out.get(timeout=30) for _ in procs)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    assert [(role, rows) for role, rows, _ in got] == [("P", want), ("Q", want)]
    assert [bad - before for _, _, bad in got] == [1, 0]
    assert os.path.exists(entrysums.sums_path(index_path))


def test_a_copy_bad_again_after_its_remake_is_never_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy still bad when read right after it was made again (a failing disk, or files
    dropped by someone else) fails the read even under ``on_error = "skip"``.

    Before, that read's :class:`BadEntry` reached the parse, which skipped the work item's
    records as a missing file: records lost without an error, on one machine only.
    """
    path = tmp_path / "shard.jsonl.zst"
    _zst_shard(path, 20)
    shard = open_shard(path)
    _, index_path = copies.artifacts(shard.checksum)
    entrysums.sums_path(index_path).unlink()
    copies._INDEX_CACHE.clear()
    entrysums._SUMS.clear()
    monkeypatch.setattr(shards, "remake", lambda *args: True)  # made again, bad again
    item = WorkItem(0, "web", "text", 0, 0, shard, 0, 20, 0, 0, 0)
    with pytest.raises(DataError, match="no readable checksums"):
        ParseJsonl(skip=frozenset({0}))(item)


def _in_thread(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run by the reader thread ``name`` only; the real function for the others."""

    def hook(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            if threading.current_thread().name != name:
                return real(*args)
            return fn(real, *args)

        return call

    return hook


def test_threads_remake_a_bad_tar_member_index_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads find a tar shard's member index bad: both read the samples, one counts it.

    Before, nothing serialised the remake: B, whose first load failed before A made the
    index again, dropped A's new index, and A's load after its remake raised
    FileNotFoundError (an OSError the multimodal parse does not catch: a WorkerError); each
    thread counted a bad entry and indexed the whole tar again.
    """
    members = [(f"{k:04d}.txt", f"sample {k}".encode()) for k in range(20)]
    shard = open_tar_shard(write_tar(tmp_path / "shard.tar", members))
    Path(shard.index_path).write_text("{garbage")  # a damaged member index
    tarmod._INDEXES.clear()
    names = ("a_remaking", "b_failed", "a_remade", "b_dropped", "a_read")
    events = {name: threading.Event() for name in names}
    real_load = tarmod._load

    def load(index_path: str) -> Any:
        try:
            return real_load(index_path)
        except BaseException:
            if threading.current_thread().name == "B":
                events["b_failed"].set()
            raise

    def remake_a(real: Callable[..., Any], *args: Any) -> None:
        events["a_remaking"].set()  # with the entry's lock held: B waits for it
        events["b_failed"].wait(10)  # B found the index bad too
        real(*args)
        events["a_remade"].set()
        events["b_dropped"].wait(HOLD_S)  # never set while A holds the entry's lock

    def drop_b(real: Callable[..., Any], *args: Any) -> None:
        events["a_remade"].wait(10)
        real(*args)
        events["b_dropped"].set()

    def remake_b(real: Callable[..., Any], *args: Any) -> None:
        events["a_read"].wait(10)
        real(*args)

    monkeypatch.setattr(tarmod, "_load", load)
    hooked_remake = _in_thread("B", remake_b)(_in_thread("A", remake_a)(tarmod._remake))
    monkeypatch.setattr(tarmod, "_remake", hooked_remake)
    monkeypatch.setattr(tarmod, "drop", _in_thread("B", drop_b)(tarmod.drop))
    before = entrysums.bad_entries()
    results: dict[str, Any] = {}

    def read() -> None:
        name = threading.current_thread().name
        if name == "B":
            events["a_remaking"].wait(10)
        try:
            results[name] = [s.text for _, s in shard.read(0, 5)]
        except Exception as e:  # reported by the assertion below
            results[name] = f"{type(e).__name__}: {e}"
        if name == "A":
            events["a_read"].set()

    _run_as_a_and_b(read)
    want = [blob for _, blob in members[:5]]
    assert results == {"A": want, "B": want}
    assert entrysums.bad_entries() == before + 1


def test_threads_drop_a_bad_whole_shard_record_index_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads open a whole-read ``.zst`` whose kept record index is damaged: both read
    the shard through the node cache, one counts the bad index, and it is sound after.

    Before, :func:`wholeshard._known_index` counted and dropped a bad index with no lock: B,
    whose first load failed before A made the index again, dropped A's new index and sums and
    counted the same bad entry a second time; B's index, made after A's read, then replaced
    the sums of the node cache's copy with sums of no copy, and B's read of that copy failed
    ("longer than its checksums say"): a third count and the copy decompressed again.
    """
    path = tmp_path / "shard.jsonl.zst"
    want = _zst_shard(path, 50)
    set_cache_limit("64M")
    try:
        checksum = open_whole_shard(str(path)).checksum  # keeps the record index and sums
        index_path = copies.artifacts(checksum)[1]
        index_path.write_bytes(b"{garbage")  # a damaged record index
        copies._INDEX_CACHE.clear()
        entrysums._SUMS.clear()
        results = _open_and_read_in_two_threads(str(path), monkeypatch)
        sound = copies.sound(None, str(index_path))
    finally:
        set_cache_limit(None)
    assert results["A"] == want and results["B"] == want
    assert results["bad"] == 1
    assert sound


def _open_and_read_in_two_threads(uri: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Threads A and B open ``uri`` whole and read it, their steps ordered by events.

    B opens once A is about to drop the bad index (A then waits for B's first load to fail);
    A, once it has made the index again, waits for B to drop it; B, once it has dropped,
    waits for A's read before making the index itself. Returns each thread's records (or
    error) and the bad entries counted meanwhile (``"bad"``).
    """
    names = ("a_dropping", "b_failed", "a_remade", "b_dropped", "a_read")
    events = {name: threading.Event() for name in names}
    real_load = wholeshard.load_index

    def load(index_path: str) -> Any:
        try:
            return real_load(index_path)
        except entrysums.BadEntry:
            if threading.current_thread().name == "B":
                events["b_failed"].set()
            raise

    def drop_a(real: Callable[..., Any], *args: Any) -> None:
        events["a_dropping"].set()  # with the entry's lock held: B waits for it
        events["b_failed"].wait(10)  # B found the index bad too
        real(*args)

    def count_a(real: Callable[..., Any], *args: Any) -> Any:
        made = real(*args)
        events["a_remade"].set()
        events["b_dropped"].wait(HOLD_S)  # never set once B re-checks under the lock
        return made

    def drop_b(real: Callable[..., Any], *args: Any) -> None:
        events["a_remade"].wait(10)
        real(*args)
        events["b_dropped"].set()

    def count_b(real: Callable[..., Any], *args: Any) -> Any:
        events["a_read"].wait(10)
        return real(*args)

    monkeypatch.setattr(wholeshard, "load_index", load)
    hooked_drop = _in_thread("B", drop_b)(_in_thread("A", drop_a)(wholeshard.drop))
    monkeypatch.setattr(wholeshard, "drop", hooked_drop)
    hooked_count = _in_thread("B", count_b)(_in_thread("A", count_a)(wholeshard._count))
    monkeypatch.setattr(wholeshard, "_count", hooked_count)
    before = entrysums.bad_entries()
    results: dict[str, Any] = {}

    def read() -> None:
        name = threading.current_thread().name
        if name == "B":
            events["a_dropping"].wait(10)
        try:
            shard = open_whole_shard(uri)
            results[name] = [raw.decode() for _, raw in shard.read(0, shard.num_records)]
        except Exception as e:  # reported by the test's assertion
            results[name] = f"{type(e).__name__}: {e}"
        if name == "A":
            events["a_read"].set()

    _run_as_a_and_b(read)
    results["bad"] = entrysums.bad_entries() - before
    return results


def test_threads_compute_a_bad_sizes_file_again_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two builds find the node's work-item sizes file damaged: one counts it and computes
    the sizes again, the other reads them.

    Before, :func:`itemsizes._read` counted and unlinked a bad file before the entry's lock
    was taken: A, which had read the bad file before B made it again, counted it a second
    time, unlinked B's new file and computed the sizes again.
    """
    want = np.arange(7, dtype=np.int64) * 3
    computed: list[str] = []

    def compute() -> tuple[np.ndarray, bool]:
        computed.append(threading.current_thread().name)
        return want, True

    itemsizes.node_sizes("items", compute)
    (path,) = (tmp_path / "cache" / "sizes").glob("items.npy")
    stored = np.load(path)
    stored[0] += 1  # a flipped value: its check no longer holds
    np.save(path, stored)
    computed.clear()
    events = {name: threading.Event() for name in ("a_loaded", "b_done")}
    real_load = np.load

    def load(*args: Any, **kwargs: Any) -> Any:
        got = real_load(*args, **kwargs)
        if threading.current_thread().name == "A" and not events["a_loaded"].is_set():
            events["a_loaded"].set()  # A holds the bad file's values, no lock held
            events["b_done"].wait(10)  # B counts it, computes and writes the sizes
        return got

    monkeypatch.setattr(itemsizes.np, "load", load)
    before = entrysums.bad_entries()
    results: dict[str, Any] = {}

    def build() -> None:
        name = threading.current_thread().name
        if name == "B":
            events["a_loaded"].wait(10)
        try:
            sizes, _ = itemsizes.node_sizes("items", compute)
            results[name] = sizes.tolist()
        except Exception as e:  # reported by the assertion below
            results[name] = f"{type(e).__name__}: {e}"
        if name == "B":
            events["b_done"].set()

    _run_as_a_and_b(build)
    assert results == {"A": want.tolist(), "B": want.tolist()}
    assert entrysums.bad_entries() == before + 1
    assert computed == ["B"]
