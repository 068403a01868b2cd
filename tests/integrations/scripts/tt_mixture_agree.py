"""torchrun script: two ranks decide a mixture alike, then differently (must be detected).

Usage: torchrun --nproc_per_node 2 tt_mixture_agree.py --recipe R.toml --out DIR
Writes ``rank{r}.json``: whether the first decision passed, and the second one's error.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch.distributed as dist

from zephon_nodes.integrations.torchtitan import ZephonDataLoader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = ZephonDataLoader.Config(recipe=args.recipe, num_workers=0).build(
        dp_world_size=world,
        dp_rank=rank,
        tokenizer=None,
        seq_len=64,
        local_batch_size=4,
        snapshot_every_n_steps=None,
    )
    it = iter(loader)
    next(it)
    result: dict[str, object] = {"agreed": False, "error": None}
    loader.set_mixture({"prose": 1, "code": 1})
    result["agreed"] = True
    next(it)
    try:
        loader.set_mixture({"prose": 1, "code": 3} if rank == 0 else {"prose": 3, "code": 1})
    except Exception as e:  # the error under test
        result["error"] = f"{type(e).__name__}: {e}"
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(result))
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
