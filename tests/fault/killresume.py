"""Kill-and-resume driver: SIGKILL a torchrun job again and again, resume elastically.

Runs ``killresume_rank.py`` under ``torchrun`` (gloo, CPU). Each run resumes from the latest
committed checkpoint at a random dp size, worker count, runner and micro-batch size, and is
SIGKILLed at a random moment: during start-up or restore, between or inside steps, or at an
exact point of a checkpoint write (a rank's file written but not renamed, some ranks saved,
all saved but not committed, just committed). At the end the digests of the trained steps
(for each run, the steps after its resume point up to the next run's resume point) must be
exactly steps ``1..N`` in order, each equal to an uninterrupted run's digest.

Every planned kill lands, however fast or loaded the machine: the ranks of a run with a kill
planned wait to be killed at a point just past it (``--hold-at``: after the ``start`` line for
a start-up kill, after step ``k + 1`` for a kill after step ``k``, after step ``F + 1`` for a
fault at the checkpoint of step ``F``). Without it a kill timed in seconds could come after
the job had already finished (a fast machine), which ended the session with fewer kills. A
planned kill that never comes (a fault hook that no longer fires) fails the session, naming
the run.

Usage::

    python tests/fault/killresume.py --kills 20 --seed 0
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
RANK_SCRIPT = HERE / "killresume_rank.py"
TOKEN_VAR = "ZEPHON_KR_TOKEN"
NUM_LANES = 12
GLOBAL_BATCH = 24
DP_SIZES = (1, 2, 3, 4)
FAULT_PHASES = ("before_rename", "after_rank_save", "before_commit", "after_commit")


def make_corpus(directory: Path, seed: int = 0) -> Path:
    """Write three ``.jsonl`` shards and a recipe next to them; return the recipe path."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    words = ["alpha", "beta", "gamma", "delta", "lane", "flush", "window", "step", "zephon"]
    for s in range(3):
        with open(directory / f"shard_{s}.jsonl", "w", encoding="utf-8") as f:
            for i in range(300):
                n = rng.randint(3, 60)
                text = " ".join(rng.choice(words) for _ in range(n)) + f" #{s}.{i}"
                f.write(json.dumps({"text": text}) + "\n")
    recipe = directory / "recipe.toml"
    recipe.write_text(
        "seed = 11\n"
        f"num_lanes = {NUM_LANES}\n"
        f"global_batch_size = {GLOBAL_BATCH}\n"
        "seq_len = 48\n"
        "flush_every = 2\n"
        "[tokenizer]\nkind = 'bytes'\n"
        "[[datasets]]\nname = 'words'\npaths = ['shard_*.jsonl']\n"
        "[work]\nchunk_size = 5\nepochs = 'inf'\n"
        "[shuffle]\nbuffer_size = 6\n",
        encoding="utf-8",
    )
    return recipe


def job_pids(token: str) -> list[int]:
    """Pids of live processes whose environment holds ``ZEPHON_KR_TOKEN=token``."""
    needle = f"{TOKEN_VAR}={token}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        out.append(int(entry))
            except OSError:
                continue
    return out


def kill_job(token: str) -> None:
    """SIGKILL every process of a job (torchrun agent, ranks, pool workers) and reap them."""
    deadline = time.monotonic() + 30
    while True:
        pids = [p for p in job_pids(token) if p != os.getpid()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} of job {token} survive SIGKILL")
        time.sleep(0.05)


@dataclass
class Run:
    """One launch of the job and what it logged."""

    run_id: int
    dp: int
    workers: int
    runner: str
    local_batch_size: int
    plan: str
    detail: str = ""
    start: int | None = None
    steps: dict[int, str] = field(default_factory=dict)
    commits: list[int] = field(default_factory=list)
    done: bool = False
    killed: bool = False
    returncode: int | None = None
    committed_before: int = 0


