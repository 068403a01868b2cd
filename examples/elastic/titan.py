"""Preemptible-cluster drill with TorchTitan's real Trainer: shrink to one node, grow back.

The same drill as ``elastic.py`` with ``torchtitan.train`` (TorchTitan 0.3.0, llama3 debug
model, :class:`~zephon_nodes.integrations.torchtitan.ZephonDataLoader`) instead of the mini
loop. Two torchrun agents (``--nnodes=1:2``, c10d rendezvous on 127.0.0.1,
``--nproc-per-node=2``) stand for two machines. The Trainer checkpoints every
``--ckpt-every`` steps (DCP: model, optimizer and the loader's lane positions) and, at every
start, loads the latest complete checkpoint of its dump folder.

1. Both agents train on 4 ranks.
2. After step ``--shrink-after`` the drill SIGKILLs agent b and its ranks (a preempted node):
   agent a restarts its workers on 2 ranks, which load the last checkpoint and go on.
3. After step ``--grow-after`` agent b comes back: agent a stops its workers, the job
   re-rendezvouses on 4 ranks, loads the last checkpoint and trains to the end.

Each worker group dumps the batches it trained on (``--dataloader.dump-batches``, one folder
per group, see ``titan_worker.py``); ``zephon digest-dump`` of every folder must equal
``zephon digest`` of the recipe for every step the group trained, whatever the world size.
The report gives the timeline: seconds from the kill (or the returning agent's launch) to the
new group's first step, and the checkpoint it resumed from. On a CPU this is slow (each group
start imports TorchTitan and builds the model): a few minutes on 2 cores.

Usage::

    python -m examples.elastic.titan [--steps 12] [--no-grow] [--workdir DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from examples.elastic.elastic import Agent, _agent_log_times, free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
NPROC = 2  # ranks per agent (default)
SEQ_LEN, GLOBAL_BATCH, LOCAL_BATCH = 64, 8, 2
ANSI = re.compile(r"\x1b\[[0-9;]*m")
LOSS = re.compile(r"(?<!validate )step:\s*(\d+)\s+loss:\s*([-\d.]+)")
GROUP = re.compile(r"^group-(\d+)-(\d+)$")
RANK_FILE = re.compile(r"^step-(\d{8})\.rank-(\d{5})\.npz$")


@dataclass
class Group:
    """One start of the worker group, as seen in its dump folder."""

    folder: str
    world: int
    first_seen: float  # time its first complete step was seen
    steps: dict[int, float] = field(default_factory=dict)  # complete step -> time seen

    @property
    def start(self) -> int:
        """The checkpoint step it resumed from (0: a fresh start)."""
        return min(self.steps) - 1 if self.steps else -1


@dataclass
class Event:
    """A change of the job's size and how long it took to train again."""

    kind: str  # "shrink" or "grow"
    at_step: int  # last complete step seen before the event
    latest_checkpoint: int  # latest complete checkpoint at the event
    resumed_from: int  # checkpoint step the new worker group started from
    world_before: int
    world_after: int
    seconds_to_first_step: float  # event -> first step trained by the new worker group
    seconds_to_notice: float | None = None  # event -> agent a noticed (its log)


