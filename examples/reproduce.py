#!/usr/bin/env python
"""Reproduce, at CPU scale, the two experiments that motivate zephon-nodes (one command).

1. **Resume on another number of ranks.** TorchTitan 0.3.0's real ``Trainer`` (llama3
   ``debugmodel``, seq_len 64) trains at dp 2 and checkpoints at step ``k``; the checkpoint
   is resumed at dp 1 (gradient accumulation), dp 2 and dp 4. Three loaders: zephon-nodes'
   ``ZephonDataLoader``; TorchTitan's default ``HuggingFaceTextDataLoader`` (it refuses
   another dp: the error is captured); a standard rank-sharded loader that resumes by
   skipping (``examples/repro/naive_loader.py``). Every global batch the Trainer takes is
   recorded and hashed (SHA-256), and every logged loss kept.
2. **Training from scratch at dp 1, 2 and 4** for a fixed number of tokens, with
   zephon-nodes and with the rank-sharded loader (a tiny causal LM, real data parallelism
   over gloo, ``examples/repro/scratch_job.py``); the held-out loss is tracked and the
   spread (max - min) of the final held-out loss across dp sizes reported per loader.

Everything runs on CPU with torchrun (gloo). The Trainer needs TorchTitan's CPU patches
(``zephon_nodes.integrations.torchtitan.cpu``, opt-in, applied by the torchrun script
``tests/integrations/scripts/tt_trainer.py``, reused here as is). The corpus is cut from
Python's own stdlib sources (no network).

Usage (from the repository root; needs the ``torchtitan``, ``trainer`` and ``report``
extras)::

    python examples/reproduce.py --out reproduce-out          # full: ~10 min on 2 cores
    python examples/reproduce.py --out reproduce-out --quick  # a few steps (CI)

Writes to ``--out``: ``resume_loss.png``, ``resume_digests.png``, ``scratch_eval.png``,
``summary.md`` (machine, versions, date, tables, figures, wall times) and ``results.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from tests.integrations.assets import (  # noqa: E402
    Assets,
    build_assets,
    stdlib_documents,
    write_corpus,
    write_recipe,
)
from tests.integrations.tt_helpers import Row, content_digest, load_rows, step_digest  # noqa: E402
from zephon_nodes.verification.digest import global_batch_digest  # noqa: E402

TT_TRAINER = REPO / "tests" / "integrations" / "scripts" / "tt_trainer.py"
SCRATCH_JOB = REPO / "examples" / "repro" / "scratch_job.py"
RUN_TIMEOUT_S = 900
LOADERS = ("zephon", "naive", "titan")
LABELS = {
    "zephon": "zephon-nodes",
    "naive": "rank-sharded, resume by skipping",
    "titan": "TorchTitan default (HuggingFaceTextDataLoader)",
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes of one reproduction (``FULL`` or ``QUICK``)."""

    steps: int
    """Trainer steps of the uninterrupted run (experiment 1)."""
    save_at: int
    """Step of the checkpoint that is resumed."""
    resume_dps: tuple[int, ...]
    """dp sizes the dp-2 checkpoint is resumed at (zephon-nodes and rank-sharded)."""
    titan_dps: tuple[int, ...]
    """dp sizes TorchTitan's default loader is asked to resume at."""
    scratch_steps: int
    """Optimizer steps of each from-scratch run (experiment 2)."""
    scratch_dps: tuple[int, ...]
    eval_every: int
    num_docs: int = 400
    heldout_docs: int = 60
    global_batch_size: int = 8
    seq_len: int = 64
    num_lanes: int = 4


FULL = Settings(
    steps=30,
    save_at=15,
    resume_dps=(1, 2, 4),
    titan_dps=(1, 4),
    scratch_steps=300,
    scratch_dps=(1, 2, 4),
    eval_every=10,
)
QUICK = Settings(
    steps=4,
    save_at=2,
    resume_dps=(1, 2, 4),
    titan_dps=(1, 4),
    scratch_steps=12,
    scratch_dps=(1, 2, 4),
    eval_every=4,
    heldout_docs=20,
)


