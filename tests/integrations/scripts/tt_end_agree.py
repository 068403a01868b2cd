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

from zephon_nodes.integrations.torchtitan import API, ZephonDataLoader
from zephon_nodes.recipe import Recipe


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    recipe = Recipe.from_toml(args.recipe)
    config = ZephonDataLoader.Config(recipe=args.recipe, num_workers=0, prefetch=1)
    if API == "main":  # 2 packed samples per flat micro-batch; repeat=False: finite data
        config.repeat = False
        size: dict[str, int] = {
            "max_context_length": recipe.seq_len,
            "num_tokens_per_batch": 2 * recipe.seq_len,
        }
    else:
        size = {"seq_len": recipe.seq_len, "local_batch_size": 2}
    loader = config.build(dp_world_size=world, dp_rank=rank, tokenizer=None, **size)
    sums = []
    ended = "StopIteration"
    it = iter(loader)
    while True:
        try:
            inputs, labels = next(it)
        except StopIteration:
            break
        except Exception as e:  # TorchTitan main's DataloaderExhaustedError
            ended = type(e).__name__
            break
        # a training step's collective: every rank must be here for every micro-batch
        total = torch.tensor([int(labels.ne(-100).sum())])
        dist.all_reduce(total)
        sums.append(int(inputs["input"].sum()))
    step = loader.state_dict()
    dist.barrier()
    Path(args.out, f"rank{rank}.json").write_text(
        json.dumps(
            {"micro_batches": len(sums), "sums": sums, "keys": sorted(step)[:3], "ended": ended}
        )
    )
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
