"""The worked dynamic-mixture controller on TorchTitan's real Trainer: dp 2, then resumes.

    python examples/curriculum/run.py work/ [--steps 40 --save-at 20 --every 4]

1. makes the walk-through's assets (``examples/torchtitan/make_assets.py``: a sentencepiece
   tokenizer and ``hf_assets``) and three domains that are not equally hard to learn:
   ``stdlib`` (Python's documentation), ``repeat`` (periodic strings, easy) and ``noise``
   (random letters, hard), mixed 1/3 each by the recipe;
2. trains the llama3 debug model with :class:`examples.curriculum.trainer.CurriculumTrainer`
   (TorchTitan's Trainer + the controller) on 2 ranks, a checkpoint every ``--save-at``
   steps, each rank dumping the batches it trained on (``--dataloader.dump-batches``);
3. resumes the checkpoint of step ``--save-at`` on 1 and on 4 ranks (``--resume-on``);
4. compares: each job's dumped batches (``zephon digest-dump``) against ``zephon digest``
   of the recipe with the dp 2 job's decision log (``--mixture-updates``); the decision log
   of every job; the losses after the resume.

It exits 1 unless all batches are equal to the digest, all decision logs are equal, and the
losses after the resume are within ``--loss-rtol`` of the uninterrupted run. On a CPU the
Trainer runs through ``zephon_nodes.integrations.torchtitan.train`` (slow: small model).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1])]

from examples.torchtitan.make_assets import make_assets  # noqa: E402
from examples.torchtitan.run import ANSI, LOSS, run  # noqa: E402
from zephon_nodes.cli import main as zephon  # noqa: E402

DOMAINS = ("stdlib", "repeat", "noise")
SEQ_LEN, GLOBAL_BATCH, NUM_LANES = 64, 8, 4

RECIPE = """\
# The curriculum example's recipe: three domains, equal weights, endless.
seed = 11
num_lanes = {num_lanes}
global_batch_size = {global_batch_size}
seq_len = {seq_len}
flush_every = 2

[tokenizer]
kind = "sentencepiece"
path = "tok.model"
{datasets}
[work]
chunk_size = 2
epochs = "inf"

[shuffle]
buffer_size = 4
"""


def write_domains(work: Path, docs: int = 400) -> Path:
    """Write ``repeat.jsonl`` and ``noise.jsonl`` next to the stdlib shards; the recipe."""
    rng = random.Random(0)
    for name in ("repeat", "noise"):
        with open(work / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for _ in range(docs):
                if name == "repeat":
                    unit = " ".join(rng.choice(["def", "class", "return", "self"]) for _ in "ab")
                    text = " ".join([unit] * rng.randint(10, 40))
                else:
                    text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(300))
                f.write(json.dumps({"text": text}) + "\n")
    paths = {"stdlib": "data/*.jsonl.zst", "repeat": "repeat.jsonl", "noise": "noise.jsonl"}
    datasets = "".join(
        f'\n[[datasets]]\nname = "{n}"\npaths = ["{paths[n]}"]\nweight = 1.0\n'
        'on_exhausted = "repeat"\n'
        for n in DOMAINS
    )
    recipe = work / "recipe.toml"
    recipe.write_text(
        RECIPE.format(
            num_lanes=NUM_LANES,
            global_batch_size=GLOBAL_BATCH,
            seq_len=SEQ_LEN,
            datasets=datasets,
        ),
        encoding="utf-8",
    )
    return recipe


def train(work: Path, name: str, nproc: int, args: argparse.Namespace, *extra: str) -> dict:
    """One torchrun job; returns its wall time, losses and journal (``curriculum.jsonl``)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={nproc}",
        "-m", "zephon_nodes.integrations.torchtitan.train",
        "--module", "examples.curriculum.trainer",
        "--config", "curriculum_debugmodel",
        "--dataloader.recipe", str(work / "recipe.toml"),
        "--dataloader.dump-batches", str(work / "batches" / name),
        "--hf-assets-path", str(work / "hf_assets"),
        "--training.seq-len", str(SEQ_LEN),
        "--training.local-batch-size", "2",
        "--training.global-batch-size", str(GLOBAL_BATCH),
        "--training.steps", str(args.steps),
        "--checkpoint.enable",
        "--checkpoint.interval", str(args.save_at),
        "--dump-folder", str(work / "runs" / name),
        "--metrics.log-freq", "1",
        "--debug.seed", "0",
        "--curriculum.every", str(args.every),
        "--curriculum.eta", str(args.eta),
        *extra,
    ]  # fmt: skip
    t0 = time.perf_counter()
    out = run(cmd, work / "logs" / f"{name}.txt")
    losses: dict[int, float] = {}
    for line in ANSI.sub("", out).splitlines():
        m = LOSS.search(line)
        if m:
            losses.setdefault(int(m.group(1)), float(m.group(2)))
    journal = [
        json.loads(line)
        for line in (work / "runs" / name / "curriculum.jsonl").read_text().splitlines()
    ]
    return {"wall_s": round(time.perf_counter() - t0, 1), "losses": losses, "journal": journal}


