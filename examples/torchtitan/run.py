"""The TorchTitan walk-through, end to end: train on dp 2, resume on dp 1 and dp 4, compare.

    python examples/torchtitan/run.py work/

runs the commands of examples/torchtitan/README.md one after another:

1. ``make_assets.py``: data, tokenizer, recipe and ``hf_assets``;
2. TorchTitan's real Trainer (llama3 debug model) on 2 ranks for ``--steps`` steps with a
   checkpoint every ``--save-at`` steps, each rank dumping the batches it trained on
   (``--dataloader.dump-batches``);
3. the same job resumed from the checkpoint on 1 and on 4 ranks;
4. ``zephon digest`` of the recipe next to ``zephon digest-dump`` of each job's batches.

It prints the per-step digests and losses side by side and exits 1 unless every job trained
on exactly the batches ``zephon digest`` names. On a machine without a GPU the Trainer runs
on the CPU through ``zephon_nodes.integrations.torchtitan.train`` (slow, small model only).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
LOSS = re.compile(r"(?<!validate )step:\s*(\d+)\s+loss:\s*([-\d.]+)")


def run(cmd: list[str], log: Path | None = None) -> str:
    """Run a command (in the repo root); return its output; raise with the tail on failure."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(out)
    if proc.returncode != 0:
        raise SystemExit(f"failed (rc={proc.returncode}): {' '.join(cmd)}\n{out[-4000:]}")
    return out


OVERRIDE = "zephon_nodes.integrations.torchtitan.override.use_recipe"
METRICS = "zephon_nodes.integrations.torchtitan.override.log_loader_metrics"


def loader_flags(work: Path, name: str, via: str) -> list[str]:
    """TorchTitan's own debug-model job switched to the recipe: one ``--override.imports``
    (``via="override"``), or the config module of this package (``via="module"``)."""
    if via == "override":
        settings = {
            "recipe": str(work / "recipe.toml"),
            "dump_batches": str(work / "batches" / name),
        }
        return [
            "--module", "llama3", "--config", "llama3_debugmodel",
            "--override.imports", f"{OVERRIDE}={json.dumps(settings)}", METRICS,
        ]  # fmt: skip
    return [
        "--module", "zephon_nodes.integrations.torchtitan.configs",
        "--config", "zephon_llama3_debugmodel",
        "--dataloader.recipe", str(work / "recipe.toml"),
        "--dataloader.dump-batches", str(work / "batches" / name),
    ]  # fmt: skip


