"""ChildRankNode: a rank's node in a child process (issue 33.4).

Each test starts as few children as it can (a spawn imports torch: seconds on a loaded CI
machine). Expected batches and states come from the same node run in this process.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.commands.conftest import RECIPE, write_recipe
from tests.torchdata.helpers import recipe
from zephon_nodes import Pipeline
from zephon_nodes.cli import main
from zephon_nodes.engine.child import ChildEngineError, ChildRankNode
from zephon_nodes.engine.multiplexer import Multiplexer

SHM = Path("/dev/shm")


def build(n: int, dp: int, rank: int) -> Multiplexer:
    """The rank node of the torchdata tests' recipe (module level: the child imports it)."""
    return Pipeline(recipe(n)).rank_node(dp, rank, local_batch_size=4)


def raising(n: int) -> Multiplexer:
    """A factory whose node fails on its fourth micro-batch (a ValueError in the child)."""
    node = build(n, 1, 0)
    inner = node.next
    count = iter(range(1000))

    def next_or_fail() -> dict[str, torch.Tensor]:
        if next(count) == 3:
            raise ValueError("record 17 of shard x is broken")
        return inner()

    node.next = next_or_fail  # type: ignore[method-assign]
    return node


def stuck(n: int) -> Multiplexer:
    """A factory whose node blocks for ever on its third micro-batch (a deadlock, say)."""
    node = build(n, 1, 0)
    inner = node.next
    count = iter(range(1000))

    def next_or_block() -> dict[str, torch.Tensor]:
        if next(count) == 2:
            threading.Event().wait()  # never set
        return inner()

    node.next = next_or_block  # type: ignore[method-assign]
    return node


def mine() -> set[str]:
    """This process's shared-memory files (names carry the creating rank's pid)."""
    return {n for n in os.listdir(SHM) if n.startswith(f"zephon-{os.getpid()}-")}


def children() -> set[int]:
    """Child processes of this process (from /proc), but multiprocessing's resource tracker.

    A spawn starts the interpreter's one resource tracker, shared by every spawn and ended
    by the interpreter's exit: it is not a child any node owns.
    """
    out: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:  # a thread may end between the listing and the read
            listed = (task / "children").read_text().split()
        except FileNotFoundError:
            continue
        for pid in listed:
            with contextlib.suppress(FileNotFoundError):
                if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                    out.add(int(pid))
    return out


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(
        a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a
    )


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """Run ``fn``; fail (instead of hanging the suite) if it has not returned in time."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the test
            out["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"no answer within {seconds} s: a hang"
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.fixture
def clean() -> Iterator[None]:
    """Every test leaves no shared-memory file and no child process behind."""
    files, procs = mine(), children()
    yield
    assert mine() == files
    assert children() <= procs


def reference(n: int) -> tuple[list[dict[str, torch.Tensor]], list[dict[str, Any]]]:
    """Every micro-batch of the recipe and the state after each, run here."""
    node = build(n, 1, 0)
    node.reset()
    batches, states = [], []
    for b in node:
        batches.append(b)
        states.append(node.state_dict())
    node.close()
    return batches, states


def test_batches_states_resume_and_end(clean: None) -> None:
    """Same micro-batches and states as in-process; the state is that of the batches handed
    out, not of those prefetched; reset/load_state_dict resume there; then StopIteration."""
    batches, states = reference(100)
    assert len(batches) > 8
    node = ChildRankNode(functools.partial(build, 100, 1, 0), prefetch=3)
    try:
        assert node.micro_per_step == 4
        got = [next(node) for _ in range(5)]
        assert all(same(a, b) for a, b in zip(got, batches, strict=False))
        assert node.state_dict() == states[4]  # the child is already batches ahead
        assert node.step == states[4]["step"]
        node.reset(states[1])  # back, mid-step
        assert node.state_dict() == states[1]
        assert same(next(node), batches[2])
        node.load_state_dict(states[6])  # forward
        rest = list(node)
        assert len(rest) == len(batches) - 7
        assert all(same(a, b) for a, b in zip(rest, batches[7:], strict=True))
        assert node.state_dict() == states[-1]
        with pytest.raises(StopIteration):
            next(node)
        node.reset()  # a new pass, as torchdata's next epoch
        assert node.state_dict()["pass"] == 1
        assert node.metrics()["step"] >= 0
    finally:
        node.close()
    node.close()  # twice is harmless


def test_error_in_child_is_raised_with_its_type(clean: None) -> None:
    """An operator's error in the child reaches the caller as the same exception."""
    node = ChildRankNode(functools.partial(raising, 100))
    try:
        for _ in range(3):
            next(node)
        with pytest.raises(ValueError, match="record 17 of shard x"):
            within(60, lambda: next(node))
        with pytest.raises(ValueError):
            next(node)
        node.reset()  # restarts the child's node
        assert node.state_dict()["step"] == 0
    finally:
        node.close()


def test_a_stuck_child_is_a_named_error_with_its_stacks(
    clean: None, capfd: pytest.CaptureFixture[str]
) -> None:
    """A live child that sends nothing for ``stall_s``: its threads' stacks on stderr, the
    child stopped, ChildEngineError naming the rank; before, the trainer waited for ever."""
    node = ChildRankNode(functools.partial(stuck, 100), prefetch=1, label="rank 5", stall_s=3)
    next(node)
    next(node)
    t = time.monotonic()
    with pytest.raises(ChildEngineError, match=r"rank 5 \(pid \d+\) sent nothing for 3 s"):
        within(60, lambda: next(node))
    assert time.monotonic() - t < 30
    assert node.pid is None
    err = capfd.readouterr().err
    assert "most recent call first" in err and "next_or_block" in err
    with pytest.raises(ChildEngineError):
        next(node)  # still an error, until a reset