# ---------------------------------------------------------------- running torchrun jobs


@dataclasses.dataclass(frozen=True)
class Job:
    """How a torchrun job ended: exit code, wall seconds, CPU seconds of all its processes."""

    rc: int
    wall_s: float
    cpu_s: float
    retries: int = 0


def torchrun(nproc: int, script: Path, args: Sequence[str], log: Path, hf_home: Path) -> Job:
    """Run ``script`` under torchrun with ``nproc`` CPU processes (gloo)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(
        OMP_NUM_THREADS="1",
        HF_HOME=str(hf_home),
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(script),
        *args,
    ]
    log.parent.mkdir(parents=True, exist_ok=True)
    t0, c0 = time.perf_counter(), _children_cpu()
    for attempt in range(1 + CRASH_RETRIES):
        with open(log, "w") as f:
            proc = subprocess.run(
                cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S
            )
        if proc.returncode == 0 or CRASH not in log.read_text(errors="replace"):
            break
        shutil.copyfile(log, log.with_suffix(f".crash{attempt}.txt"))
    return Job(proc.returncode, time.perf_counter() - t0, _children_cpu() - c0, attempt)


CRASH = "terminate called without an active exception"
"""A rare abort of a rank process while it starts (under heavy CPU load; seen twice in a row)."""
CRASH_RETRIES = 3


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def log_tail(log: Path, n: int = 3000) -> str:
    return log.read_text(errors="replace")[-n:]


ERROR_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:\w+\.)*\w*(?:Error|Exception): .+)$", re.M)


WRAPPERS = ("CheckpointException", "ChildFailedError")


def first_error(log: Path) -> str:
    """The first ``SomethingError: message`` line of a failed job's log.

    Wrapper exceptions (DCP's ``CheckpointException``, torchrun's ``ChildFailedError``) are
    passed over when the log holds the error they wrap.
    """
    found = [e.strip() for e in ERROR_LINE.findall(log.read_text(errors="replace"))]
    found = [e for e in found if "Errno" not in e] or found
    inner = [e for e in found if not any(w in e for w in WRAPPERS)]
    return (inner or found or ["(no error line found; see the log)"])[0]


# ---------------------------------------------------------------- experiment 1


def trainer_args(
    loader: str, a: Assets, recipe: Path, titan_data: Path, s: Settings, dump: Path, steps: int
) -> list[str]:
    """TorchTitan ``train`` arguments for one loader (llama3 debugmodel on CPU)."""
    if loader == "zephon":
        model = [
            "--module",
            "zephon_nodes.integrations.torchtitan.configs",
            "--config",
            "zephon_llama3_debugmodel",
            "--dataloader.recipe",
            str(recipe),
        ]
    elif loader == "naive":
        model = [
            "--module",
            "examples.repro.naive_loader",
            "--config",
            "naive_llama3_debugmodel",
            "--dataloader.recipe",
            str(recipe),
        ]
    else:
        model = [
            "--module",
            "llama3",
            "--config",
            "llama3_debugmodel",
            "--dataloader.dataset_path",
            str(titan_data),
        ]
    return [
        *model,
        "--hf_assets_path",
        str(a.hf_assets),
        "--training.seq_len",
        str(s.seq_len),
        "--training.local_batch_size",
        "2",
        "--training.global_batch_size",
        str(s.global_batch_size),
        "--training.steps",
        str(steps),
        "--checkpoint.enable",
        "--checkpoint.interval",
        str(s.save_at),
        "--dump_folder",
        str(dump),
        "--parallelism.spmd_backend",
        "partial_dtensor",
        "--metrics.log_freq",
        "1",
        "--debug.seed",
        "0",
    ]


def read_trainer_run(out: Path, world: int, loader: str, spl: int) -> dict[str, Any]:
    """Losses, and per-step global-batch digests, of a finished ``tt_trainer.py`` run."""
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    result["losses"] = {int(k): v for k, v in result["losses"].items()}
    rows = [load_rows(out / f"rows_rank{r}.npz") for r in range(world)]
    steps = sorted(rows[0])
    per_step: dict[int, list[list[Row]]] = {t: [rr[t] for rr in rows] for t in steps}
    if loader == "zephon":  # lane-labelled, as zephon_nodes.verification.simulate hashes it
        result["digests"] = {t: step_digest(per_step[t], spl) for t in steps}
    else:  # rank order, as zephon_nodes.verification.baselines.naive_digests hashes it
        result["digests"] = {
            t: global_batch_digest((0, r) for rr in per_step[t] for r in rr) for t in steps
        }
    result["contents"] = {t: content_digest(per_step[t]) for t in steps}
    return result


def experiment_resume(
    a: Assets, recipe: Path, work: Path, s: Settings, say: Callable[[str], None]
) -> dict[str, Any]:
    """Experiment 1: checkpoint at dp 2, resume at other dp sizes, with the three loaders."""
    titan_data = work / "titan_data"
    titan_data.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(a.corpus, titan_data / "train.jsonl")
    spl = s.global_batch_size // s.num_lanes
    hf_home = work / "hf_home"
    runs: dict[str, Any] = {}
    for loader in LOADERS:
        root = work / f"resume_{loader}"
        base_steps = s.save_at if loader == "titan" else s.steps
        out, dump = root / "dp2", root / "dump_dp2"
        args = trainer_args(loader, a, recipe, titan_data, s, dump, base_steps)
        job = torchrun(2, TT_TRAINER, ["--out", str(out), "--", *args], out / "log.txt", hf_home)
        if job.rc != 0:
            raise RuntimeError(
                f"{loader} uninterrupted run failed (rc={job.rc}):\n{log_tail(out / 'log.txt')}"
            )
        base = read_trainer_run(out, 2, loader, spl)
        base.update(run_wall_s=job.wall_s, run_cpu_s=job.cpu_s, retries=job.retries)
        say(f"  {loader:6s} dp2 uninterrupted, {base_steps} steps: {job.wall_s:.0f} s")
        resumed: dict[int, Any] = {}
        load = [
            "--checkpoint.initial_load_path",
            str(dump / "checkpoint" / f"step-{s.save_at}"),
            "--checkpoint.no-initial_load_model_only",
        ]
        for world in s.titan_dps if loader == "titan" else s.resume_dps:
            out = root / f"resume_dp{world}"
            args = trainer_args(
                loader, a, recipe, titan_data, s, root / f"dump_resume_dp{world}", s.steps
            )
            argv = ["--out", str(out), "--", *args, *load]
            job = torchrun(world, TT_TRAINER, argv, out / "log.txt", hf_home)
            if job.rc == 0:
                r = read_trainer_run(out, world, loader, spl)
                say(f"  {loader:6s} dp2 -> dp{world}: step {r['first_step']}+, {job.wall_s:.0f} s")
            elif loader == "titan":
                r = {"error": first_error(out / "log.txt"), "rc": job.rc}
                say(f"  {loader:6s} dp2 -> dp{world}: refused: {r['error'][:80]}")
            else:
                raise RuntimeError(
                    f"{loader} resume at dp {world} failed (rc={job.rc}):\n"
                    f"{log_tail(out / 'log.txt')}"
                )
            r.update(run_wall_s=job.wall_s, run_cpu_s=job.cpu_s, retries=job.retries)
            resumed[world] = r
        runs[loader] = {"base": base, "resumed": resumed}
    return runs


def reference_digests(recipe: Path, s: Settings) -> dict[str, list[str]]:
    """Independent in-process references: the core's simulate and the naive baseline, dp 2."""
    from zephon_nodes.engine.pipeline import Pipeline
    from zephon_nodes.recipe import Recipe
    from zephon_nodes.verification.baselines import naive_digests
    from zephon_nodes.verification.simulate import simulate

    # The Trainer's batches carry no dataset_ids (TorchTitan passes input keys to the model).
    p = Pipeline(Recipe.from_toml(recipe), provenance=False)
    return {
        "zephon": [r.digest for r, _ in simulate(p, 2, s.steps, num_workers=1)],
        "naive": naive_digests(p, 2, s.steps),
    }


