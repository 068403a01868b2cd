"""torchrun script: every rank reads a finite recipe to its end; all must stop alike.

Usage: torchrun --nproc_per_node 2 tt_end_agree.py --recipe R.toml --out DIR
Writes ``rank{r}.json``: the micro-batches this rank got, then runs one collective (which
would hang, or fail, if a rank had stopped earlier and another were still reading).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist

from zephon_nodes.integrations.torchtitan import ZephonDataLoader
from zephon_nodes.recipe import Recipe


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    recipe = Recipe.from_toml(args.recipe)
    loader = ZephonDataLoader.Config(recipe=args.recipe, num_workers=0, prefetch=1).build(
        dp_world_size=world,
        dp_rank=rank,
        tokenizer=None,
        seq_len=recipe.seq_len,
        local_batch_size=2,
        snapshot_every_n_steps=None,
    )
    sums = []
    for inputs, labels in loader:
        # a training step's collective: every rank must be here for every micro-batch
        total = torch.tensor([int(labels.ne(-100).sum())])
        dist.all_reduce(total)
        sums.append(int(inputs["input"].sum()))
    step = loader.state_dict()
    dist.barrier()
    Path(args.out, f"rank{rank}.json").write_text(
        json.dumps({"micro_batches": len(sums), "sums": sums, "keys": sorted(step)[:3]})
    )
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