@dataclass
class Report:
    """Counts of a kill-and-resume session."""

    kills: int = 0
    resumes: int = 0
    dp_changes: int = 0
    steps_verified: int = 0
    steps_logged: int = 0
    kill_plans: dict[str, int] = field(default_factory=dict)
    partial_checkpoints_left: int = 0
    temp_files_left: int = 0
    seconds: float = 0.0
    runs: list[Run] = field(default_factory=list)

    def summary(self) -> str:
        """One human-readable paragraph."""
        dps = [r.dp for r in self.runs]
        return (
            f"kills={self.kills} resumes={self.resumes} dp_changes={self.dp_changes} "
            f"steps_verified={self.steps_verified} (digests logged incl. replayed steps: "
            f"{self.steps_logged}) kill_plans={self.kill_plans} "
            f"partial_checkpoints_left={self.partial_checkpoints_left} "
            f"temp_files_left={self.temp_files_left} dp_sequence={dps} "
            f"seconds={self.seconds:.1f}"
        )

    def kill_log(self) -> str:
        """One line per run: its plan, where it resumed, the last step it logged, commits."""
        lines = []
        for r in self.runs:
            last = max(r.steps, default=None)
            lines.append(
                f"run {r.run_id:2d} dp={r.dp} workers={r.workers} {r.runner:7s} "
                f"{r.plan:22s} {r.detail:40s} resumed={r.start} last_step={last} "
                f"commits={r.commits} {'KILLED' if r.killed else 'done' if r.done else '?'}"
            )
        return "\n".join(lines)


def read_log(path: Path) -> list[list[str]]:
    """Return the complete lines of ``digests.log`` split into words."""
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")[:-1]  # the last element is "" or a partial line
    return [ln.split() for ln in lines]


def committed_step(root: Path) -> int:
    """Highest step with a commit marker (the driver's own scan of the layout), 0 if none."""
    best = 0
    if root.is_dir():
        for d in root.iterdir():
            if d.name.startswith("step_") and (d / "COMMITTED.json").is_file():
                best = max(best, int(d.name[5:]))
    return best


def launch(
    recipe: Path,
    workdir: Path,
    run: Run,
    steps: int,
    ckpt_every: int,
    step_sleep: float,
    fault: str,
    token: str,
    hold_at: int | None = None,
) -> subprocess.Popen[bytes]:
    """Start one torchrun job."""
    env = dict(os.environ)
    env[TOKEN_VAR] = token
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={run.dp}", "--max_restarts=0", str(RANK_SCRIPT),
        "--workdir", str(workdir), "--recipe", str(recipe), "--run-id", str(run.run_id),
        "--steps", str(steps), "--ckpt-every", str(ckpt_every),
        "--workers", str(run.workers), "--runner", run.runner,
        "--local-batch-size", str(run.local_batch_size), "--step-sleep", str(step_sleep),
    ]  # fmt: skip
    if fault:
        cmd += ["--fault", fault]
    if hold_at is not None:
        cmd += ["--hold-at", str(hold_at)]
    out = open(workdir / f"run_{run.run_id}.out", "wb")  # noqa: SIM115
    try:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    finally:
        out.close()


def _collect(run: Run, lines: list[list[str]]) -> None:
    for w in lines:
        if len(w) < 3 or w[1] != str(run.run_id):
            continue
        if w[0] == "start":
            run.start = int(w[2])
        elif w[0] == "step" and len(w) == 4:
            run.steps[int(w[2])] = w[3]
        elif w[0] == "ckpt":
            run.commits.append(int(w[2]))
        elif w[0] == "done":
            run.done = True