def resume_checks(runs: dict[str, Any], refs: dict[str, list[str]], s: Settings) -> dict[str, Any]:
    """Per loader and resumed dp: steps whose global batch equals the uninterrupted run's."""
    after = list(range(s.save_at + 1, s.steps + 1))
    table: dict[str, Any] = {}
    for loader in ("zephon", "naive"):
        base = runs[loader]["base"]
        ref_ok = [base["digests"][t] for t in range(1, s.steps + 1)] == refs[loader]
        rows = {}
        for world, r in runs[loader]["resumed"].items():
            rows[world] = {
                "first_step": r["first_step"],
                "exact": [r["digests"].get(t) == base["digests"][t] for t in after],
                "same_rows": [r["contents"].get(t) == base["contents"][t] for t in after],
                "max_abs_loss_diff": max(abs(r["losses"][t] - base["losses"][t]) for t in after),
            }
        table[loader] = {"uninterrupted_matches_reference": ref_ok, "resumed": rows}
    table["titan"] = {
        "resumed": {w: r.get("error", "resumed") for w, r in runs["titan"]["resumed"].items()}
    }
    return table


# ---------------------------------------------------------------- experiment 2


def write_heldout(work: Path, recipe_kwargs: dict[str, Any], a: Assets, s: Settings) -> Path:
    """Pack held-out documents (never in the training corpus) into rows; save them as npz."""
    from examples.repro.naive_loader import rank_samples
    from zephon_nodes.engine.pipeline import Pipeline
    from zephon_nodes.recipe import Recipe

    docs = stdlib_documents(s.num_docs + s.heldout_docs)[s.num_docs :]
    held = dataclasses.replace(a, corpus=write_corpus(work / "heldout.jsonl", docs))
    path = write_recipe(work / "heldout.toml", held, **recipe_kwargs, epochs=1)
    rows = list(rank_samples(Pipeline(Recipe.from_toml(path)), 1, 0))
    out = work / "heldout.npz"
    np.savez(out, **{k: np.stack([r[k] for r in rows]) for k in ("input", "labels")})
    return out


