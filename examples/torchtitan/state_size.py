"""Bytes per lane of ZephonDataLoader's DCP state: a static recipe and one with 3 decisions.

    python examples/torchtitan/state_size.py

Builds the loader of the installed TorchTitan (0.3.0 or main) on small generated recipes
(bytes tokenizer, dp 1), takes 6 steps (with ``set_mixture`` after steps 1, 3 and 5 in the
dynamic case), saves ``{"dataloader": loader}`` with torch.distributed.checkpoint and prints,
per lane: the tensor payload of its keys (``lane_NNNNN`` and ``mixture_lane_NNNNN``) and the
on-disk cost, measured as the growth of the checkpoint from 4 to 8 lanes, divided by 4.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp

from zephon_nodes.integrations.torchtitan import API, ZephonDataLoader

SEQ, G = 32, 8


def write_recipe(root: Path, lanes: int, datasets: int) -> Path:
    names = ["prose", "code"][:datasets]
    blocks = []
    for n in names:
        with open(root / f"{n}.jsonl", "w", encoding="utf-8") as f:
            for i in range(200):
                f.write(json.dumps({"text": f"{n} {i} " + "word " * (i % 17 + 3)}) + "\n")
        weight = f"weight = {1 / datasets}\n" if datasets > 1 else ""
        blocks.append(f'[[datasets]]\nname = "{n}"\npaths = ["{n}.jsonl"]\n{weight}')
    text = (
        f"seed = 3\nnum_lanes = {lanes}\nglobal_batch_size = {G}\nseq_len = {SEQ}\n"
        f'flush_every = 2\n\n[tokenizer]\nkind = "bytes"\n\n' + "\n".join(blocks) + "\n"
        '[work]\nchunk_size = 2\nepochs = "inf"\n'
    )
    path = root / f"r{lanes}_{datasets}.toml"
    path.write_text(text)
    return path


def build(recipe: Path, **cfg: Any) -> Any:
    config = ZephonDataLoader.Config(recipe=str(recipe), num_workers=0, prefetch=0, **cfg)
    if API == "main":
        return config.build(
            dp_world_size=1,
            dp_rank=0,
            tokenizer=None,
            max_context_length=SEQ,
            num_tokens_per_batch=G * SEQ,
        )
    return config.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=SEQ, local_batch_size=G)


def measure(root: Path, lanes: int, datasets: int, decisions: int, **cfg: Any) -> tuple:
    loader = build(write_recipe(root, lanes, datasets), **cfg)
    it = iter(loader)
    for step in range(1, 7):
        next(it)
        if decisions and step in (1, 3, 5)[:decisions]:
            w = 0.2 + 0.1 * step
            loader.set_mixture({"prose": w, "code": 1 - w})
    sd = loader.state_dict()
    payload = sum(v.numel() * v.element_size() for k, v in sd.items() if "lane_" in k) / lanes
    out = root / f"ckpt_{lanes}_{datasets}_{decisions}_{cfg}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"dataloader": loader}, checkpoint_id=str(out), no_dist=True)
    disk = sum(f.stat().st_size for f in out.iterdir())
    loader.close()
    return payload, disk, len(sd)


def main() -> None:
    print(f"TorchTitan API: {API}")
    cases = [
        ("static, one dataset (default)", 1, 0, {}),
        ("static, two datasets, max_decisions=0", 2, 0, {"max_decisions": 0}),
        ("two datasets, no decision (default room 256)", 2, 0, {}),
        ("3 decisions, max_decisions=3", 2, 3, {"max_decisions": 3}),
        ("3 decisions (default room 256)", 2, 3, {}),
    ]
    print("case | payload B/lane | on-disk B/lane (8 vs 4 lanes) | checkpoint B at 4 lanes")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, datasets, decisions, cfg in cases:
            p4, d4, _ = measure(root, 4, datasets, decisions, **cfg)
            p8, d8, _ = measure(root, 8, datasets, decisions, **cfg)
            assert p4 == p8
            print(f"{name} | {p4:.0f} | {(d8 - d4) / 4:.0f} | {d4}")


if __name__ == "__main__":
    main()
