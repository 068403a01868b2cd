"""torchrun script (demo-only): train a tiny causal LM from scratch with a chosen loader.

Data-parallel for real: one process per rank (gloo), gradients summed over ranks and
normalized by the global count of valid tokens (as TorchTitan's trainer does). The loader
is zephon-nodes' :class:`~zephon_nodes.integrations.torchtitan.ZephonDataLoader` or the
rank-sharded baseline (:mod:`examples.repro.naive_loader`); both are built through their
TorchTitan ``Config.build``. Rank 0 evaluates the mean token loss on a held-out set
(``--heldout`` npz of packed rows) every ``--eval-every`` steps and at the end.

Writes ``result.json`` (train losses and eval losses per step, wall time) to ``--out``.

Usage: torchrun --nproc_per_node R scratch_job.py --recipe R.toml --loader zephon|naive
--heldout H.npz --out DIR --steps N [--eval-every E] [--lbs B]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from zephon_nodes.recipe import Recipe

IGNORE_INDEX = -100


class TinyCausalLM(nn.Module):
    """Token + position embeddings, one pre-norm causal self-attention block, a head."""

    def __init__(self, vocab: int, seq_len: int, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.block = nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        h = self.tok(tokens) + self.pos.weight[:n]
        h = self.block(h, src_mask=self.mask[:n, :n], is_causal=True)
        return self.head(self.norm(h))


def build_loader(args: argparse.Namespace, world: int, rank: int, seq_len: int) -> Any:
    if args.loader == "zephon":
        from zephon_nodes.integrations.torchtitan import ZephonDataLoader

        config: Any = ZephonDataLoader.Config(
            recipe=args.recipe, num_workers=1, prefetch=2, check_tokenizer=False
        )
    else:
        from examples.repro.naive_loader import RankShardedLoader

        config = RankShardedLoader.Config(recipe=args.recipe)
    return config.build(
        dp_world_size=world, dp_rank=rank, seq_len=seq_len, local_batch_size=args.lbs
    )


@torch.no_grad()
def evaluate(model: nn.Module, heldout: dict[str, torch.Tensor]) -> float:
    """Mean token cross-entropy over the held-out rows."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(heldout["input"]), 16):
        logits = model(heldout["input"][i : i + 16])
        labels = heldout["labels"][i : i + 16]
        total += float(
            F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]),
                labels.reshape(-1),
                ignore_index=IGNORE_INDEX,
                reduction="sum",
            )
        )
        count += int((labels != IGNORE_INDEX).sum())
    model.train()
    return total / count


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--loader", choices=("zephon", "naive"), required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--lbs", type=int, default=2)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()

    t0 = time.perf_counter()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    recipe = Recipe.from_toml(args.recipe)
    seq_len, G = recipe.seq_len, recipe.global_batch_size
    micro = G // (world * args.lbs)
    loader = build_loader(args, world, rank, seq_len)
    with np.load(args.heldout) as h:
        heldout = {k: torch.from_numpy(h[k]) for k in ("input", "labels")}

    torch.manual_seed(0)
    model = TinyCausalLM(args.vocab, seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    result: dict[str, Any] = {"world": world, "loader": args.loader, "train": {}, "eval": {}}
    if rank == 0:
        result["eval"][0] = evaluate(model, heldout)
    it = iter(loader)
    tokens = 0
    for step in range(1, args.steps + 1):
        batches = [next(it) for _ in range(micro)]
        valid = torch.tensor(sum(int((b[1] != IGNORE_INDEX).sum()) for b in batches))
        dist.all_reduce(valid)
        opt.zero_grad()
        total = torch.zeros(())
        for inputs, labels in batches:
            logits = model(inputs["input"])
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
        opt.step()
        dist.all_reduce(total)
        tokens += G * seq_len
        result["train"][step] = float(total / valid)
        if rank == 0 and (step % args.eval_every == 0 or step == args.steps):
            result["eval"][step] = evaluate(model, heldout)
    result["tokens"] = tokens
    result["wall_s"] = time.perf_counter() - t0
    if rank == 0:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "result.json").write_text(json.dumps(result))
    if hasattr(loader, "close"):
        loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