def experiment_scratch(
    a: Assets, recipe: Path, heldout: Path, work: Path, s: Settings, say: Callable[[str], None]
) -> dict[str, Any]:
    """Experiment 2: from scratch at each dp size, per loader; held-out loss curves."""
    import sentencepiece as spm

    vocab = spm.SentencePieceProcessor(model_file=str(a.sp_model)).get_piece_size()
    runs: dict[str, Any] = {}
    for loader in ("zephon", "naive"):
        runs[loader] = {}
        for world in s.scratch_dps:
            out = work / f"scratch_{loader}" / f"dp{world}"
            args = [
                "--recipe",
                str(recipe),
                "--loader",
                loader,
                "--heldout",
                str(heldout),
                "--out",
                str(out),
                "--steps",
                str(s.scratch_steps),
                "--eval-every",
                str(s.eval_every),
                "--vocab",
                str(vocab),
            ]
            job = torchrun(world, SCRATCH_JOB, args, out / "log.txt", work / "hf_home")
            if job.rc != 0:
                raise RuntimeError(
                    f"scratch {loader} dp{world} failed (rc={job.rc}):\n{log_tail(out / 'log.txt')}"
                )
            r = json.loads((out / "result.json").read_text())
            r["train"] = {int(k): v for k, v in r["train"].items()}
            r["eval"] = {int(k): v for k, v in r["eval"].items()}
            r.update(run_wall_s=job.wall_s, run_cpu_s=job.cpu_s, retries=job.retries)
            runs[loader][world] = r
            say(
                f"  {loader:6s} dp{world}: final held-out loss {r['eval'][s.scratch_steps]:.6f}, "
                f"{job.wall_s:.0f} s"
            )
    return runs


