"""One worker of the elastic job (launched by ``torchrun --nnodes=1:2``; see ``elastic.py``).

Every (re)start of the worker group reads the world size torchrun gives it, builds its rank's
loader with ``Pipeline(recipe).rank_node(world, rank)``, and resumes the model, the optimizer
and the loader from the latest committed checkpoint, whatever the world size that wrote it.
Each step: forward/backward on the rank's micro-batches, gradients summed over ranks, and rank
0 appends the global batch digest and the loss to ``steps.log``. ``--gate FILE`` lets the
drill hold the job before a given step (each rank waits until FILE holds a number >= step).
Every ``--ckpt-every`` steps each rank saves its lanes' state, rank 0 the model and optimizer,
then rank 0 commits.

Log lines (rank 0): ``start GROUP STEP WORLD TIME``, ``step GROUP STEP DIGEST LOSS TIME``,
``ckpt GROUP STEP``, ``done GROUP STEP``; GROUP is a fresh id per worker-group start.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

from examples.elastic.model import TinyLM, make_optimizer, train_step
from zephon_nodes import Pipeline, Recipe, WorkerPool, digest_microbatches
from zephon_nodes import state as ckpt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--ckpt-every", type=int, default=3)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--gate", default="", help="file holding the last step allowed (a drill)")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    work = Path(args.workdir)
    root = work / "checkpoints"
    pipeline = Pipeline(Recipe.from_toml(args.recipe))
    pool = WorkerPool(1, "thread", timeout_s=60)
    node = pipeline.rank_node(world, rank, pool=pool)
    model = TinyLM(pipeline.recipe.seq_len)
    opt = make_optimizer(model)

    latest = ckpt.latest_checkpoint(root)
    node.reset(ckpt.load_checkpoint(latest) if latest is not None else None)
    if latest is not None:
        saved = torch.load(latest / "model.pt", weights_only=True)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
    start = node.step

    group = uuid.uuid4().hex[:8]
    log = open(work / "steps.log", "a", encoding="utf-8") if rank == 0 else None  # noqa: SIM115

    def emit(line: str) -> None:
        if log is not None:
            log.write(line + "\n")
            log.flush()

    def all_reduce(t: torch.Tensor) -> None:
        dist.all_reduce(t)

    def wait_gate(t: int) -> None:
        while args.gate:
            with contextlib.suppress(OSError, ValueError):
                if int(Path(args.gate).read_text(encoding="utf-8")) >= t:
                    return
            time.sleep(0.02)

    emit(f"start {group} {start} {world} {time.time():.3f}")
    for t in range(start + 1, args.steps + 1):
        wait_gate(t)
        mbs = [next(node) for _ in range(node.micro_per_step)]
        loss = train_step(model, opt, mbs, all_reduce)
        gathered: list[object] = [None] * world
        dist.all_gather_object(gathered, mbs)
        if rank == 0:
            flat = [mb for part in gathered for mb in part]  # type: ignore[attr-defined]
            emit(f"step {group} {t} {digest_microbatches(flat)} {loss:.9g} {time.time():.3f}")
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if t % args.ckpt_every == 0:
            ckpt.save_rank_state(root, t, rank, node.state_dict())
            if rank == 0:
                tmp = ckpt.checkpoint_path(root, t) / f"model.pt.{os.getpid()}.tmp"
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp)
                os.replace(tmp, tmp.with_name("model.pt"))
            dist.barrier()
            if rank == 0:
                ckpt.commit_checkpoint(root, t, world)
                emit(f"ckpt {group} {t}")
            dist.barrier()
    emit(f"done {group} {args.steps}")
    pool.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
