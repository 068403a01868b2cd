"""One rank of the kill-and-resume job (launched by ``killresume.py`` through torchrun).

Each rank builds its multiplexer with ``Pipeline(recipe).rank_node(R, rank, ...)``, resumes
from the latest committed checkpoint (if any), and trains ``--steps`` steps: every step the
ranks all-gather their micro-batches and rank 0 appends the global batch digest to
``digests.log``. Every ``--ckpt-every`` steps each rank saves its lanes' state with
:func:`zephon_nodes.state.save_rank_state`; after a barrier rank 0 commits.

``--fault PHASE:STEP:RANK`` makes that rank SIGKILL the whole job at an exact point of the
checkpoint of step STEP: ``before_rename`` (its state file fully written to a temporary name,
not yet renamed), ``after_rank_save``, ``before_commit`` (rank 0, every rank file written),
``after_commit``.

``--hold-at T`` makes every rank stop and wait to be killed once step ``T`` is logged (``0``:
once the ``start`` line is logged, before the first step); the driver passes it with every
planned kill, so that a kill lands before that point however fast the machine is. A rank still
waiting after ``HOLD_S`` seconds exits with status 3: the planned kill never came.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from types import ModuleType

TOKEN_VAR = "ZEPHON_KR_TOKEN"
HOLD_EXIT = 3  # exit status of a rank whose planned kill never came
HOLD_S = float(os.environ.get("ZEPHON_KR_HOLD_S", "120"))


def kill_job() -> None:
    """SIGKILL every process of this job (same token), this one last."""
    token = os.environ[TOKEN_VAR]
    me = os.getpid()
    for pid in job_pids(token):
        if pid != me:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    os.kill(me, signal.SIGKILL)


def job_pids(token: str) -> list[int]:
    """Return the pids of live processes whose environment holds ``TOKEN_VAR=token``."""
    needle = f"{TOKEN_VAR}={token}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            out.append(int(entry))
    return out


def _parse_fault(spec: str) -> tuple[str, int, int]:
    """``PHASE:STEP:RANK`` as ``(phase, step, rank)``; ``("", -1, -1)`` for no fault."""
    if not spec:
        return "", -1, -1
    phase, step_s, rank_s = spec.split(":")
    return phase, int(step_s), int(rank_s)


def _kill_before_rename(state_files: ModuleType, rank: int, fault_step: int) -> None:
    """Kill the job when this rank's state file of ``fault_step`` is about to be renamed."""
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        if Path(dst).name == f"rank_{rank:05d}.json" and f"{fault_step:010d}" in str(dst):
            kill_job()
        real_replace(src, dst)

    state_files.os.replace = replace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--run-id", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--ckpt-every", type=int, required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--runner", default="thread")
    ap.add_argument("--local-batch-size", type=int, default=0)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--fault", default="")
    ap.add_argument("--hold-at", type=int, default=-1)
    args = ap.parse_args()

    import torch.distributed as dist

    from zephon_nodes import Pipeline, Recipe, WorkerPool, digest_microbatches
    from zephon_nodes import state as ckpt
    from zephon_nodes.state import files as state_files

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    work = Path(args.workdir)
    root = work / "checkpoints"
    fault_phase, fault_step, fault_rank = _parse_fault(args.fault)

    def hold(step: int) -> None:
        if step != args.hold_at:
            return
        time.sleep(HOLD_S)  # the planned kill ends the job here at the latest
        print(
            f"rank {rank}: held at step {step} for {HOLD_S:.0f}s, the planned kill never came",
            file=sys.stderr,
            flush=True,
        )
        os._exit(HOLD_EXIT)

    def fault(phase: str, step: int) -> None:
        if phase == fault_phase and step == fault_step and rank == fault_rank:
            kill_job()

    if fault_phase == "before_rename" and rank == fault_rank:
        _kill_before_rename(state_files, rank, fault_step)

    pipeline = Pipeline(Recipe.from_toml(args.recipe))
    pool = WorkerPool(args.workers, args.runner, timeout_s=60)
    node = pipeline.rank_node(
        world, rank, pool=pool, local_batch_size=args.local_batch_size or None
    )
    latest = ckpt.latest_checkpoint(root)
    state = ckpt.load_checkpoint(latest) if latest is not None else None
    node.reset(state)
    start = node.step
    log = open(work / "digests.log", "a", encoding="utf-8") if rank == 0 else None  # noqa: SIM115

    def emit(line: str) -> None:
        if log is not None:
            log.write(line + "\n")
            log.flush()

    emit(
        f"start {args.run_id} {start} dp={world} workers={args.workers} runner={args.runner} "
        f"lbs={node.local_batch_size}"
    )
    hold(0)
    for t in range(start + 1, args.steps + 1):
        mbs = [next(node) for _ in range(node.micro_per_step)]
        gathered: list[object] = [None] * world
        dist.all_gather_object(gathered, mbs)
        if rank == 0:
            flat = [mb for part in gathered for mb in part]  # type: ignore[attr-defined]
            emit(f"step {args.run_id} {t} {digest_microbatches(flat)}")
        hold(t)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if t % args.ckpt_every == 0:
            ckpt.save_rank_state(root, t, rank, node.state_dict())
            fault("after_rank_save", t)
            dist.barrier()
            if rank == 0:
                fault("before_commit", t)
                ckpt.commit_checkpoint(root, t, world)
                emit(f"ckpt {args.run_id} {t}")
                fault("after_commit", t)
            dist.barrier()
    emit(f"done {args.run_id} {args.steps}")
    pool.close()
    dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
