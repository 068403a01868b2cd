"""torchrun script: TorchTitan's real Trainer (llama3 debug model) with ZephonDataLoader, on CPU.

Applies the test-only CPU patches, records every micro-batch the Trainer takes (per step)
and every logged loss, then runs ``torchtitan.train.main`` with the command line given
after ``--``. Writes ``rows_rank{r}.npz`` and, on rank 0, ``result.json`` to ``--out``.

Usage: torchrun --nproc_per_node R tt_trainer.py --out DIR -- <torchtitan.train arguments>
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from zephon_nodes.integrations.torchtitan import cpu as cpu_patches

cpu_patches.apply()

from torchtitan import train  # noqa: E402
from torchtitan.components.metrics import MetricsProcessor  # noqa: E402
from torchtitan.trainer import Trainer  # noqa: E402

from tests.integrations.tt_helpers import Row, rows_of, save_rows  # noqa: E402

ROWS: dict[int, list[Row]] = {}
LOSSES: dict[int, float] = {}
START: dict[str, int] = {}


def _record_batches() -> None:
    original = Trainer.batch_generator

    def batch_generator(self: Trainer, data_iterable: Any) -> Any:
        START.setdefault("first_step", self.step)
        for item in original(self, data_iterable):
            ROWS.setdefault(self.step, []).extend(rows_of(item))
            yield item

    Trainer.batch_generator = batch_generator  # type: ignore[method-assign]


def _record_losses() -> None:
    original = MetricsProcessor.log

    def log(self: MetricsProcessor, step: int, global_avg_loss: float, *a: Any, **kw: Any) -> Any:
        LOSSES[step] = float(global_avg_loss)
        return original(self, step, global_avg_loss, *a, **kw)

    MetricsProcessor.log = log  # type: ignore[method-assign]


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--")
    own, rest = argv[:split], argv[split + 1 :]
    out = Path(own[own.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    _record_batches()
    _record_losses()
    t0 = time.perf_counter()
    sys.argv = [sys.argv[0], *rest]
    train.main()
    wall = time.perf_counter() - t0
    rank = int(os.environ.get("RANK", "0"))
    save_rows(out / f"rows_rank{rank}.npz", ROWS)
    if rank == 0:
        result = {
            "world": int(os.environ.get("WORLD_SIZE", "1")),
            "first_step": START.get("first_step"),
            "losses": LOSSES,
            "wall_s": wall,
        }
        (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
