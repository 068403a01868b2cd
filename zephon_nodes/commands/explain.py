"""``zephon explain``: what each rank will run (lanes, operators, pools, checkpoint size).

Its arguments are declared by :mod:`zephon_nodes.commands.explain_args`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from zephon_nodes.commands.explain_args import TOKENS_PER_S
from zephon_nodes.core.errors import RecipeError
from zephon_nodes.core.operator import operator_name
from zephon_nodes.engine.accumulate import AccumulatorNode
from zephon_nodes.engine.lane import chain_nodes
from zephon_nodes.engine.parallel_map import OrderedParallelMap
from zephon_nodes.engine.pipeline import Pipeline, lanes_for_rank
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.recipe import Recipe
from zephon_nodes.state.schema import RankState

__all__ = ["explain", "run"]

# Counters of a long run (steps, windows, samples) for the checkpoint size upper bound.
_BIG = 10**12


def first_batch(
    lanes: int, buffer_size: int, samples_per_lane: int, seq_len: int, workers: int, rate: float
) -> dict[str, Any]:
    """Tokens a rank tokenizes before its first batch, and the seconds that takes at ``rate``.

    Each lane's shuffle buffer is full (``buffer_size`` samples) before it draws, then the
    step takes ``samples_per_lane``: every lane packs ``buffer_size + samples_per_lane``
    samples of ``seq_len`` tokens before step 1 (all lanes in parallel on the pool). A
    resume replays, per lane, the part of its flush window consumed before the save, then
    the same refill: up to a whole window more.
    """
    tokens = lanes * (buffer_size + samples_per_lane) * seq_len
    seconds = tokens / (rate * max(1, workers))
    why = (
        f"{lanes} lane(s) x ({buffer_size} shuffle-buffer + {samples_per_lane} step) samples "
        f"x {seq_len} tokens = {tokens} tokens before step 1, ~{seconds:.1f} s at "
        f"{rate / 1e6:.2f} Mtok/s per worker x {max(1, workers)}; a resume adds the replay "
        f"of each lane's flush window up to the saved sample"
    )
    return {"tokens": tokens, "seconds": seconds, "why": why}


def _chain(pipeline: Pipeline) -> list[dict[str, str]]:
    """The nodes of lane 0 from source to output (every lane has the same chain)."""
    pool = WorkerPool(0, "thread")
    try:
        out = []
        for node in chain_nodes(pipeline.build_lane(0, pool).source):
            kind = type(node).__name__
            if isinstance(node, AccumulatorNode):
                name = type(node.make(0)).__name__
                out.append({"node": kind, "operator": name, "where": "lane (single-threaded)"})
            elif isinstance(node, OrderedParallelMap):
                name = operator_name(node.fn)
                out.append({"node": kind, "operator": name, "where": "worker pool"})
            else:
                out.append(
                    {"node": kind, "operator": "work items + flush markers", "where": "lane"}
                )
        return out[::-1]
    finally:
        pool.close()


def _state_bytes(pipeline: Pipeline, lanes: list[int], big: bool) -> int:
    v = _BIG if big else 0
    state = RankState(
        fingerprint=pipeline.fingerprint,
        recipe=pipeline.summary,
        num_lanes=pipeline.num_lanes,
        step=v,
        micro=0,
        lanes={i: (v, v) for i in lanes},
        last_sample={i: (1 << 62) - 1 for i in lanes} if big else {},
    ).to_dict()
    return len(json.dumps(state).encode("utf-8"))


def explain(
    pipeline: Pipeline,
    dp_world_size: int,
    *,
    num_workers: int = 2,
    runner: str = "thread",
    lookahead: int = 4,
    tokens_per_s: float = TOKENS_PER_S,
) -> dict[str, Any]:
    """Describe the job a recipe makes at ``dp_world_size`` ranks (a JSON-safe dict).

    Raises:
        RecipeError: If the lanes cannot be shared among ``dp_world_size`` ranks.
    """
    r = pipeline.recipe
    if dp_world_size < 1 or r.num_lanes % dp_world_size:
        raise RecipeError(
            f"num_lanes={r.num_lanes} must be a multiple of --dp-world-size={dp_world_size}"
        )
    per_step = r.global_batch_size // dp_world_size
    ranks = []
    for rank in range(dp_world_size):
        lanes = lanes_for_rank(r.num_lanes, dp_world_size, rank)
        ranks.append(
            {
                "rank": rank,
                "lanes": lanes,
                "samples_per_step": per_step,
                "pool": {"workers": num_workers, "runner": runner},
                "in_flight_work_items": len(lanes) * lookahead,
                "checkpoint_bytes": _state_bytes(pipeline, lanes, big=False),
                "checkpoint_bytes_max": _state_bytes(pipeline, lanes, big=True),
                "first_batch": first_batch(
                    len(lanes),
                    r.shuffle.buffer_size,
                    r.samples_per_lane,
                    r.seq_len,
                    num_workers,
                    tokens_per_s,
                ),
            }
        )
    return {
        "recipe": str(r.source) if r.source else None,
        "fingerprint": pipeline.fingerprint,
        "num_lanes": r.num_lanes,
        "global_batch_size": r.global_batch_size,
        "samples_per_lane_per_step": r.samples_per_lane,
        "seq_len": r.seq_len,
        "flush_every": r.flush_every,
        "datasets": [
            {
                "name": d.name,
                "files": len(d.shards),
                "records": d.num_records,
                "work_items": d.num_work_items,
            }
            for d in pipeline.datasets
        ],
        "lane_chain": _chain(pipeline),
        "ranks": ranks,
    }


def _text(info: dict[str, Any]) -> str:
    lines = [
        f"recipe {info['recipe']}  fingerprint {info['fingerprint'][:16]}",
        f"  {info['num_lanes']} lanes, global batch {info['global_batch_size']} "
        f"({info['samples_per_lane_per_step']} per lane per step), seq_len {info['seq_len']}, "
        f"flush every {info['flush_every']} work items",
    ]
    for d in info["datasets"]:
        lines.append(
            f"  dataset {d['name']}: {d['files']} file(s), {d['records']} records, "
            f"{d['work_items']} work items"
        )
    lines.append("each lane (in order):")
    for k, n in enumerate(info["lane_chain"]):
        lines.append(f"  {k + 1}. {n['operator']}  [{n['node']}, {n['where']}]")
    for rk in info["ranks"]:
        lanes = rk["lanes"]
        span = f"{lanes[0]}..{lanes[-1]}" if len(lanes) > 1 else str(lanes[0])
        pool = rk["pool"]
        lines.append(
            f"rank {rk['rank']}: lanes {span} ({len(lanes)}), {rk['samples_per_step']} samples "
            f"per step, pool {pool['workers']} {pool['runner']} worker(s), "
            f"{rk['in_flight_work_items']} work items in flight, checkpoint "
            f"{rk['checkpoint_bytes']} B (at most {rk['checkpoint_bytes_max']} B)"
        )
        lines.append(f"  first batch: {rk['first_batch']['why']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run ``zephon explain``."""
    if args.num_workers < 0:
        raise RecipeError(f"--num-workers={args.num_workers} must be >= 0")
    if not 1 <= args.tokens_per_s <= 1e12:  # also refuses nan and inf
        raise RecipeError(
            f"--tokens-per-s={args.tokens_per_s} must be a number in [1, 1e12] (tokens per "
            "second per worker)"
        )
    if args.lookahead < 1:
        raise RecipeError(f"--lookahead={args.lookahead} must be >= 1")
    info = explain(
        Pipeline(Recipe.from_toml(args.recipe)),
        args.dp_world_size,
        num_workers=args.num_workers,
        runner=args.runner,
        lookahead=args.lookahead,
        tokens_per_s=args.tokens_per_s,
    )
    print(json.dumps(info) if args.json else _text(info))
    return 0
