"""torchrun script: a tiny model trained with TorchTitan's components (no Trainer).

Uses TorchTitan's ``CheckpointManager`` (DCP), ``OptimizersContainer`` (``default_adamw``),
``LRSchedulersContainer`` and ``HuggingFaceTokenizer``, with either ``ZephonDataLoader`` or
TorchTitan's own ``HuggingFaceTextDataLoader``. Gradients are summed over ranks with gloo
and normalized by the global count of valid tokens, as TorchTitan's trainer does.

Writes to ``--out``: ``rows_rank{r}.npz`` (each step's rows, in the rank's order) and, on
rank 0, ``result.json`` (losses per step, wall time, the error if loading failed).

Usage: torchrun --nproc_per_node R tt_mini.py --recipe R.toml --hf-assets DIR --out DIR
--ckpt DIR --steps N [--interval K] [--resume-step K] [--loader zephon|titan]
[--relane-from L] [--relaned]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.components.tokenizer import HuggingFaceTokenizer

from tests.integrations.tt_helpers import Row, rows_of, save_rows

IGNORE_INDEX = -100


class TinyLM(nn.Module):
    """Token + position embeddings, one MLP block, a vocabulary head."""

    def __init__(self, vocab: int, seq_len: int, dim: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens) + self.pos(positions)
        return self.head(h + self.mlp(h))


class TrainState(Stateful):
    """The step counter, saved with the checkpoint."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": torch.tensor(self.step, dtype=torch.int64)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = int(state_dict["step"])


def build_loader(args: argparse.Namespace, world: int, rank: int, tok: Any) -> Any:
    if args.loader == "zephon":
        from zephon_nodes.integrations.torchtitan import ZephonDataLoader

        config: Any = ZephonDataLoader.Config(
            recipe=args.recipe,
            num_workers=1,
            prefetch=2,
            relane_from=args.relane_from,
            relaned=args.relaned,
        )
    else:
        from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

        config = HuggingFaceTextDataLoader.Config(dataset="c4_test", dataset_path=args.data_dir)
    return config.build(
        dp_world_size=world,
        dp_rank=rank,
        tokenizer=tok,
        seq_len=args.seq_len,
        local_batch_size=args.lbs,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="")
    ap.add_argument("--data-dir", default="")
    ap.add_argument("--hf-assets", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--interval", type=int, default=1000)
    ap.add_argument("--resume-step", type=int, default=0)
    ap.add_argument("--exclude-dataloader", action="store_true")
    ap.add_argument("--loader", choices=("zephon", "titan"), default="zephon")
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--lbs", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--relane-from", type=int, default=0)  # dataloader.relane_from
    ap.add_argument("--relaned", action="store_true")  # dataloader.relaned
    args = ap.parse_args()

    t0 = time.perf_counter()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"world": world, "losses": {}}

    tok = HuggingFaceTokenizer(tokenizer_path=args.hf_assets)
    loader = build_loader(args, world, rank, tok)
    torch.manual_seed(0)
    model = TinyLM(tok.get_vocab_size(), args.seq_len)
    optimizers = default_adamw(lr=1e-2).build(model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(
        optimizers=optimizers, training_steps=args.steps
    )
    state = TrainState()
    ckpt = CheckpointManager.Config(
        enable=True,
        interval=args.interval,
        keep_latest_k=0,
        last_save_model_only=False,
        load_only=args.resume_step > 0,
        exclude_from_loading=["dataloader"] if args.exclude_dataloader else [],
    ).build(
        dataloader=loader,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=schedulers,
        states={"train_state": state},
        sd_adapter=None,
        base_folder=args.ckpt,
    )
    if args.resume_step:
        try:
            ckpt.load(step=args.resume_step)
        except BaseException as e:  # DCP's CheckpointException derives from BaseException
            result["load_error"] = f"{type(e).__name__}: {e}"
            result["load_traceback"] = traceback.format_exc()[-4000:]
            (out / f"result_rank{rank}.json").write_text(json.dumps(result))
            os._exit(3)
        assert state.step == args.resume_step, (state.step, args.resume_step)

    micro = args.global_batch // (world * args.lbs)
    it = iter(loader)
    rows: dict[int, list[Row]] = {}
    for step in range(state.step + 1, args.steps + 1):
        batches = [next(it) for _ in range(micro)]
        rows[step] = [r for b in batches for r in rows_of(b)]
        valid = torch.tensor(sum(int((b[1] != IGNORE_INDEX).sum()) for b in batches))
        dist.all_reduce(valid)
        optimizers.zero_grad()
        total = torch.zeros(())
        for inputs, labels in batches:
            logits = model(inputs["input"], inputs["positions"])
            loss_sum = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]),
                labels.reshape(-1),
                ignore_index=IGNORE_INDEX,
                reduction="sum",
            )
            (loss_sum / valid).backward()
            total += loss_sum.detach()
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
        optimizers.step()
        schedulers.step()
        dist.all_reduce(total)
        result["losses"][step] = float(total / valid)
        state.step = step
        ckpt.save(curr_step=step, last_step=step == args.steps)
    save_rows(out / f"rows_rank{rank}.npz", rows)
    ckpt.close()
    result["wall_s"] = time.perf_counter() - t0
    if rank == 0:
        (out / "result.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
