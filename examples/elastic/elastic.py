"""Preemptible-cluster drill: torchelastic shrinks a job to one node and grows it back.

Two torchrun agents (``--nnodes=1:2``, c10d rendezvous on 127.0.0.1, ``--nproc-per-node=2``)
stand for two machines and run ``train.py`` (a tiny model trained on the loader, checkpointed
every few steps). The drill SIGKILLs the second agent and its workers (a preempted node): the
surviving agent restarts its workers with half the ranks, which resume from the latest
committed checkpoint. Then the second agent comes back and the job grows to four ranks again,
again from the latest checkpoint. Every step trained by every worker group is compared with an
uninterrupted in-process run: global batch digests exactly, losses to float rounding. The
report gives the timeline (seconds from the kill, or from the new agent's launch, to the first
step trained by the new worker group).

Usage::

    python -m examples.elastic.elastic --steps 60 --cycles 2 [--workdir DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TRAIN = "examples.elastic.train"
NPROC = 2  # ranks per agent ("GPUs per node")


def make_corpus(directory: Path, seed: int = 0) -> Path:
    """Write two ``.jsonl`` shards and a recipe next to them; return the recipe path."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    words = ["preempt", "node", "rank", "lane", "resume", "shrink", "grow", "step", "batch"]
    for s in range(2):
        with open(directory / f"shard_{s}.jsonl", "w", encoding="utf-8") as f:
            for i in range(400):
                text = " ".join(rng.choice(words) for _ in range(rng.randint(3, 40)))
                f.write(json.dumps({"text": f"{text} #{s}.{i}"}) + "\n")
    recipe = directory / "recipe.toml"
    recipe.write_text(
        "seed = 5\nnum_lanes = 8\nglobal_batch_size = 16\nseq_len = 32\nflush_every = 2\n"
        "[tokenizer]\nkind = 'bytes'\n"
        "[[datasets]]\nname = 'words'\npaths = ['shard_*.jsonl']\n"
        "[work]\nchunk_size = 4\nepochs = 'inf'\n"
        "[shuffle]\nbuffer_size = 4\n",
        encoding="utf-8",
    )
    return recipe


def reference(recipe: Path, steps: int) -> dict[int, tuple[str, float]]:
    """Digest and loss of every step of an uninterrupted run, in this process (no torchrun)."""
    from examples.elastic.model import TinyLM, make_optimizer, train_step
    from zephon_nodes import Pipeline, Recipe
    from zephon_nodes.verification.simulate import simulate

    pipeline = Pipeline(Recipe.from_toml(recipe))
    model = TinyLM(pipeline.recipe.seq_len)
    opt = make_optimizer(model)
    out = {}
    for result, mbs in simulate(pipeline, 1, steps, num_workers=0, keep_batches=True):
        assert mbs is not None
        out[result.step] = (result.digest, train_step(model, opt, mbs))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class Agent:
    """One torchrun agent (one "machine") of the elastic job."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.log = log

    def kill(self) -> None:
        """SIGKILL the agent and every worker it started, as when its machine is lost."""
        pids = [self.proc.pid, *_descendants(self.proc.pid)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """Kill what is left of the agent (used on the way out)."""
        if self.proc.poll() is None:
            self.kill()
        for pid in _descendants(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@dataclass
class Group:
    """One start of the worker group, as logged by its rank 0."""

    group: str
    start: int
    world: int
    started_at: float
    committed_before: int = 0
    steps: dict[int, tuple[str, float, float]] = field(default_factory=dict)
    done: bool = False


@dataclass
class Event:
    """A change of the job's size and how long it took to train again."""

    kind: str  # "shrink" or "grow"
    at_step: int  # last step logged before the event
    resumed_from: int  # checkpoint step the new worker group started from
    world_before: int
    world_after: int
    seconds_to_restart: float  # event -> new worker group logged its start (resumed state)
    seconds_to_first_step: float  # event -> first step trained by the new worker group
    # event -> the surviving agent noticed it (its workers failed, or it stopped them for
    # the returning node), from the agent's log
    seconds_to_notice: float | None = None