def digests(cmd: list[str]) -> dict[int, str]:
    """Run a ``zephon`` subcommand printing JSON lines (in this process); ``{step: digest}``."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        if zephon(cmd) != 0:
            raise SystemExit(f"zephon {' '.join(cmd)} failed")
    return {
        (d := json.loads(line))["step"]: d["digest"]
        for line in buf.getvalue().splitlines()
        if line.startswith("{")
    }


def decision_log(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's decisions as ``--mixture-updates`` JSON (``[{"step", "weights"}]``)."""
    return [
        {"step": r["step"], "weights": dict(zip(DOMAINS, r["decision"], strict=True))}
        for r in job["journal"]
        if r["decision"] is not None
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("work", type=Path, help="working folder (assets, runs, batch dumps)")
    ap.add_argument("--steps", type=int, default=40, help="training steps")
    ap.add_argument("--save-at", type=int, default=20, help="checkpoint interval (resume point)")
    ap.add_argument("--every", type=int, default=4, help="steps between decisions")
    ap.add_argument("--eta", type=float, default=0.3, help="controller step size")
    ap.add_argument("--loss-rtol", type=float, default=1e-4, help="resumed-loss tolerance")
    ap.add_argument("--domain-rtol", type=float, default=1e-2, help="per-domain tolerance")
    ap.add_argument("--json", type=Path, default=None, help="also write the summary here")
    ap.add_argument("--resume-on", default="1,4", help="dp sizes to resume on (comma-separated)")
    args = ap.parse_args()
    resume_on = [int(x) for x in args.resume_on.split(",") if x]
    work = args.work.resolve()
    t0 = time.perf_counter()
    make_assets(work, seq_len=SEQ_LEN, num_lanes=NUM_LANES, global_batch_size=GLOBAL_BATCH)
    write_domains(work)
    jobs = {"dp2": train(work, "dp2", 2, args)}
    ckpt = work / "runs" / "dp2" / "checkpoint" / f"step-{args.save_at}"
    load = ["--checkpoint.initial-load-path", str(ckpt), "--checkpoint.no-initial-load-model-only"]
    # The resumes are independent jobs (each reads the dp 2 checkpoint): run them at once.
    with ThreadPoolExecutor(max(1, len(resume_on))) as ex:
        resumed = {w: ex.submit(train, work, f"dp{w}", w, args, *load) for w in resume_on}
        jobs.update({f"dp{w}": f.result() for w, f in resumed.items()})

    log = decision_log(jobs["dp2"])
    (work / "decisions.json").write_text(json.dumps(log, indent=1))
    cmd = ["digest", str(work / "recipe.toml"), "--steps", str(args.steps)]
    expected = digests([*cmd, "--mixture-updates", str(work / "decisions.json")])
    static = digests(cmd)  # what the batches would have been without the controller
    ok = True
    summary: dict[str, Any] = {"steps": args.steps, "save_at": args.save_at, "log": log}
    summary["dp2_losses"] = [jobs["dp2"]["losses"][t] for t in range(1, args.steps + 1)]
    after = range(args.save_at + 1, args.steps + 1)
    for name, job in jobs.items():
        got = digests(["digest-dump", str(work / "batches" / name)])
        steps = range(1, args.steps + 1) if name == "dp2" else after
        same = sum(got.get(t) == expected[t] for t in steps)
        first = steps[0]
        job_log = [e for e in decision_log(job) if e["step"] >= first]
        same_log = job_log == [e for e in log if e["step"] >= first]
        losses = {r["step"]: r for r in job["journal"]}
        summary[name] = {
            "digests": got,
            "wall_s": job["wall_s"],
            "steps": len(steps),
            "same_batches": same,
            "dumped_steps": sorted(got),
            "same_log": same_log,
            "min_margin": min((r["margin"] for r in job["journal"] if "margin" in r), default=None),
        }
        ok &= same == len(steps) and sorted(got) == list(steps) and same_log
        if name != "dp2":
            base = jobs["dp2"]
            rdiff = [abs(job["losses"][t] - base["losses"][t]) / base["losses"][t] for t in after]
            domain = [
                abs(a - b) / a
                for t in after
                for a, b in zip(base["journal"][t - 1]["loss"], losses[t]["loss"], strict=True)
                if a is not None and b is not None
            ]
            summary[name]["losses"] = [job["losses"][t] for t in after]
            summary[name]["max_raw_weight_diff"] = max(
                abs(a - b)
                for t in after
                if "raw" in losses[t]
                for a, b in zip(base["journal"][t - 1]["raw"], losses[t]["raw"], strict=True)
            )
            summary[name]["max_loss_rdiff"] = max(rdiff)
            summary[name]["max_domain_loss_rdiff"] = max(domain)
            ok &= max(rdiff) <= args.loss_rtol and max(domain) <= args.domain_rtol
    summary["batches_moved_by_decisions"] = sum(
        expected[t] != static[t] for t in range(1, args.steps + 1)
    )
    summary["expected"] = expected
    summary["ok"] = ok
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    summary["journal"] = {k: v["journal"] for k, v in jobs.items()}
    brief = {k: v for k, v in summary.items() if k not in ("journal", "expected", "dp2_losses")}
    for name in jobs:
        skip = ("digests", "dumped_steps")
        brief[name] = {k: v for k, v in summary[name].items() if k not in skip}
    print(json.dumps(brief))
    print("every job trained on the digested batches with the same decisions" if ok else "MISMATCH")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