@dataclass
class Report:
    """What the drill did and measured."""

    steps: int
    groups: list[dict[str, Any]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    steps_compared: int = 0
    loss_max_rel_spread: float = 0.0  # across groups that trained the same step
    seconds: float = 0.0


def _env() -> dict[str, str]:
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        # See elastic.py: one rendezvous store per round, or a grow hangs in torch 2.13.
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _run(cmd: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"failed: {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-3000:]}")
    return proc.stdout


def _digests(out: str) -> dict[int, str]:
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    return {d["step"]: d["digest"] for d in lines}


class TitanJob:
    """The two agents of the job, its dump folders and checkpoints."""

    def __init__(self, work: Path, steps: int, ckpt_every: int, nproc: int = NPROC) -> None:
        self.work = work
        self.nproc = nproc
        self.env = _env()
        self.port = free_port()
        self.dumps = work / "batches"
        self.run_dir = work / "run"
        self.agents: dict[str, Agent] = {}
        self.train_args = [
            "--module", "zephon_nodes.integrations.torchtitan.configs",
            "--config", "zephon_llama3_debugmodel",
            "--dataloader.recipe", str(work / "recipe.toml"),
            "--hf-assets-path", str(work / "hf_assets"),
            "--training.seq-len", str(SEQ_LEN),
            "--training.local-batch-size", str(LOCAL_BATCH),
            "--training.global-batch-size", str(GLOBAL_BATCH),
            "--training.steps", str(steps),
            "--checkpoint.enable", "--checkpoint.interval", str(ckpt_every),
            "--dump-folder", str(self.run_dir),
            "--metrics.log-freq", "1", "--debug.seed", "0",
        ]  # fmt: skip
        self._seen: dict[tuple[str, int], float] = {}

    def launch(self, name: str, host: bool) -> Agent:
        """Start agent ``name`` (the host agent serves the rendezvous store)."""
        conf = (
            f"is_host={int(host)},join_timeout=300,last_call_timeout=2,close_timeout=10,"
            "keep_alive_interval=1,keep_alive_max_attempt=3"
        )
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes=1:2", f"--nproc-per-node={self.nproc}", "--max-restarts=5",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{self.port}",
            "--rdzv-id=zephon-titan", f"--rdzv-conf={conf}", "--local-addr=127.0.0.1",
            "--monitor-interval=0.2", "-m", "examples.elastic.titan_worker", str(self.dumps),
            *self.train_args,
        ]  # fmt: skip
        agent = Agent(name, cmd, self.env, self.work / f"agent_{name}.out")
        self.agents[name] = agent
        return agent

    def groups(self) -> list[Group]:
        """The worker groups so far, in the order they started; complete steps only."""
        out = []
        if not self.dumps.is_dir():
            return out
        now = time.time()
        for d in self.dumps.iterdir():
            m = GROUP.match(d.name)
            if m is None:
                continue
            world = int(m.group(1))
            ranks: dict[int, set[int]] = {}
            for f in d.iterdir():
                fm = RANK_FILE.match(f.name)
                if fm:
                    ranks.setdefault(int(fm.group(1)), set()).add(int(fm.group(2)))
            g = Group(d.name, world, 0.0)
            for step, rs in ranks.items():
                if len(rs) == world:
                    g.steps[step] = self._seen.setdefault((d.name, step), now)
            if g.steps:
                g.first_seen = min(g.steps.values())
                out.append(g)
        return sorted(out, key=lambda g: (g.first_seen, min(g.steps)))

    def latest_checkpoint(self) -> int:
        """The latest complete checkpoint (TorchTitan loads a step folder with DCP metadata)."""
        steps = [0]
        for d in (self.run_dir / "checkpoint").glob("step-*"):
            if (d / ".metadata").is_file():
                steps.append(int(d.name.split("-")[1]))
        return max(steps)

    def last_step(self, world: int | None = None) -> int:
        gs = [g for g in self.groups() if world is None or g.world == world]
        return max((max(g.steps) for g in gs), default=0)

    def wait(self, pred: Any, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred():
            for a in self.agents.values():
                rc = a.proc.poll()
                if rc is not None and rc not in (0, -9):
                    raise RuntimeError(f"agent {a.name} failed (rc={rc}):\n{self._tail(a)}")
            if time.monotonic() > deadline:
                tails = "\n".join(self._tail(a) for a in self.agents.values())
                raise TimeoutError(f"waited {timeout_s}s for {what}:\n{tails}")
            time.sleep(0.1)

    def _tail(self, a: Agent) -> str:
        return f"--- {a.name}:\n" + a.log.read_text(errors="replace")[-3000:]

    def new_group(self, world: int, since: float) -> Group | None:
        for g in self.groups():
            if g.world == world and g.first_seen >= since:
                return g
        return None

    def stop(self) -> None:
        for a in self.agents.values():
            a.stop()


def drill(
    workdir: Path,
    *,
    steps: int = 12,
    ckpt_every: int = 3,
    shrink_after: int = 4,
    grow_after: int = 8,
    grow: bool = True,
    nproc: int = NPROC,
    timeout_s: float = 600.0,
    say: Any = print,
) -> Report:
    """Run the real Trainer on two agents, lose one, (optionally) bring it back; verify.

    Args:
        workdir: Empty directory for the assets, checkpoints, batch dumps and logs.
        steps: Steps of the whole job.
        ckpt_every: Steps between checkpoints.
        shrink_after: Kill agent b once this step was trained on 4 ranks.
        grow_after: Bring agent b back once this step was trained on 2 ranks.
        grow: Also grow back (otherwise the job ends on one node).
        nproc: Ranks per agent.
        timeout_s: Longest wait for any phase.
        say: Progress printer.
    """
    t0 = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    env = _env()
    _run([sys.executable, str(ROOT / "examples/torchtitan/make_assets.py"), str(workdir),
          "--seq-len", str(SEQ_LEN), "--global-batch-size", str(GLOBAL_BATCH)], env)  # fmt: skip
    cli = [sys.executable, "-m", "zephon_nodes.cli"]
    expected = _digests(_run([*cli, "digest", str(workdir / "recipe.toml"), "--steps",
                              str(steps)], env))  # fmt: skip
    job = TitanJob(workdir, steps, ckpt_every, nproc)
    report = Report(steps=steps)
    try:
        job.launch("b", host=False)
        job.launch("a", host=True)
        job.wait(lambda: job.last_step(2 * nproc) >= shrink_after, "both nodes training", timeout_s)
        before, ckpt = job.last_step(), job.latest_checkpoint()
        t_kill = time.time()
        job.agents["b"].kill()
        say(f"killed agent b (and its ranks) after step {before}; last checkpoint {ckpt}")
        job.wait(lambda: job.new_group(nproc, t_kill) is not None, "one node training", timeout_s)
        g = job.new_group(nproc, t_kill)
        assert g is not None
        report.events.append(_event("shrink", before, ckpt, g, 2 * nproc, t_kill, job))
        say(f"  {report.events[-1]}")
        if grow:
            job.wait(lambda: job.last_step(nproc) >= grow_after, "one node training", timeout_s)
            before, ckpt = job.last_step(), job.latest_checkpoint()
            t_launch = time.time()
            job.launch("b", host=False)
            say(f"agent b is back after step {before}; last checkpoint {ckpt}")
            job.wait(
                lambda: job.new_group(2 * nproc, t_launch) is not None, "both nodes", timeout_s
            )
            g = job.new_group(2 * nproc, t_launch)
            assert g is not None
            report.events.append(_event("grow", before, ckpt, g, nproc, t_launch, job))
            say(f"  {report.events[-1]}")
        for a in job.agents.values():
            if a.proc.poll() is None:
                a.proc.wait(timeout=timeout_s)
        for a in job.agents.values():
            if a.proc.returncode not in (0, -9):
                raise RuntimeError(f"agent {a.name} failed:\n{job._tail(a)}")
    finally:
        job.stop()
    report.seconds = round(time.monotonic() - t0, 1)
    verify(job, expected, steps, report, cli)
    return report


def _event(
    kind: str, before: int, ckpt: int, g: Group, world_before: int, t: float, job: TitanJob
) -> Event:
    mark = "failed (exitcode" if kind == "shrink" else "closing signal SIGTERM"
    noticed = [x for x in _agent_log_times(job.agents["a"].log, mark) if x >= t]
    return Event(
        kind=kind,
        at_step=before,
        latest_checkpoint=ckpt,
        resumed_from=g.start,
        world_before=world_before,
        world_after=g.world,
        seconds_to_first_step=round(g.first_seen - t, 1),
        seconds_to_notice=round(noticed[0] - t, 1) if noticed else None,
    )


def _losses(job: TitanJob) -> dict[int, list[float]]:
    """Every ``step: N loss: X`` line the ranks logged (all groups, both agents)."""
    out: dict[int, list[float]] = {}
    for a in job.agents.values():
        for line in ANSI.sub("", a.log.read_text(errors="replace")).splitlines():
            m = LOSS.search(line)
            if m:
                out.setdefault(int(m.group(1)), []).append(float(m.group(2)))
    return out


def verify(
    job: TitanJob, expected: dict[int, str], steps: int, report: Report, cli: list[str]
) -> None:
    """Every complete step of every group equals ``zephon digest``; 1..N all trained."""
    groups = job.groups()
    covered: set[int] = set()
    for k, g in enumerate(groups):
        got = _digests(_run([*cli, "digest-dump", str(job.dumps / g.folder)], job.env))
        report.groups.append(
            {
                "folder": g.folder,
                "world": g.world,
                "resumed_from": g.start,
                "steps": sorted(g.steps),
            }
        )
        want = list(range(g.start + 1, max(g.steps) + 1))
        if sorted(g.steps) != want:
            raise AssertionError(f"group {g.folder} trained steps {sorted(g.steps)}, not {want}")
        if k and g.start % job_interval(job) != 0:
            raise AssertionError(f"group {g.folder} resumed at {g.start}, not a checkpoint step")
        for t in g.steps:
            if got[t] != expected[t]:
                raise AssertionError(
                    f"group {g.folder} (world {g.world}) step {t}: digest {got[t][:16]} != "
                    f"zephon digest {expected[t][:16]}"
                )
            report.steps_compared += 1
        covered |= set(g.steps)
    if covered != set(range(1, steps + 1)):
        raise AssertionError(f"steps trained {sorted(covered)} are not 1..{steps}")
    for values in _losses(job).values():
        spread = (max(values) - min(values)) / max(abs(min(values)), 1e-12)
        report.loss_max_rel_spread = max(report.loss_max_rel_spread, spread)


def job_interval(job: TitanJob) -> int:
    return int(job.train_args[job.train_args.index("--checkpoint.interval") + 1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--ckpt-every", type=int, default=3)
    ap.add_argument("--shrink-after", type=int, default=4)
    ap.add_argument("--grow-after", type=int, default=8)
    ap.add_argument("--no-grow", action="store_true", help="end the job on one node")
    ap.add_argument("--nproc", type=int, default=NPROC, help="ranks per agent")
    ap.add_argument("--json", type=Path, default=None, help="write the report here")
    args = ap.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="zephon-titan-"))
    report = drill(
        workdir,
        steps=args.steps,
        ckpt_every=args.ckpt_every,
        shrink_after=args.shrink_after,
        grow_after=args.grow_after,
        grow=not args.no_grow,
        nproc=args.nproc,
    )
    text = json.dumps(asdict(report), indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