@dataclass
class Report:
    """What the drill did and measured."""

    steps: int
    groups: list[dict[str, Any]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    steps_compared: int = 0
    max_loss_rel_diff: float = 0.0
    seconds: float = 0.0


class ElasticJob:
    """The two agents of one job and the log of its worker groups."""

    def __init__(self, recipe: Path, workdir: Path, steps: int, ckpt_every: int, sleep: float):
        self.workdir = workdir
        self.port = free_port()
        self.log = workdir / "steps.log"
        self.agents: dict[str, Agent] = {}
        # TORCH_DISABLE_SHARE_RDZV_TCP_STORE: torch 2.13's shared bootstrap store hangs a grow
        # (a surviving rank-0 agent does not republish MASTER_ADDR for the new round: the
        # returning agent waits 60 s and fails); one store per round avoids it.
        self.env = dict(
            os.environ,
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
            TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        )
        self.gate = workdir / "gate"
        self.set_gate(0)
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT), self.env.get("PYTHONPATH", "")) if p
        )
        self.train_args = [
            "--recipe", str(recipe), "--workdir", str(workdir), "--steps", str(steps),
            "--ckpt-every", str(ckpt_every), "--step-sleep", str(sleep),
            "--gate", str(self.gate),
        ]  # fmt: skip

    def set_gate(self, step: int) -> None:
        """Let the workers train up to ``step`` (atomically replaced file)."""
        tmp = self.gate.with_suffix(".tmp")
        tmp.write_text(str(step), encoding="utf-8")
        os.replace(tmp, self.gate)

    def launch(self, name: str, host: bool) -> Agent:
        """Start agent ``name``; the host agent serves the rendezvous store."""
        conf = (
            f"is_host={int(host)},join_timeout=120,last_call_timeout=2,close_timeout=10,"
            "keep_alive_interval=1,keep_alive_max_attempt=3"
        )
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes=1:2", f"--nproc-per-node={NPROC}", "--max-restarts=5",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{self.port}",
            "--rdzv-id=zephon-elastic", f"--rdzv-conf={conf}", "--local-addr=127.0.0.1",
            "--monitor-interval=0.2", "-m", TRAIN, *self.train_args,
        ]  # fmt: skip
        agent = Agent(name, cmd, self.env, self.workdir / f"agent_{name}.out")
        self.agents[name] = agent
        return agent

    def lines(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [ln.split() for ln in self.log.read_text(encoding="utf-8").split("\n")[:-1]]

    def groups(self) -> list[Group]:
        out: dict[str, Group] = {}
        committed = 0
        for w in self.lines():
            if w[0] == "start":
                out[w[1]] = Group(w[1], int(w[2]), int(w[3]), float(w[4]), committed)
            elif w[0] == "step":
                out[w[1]].steps[int(w[2])] = (w[3], float(w[4]), float(w[5]))
            elif w[0] == "ckpt":
                committed = max(committed, int(w[2]))
            elif w[0] == "done":
                out[w[1]].done = True
        return list(out.values())

    def wait(self, pred: Any, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred():
            for a in self.agents.values():
                if a.proc.poll() not in (None, -signal.SIGKILL) and a.proc.returncode != 0:
                    raise RuntimeError(f"agent {a.name} failed:\n{self._tail(a)}")
            if time.monotonic() > deadline:
                tails = "\n".join(self._tail(a) for a in self.agents.values())
                raise TimeoutError(f"waited {timeout_s}s for {what}:\n{tails}")
            time.sleep(0.05)

    def _tail(self, a: Agent) -> str:
        return f"--- {a.name}:\n" + a.log.read_text(errors="replace")[-3000:]

    def last_step(self, world: int | None = None) -> int:
        gs = [g for g in self.groups() if world is None or g.world == world]
        return max((max(g.steps) for g in gs if g.steps), default=0)

    def stop(self) -> None:
        for a in self.agents.values():
            a.stop()


def drill(
    workdir: Path,
    *,
    steps: int = 60,
    cycles: int = 2,
    ckpt_every: int = 3,
    run_steps: int = 5,
    sleep: float = 0.0,
    timeout_s: float = 240.0,
    say: Any = print,
) -> Report:
    """Run the job on two agents; ``cycles`` times shrink to one and grow back; verify.

    Args:
        workdir: Empty directory for the corpus, checkpoints and logs.
        steps: Steps of the whole job.
        cycles: Shrink/grow cycles.
        ckpt_every: Steps between checkpoints.
        run_steps: Steps between events (the workers wait at a gate file in between): not a
            multiple of ``ckpt_every``, so that each event redoes a few steps.
        sleep: Seconds each step sleeps.
        timeout_s: Longest wait for any phase.
        say: Progress printer.
    """
    t0 = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    recipe = make_corpus(workdir / "data")
    ref = reference(recipe, steps)
    job = ElasticJob(recipe, workdir, steps, ckpt_every, sleep)
    report = Report(steps=steps)
    try:
        gate = run_steps
        job.set_gate(gate)
        job.launch("b", host=False)
        job.launch("a", host=True)
        job.wait(lambda: job.last_step(2 * NPROC) >= gate, "4 ranks training", timeout_s)
        for cycle in range(cycles):
            # Shrink: node b is lost while the ranks train the next step (only that one, so
            # that the checkpoint to resume from is known before the kill).
            before = job.last_step()
            job.set_gate(before + 1)
            t_kill = time.time()
            job.agents["b"].kill()
            gate += run_steps
            job.set_gate(gate)
            say(f"cycle {cycle}: killed agent b (and its ranks) after step {before}")
            event = _await_group(job, NPROC, t_kill, timeout_s)
            report.events.append(_event("shrink", before, event, 2 * NPROC, t_kill, job))
            say(f"  {report.events[-1]}")
            job.wait(lambda g=gate: job.last_step(NPROC) >= g, "2 ranks training", timeout_s)
            # Grow: node b is back (the survivors wait at the gate meanwhile).
            before = job.last_step()
            t_launch = time.time()
            job.launch("b", host=False)
            event = _await_group(job, 2 * NPROC, t_launch, timeout_s, job, gate + run_steps)
            gate += run_steps
            report.events.append(_event("grow", before, event, NPROC, t_launch, job))
            say(f"  {report.events[-1]}")
            if cycle + 1 < cycles:
                job.wait(lambda g=gate: job.last_step(2 * NPROC) >= g, "4 ranks", timeout_s)
        job.set_gate(steps)
        job.wait(lambda: any(g.done for g in job.groups()), "the end of the job", timeout_s)
        for a in job.agents.values():
            if a.proc.poll() is None:
                a.proc.wait(timeout=timeout_s)
    finally:
        job.stop()
    report.seconds = time.monotonic() - t0
    verify(job.groups(), ref, steps, report)
    return report


def _await_group(
    job: ElasticJob,
    world: int,
    since: float,
    timeout_s: float,
    gated: ElasticJob | None = None,
    open_to: int = 0,
) -> Group:
    """Wait for a new worker group of ``world`` ranks; optionally open the gate once it
    started; then wait for its first step."""

    def new(with_steps: bool) -> Group | None:
        for g in job.groups():
            if g.world == world and g.started_at >= since and (g.steps or not with_steps):
                return g
        return None

    job.wait(lambda: new(False) is not None, f"a worker group of {world} ranks", timeout_s)
    if gated is not None:
        gated.set_gate(open_to)
    job.wait(lambda: new(True) is not None, f"a step of {world} ranks", timeout_s)
    group = new(True)
    assert group is not None
    return group


def _event(kind: str, before: int, g: Group, world_before: int, t: float, job: ElasticJob) -> Event:
    first = min(g.steps)
    mark = "failed (exitcode" if kind == "shrink" else "closing signal SIGTERM"
    noticed = [x for x in _agent_log_times(job.agents["a"].log, mark) if x >= t]
    return Event(
        kind=kind,
        at_step=before,
        resumed_from=g.start,
        world_before=world_before,
        world_after=g.world,
        seconds_to_restart=round(g.started_at - t, 2),
        seconds_to_first_step=round(g.steps[first][2] - t, 2),
        seconds_to_notice=round(noticed[0] - t, 2) if noticed else None,
    )


def _agent_log_times(log: Path, mark: str) -> list[float]:
    """Times (epoch seconds) of an agent's log lines that contain ``mark``."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        # glog prefix: E1201 09:06:40.196000 PID file:line] message (local time, no year)
        if line[:1] in "IWE" and mark in line:
            with contextlib.suppress(ValueError, IndexError):
                stamp = time.strftime("%Y") + line[1:5] + " " + line.split()[1]
                when = time.mktime(time.strptime(stamp.split(".")[0], "%Y%m%d %H:%M:%S"))
                out.append(when + float("0." + stamp.split(".")[1]))
    return out


def verify(
    groups: list[Group], ref: dict[int, tuple[str, float]], steps: int, report: Report
) -> None:
    """Every logged step equals the reference; the trained steps are 1..N exactly once."""
    trained: list[int] = []
    for k, g in enumerate(groups):
        report.groups.append({"group": g.group, "world": g.world, "start": g.start,
                              "steps": len(g.steps), "done": g.done})  # fmt: skip
        if g.start != g.committed_before:
            raise AssertionError(
                f"worker group {g.group} resumed at step {g.start}, but the latest committed "
                f"checkpoint was step {g.committed_before}"
            )
        for t, (digest, loss, _) in sorted(g.steps.items()):
            ref_digest, ref_loss = ref[t]
            if digest != ref_digest:
                raise AssertionError(
                    f"worker group {g.group} (world {g.world}) step {t}: digest {digest[:16]} "
                    f"!= uninterrupted {ref_digest[:16]}"
                )
            rel = abs(loss - ref_loss) / max(abs(ref_loss), 1e-12)
            report.max_loss_rel_diff = max(report.max_loss_rel_diff, rel)
            if rel > 1e-4:
                raise AssertionError(f"step {t}: loss {loss} != uninterrupted {ref_loss}")
            report.steps_compared += 1
        end = groups[k + 1].start if k + 1 < len(groups) else steps
        missing = [t for t in range(g.start + 1, end + 1) if t not in g.steps]
        if missing:
            raise AssertionError(f"worker group {g.group} never trained steps {missing}")
        trained.extend(range(g.start + 1, end + 1))
    if trained != list(range(1, steps + 1)):
        raise AssertionError(f"trained steps are not 1..{steps} exactly once: {trained}")
    if not groups or not groups[-1].done:
        raise AssertionError("the last worker group did not finish the job")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="write the report here")
    args = ap.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="zephon-elastic-"))
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(workdir / "cache"))
    report = drill(workdir, steps=args.steps, cycles=args.cycles)
    text = json.dumps(asdict(report), indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