def run_job(
    recipe: Path,
    workdir: Path,
    run: Run,
    steps: int,
    ckpt_every: int,
    step_sleep: float,
    *,
    fault: str = "",
    kill_after_step: int | None = None,
    kill_delay: float | None = None,
    rng: random.Random | None = None,
    hold_at: int | None = None,
    timeout_s: float = 240.0,
) -> Run:
    """Run one job until it ends or the driver SIGKILLs it per the plan.

    ``hold_at`` makes the ranks wait to be killed once that step is logged (0: the ``start``
    line): a run with a kill planned passes it, so that the kill lands before that point.
    """
    token = uuid.uuid4().hex
    log = workdir / "digests.log"
    t0 = time.monotonic()
    proc = launch(recipe, workdir, run, steps, ckpt_every, step_sleep, fault, token, hold_at)
    kill_at: float | None = t0 + kill_delay if kill_delay is not None else None
    try:
        while proc.poll() is None:
            now = time.monotonic()
            if now - t0 > timeout_s:
                raise TimeoutError(f"run {run.run_id} did not finish within {timeout_s}s")
            if kill_at is None and kill_after_step is not None:
                probe = Run(run.run_id, 0, 0, "", 0, "")
                _collect(probe, read_log(log))
                if kill_after_step in probe.steps:
                    assert rng is not None
                    kill_at = now + rng.uniform(0, 1.5 * step_sleep)
            if kill_at is not None and now >= kill_at:
                kill_job(token)
                run.killed = True
                break
            time.sleep(0.005)
        proc.wait(timeout=60)
    finally:
        kill_job(token)
    run.returncode = proc.returncode
    if proc.returncode == -signal.SIGKILL:
        run.killed = True
    _collect(run, read_log(log))
    if not run.killed and (proc.returncode != 0 or not run.done):
        out = (workdir / f"run_{run.run_id}.out").read_text(errors="replace")[-4000:]
        raise RuntimeError(
            f"run {run.run_id} ({run.plan} {run.detail}) failed (rc={proc.returncode}):\n{out}"
        )
    return run


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def reference_digests(
    recipe: Path, workdir: Path, steps: int, ckpt_every: int, dp: int = 2
) -> dict[int, str]:
    """Digests of an uninterrupted torchrun run."""
    workdir.mkdir(parents=True, exist_ok=True)
    run = Run(0, dp, 2, "thread", 0, "uninterrupted")
    run_job(recipe, workdir, run, steps, ckpt_every, 0.0)
    if sorted(run.steps) != list(range(1, steps + 1)):
        raise AssertionError(f"the reference run logged steps {sorted(run.steps)}")
    return run.steps


