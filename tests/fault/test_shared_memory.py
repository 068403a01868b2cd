"""Shared-memory transport of the process runner: same results, no file left on any exit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from torchdata.nodes import IterableWrapper

from tests.core.helpers import digests, texts_recipe
from tests.fault.shm_ops import arrays, export_then
from zephon_nodes import Pipeline, WorkerPool
from zephon_nodes.core.errors import WorkerError
from zephon_nodes.engine import shm
from zephon_nodes.engine.parallel_map import OrderedParallelMap

pytestmark = pytest.mark.skipif(not shm.available(), reason="needs /dev/shm (Linux)")

ROOT = Path(__file__).resolve().parents[2]


def _files(prefix: str) -> list[str]:
    return [n for n in os.listdir(shm.SHM_DIR) if n.startswith(prefix)]


def _mapped(a: np.ndarray) -> bool:
    """Whether ``a``'s memory is a shared-memory mapping (not a pickled copy)."""
    base = a
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and type(base.obj).__name__ == "mmap"


@pytest.fixture(scope="module")
def pool():
    """Workers with a 1 MiB arena: larger results take the result-file path."""
    old = os.environ.get("ZEPHON_SHM_ARENA_MB")
    os.environ["ZEPHON_SHM_ARENA_MB"] = "1"
    try:
        with WorkerPool(2, "process", timeout_s=60) as p:
            p.submit(arrays, 1).result(timeout=60)  # spawned with the setting
            yield p
    finally:
        if old is None:
            del os.environ["ZEPHON_SHM_ARENA_MB"]
        else:
            os.environ["ZEPHON_SHM_ARENA_MB"] = old


def test_arena_and_result_file_paths(pool: WorkerPool) -> None:
    """Results copied out of the arena, or mapped from their own file; no file left."""
    for _ in range(6):  # the arena wraps around: 6 x 400 kB through 1 MiB
        out = pool.submit(arrays, 100_000).result(timeout=60)
        assert out["big"].tolist() == list(range(100_000))
        assert out["small"].tolist() == [0, 1, 2, 3, 4]
        assert not _mapped(out["big"]) and out["big"].flags.writeable  # a copy
    big = pool.submit(arrays, 400_000).result(timeout=60)  # 1.6 MB: larger than the arena
    assert big["big"].tolist() == list(range(400_000))
    assert _mapped(big["big"]) and big["big"].flags.writeable
    assert _files(f"zephon-{os.getpid()}-") == []  # unlinked on arrival, still readable


def test_many_results_in_flight_keep_their_bytes(pool: WorkerPool) -> None:
    """More results in flight than the arena holds: each one intact (the rest go to files)."""
    futures = [pool.submit(arrays, 50_000 + 1000 * i) for i in range(24)]
    for i, f in enumerate(futures):
        assert f.result(timeout=60)["big"].tolist() == list(range(50_000 + 1000 * i))
    assert _files(f"zephon-{os.getpid()}-") == []


def test_digests_equal_threads_and_pickling(pool: WorkerPool) -> None:
    texts = [f"document {i} " * (300 * (i % 5) + 1) for i in range(40)]
    pipeline = Pipeline(texts_recipe(texts, seq_len=4096, global_batch_size=4, num_lanes=4))
    reference = digests(pipeline, 1, num_workers=0)
    assert len(reference) > 5
    assert digests(pipeline, 2, pool=pool) == reference
    assert _files(f"zephon-{os.getpid()}-") == []


@pytest.mark.slow
def test_killed_rank_leaves_no_file() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fault.shm_rank"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        worker, prefix = proc.stdout.readline().split()
        assert _files(prefix)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    deadline = time.monotonic() + 15
    while (_files(prefix) or Path(f"/proc/{worker}").exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _files(prefix) == [], "the SIGKILLed rank's shared-memory files were left behind"
    assert not Path(f"/proc/{worker}/exe").exists() or _state(int(worker)) == "Z"


def test_stale_files_of_dead_ranks_are_removed() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = shm.SHM_DIR / f"zephon-{dead.pid}-0-1-2"
    mine = shm.SHM_DIR / f"zephon-{os.getpid()}-999-1-2"  # a live rank's: kept
    try:
        stale.write_bytes(b"x")
        mine.write_bytes(b"x")
        assert shm.remove_stale_segments() >= 1  # what a new process pool does first
        assert not stale.exists() and mine.exists()
    finally:
        for f in (stale, mine):
            f.unlink(missing_ok=True)


def test_stale_files_of_another_pid_namespace_are_kept() -> None:
    """Containers sharing /dev/shm (``--ipc=host``) but not their pid namespace: a file whose
    owner's pid is not alive *here* may be a live rank's there; only this namespace's stale
    files are removed (before, any ``zephon-<pid>-`` file of a pid not alive here was)."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    own = os.stat("/proc/self/ns/pid").st_ino
    theirs = shm.SHM_DIR / f"zephon-{dead.pid}-ns{own + 1}-0-1-2"
    stale = shm.SHM_DIR / f"zephon-{dead.pid}-ns{own}-0-1-2"
    try:
        theirs.write_bytes(b"x")
        stale.write_bytes(b"x")
        assert shm.remove_stale_segments() >= 1
        assert theirs.exists() and not stale.exists()
        assert shm.pool_prefix(7).startswith(f"zephon-{os.getpid()}-ns{own}-7-")
    finally:
        for f in (theirs, stale):
            f.unlink(missing_ok=True)


def test_killed_worker_leaves_no_file() -> None:
    """A worker dies after writing its result's file: WorkerError, and close() removes it."""
    with WorkerPool(1, "process", timeout_s=60) as p:
        p.submit(arrays, 1).result(timeout=60)  # workers started, prefix known
        prefix = p._prefix
        node = OrderedParallelMap(IterableWrapper([(prefix, "kill")]), export_then, p)
        node.reset(None)
        with pytest.raises(WorkerError, match="a worker process died"):
            next(node)
        assert len(_files(prefix)) == 1  # the unsent result of the killed worker
    assert _files(prefix) == []


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "gone"
