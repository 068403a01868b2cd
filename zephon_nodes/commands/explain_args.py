"""``zephon explain``'s arguments: light, so that ``--help`` imports no engine.

The command runs in :mod:`zephon_nodes.commands.explain` (the engine, and with it torch,
imported only when it runs; see :mod:`zephon_nodes.cli`).
"""

from __future__ import annotations

from typing import Any

from zephon_nodes.commands.options import add_workers_arg
from zephon_nodes.engine.pool import RUNNERS

__all__ = ["TOKENS_PER_S", "add_parser"]

# Tokens per second one worker thread tokenizes, for the first-batch estimate: sentencepiece
# on the benchmark machine (docs/performance.md, "First batch"); --tokens-per-s overrides.
TOKENS_PER_S = 550_000


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        "explain",
        help="print what each rank will run: lanes, operators, pools, checkpoint size",
        description=(
            "Open the recipe (datasets indexed, tokenizer loaded) and describe the job "
            "without producing a batch: the datasets, the operator chain of every lane, "
            "and per rank its lanes, worker pool and the size of its checkpoint state."
        ),
    )
    p.add_argument("recipe", help="recipe TOML file")
    p.add_argument("--dp-world-size", type=int, default=1, help="data-parallel ranks")
    add_workers_arg(p)
    p.add_argument("--runner", choices=RUNNERS, default="thread", help="worker runner")
    p.add_argument("--lookahead", type=int, default=4, help="work items each lane submits ahead")
    p.add_argument(
        "--tokens-per-s",
        type=float,
        default=TOKENS_PER_S,
        help="tokens per second per worker, for the first-batch estimate (default 550000)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(run="zephon_nodes.commands.explain")