def kill_and_resume(
    recipe: Path,
    workdir: Path,
    reference: dict[int, str],
    *,
    kills: int = 20,
    seed: int = 0,
    steps: int = 60,
    ckpt_every: int = 3,
    step_sleep: float = 0.04,
    process_runner_share: float = 0.15,
) -> Report:
    """SIGKILL the job ``kills`` times, resume each time, verify every trained step."""
    rng = random.Random(seed)
    workdir.mkdir(parents=True, exist_ok=True)
    root = workdir / "checkpoints"
    report = Report()
    t0 = time.monotonic()
    run_id = 0
    faults = 0
    while True:
        run_id += 1
        s = committed_step(root)
        dp = rng.choice(DP_SIZES)
        workers = rng.choice((0, 1, 2, 3))
        runner = "process" if workers and rng.random() < process_runner_share else "thread"
        lbs = rng.choice(_divisors(GLOBAL_BATCH // dp))
        horizon = min(s + 3 * ckpt_every, steps - 1)
        plan = "none"
        kw: dict[str, object] = {}
        if report.kills < kills and horizon > s:
            plan = rng.choices(["startup", "step", "fault"], weights=[1, 4, 4])[0]
            ckpts = [t for t in range(s + 1, horizon + 1) if t % ckpt_every == 0]
            # A short session (few kills) still reaches every fault phase: while the kills
            # left are no more than the phases not yet hit, each goes inside a checkpoint.
            if ckpts and kills - report.kills <= len(FAULT_PHASES) - faults:
                plan = "fault"
            if plan == "fault" and not ckpts:
                plan = "step"
            if plan == "fault":
                phase = FAULT_PHASES[faults % len(FAULT_PHASES)]  # every phase, in turn
                faults += 1
                frank = 0 if phase in ("before_commit", "after_commit") else rng.randrange(dp)
                at = rng.choice(ckpts)
                kw["fault"] = f"{phase}:{at}:{frank}"
                kw["hold_at"] = at + 1  # the fault fires inside step `at`'s checkpoint
                plan = f"fault:{phase}"
            elif plan == "step":
                at = rng.randint(s + 1, horizon)
                kw["kill_after_step"] = at
                kw["rng"] = rng
                kw["hold_at"] = at + 1  # <= steps: horizon < steps
            else:
                kw["kill_delay"] = rng.uniform(0.3, 6.0)
                kw["hold_at"] = 0  # a start-up kill lands before the first step
        detail = ", ".join(f"{k}={v}" for k, v in kw.items() if k != "rng")
        run = Run(run_id, dp, workers, runner, lbs, plan, detail, committed_before=s)
        run_job(recipe, workdir, run, steps, ckpt_every, step_sleep, **kw)  # type: ignore[arg-type]
        report.runs.append(run)
        if plan != "none" and not run.killed:
            raise RuntimeError(f"run {run_id}: the planned kill ({plan}, {detail}) never landed")
        if run.killed:
            report.kills += 1
            key = plan.split(":")[0] if plan.startswith("fault") else plan
            key = plan if plan.startswith("fault") else key
            report.kill_plans[key] = report.kill_plans.get(key, 0) + 1
        if run.done:
            break
        if not run.killed:
            raise RuntimeError(f"run {run_id} neither finished nor was killed")
        if run_id > 4 * kills + 10:
            raise RuntimeError("too many runs; the job makes no progress")
    report.seconds = time.monotonic() - t0
    verify(report, reference, steps)
    for d in root.iterdir():
        if not (d / "COMMITTED.json").exists():
            report.partial_checkpoints_left += 1
        report.temp_files_left += sum(1 for f in d.iterdir() if f.name.endswith(".tmp"))
    return report


class VerificationError(Exception):
    """A trained step, a resume point or a commit that contradicts the uninterrupted run."""


def verify(report: Report, reference: dict[int, str], steps: int) -> None:
    """Check the trained steps of all runs against the uninterrupted run."""
    runs = report.runs
    prev_dp = None
    trained: list[int] = []
    for k, run in enumerate(runs):
        if run.start:
            report.resumes += 1  # started from a committed checkpoint
        if prev_dp is not None and run.start is not None and run.dp != prev_dp:
            report.dp_changes += 1
        if run.start is not None:
            prev_dp = run.dp
            if run.start != run.committed_before:
                raise VerificationError(
                    f"run {run.run_id} resumed at step {run.start}, but the latest committed "
                    f"checkpoint was step {run.committed_before}"
                )
        for t, digest in run.steps.items():
            report.steps_logged += 1
            if digest != reference[t]:
                raise VerificationError(
                    f"run {run.run_id} (dp={run.dp}, workers={run.workers}, {run.runner}) "
                    f"step {t}: digest {digest[:16]} != uninterrupted {reference[t][:16]}"
                )
        end = runs[k + 1].committed_before if k + 1 < len(runs) else steps
        begin = run.committed_before
        if end < begin:
            raise VerificationError(f"the committed step went back from {begin} to {end}")
        missing = [t for t in range(begin + 1, end + 1) if t not in run.steps]
        if missing:
            raise VerificationError(
                f"run {run.run_id} committed past steps it never logged: {missing}"
            )
        trained.extend(range(begin + 1, end + 1))
    if trained != list(range(1, steps + 1)):
        raise VerificationError(f"trained steps are not 1..{steps} exactly once: {trained}")
    report.steps_verified = len(trained)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints the report as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--ckpt-every", type=int, default=3)
    args = ap.parse_args(argv)
    import tempfile

    base = args.workdir or Path(tempfile.mkdtemp(prefix="zephon-killresume-"))
    recipe = make_corpus(base / "data", seed=args.seed)
    os.environ.setdefault("ZEPHON_CACHE_DIR", str(base / "cache"))
    ref = reference_digests(recipe, base / "reference", args.steps, args.ckpt_every)
    report = kill_and_resume(
        recipe, base / "killed", ref, kills=args.kills, seed=args.seed, steps=args.steps,
        ckpt_every=args.ckpt_every,
    )  # fmt: skip
    print(report.kill_log())
    print(report.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