def test_sigkill_is_a_named_error_and_leaves_nothing(clean: None) -> None:
    """A child killed with SIGKILL: ChildEngineError naming the rank and the signal (after
    at most the batches already in flight), and no process or file is left."""
    node = ChildRankNode(functools.partial(build, 100, 1, 0), label="rank 3")
    next(node)
    pid = node.pid
    assert pid is not None and pid in children()
    os.kill(pid, signal.SIGKILL)

    def drain() -> None:
        for _ in range(50):
            next(node)

    with pytest.raises(ChildEngineError, match=r"rank 3 \(pid \d+\) was killed by SIGKILL"):
        within(30, drain)
    with pytest.raises(ChildEngineError):
        next(node)  # still an error, until a reset
    assert node.pid is None


def test_garbage_collection_stops_the_child(clean: None) -> None:
    """A node dropped without close(): its child and files go with it."""
    node = ChildRankNode(functools.partial(build, 100, 1, 0))
    next(node)
    assert mine() == set() and node.pid in children()  # slots have no name in /dev/shm
    del node  # the clean fixture checks the process is gone


EXIT_SCRIPT = """
import functools, os, signal, sys
sys.path.insert(0, {root!r})
from tests.engine.test_child import build
from zephon_nodes.engine.child import ChildRankNode

if __name__ == "__main__":
    node = ChildRankNode(functools.partial(build, 100, 1, 0))
    next(node)
    print(os.getpid(), node.pid, flush=True)
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_trainer_exit_or_sigkill_leaves_nothing(tmp_path: Path) -> None:
    """The trainer's process exits without close(), or is SIGKILLed: the child is gone and
    no file of the trainer's is left in /dev/shm (both trainers run at once)."""
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(EXIT_SCRIPT.format(root=str(Path.cwd()))))
    procs = {
        how: subprocess.Popen(
            [sys.executable, str(script), how], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for how in ("exit", "kill")
    }
    for how, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == (0 if how == "exit" else -signal.SIGKILL), err.decode()
        trainer, child = (int(x) for x in out.split()[:2])
        deadline = time.monotonic() + 20  # the orphan's watch polls its parent every 0.5 s
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _gone(child), how
        assert not [n for n in os.listdir(SHM) if n.startswith(f"zephon-{trainer}-")]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return True
    return state == "Z"


# ------------------------------------------------------------------ zephon digest --engine


def _digest(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    assert main(["digest", *argv]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_digest_engines_agree_and_resume_across(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], clean: None
) -> None:
    """--engine process gives the thread engine's digests at dp 1 and 2; a state saved by
    one engine resumes in the other with the same digests."""
    toml = str(write_recipe(tmp_path, RECIPE, docs=120))
    ref = _digest(capsys, toml, "--steps", "6")
    assert len(ref) == 6
    one = _digest(capsys, toml, "--steps", "6", "--engine", "process")
    assert one == ref
    ck = str(tmp_path / "ck")
    two = _digest(
        capsys, toml, "--steps", "6", "--engine", "process", "--dp-world-size", "2",
        "--save-at", "3", "--checkpoint-dir", ck,
    )  # fmt: skip
    assert two == ref
    back = _digest(capsys, toml, "--steps", "3", "--resume-from", ck, "--dp-world-size", "4")
    assert back == ref[3:]
    ck2 = str(tmp_path / "ck2")
    _digest(capsys, toml, "--steps", "2", "--save-at", "2", "--checkpoint-dir", ck2)
    on = _digest(capsys, toml, "--steps", "4", "--resume-from", ck2, "--engine", "process")
    assert on == ref[2:]


def test_digest_child_killed_mid_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child SIGKILLed mid-run: a one-line error naming the rank, exit 2, nothing left."""
    toml = str(write_recipe(tmp_path, RECIPE, docs=120))
    files, procs = mine(), children()
    original = ChildRankNode.next
    calls = iter(range(10**6))

    def next_killing(self: ChildRankNode) -> dict[str, torch.Tensor]:
        if next(calls) == 4 and self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)
        return original(self)

    monkeypatch.setattr(ChildRankNode, "next", next_killing)
    argv = ["digest", toml, "--steps", "8", "--engine", "process", "--dp-world-size", "2"]
    assert within(60, lambda: main(argv)) == 2
    out = capsys.readouterr()
    assert out.out.count("digest") < 8
    err = out.err.strip().splitlines()[-1]
    assert "engine child process of rank" in err and "SIGKILL" in err
    assert mine() == files and children() <= procs


def test_digest_mixture_updates_in_the_child(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], clean: None
) -> None:
    """Dynamic-mixture decisions reach the children's nodes (set_mixture after the step
    handed out, not after the prefetched ones): the thread engine's digests at dp 2."""
    from tests.mixing.test_dynamic import write_mixed

    recipe_path = write_mixed(tmp_path)
    updates = tmp_path / "updates.json"
    updates.write_text(json.dumps([{"step": 2, "weights": {"web": 1, "code": 0}}]))
    args = [str(recipe_path), "--steps", "5", "--mixture-updates", str(updates)]
    ref = _digest(capsys, *args)
    assert len(ref) == 5 and ref != _digest(capsys, str(recipe_path), "--steps", "5")
    assert _digest(capsys, *args, "--engine", "process", "--dp-world-size", "2") == ref
