"""Re-laning with TorchTitan's real Trainer: 4 lanes on dp 2, re-laned to 6 on dp 3 and dp 6.

    python examples/torchtitan/relane.py work/

1. ``make_assets.py``: data, tokenizer, a 4-lane recipe with ``global_batch_size = 12``;
2. TorchTitan's real Trainer (llama3 debug model) on 2 ranks, checkpoint at ``--save-at``;
3. the same recipe at ``num_lanes = 6``, resumed from that checkpoint on 3 and on 6 ranks
   with ``--dataloader.relane-from 4`` (each job re-lanes the checkpoint at load);
4. the expected batches from the command line: ``zephon digest --save-at`` on the 4-lane
   recipe, ``zephon relane`` to 6 lanes, ``zephon digest --resume-from``; each job's dumped
   batches (``zephon digest-dump``) must equal them, and the two jobs' losses must agree.

Exits 1 on any difference. Slow on a CPU (three Trainer jobs, eleven processes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as walk  # noqa: E402  (the walk-through's helpers)
from run import digests, run  # noqa: E402

GLOBAL_BATCH, LOSS_RTOL = 12, 1e-4


def train(work: Path, name: str, nproc: int, steps: int, save_at: int, *extra: str) -> dict:
    """The walk-through's Trainer job with ``global_batch_size = 12`` (and ``extra`` flags)."""
    walk.GLOBAL_BATCH = GLOBAL_BATCH
    return walk.train(work, name, nproc, steps, save_at, *extra)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("work", type=Path, help="working folder (assets, runs, batch dumps)")
    ap.add_argument("--steps", type=int, default=6, help="training steps")
    ap.add_argument("--save-at", type=int, default=3, help="checkpoint (and re-lane) step")
    ap.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = ap.parse_args()
    work = args.work.resolve()
    steps, save_at = args.steps, args.save_at
    run([sys.executable, str(HERE / "make_assets.py"), str(work), "--num-lanes", "4",
         "--global-batch-size", str(GLOBAL_BATCH)])  # fmt: skip
    four = work / "recipe.toml"
    # The re-laned jobs' folder: the same data, tokenizer and assets; the recipe at 6 lanes.
    work6 = work / "six"
    work6.mkdir(exist_ok=True)
    for name in ("data", "tok.model", "hf_assets"):
        if not (work6 / name).exists():
            (work6 / name).symlink_to(work / name)
    six = work6 / "recipe.toml"
    six.write_text(four.read_text().replace("num_lanes = 4", "num_lanes = 6"))
    jobs = {"dp2": train(work, "dp2", 2, steps, save_at)}
    ckpt = work / "runs" / "dp2" / "checkpoint" / f"step-{save_at}"
    for world in (3, 6):
        jobs[f"dp{world}"] = train(
            work6, f"dp{world}", world, steps, save_at, "--dataloader.relane-from", "4",
            "--checkpoint.initial-load-path", str(ckpt),
            "--checkpoint.no-initial-load-model-only",
        )  # fmt: skip
    zephon = [sys.executable, "-m", "zephon_nodes.cli"]
    run([*zephon, "digest", str(four), "--steps", str(save_at), "--save-at", str(save_at),
         "--checkpoint-dir", str(work / "state4")])  # fmt: skip
    run([*zephon, "relane", str(four), str(work / "state4"), "--num-lanes", "6",
         "--output", str(work / "state6")])  # fmt: skip
    expected = digests(["digest", str(six), "--steps", str(steps - save_at),
                        "--resume-from", str(work / "state6")])  # fmt: skip
    ok = sorted(expected) == list(range(save_at + 1, steps + 1))
    for name in ("dp3", "dp6"):
        jobs[name]["digests"] = digests(["digest-dump", str(work6 / "batches" / name)])
        ok &= jobs[name]["digests"] == expected
        log = (work6 / "logs" / f"{name}.txt").read_text()
        ok &= f"re-laned the checkpoint of step {save_at} from 4 to 6 lanes" in log
    for t in range(save_at + 1, steps + 1):
        a, b = jobs["dp3"]["losses"].get(t), jobs["dp6"]["losses"].get(t)
        same = a is not None and b is not None and abs(a - b) <= LOSS_RTOL * abs(a)
        ok &= same
        d3 = jobs["dp3"]["digests"].get(t, "-")[:12]
        print(f"step {t}: expected {expected.get(t, '-')[:12]} dp3 {d3} loss {a} | dp6 loss {b}")
    print("wall s: " + ", ".join(f"{k} {v['wall_s']}" for k, v in jobs.items()))
    print("both re-laned jobs trained on the batches zephon relane names" if ok else "MISMATCH")
    if args.json:
        args.json.write_text(json.dumps({"ok": ok, "expected": expected, "jobs": jobs}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
