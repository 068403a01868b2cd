"""A failing, blocked or killed worker: a clear WorkerError in bounded time, never a hang,
never a short or reordered epoch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.fault.common import memory_pipeline
from tests.fault.faulty_ops import Faulty
from zephon_nodes import Pipeline, WorkerError, WorkerPool, digest_microbatches

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def alarm(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging forever) if the block runs longer than ``seconds``."""

    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError(f"hung for more than {seconds}s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _steps(pipe: Pipeline, pool: WorkerPool, world: int = 2) -> Iterator[str]:
    """Yield global batch digests of ``world`` rank nodes sharing ``pool``, in step order."""
    nodes = [pipe.rank_node(world, r, pool=pool) for r in range(world)]
    for n in nodes:
        n.reset(None)
    while True:
        try:
            mbs = [next(n) for n in nodes for _ in range(n.micro_per_step)]
        except StopIteration:
            return
        yield digest_microbatches(mbs)


def _reference() -> list[str]:
    with WorkerPool(0) as pool:
        return list(_steps(memory_pipeline(), pool))


REF = _reference()


def test_reference_is_long_enough() -> None:
    assert len(REF) >= 5


def _run_faulty(
    mode: str, runner: str, timeout_s: float, **kw: object
) -> tuple[list[str], WorkerError, float, WorkerPool, Pipeline]:
    pipe = memory_pipeline()
    pipe.stateless = Faulty(pipe.stateless, mode, **kw)  # type: ignore[arg-type]
    pool = WorkerPool(2, runner, timeout_s=timeout_s)
    got: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        for d in _steps(pipe, pool):
            got.append(d)
    return got, info.value, time.monotonic() - t0, pool, pipe


def _check_prefix_and_sticky(got: list[str], pipe: Pipeline, pool: WorkerPool) -> None:
    # Everything yielded before the failure is the reference, in order; the epoch is not
    # completed around the hole.
    assert got == REF[: len(got)]
    assert len(got) < len(REF)


def test_thread_operator_raises() -> None:
    with alarm(60):
        got, err, _, pool, pipe = _run_faulty("raise", "thread", 30)
    pool.close()
    msg = str(err)
    assert "operator 'faulty' failed on dataset 'm'" in msg
    assert "(lane 1, work item 3)" in msg and "ValueError: injected failure" in msg
    _check_prefix_and_sticky(got, pipe, pool)


def test_error_is_sticky_never_a_short_epoch() -> None:
    pipe = memory_pipeline()
    pipe.stateless = Faulty(pipe.stateless, "raise")
    with WorkerPool(2, "thread", timeout_s=30) as pool, alarm(60):
        node = pipe.rank_node(1, 0, pool=pool)
        node.reset(None)
        n = 0
        with pytest.raises(WorkerError):
            while True:
                next(node)
                n += 1
        for _ in range(3):  # raised again and again, never StopIteration, never data
            with pytest.raises(WorkerError, match="lane 1, work item 3"):
                next(node)
        assert n < len(REF)


def test_thread_operator_blocks_timeout() -> None:
    with alarm(60):
        got, err, elapsed, pool, pipe = _run_faulty("block", "thread", 0.5, seconds=30)
    pool.close()
    assert "gave no result within timeout_s=0.5" in str(err)
    assert "(lane 1, work item 3)" in str(err)
    assert elapsed >= 0.5
    _check_prefix_and_sticky(got, pipe, pool)


def test_slow_workers_never_reorder() -> None:
    """Control: operators finishing out of order (jitter) still give the reference epoch."""
    pipe = memory_pipeline()
    pipe.stateless = Faulty(pipe.stateless, "jitter")
    with WorkerPool(3, "thread", timeout_s=30) as pool, alarm(120):
        assert list(_steps(pipe, pool)) == REF


@pytest.mark.slow
def test_process_worker_sigkilled_from_outside(tmp_path: Path) -> None:
    pidfile = tmp_path / "worker.pid"
    pipe = memory_pipeline()
    pipe.stateless = Faulty(pipe.stateless, "pidfile_block", path=str(pidfile))
    pool = WorkerPool(2, "process", timeout_s=120)
    got: list[str] = []
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            for d in _steps(pipe, pool):
                got.append(d)
        except BaseException as e:
            errors.append(e)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    deadline = time.monotonic() + 90
    while not pidfile.exists():
        assert time.monotonic() < deadline, "the blocking item never started"
        time.sleep(0.05)
    os.kill(int(pidfile.read_text()), signal.SIGKILL)
    t0 = time.monotonic()
    consumer.join(timeout=100)
    detect = time.monotonic() - t0
    assert not consumer.is_alive(), "the loader hangs after its worker was SIGKILLed"
    pool.close()
    assert len(errors) == 1 and isinstance(errors[0], WorkerError), errors
    assert "a worker process died while running operator 'faulty'" in str(errors[0])
    assert detect < 100  # detected as a death, not by the 120 s timeout
    _check_prefix_and_sticky(got, pipe, pool)


@pytest.mark.slow
def test_process_worker_sigkills_itself() -> None:
    with alarm(150):
        got, err, _, pool, pipe = _run_faulty("sigkill", "process", 120)
    pool.close()
    assert "a worker process died while running operator 'faulty'" in str(err)
    _check_prefix_and_sticky(got, pipe, pool)


@pytest.mark.slow
@pytest.mark.parametrize(("runner", "timeout_s"), [("thread", 1.0), ("process", 20.0)])
def test_blocked_worker_does_not_hang_process_exit(
    tmp_path: Path, runner: str, timeout_s: float
) -> None:
    """The loader raises after ``timeout_s``; then the process exits (no pool.close call)."""
    pidfile = tmp_path / "worker.pid"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fault.blocked_exit", runner, str(timeout_s), str(pidfile)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("raised "), proc.stdout + proc.stderr[-3000:]
    assert f"timeout_s={timeout_s}" in proc.stdout
    if runner == "process":
        pid = int(pidfile.read_text())
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and _state(pid) != "Z":
            assert time.monotonic() < deadline, f"blocked worker {pid} outlived its parent"
            time.sleep(0.1)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.slow
def test_workers_exit_when_their_rank_is_sigkilled() -> None:
    """A SIGKILLed rank cannot close its pool; its worker processes must not live on."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fault.orphan_workers"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        with alarm(150):
            pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids and all(Path(f"/proc/{p}").exists() for p in pids)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    deadline = time.monotonic() + 15
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in pids if _state(p) not in ("gone", "Z")]
    for p in alive:  # clean up before failing
        os.kill(p, signal.SIGKILL)
    assert not alive, f"worker processes {alive} outlived their SIGKILLed rank"