def spreads(runs: dict[str, Any], s: Settings) -> dict[str, dict[str, float]]:
    """Per loader: the final held-out losses per dp and their spread (max - min)."""
    out: dict[str, dict[str, float]] = {}
    for loader, by_dp in runs.items():
        finals = {f"dp{w}": r["eval"][s.scratch_steps] for w, r in by_dp.items()}
        out[loader] = {**finals, "spread": max(finals.values()) - min(finals.values())}
    return out


# ---------------------------------------------------------------- plots


COLORS = {1: "tab:blue", 2: "tab:green", 4: "tab:red"}
FLOOR = 1e-9


def plot_resume(runs: dict[str, Any], s: Settings, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True, sharey="row")
    for col, loader in enumerate(("zephon", "naive")):
        base = runs[loader]["base"]
        steps = sorted(base["losses"])
        ax, dax = axes[0][col], axes[1][col]
        ax.plot(
            steps,
            [base["losses"][t] for t in steps],
            color="black",
            lw=4,
            alpha=0.35,
            label="uninterrupted, dp 2",
        )
        for world, r in runs[loader]["resumed"].items():
            rs = sorted(r["losses"])
            ax.plot(
                rs,
                [r["losses"][t] for t in rs],
                color=COLORS[world],
                marker="o",
                ms=3,
                lw=1.2,
                label=f"resumed at dp {world}",
            )
            diff = [max(abs(r["losses"][t] - base["losses"][t]), FLOOR) for t in rs]
            dax.semilogy(rs, diff, color=COLORS[world], marker="o", ms=3, label=f"dp {world}")
        for a_ in (ax, dax):
            a_.axvline(s.save_at, color="gray", ls="--", lw=1)
        ax.set_title(LABELS[loader])
        ax.legend(fontsize=8)
        dax.axhline(FLOOR, color="gray", lw=0.5)
        dax.set_xlabel("training step (checkpoint at dp 2 = dashed line)")
        dax.legend(fontsize=8)
    axes[0][0].set_ylabel("training loss")
    axes[1][0].set_ylabel(f"|resumed - uninterrupted| loss\n(0 drawn at {FLOOR:g})")
    fig.suptitle(
        "TorchTitan Trainer (llama3 debugmodel, CPU): checkpoint at dp 2, resume elsewhere"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_digests(checks: dict[str, Any], s: Settings, path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    labels, grid = [], []
    for loader in ("zephon", "naive"):
        name = "zephon-nodes" if loader == "zephon" else "rank-sharded"
        for world, row in checks[loader]["resumed"].items():
            labels.append(f"{name}, dp 2 -> dp {world}")
            pairs = zip(row["exact"], row["same_rows"], strict=True)
            grid.append([2 if e else (1 if c else 0) for e, c in pairs])
    for world in checks["titan"]["resumed"]:
        labels.append(f"TorchTitan default, dp 2 -> dp {world}")
        grid.append([-1] * (s.steps - s.save_at))
    after = list(range(s.save_at + 1, s.steps + 1))
    colors = ["#bbbbbb", "#d62728", "#ff9f1c", "#2ca02c"]
    fig, ax = plt.subplots(figsize=(max(8.0, 3.5 + 0.35 * len(after)), 0.4 * len(labels) + 1.8))
    ax.imshow(np.asarray(grid) + 1, cmap=ListedColormap(colors), vmin=0, vmax=3, aspect="auto")
    ax.set_yticks(range(len(labels)), labels, fontsize=9)
    ax.set_xticks(range(len(after)), [str(t) for t in after], fontsize=8)
    ax.set_xticks(np.arange(-0.5, len(after)), minor=True)
    ax.set_yticks(np.arange(-0.5, len(labels)), minor=True)
    ax.grid(which="minor", color="white", lw=1)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("training step after the resume")
    ax.set_title("Global batch SHA-256 of each step vs the uninterrupted dp 2 run", fontsize=10)
    legend = [
        Patch(color=colors[3], label="identical"),
        Patch(color=colors[2], label="same rows, other order"),
        Patch(color=colors[1], label="different"),
        Patch(color=colors[0], label="could not resume"),
    ]
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4,
              fontsize=8, frameon=False)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_scratch(runs: dict[str, Any], sp: dict[str, Any], s: Settings, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    tokens_per_step = s.global_batch_size * s.seq_len
    names = {"zephon": "zephon-nodes", "naive": "rank-sharded"}
    for col, loader in enumerate(("zephon", "naive")):
        ax = axes[0][col]
        for world, r in runs[loader].items():
            st = sorted(r["eval"])
            ax.plot([t * tokens_per_step for t in st], [r["eval"][t] for t in st],
                    color=COLORS[world], marker="o", ms=2, lw=1, label=f"dp {world}")  # fmt: skip
        ax.set_title(f"{names[loader]}: held-out loss")
        ax.set_xlabel("training tokens")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("held-out loss")
    axes[0][1].sharey(axes[0][0])
    ax = axes[1][0]
    for loader, ls in (("zephon", "-"), ("naive", "--")):
        ref = runs[loader][min(runs[loader])]
        for world, r in runs[loader].items():
            if world == min(runs[loader]):
                continue
            st = [t for t in sorted(r["eval"]) if t > 0]
            diff = [max(abs(r["eval"][t] - ref["eval"][t]), FLOOR) for t in st]
            ax.semilogy([t * tokens_per_step for t in st], diff, color=COLORS[world], ls=ls,
                        lw=1.2, label=f"{names[loader]}, dp {world}")  # fmt: skip
    ax.axhline(FLOOR, color="gray", lw=0.5)
    ax.set_title(f"|held-out loss - its dp {min(s.scratch_dps)} value| (0 drawn at {FLOOR:g})")
    ax.set_xlabel("training tokens")
    ax.legend(fontsize=8)
    ax = axes[1][1]
    raw = [sp["zephon"]["spread"], sp["naive"]["spread"]]
    vals = [max(v, FLOOR) for v in raw]
    bars = ax.bar(list(names.values()), vals, color=["tab:green", "tab:red"])
    ax.set_yscale("log")
    ax.set_ylim(FLOOR / 2, max(vals) * 5)
    for b, v, r_ in zip(bars, vals, raw, strict=True):
        ax.annotate(f"{r_:.2e}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom")
    dps = ", ".join(str(d) for d in s.scratch_dps)
    ax.set_title(f"final held-out loss, max - min over dp {dps}")
    fig.suptitle(f"From scratch at each dp size: {s.scratch_steps * tokens_per_step} tokens, "
                 "tiny causal LM, real data parallelism (gloo, CPU)")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# ---------------------------------------------------------------- summary


def environment() -> dict[str, str]:
    import importlib.metadata as md

    def version(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.system()} {platform.release()}, {cpu}, "
        f"{len(os.sched_getaffinity(0))} usable cores (os.cpu_count()={os.cpu_count()})",
        "python": platform.python_version(),
        **{
            p: version(p)
            for p in ("torch", "torchtitan", "torchdata", "zephon-nodes", "matplotlib")
        },
        "commit": commit or "unknown",
    }


def tick(b: bool) -> str:
    return "yes" if b else "**no**"


def summary_markdown(res: dict[str, Any]) -> str:
    s = Settings(**res["settings"])
    env, checks, runs = res["environment"], res["resume_checks"], res["resume_runs"]
    after = list(range(s.save_at + 1, s.steps + 1))
    L: list[str] = [f"# zephon-nodes: reproduction ({'quick' if res['quick'] else 'full'})", ""]
    L += [f"- {k}: {v}" for k, v in env.items()]
    L += [f"- total wall time: {res['wall_s']:.0f} s", ""]
    L += ["## 1. Resume on another number of ranks", ""]
    L += [
        f"TorchTitan {env['torchtitan']} `Trainer`, llama3 debugmodel, seq_len {s.seq_len}, "
        f"global batch {s.global_batch_size}, local batch 2; uninterrupted at dp 2 for "
        f"{s.steps} steps, checkpoint at step {s.save_at}, resumed to step {s.steps}.",
        "",
    ]
    L += ["![loss curves](resume_loss.png)", "", "![per-step digests](resume_digests.png)", ""]
    L += [
        "Per-step global batch SHA-256 after the resume, vs the uninterrupted dp-2 run "
        "(`=` identical, `~` same rows in another order, `x` different):",
        "",
    ]
    cols = [(ld, w) for ld in ("zephon", "naive") for w in checks[ld]["resumed"]]
    L.append(
        "| step | uninterrupted (zephon) | "
        + " | ".join(f"{'zephon' if ld == 'zephon' else 'sharded'} dp{w}" for ld, w in cols)
        + " |"
    )
    L.append("|---" * (len(cols) + 2) + "|")
    for i, t in enumerate(after):
        cells = []
        for ld, w in cols:
            row = checks[ld]["resumed"][w]
            cells.append("=" if row["exact"][i] else ("~" if row["same_rows"][i] else "x"))
        digest = runs["zephon"]["base"]["digests"][t][:16]
        L.append(f"| {t} | `{digest}` | " + " | ".join(cells) + " |")
    L += [
        "",
        "| loader | resumed at | identical batches | same rows | max abs loss diff |",
        "|---|---|---|---|---|",
    ]
    for ld in ("zephon", "naive"):
        for w, row in checks[ld]["resumed"].items():
            L.append(
                f"| {LABELS[ld]} | dp {w} | {sum(row['exact'])}/{len(after)} | "
                f"{sum(row['same_rows'])}/{len(after)} | {row['max_abs_loss_diff']:.3g} |"
            )
    for w, err in checks["titan"]["resumed"].items():
        L.append(f"| {LABELS['titan']} | dp {w} | refused | - | `{err[:120]}` |")
    L += [
        "",
        "Independent references (in-process, no Trainer): the zephon-nodes uninterrupted "
        f"run equals `zephon_nodes.verification.simulate` at dp 2: "
        f"{tick(checks['zephon']['uninterrupted_matches_reference'])}; the rank-sharded one "
        f"equals `zephon_nodes.verification.baselines.naive_digests` at dp 2: "
        f"{tick(checks['naive']['uninterrupted_matches_reference'])}.",
        "",
    ]
    sc, sp = res["scratch_runs"], res["spreads"]
    tokens = s.scratch_steps * s.global_batch_size * s.seq_len
    L += ["## 2. Training from scratch at different dp sizes", ""]
    L += [
        f"Tiny causal LM (1 attention block, dim 64), AdamW lr 3e-3, {s.scratch_steps} steps "
        f"= {tokens} tokens, global batch {s.global_batch_size} x {s.seq_len}; held-out set: "
        f"{s.heldout_docs} stdlib documents not in the training corpus.",
        "",
    ]
    L += ["![held-out loss](scratch_eval.png)", ""]
    dps = [f"dp{w}" for w in s.scratch_dps]
    L.append(
        "| loader | "
        + " | ".join(f"final held-out loss {d}" for d in dps)
        + " | spread (max - min) |"
    )
    L.append("|---" * (len(dps) + 2) + "|")
    for ld in ("zephon", "naive"):
        L.append(
            f"| {LABELS[ld] if ld == 'zephon' else 'rank-sharded'} | "
            + " | ".join(f"{sp[ld][d]:.6f}" for d in dps)
            + f" | {sp[ld]['spread']:.3g} |"
        )
    L += ["", "## Wall times", "",
          "CPU s: user + system time of all the job's processes (independent of other load).",
          "", "| run | wall s | CPU s |", "|---|---|---|"]  # fmt: skip

    def time_row(name: str, r: dict[str, Any]) -> None:
        again = (
            f" (started again after a crash at start-up: {r['retries']}x)" if r["retries"] else ""
        )
        L.append(f"| {name}{again} | {r['run_wall_s']:.0f} | {r['run_cpu_s']:.0f} |")

    for ld in LOADERS:
        time_row(f"exp 1 {ld} dp2 uninterrupted", runs[ld]["base"])
        for w, r in runs[ld]["resumed"].items():
            time_row(f"exp 1 {ld} dp2 -> dp{w}", r)
    for ld in ("zephon", "naive"):
        for w, r in sc[ld].items():
            time_row(f"exp 2 {ld} dp{w}", r)
    L.append(f"| total | {res['wall_s']:.0f} | {res['cpu_s']:.0f} |")
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------- main


def reproduce(
    out: Path, settings: Settings, *, work: Path | None = None, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run both experiments; write plots, ``summary.md`` and ``results.json`` to ``out``.

    Returns:
        The results (the content of ``results.json``).
    """
    t0, c0 = time.perf_counter(), _children_cpu()
    out.mkdir(parents=True, exist_ok=True)
    tmp = None
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix="zephon-reproduce-")
        work = Path(tmp.name)
    try:
        s = settings
        say("building the corpus and tokenizers (stdlib sources)")
        a = build_assets(work / "assets", num_docs=s.num_docs)
        kw = {
            "num_lanes": s.num_lanes,
            "global_batch_size": s.global_batch_size,
            "seq_len": s.seq_len,
        }
        recipe = write_recipe(work / "recipe.toml", a, **kw)
        say("experiment 1: resume on another number of ranks (TorchTitan Trainer)")
        runs = experiment_resume(a, recipe, work, s, say)
        checks = resume_checks(runs, reference_digests(recipe, s), s)
        say("experiment 2: from scratch at dp " + ", ".join(map(str, s.scratch_dps)))
        heldout = write_heldout(work, kw, a, s)
        scratch = experiment_scratch(a, recipe, heldout, work, s, say)
        sp = spreads(scratch, s)
        plot_resume(runs, s, out / "resume_loss.png")
        plot_digests(checks, s, out / "resume_digests.png")
        plot_scratch(scratch, sp, s, out / "scratch_eval.png")
    finally:
        if tmp is not None:
            tmp.cleanup()
    res: dict[str, Any] = {
        "quick": settings != FULL,
        "settings": dataclasses.asdict(settings),
        "environment": environment(),
        "resume_runs": runs,
        "resume_checks": checks,
        "scratch_runs": scratch,
        "spreads": sp,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": _children_cpu() - c0 + sum(os.times()[:2]),
    }
    (out / "summary.md").write_text(summary_markdown(res), encoding="utf-8")
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str), encoding="utf-8")
    say(f"wrote {out}/summary.md ({res['wall_s']:.0f} s)")
    return res


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("reproduce-out"), help="output folder")
    ap.add_argument("--quick", action="store_true", help="a few steps only (the CI version)")
    ap.add_argument("--work", type=Path, help="keep checkpoints and logs here (default: temp)")
    args = ap.parse_args(argv)
    reproduce(args.out, QUICK if args.quick else FULL, work=args.work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