def train(
    work: Path, name: str, nproc: int, steps: int, save_at: int, *extra: str, via: str = "override"
) -> dict:
    """One torchrun job of the walk-through; returns its wall time and logged losses."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={nproc}",
        "-m", "zephon_nodes.integrations.torchtitan.train",
        *loader_flags(work, name, via),
        "--hf-assets-path", str(work / "hf_assets"),
        *size_flags(),
        "--training.steps", str(steps),
        "--checkpoint.enable",
        "--checkpoint.interval", str(save_at),
        "--dump-folder", str(work / "runs" / name),
        "--metrics.log-freq", "1",
        "--metrics.enable-tensorboard",
        "--debug.seed", "0",
        *extra,
    ]  # fmt: skip
    t0 = time.perf_counter()
    out = run(cmd, work / "logs" / f"{name}.txt")
    losses: dict[int, float] = {}
    for line in ANSI.sub("", out).splitlines():
        m = LOSS.search(line)
        if m:
            losses.setdefault(int(m.group(1)), float(m.group(2)))
    return {"wall_s": round(time.perf_counter() - t0, 1), "losses": losses}


def digests(cmd: list[str]) -> dict[int, str]:
    """Run a ``zephon`` subcommand printing JSON lines; return ``{step: digest}``."""
    out = run([sys.executable, "-m", "zephon_nodes.cli", *cmd])
    return {
        (d := json.loads(line))["step"]: d["digest"]
        for line in out.splitlines()
        if line.startswith("{")
    }


SEQ_LEN, GLOBAL_BATCH, ROWS = 64, 8, 2


def size_flags() -> list[str]:
    """The batch-size options of the installed TorchTitan (0.3.0 or main), same batches."""
    from zephon_nodes.integrations.torchtitan.api import detect_api

    if detect_api() == "main":
        return [
            "--training.max-context-length", str(SEQ_LEN),
            "--training.num-tokens-per-microbatch-per-dp-rank", str(ROWS * SEQ_LEN),
            "--training.num-tokens-per-train-step", str(GLOBAL_BATCH * SEQ_LEN),
        ]  # fmt: skip
    return [
        "--training.seq-len", str(SEQ_LEN),
        "--training.local-batch-size", str(ROWS),
        "--training.global-batch-size", str(GLOBAL_BATCH),
    ]  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("work", type=Path, help="working folder (assets, runs, batch dumps)")
    ap.add_argument("--steps", type=int, default=6, help="training steps")
    ap.add_argument("--save-at", type=int, default=3, help="checkpoint interval (resume point)")
    ap.add_argument("--json", type=Path, default=None, help="also write the summary here")
    ap.add_argument("--resume-on", default="1,4", help="dp sizes to resume on (comma-separated)")
    ap.add_argument(
        "--via",
        choices=("override", "module"),
        default="override",
        help="switch TorchTitan's debug-model job to the recipe with --override.imports "
        "(default) or run this package's config module",
    )
    args = ap.parse_args()
    work = args.work.resolve()
    steps, save_at = args.steps, args.save_at
    used = [name for name in ("runs", "batches") if (work / name).exists()]
    if used:
        # TorchTitan would resume the old checkpoints there (ignoring the initial load path)
        # and the batch dumps would mix with old ones: every job needs fresh folders.
        print(
            f"error: {work} already holds {' and '.join(used)}/ from an earlier run: give a new "
            f"working folder (or delete that one)",
            file=sys.stderr,
        )
        return 2

    run([sys.executable, str(HERE / "make_assets.py"), str(work), "--seq-len", str(SEQ_LEN),
         "--global-batch-size", str(GLOBAL_BATCH)])  # fmt: skip
    jobs = {"dp2": train(work, "dp2", 2, steps, save_at, via=args.via)}
    ckpt = work / "runs" / "dp2" / "checkpoint" / f"step-{save_at}"
    load = [
        "--checkpoint.initial-load-path", str(ckpt),
        "--checkpoint.no-initial-load-model-only",
    ]  # fmt: skip
    resume_on = [int(x) for x in args.resume_on.split(",") if x]
    for world in resume_on:
        jobs[f"dp{world}"] = train(work, f"dp{world}", world, steps, save_at, *load, via=args.via)

    expected = digests(["digest", str(work / "recipe.toml"), "--steps", str(steps)])
    ok = True
    print(f"{'step':>4} | {'zephon digest':14} | " + " | ".join(f"{k:>22}" for k in jobs))
    for name in jobs:
        jobs[name]["digests"] = digests(["digest-dump", str(work / "batches" / name)])
    for t in range(1, steps + 1):
        cells = []
        for job in jobs.values():
            got = job["digests"].get(t)
            loss = job["losses"].get(t)
            if got is None:
                cells.append(f"{'-':>22}")
                continue
            same = got == expected[t]
            ok &= same
            cells.append(f"{'same' if same else 'DIFFERS':>7} loss {loss if loss else '?':>9}")
        print(f"{t:>4} | {expected[t][:12]}.. | " + " | ".join(cells))
    want = {"dp2": list(range(1, steps + 1))}
    want.update({f"dp{w}": list(range(save_at + 1, steps + 1)) for w in resume_on})
    for name, job in jobs.items():
        if sorted(job["digests"]) != want[name]:
            ok = False
            print(f"{name}: dumped steps {sorted(job['digests'])}, expected {want[name]}")
    print("wall s: " + ", ".join(f"{k} {v['wall_s']}" for k, v in jobs.items()))
    print("every job trained on the batches zephon digest names" if ok else "MISMATCH")
    if args.json:
        summary = {"ok": ok, "expected": expected, "jobs": jobs}
        args.json.write_text(json.dumps(summary, indent=1, sort_keys=True))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
