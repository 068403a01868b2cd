"""Benchmark runner: zephon-nodes side by side with its peers, plus its own properties.

Usage::

    python -m benchmarks.run                       # everything, Markdown tables on stdout
    python -m benchmarks.run --suite throughput --rounds 7 --json results.json
    python -m benchmarks.run --tiny --rounds 1 --seconds 0.5 --json -   # smoke run

Suites:

* ``throughput``: zephon-nodes, Grain (threads and processes), TorchTitan 0.3.0's
  ``HuggingFaceTextDataLoader``, plain torchdata.nodes and the raw tokenizer on the same
  corpus, tokenizer and shape; each run in a fresh subprocess, pipelines alternating within a
  round (the order rotates every round), medians over rounds.
  Both tokenizers by default (``--tokenizers sp,hf``): the corpus's sentencepiece model and
  a byte-level BPE ``tokenizer.json`` (128k entries, Hugging Face ``tokenizers``); TorchTitan
  main's ``GrainDataLoader`` runs under ``.venv-titan-main`` (see ``benchmarks/titan_main.py``).
  Then the first-batch table (as the ``first`` suite).
* ``first``: seconds from building each pipeline to its first batch, fresh and resumed
  (after 20 batches), at dp 1 and dp 4 (rank 0), fresh process each, medians over
  ``--first-rounds``; ``--peers`` picks pipelines (``--throughput-peers`` those of the
  throughput suite; ``zephon_cache``: zephon-nodes with the
  token cache on, empty at the start, so that a resume's replay reads what the run before
  the save stored).
* ``scaling``: 1 vs 32 lanes, 1 vs 2 workers, thread vs process runner with a pure-Python
  operator (alternating pairs, medians).
* ``checkpoint``: state size per lane and fixed header, ``state_dict()`` time, for several
  seq_len / shuffle buffer / step counts.
* ``resume``: time from ``load_state_dict`` to the first batch, and padding waste, per flush
  interval.
* ``memory``: peak RSS with 32 lanes, seq_len 2048, shuffle buffer 64, for a run and a run
  10x longer.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.corpus import Corpus, build_corpus, default_root
from benchmarks.pipelines import FIRST, RUNNERS, BenchConfig, zephon_pipeline, zephon_recipe
from benchmarks.titan_main import titan_main_python

SUITES = ("throughput", "first", "scaling", "checkpoint", "resume", "memory")
PEERS = ("zephon", "grain", "grain_proc", "torchtitan", "titan_main", "nodes", "raw")
# First-batch peers only: variants of zephon-nodes with a physical setting changed.
FIRST_ONLY = ("zephon_cache",)
# The throughput tables compare every peer with these two: they always run.
ALWAYS = ("zephon", "raw")
LABELS = {
    "zephon": "zephon-nodes (8 lanes, shuffle 64, 2 threads)",
    "grain": "Grain, thread prefetch, 2 threads",
    "grain_proc": "Grain, 2 processes (mp_prefetch)",
    "torchtitan": "TorchTitan 0.3.0 HuggingFaceTextDataLoader, 2 workers",
    "titan_main": "TorchTitan main GrainDataLoader (b5bcd76), 2 read threads",
    "nodes": "plain torchdata.nodes (ParallelMapper, 2 threads)",
    "raw": "raw tokenizer encode_batch, 2 threads (the limit)",
    "zephon_cache": "zephon-nodes, token cache on (empty at the start)",
}
TOKENIZERS = {
    "sp": "sentencepiece BPE, 32k",
    "hf": "Hugging Face tokenizers byte-level BPE, 128k (tokenizer.json)",
}
FIRST_STEPS = 20  # a resume saves after this many batches
FIRST_DP = (1, 4)
FLUSH_INTERVALS = (1, 2, 4, 8, 16, 32)
REPO = Path(__file__).resolve().parent.parent


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# One measurement in a fresh process


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_one(kind: str, corpus: Corpus, cfg: BenchConfig) -> dict[str, Any]:
    """Run one measurement in this process and return its numbers."""
    if kind in RUNNERS:
        r = RUNNERS[kind](corpus, cfg)
        return {
            "tok_s": r.tok_s,
            "tokens": r.tokens,
            "seconds": r.seconds,
            "flush_periods": r.flush_periods,
            "first_batch_s": r.first_batch_s,
            "ckpt_bytes": r.ckpt_bytes,
            "padding_tokens": r.padding_tokens,
            "tok_per_cpu_s": r.tokens / r.cpu_s if r.cpu_s else None,
            "peak_rss_mb": _peak_rss_mb(),
        }
    if kind == "first":
        peer, steps = cfg.extra["peer"], int(cfg.extra["steps"])
        return {"first_batch_s": FIRST[peer](corpus, cfg, steps)}
    if kind == "resume":
        return _measure_resume(corpus, cfg)
    if kind == "memory":
        return _measure_memory(corpus, cfg)
    raise ValueError(f"unknown measurement {kind!r}")


def _measure_resume(corpus: Corpus, cfg: BenchConfig) -> dict[str, Any]:
    """Throughput and padding at one flush interval, then resume times at a few points."""
    r = RUNNERS["zephon"](corpus, cfg)
    total = r.tokens + r.padding_tokens
    times = []
    for steps in cfg.extra.get("save_steps", [7, 23]):
        _, node, pool = zephon_pipeline(corpus, cfg)
        try:
            it = iter(node)
            for _ in range(steps):
                next(it)
            state = node.state_dict()
        finally:
            pool.close()
        _, node2, pool2 = zephon_pipeline(corpus, cfg)
        try:
            t0 = time.perf_counter()
            node2.reset(state)  # what Loader.load_state_dict + iter() do
            next(node2)
            times.append(time.perf_counter() - t0)
        finally:
            pool2.close()
    return {
        "tok_s": r.tok_s,
        "padding_frac": r.padding_tokens / total if total else 0.0,
        "resume_s": statistics.mean(times),
        "resume_max_s": max(times),
        "resume_all_s": times,
        "save_steps": list(cfg.extra.get("save_steps", [7, 23])),
    }


def _measure_memory(corpus: Corpus, cfg: BenchConfig) -> dict[str, Any]:
    """Peak RSS over ``steps`` steps, and RSS at 10% vs the end (growth)."""
    steps = int(cfg.extra["steps"])
    _, node, pool = zephon_pipeline(corpus, cfg)
    try:
        it = iter(node)
        next(it)
        after_first = _rss_mb()
        t0 = time.perf_counter()
        mark = max(1, steps // 10)
        at_mark = at_half = after_first
        for i in range(steps):
            next(it)
            if i == mark:
                at_mark = _rss_mb()
            if i == steps // 2:
                at_half = _rss_mb()
        seconds = time.perf_counter() - t0
    finally:
        pool.close()
    return {
        "steps": steps,
        "seconds": seconds,
        "rss_after_first_mb": after_first,
        "rss_at_10pct_mb": at_mark,
        "rss_at_50pct_mb": at_half,
        "rss_end_mb": _rss_mb(),
        "peak_rss_mb": _peak_rss_mb(),
    }


def _titan_main_cmd(kind: str, cfg: BenchConfig, corpus_args: dict[str, Any]) -> list[str] | None:
    python = titan_main_python()
    if python is None:
        return None
    mode = "first" if kind == "first" else "throughput"
    return [
        python,
        "-m",
        "benchmarks.titan_main",
        "--mode",
        mode,
        "--steps",
        str(cfg.extra.get("steps", 0)),
        "--config",
        cfg.to_json(),
        "--corpus-args",
        json.dumps(corpus_args),
    ]


def _is_titan_main(kind: str, cfg: BenchConfig) -> bool:
    return kind == "titan_main" or (kind == "first" and cfg.extra.get("peer") == "titan_main")


def run_isolated(
    kind: str, cfg: BenchConfig, corpus_args: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """Run one measurement in a fresh Python process (clean threads, memory and caches).

    TorchTitan main's loader runs under its own venv's Python; where that venv is absent the
    answer is ``{"absent": ...}``.
    """
    if _is_titan_main(kind, cfg):
        titan = _titan_main_cmd(kind, cfg, corpus_args)
        if titan is None:
            return {"absent": "no .venv-titan-main (set ZEPHON_TITAN_MAIN_PYTHON)"}
        cmd = titan
    else:
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.run",
            "--one",
            kind,
            "--config",
            cfg.to_json(),
            "--corpus-args",
            json.dumps(corpus_args),
        ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(REPO)
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.splitlines()[-15:])
        raise RuntimeError(f"measurement {kind} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------------------
# Suites


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def _alternate(
    variants: dict[str, tuple[str, BenchConfig]],
    rounds: int,
    measure: Callable[[str, BenchConfig], dict[str, Any]],
    key: str = "tok_s",
) -> tuple[dict[str, dict[str, float]], dict[str, list[dict[str, Any]]]]:
    """Measure every variant once per round, rotating the order; return per-variant stats."""
    names = list(variants)
    raw: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            kind, cfg = variants[name]
            res = measure(kind, cfg)
            if "absent" in res:
                _log(f"  {name}: absent ({res['absent']})")
                continue
            raw[name].append(res)
            v = res.get(key, 0)
            shown = f"{v:.3f} s" if key == "first_batch_s" else f"{v / 1e6:.3f} M{key}"
            _log(f"  round {r + 1}/{rounds} {name}: {shown}")
    return {n: _stats([x[key] for x in raw[n]]) for n in names if raw[n]}, raw


def suite_throughput(
    base: BenchConfig,
    rounds: int,
    measure: Any,
    first_rounds: int = 3,
    first_peers: Sequence[str] = PEERS,
    peers: Sequence[str] = PEERS,
) -> dict[str, Any]:
    """The peers on one tokenizer (``base.tokenizer``), then the first batch table.

    ``peers`` (``--throughput-peers``) picks the pipelines timed, ``first_peers``
    (``--peers``) those of the first-batch table; zephon-nodes and the raw tokenizer always
    run (the tables are relative to them).
    """
    names = [n for n in PEERS if n in peers or n in ALWAYS]
    variants = {name: (name, base) for name in names}
    stats, raw = _alternate(variants, rounds, measure)
    ran = [n for n in names if n in stats]
    ckpt = {n: raw[n][-1].get("ckpt_bytes") for n in ran}
    first = {n: statistics.median([x["first_batch_s"] for x in raw[n]]) for n in ran}
    cpu = {
        n: statistics.median([x["tok_per_cpu_s"] for x in raw[n]])
        if all(x.get("tok_per_cpu_s") for x in raw[n])
        else None
        for n in ran
    }
    return {
        "tokenizer": base.tokenizer,
        "peers": names,
        "stats": stats,
        "ckpt_bytes": ckpt,
        "first_batch_s": first,
        "tok_per_cpu_s": cpu,
        "first": suite_first(base, first_rounds, measure, first_peers),
    }


def suite_first(
    base: BenchConfig, rounds: int, measure: Any, peers: Sequence[str] = PEERS
) -> dict[str, dict[str, float]]:
    """Seconds from building each pipeline to its first batch: fresh and resumed, dp 1 and 4.

    Each measurement in a fresh process (imports done before the clock), rounds alternating,
    medians. A resume first runs :data:`FIRST_STEPS` batches and saves, then times a new
    pipeline's build, state load and first batch.
    """
    variants: dict[str, tuple[str, BenchConfig]] = {}
    for dp in FIRST_DP:
        for steps, what in ((0, "fresh"), (FIRST_STEPS, "resumed")):
            for peer in peers:
                extra = {"peer": peer, "steps": steps}
                variants[f"{peer}|{what}|dp{dp}"] = ("first", replace(base, dp=dp, extra=extra))
    stats, _ = _alternate(variants, rounds, measure, key="first_batch_s")
    out: dict[str, dict[str, float]] = {}
    for name, st in stats.items():
        peer, what, dp = name.split("|")
        out.setdefault(peer, {})[f"{what}_{dp}"] = st["median"]
    return out


def suite_scaling(base: BenchConfig, rounds: int, measure: Any) -> dict[str, Any]:
    g = 32
    # 32 lanes flush in lockstep (every lane's shuffle buffer drains and refills together):
    # the window must span several flush cycles (~8 work items x 32 lanes) to be steady.
    long = replace(base, seconds=base.seconds * 4)
    lanes = {
        "lanes_1": ("zephon", replace(long, num_lanes=1, batch_size=g)),
        "lanes_32": ("zephon", replace(long, num_lanes=32, batch_size=g)),
    }
    workers = {
        "workers_1": ("zephon", replace(base, num_workers=1)),
        "workers_2": ("zephon", replace(base, num_workers=2)),
    }
    runner = {
        "pyfilter_thread": ("zephon", replace(base, python_filter=True, runner="thread")),
        "pyfilter_process": ("zephon", replace(base, python_filter=True, runner="process")),
    }
    out: dict[str, Any] = {}
    for group in (lanes, workers, runner):
        stats, raw = _alternate(group, rounds, measure)
        for name, st in stats.items():
            per_cpu = [x["tok_per_cpu_s"] for x in raw[name] if x.get("tok_per_cpu_s")]
            st["per_cpu_median"] = statistics.median(per_cpu) if per_cpu else 0.0
            st["per_cpu_min"] = min(per_cpu) if per_cpu else 0.0
            st["per_cpu_max"] = max(per_cpu) if per_cpu else 0.0
            periods = [x["flush_periods"] for x in raw[name] if x.get("flush_periods") is not None]
            st["flush_periods_min"] = min(periods) if periods else None
        out.update(stats)
    return out


def suite_checkpoint(base: BenchConfig, corpus: Corpus) -> dict[str, Any]:
    """State size and state_dict() time, in this process (cheap)."""
    rows = []
    for seq_len, buf, steps, lanes in (
        (base.seq_len, base.shuffle_buffer, 10, base.num_lanes),
        (base.seq_len, base.shuffle_buffer, 100, base.num_lanes),
        (max(16, base.seq_len // 4), 0, 100, base.num_lanes),
        (base.seq_len, base.shuffle_buffer, 20, 32),
    ):
        cfg = replace(
            base,
            seq_len=seq_len,
            shuffle_buffer=buf,
            num_lanes=lanes,
            batch_size=max(base.batch_size, lanes),
        )
        _, node, pool = zephon_pipeline(corpus, cfg)
        try:
            it = iter(node)
            for _ in range(steps):
                next(it)
            t0 = time.perf_counter()
            node.state_dict()  # the first after a step hashes each lane's last sample
            first = time.perf_counter() - t0
            times = []
            for _ in range(200):
                t0 = time.perf_counter()
                state = node.state_dict()
                times.append(time.perf_counter() - t0)
        finally:
            pool.close()
        blob = json.dumps(state, separators=(",", ":")).encode()
        per_lane = (state["lanes"], state.get("last_sample", {}))  # both grow with the lanes
        lanes_blob = json.dumps(per_lane, separators=(",", ":")).encode()
        rows.append(
            {
                "seq_len": seq_len,
                "shuffle_buffer": buf,
                "steps": steps,
                "num_lanes": lanes,
                "total_bytes": len(blob),
                "header_bytes": len(blob) - len(lanes_blob),
                "bytes_per_lane": len(lanes_blob) / lanes,
                "state_dict_us": statistics.median(times) * 1e6,
                "state_dict_first_us": first * 1e6,
            }
        )
        _log(f"  checkpoint {rows[-1]}")
    return {"rows": rows}


def padding_by_interval(
    corpus: Corpus, base: BenchConfig, intervals: Sequence[int], epochs: int = 8
) -> tuple[dict[int, float], float]:
    """Exact padding share over ``epochs`` epochs, per flush interval (no timing involved).

    Every work item is tokenized once; each lane's packer pads the partial sample at every
    flush, i.e. ``(-tokens in the window) mod seq_len`` tokens per window. Also returns the
    mean number of samples a work item fills.
    """
    import numpy as np

    from zephon_nodes.engine.pipeline import Pipeline
    from zephon_nodes.recipe import WorkSpec

    recipe = zephon_recipe(corpus, base)
    recipe = recipe.replace(work=WorkSpec(chunk_size=base.chunk_size, epochs=epochs))
    pipeline = Pipeline(recipe)
    ws = pipeline.work_source
    pairs: dict[int, int] = {}  # work item -> tokens it packs (each item tokenized once)
    per_lane: list[list[int]] = []
    for lane in range(recipe.num_lanes):
        counts = []
        i = 0
        while (item := ws.work(lane, i)) is not None:
            if item.item not in pairs:
                lengths = pipeline.stateless(item).lengths
                pairs[item.item] = int(np.maximum(lengths - 1, 0).sum())
            counts.append(pairs[item.item])
            i += 1
        per_lane.append(counts)
    s = base.seq_len
    out = {}
    for k in intervals:
        real = pad = 0
        for counts in per_lane:
            for w in range(0, len(counts), k):
                held = sum(counts[w : w + k])
                real += held
                pad += -held % s
        out[k] = pad / (real + pad) if real + pad else 0.0
    items = [c for counts in per_lane for c in counts]
    return out, sum(items) / max(1, len(items)) / s


def suite_resume(
    base: BenchConfig, measure: Any, intervals: Sequence[int], corpus: Corpus
) -> dict[str, Any]:
    padding, rows_per_item = padding_by_interval(corpus, base, intervals)
    rows = []
    for k in intervals:
        # Save half-way through and near the end of the first flush window of every lane
        # (one sample per lane per step): replay re-runs the window up to that point.
        window_steps = k * rows_per_item * base.num_lanes / max(base.batch_size, base.num_lanes)
        save = sorted({max(1, round(window_steps * f)) for f in (0.5, 0.9)})
        res = measure("resume", replace(base, flush_every=k, extra={"save_steps": save}))
        rows.append({"flush_every": k, **res, "padding_epoch_frac": padding[k]})
        _log(
            f"  flush_every={k}: resume {res['resume_s']:.2f} s, padding "
            f"{padding[k] * 100:.2f}% (8 epochs), {res['padding_frac'] * 100:.2f}% (timed run), "
            f"{res['tok_s'] / 1e6:.3f} Mtok/s"
        )
    return {"rows": rows, "rows_per_work_item": rows_per_item}


def suite_memory(base: BenchConfig, measure: Any, steps: int) -> dict[str, Any]:
    cfg = replace(base, num_lanes=32, batch_size=32, shuffle_buffer=64)
    short = measure("memory", replace(cfg, extra={"steps": steps}))
    _log(f"  memory {steps} steps: {short}")
    long = measure("memory", replace(cfg, extra={"steps": steps * 10}))
    _log(f"  memory {steps * 10} steps: {long}")
    return {"short": short, "long": long}


# ---------------------------------------------------------------------------------------
# Report


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in (
        "zephon-nodes",
        "torch",
        "torchdata",
        "torchtitan",
        "grain",
        "sentencepiece",
        "numpy",
        "datasets",
    ):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "absent"
    return out


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg()
    return f"{os.cpu_count()} cores ({cpu}), load average at start {load[0]:.1f}"


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """The flat JSON the issue asks for (plus the detail under ``details``)."""
    out: dict[str, Any] = {}
    for tok, tp in results.get("throughput", {}).items():
        s = tp["stats"]
        sfx = "" if tok == "sp" else f"_{tok}"
        out["zephon_tok_s" + sfx] = s["zephon"]["median"]
        if "grain" in s and "grain_proc" in s:  # not when --throughput-peers leaves them out
            out["grain_tok_s" + sfx] = max(s["grain"]["median"], s["grain_proc"]["median"])
        if "torchtitan" in s:
            out["torchtitan_tok_s" + sfx] = s["torchtitan"]["median"]
        if "titan_main" in s:
            out["titan_main_tok_s" + sfx] = s["titan_main"]["median"]
        if "nodes" in s:
            out["nodes_tok_s" + sfx] = s["nodes"]["median"]
        out["raw_tok_s" + sfx] = s["raw"]["median"]
        out["tok_per_cpu_s" + sfx] = tp["tok_per_cpu_s"]
        out["first_batch_s" + sfx] = tp["first"].get("zephon", {})
    ck = results.get("checkpoint")
    if ck:
        out["ckpt_bytes_per_lane"] = max(r["bytes_per_lane"] for r in ck["rows"])
        out["ckpt_header_bytes"] = max(r["header_bytes"] for r in ck["rows"])
        out["state_dict_us"] = max(r["state_dict_us"] for r in ck["rows"])
    rs = results.get("resume")
    if rs:
        default = results.get("default_flush_every", 8)
        rows = {r["flush_every"]: r for r in rs["rows"]}
        row = rows.get(default) or rs["rows"][-1]
        out["resume_s"] = row["resume_s"]
    mem = results.get("memory")
    if mem:
        out["peak_rss_mb"] = mem["long"]["peak_rss_mb"]
    out["details"] = results
    return out


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def markdown(results: dict[str, Any]) -> str:
    """Render the results as Markdown tables."""
    lines = [f"Machine: {results['machine']}; date {results['date']}; rounds {results['rounds']}"]
    lines.append("Versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()))
    for tok, tp in results.get("throughput", {}).items():
        lines += _throughput_table(tok, tp)
        lines += _first_table(tok, tp["first"])
    for tok, first in results.get("first", {}).items():
        lines += _first_table(tok, first)
    lines += _other_tables(results)
    return "\n".join(lines)


def _first_table(tok: str, first: dict[str, dict[str, float]]) -> list[str]:
    cols = [f"{w}_dp{dp}" for dp in FIRST_DP for w in ("fresh", "resumed")]
    lines = [
        "",
        f"First batch, s ({TOKENIZERS[tok]}; resumed after {FIRST_STEPS} batches)",
        "",
        "| pipeline | " + " | ".join(c.replace("_", ", ") for c in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for n in PEERS + FIRST_ONLY:
        if n in first:
            row = [_fmt(first[n].get(c)) for c in cols]
            lines.append(f"| {LABELS[n]} | " + " | ".join(row) + " |")
    return lines


def _throughput_table(tok: str, tp: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    s = tp["stats"]
    raw = s["raw"]["median"]
    z = s["zephon"]["median"]
    lines += [
        "",
        f"Throughput ({TOKENIZERS[tok]})",
        "",
        "| pipeline | Mtok/s median | min-max | vs raw | zephon vs it | first batch s "
        "| ckpt bytes | Mtok per CPU-s | per CPU-s vs raw |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    cpu = tp["tok_per_cpu_s"]
    for n in PEERS:
        if n not in tp.get("peers", PEERS):
            continue  # not picked (--peers)
        if n not in s:
            lines.append(f"| {LABELS[n]} | absent | | | | | | | |")
            continue
        st = s[n]
        lines.append(
            f"| {LABELS[n]} | {st['median'] / 1e6:.3f} | {st['min'] / 1e6:.3f}-"
            f"{st['max'] / 1e6:.3f} | {st['median'] / raw:.2f} | "
            f"{z / st['median']:.2f}x | {tp['first_batch_s'][n]:.2f} | "
            f"{tp['ckpt_bytes'][n] if tp['ckpt_bytes'][n] is not None else '-'} | "
            f"{_fmt(cpu[n] / 1e6 if cpu[n] else None)} | "
            f"{_fmt(cpu[n] / cpu['raw'] if cpu[n] and cpu['raw'] else None)} |"
        )
    return lines


def _other_tables(results: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    sc = results.get("scaling")
    if sc:
        lines += [
            "",
            "| zephon variant | Mtok/s median | min-max | Mtok per CPU-s median | min-max "
            "| whole flush periods per lane (min) |",
            "|---|---|---|---|---|---|",
        ]
        for n, st in sc.items():
            lines.append(
                f"| {n} | {st['median'] / 1e6:.3f} | {st['min'] / 1e6:.3f}-{st['max'] / 1e6:.3f} "
                f"| {st.get('per_cpu_median', 0.0) / 1e6:.3f} "
                f"| {st.get('per_cpu_min', 0.0) / 1e6:.3f}-{st.get('per_cpu_max', 0.0) / 1e6:.3f} "
                f"| {st.get('flush_periods_min')} |"
            )

        def ratio(a: str, b: str, key: str = "median") -> float:
            return float(sc[a][key] / sc[b][key]) if sc[b][key] else 0.0

        for key, what in (("median", "wall"), ("per_cpu_median", "per CPU-s")):
            lines.append(
                f"\n{what}: 32 lanes / 1 lane: {ratio('lanes_32', 'lanes_1', key):.2f}; "
                f"2 workers / 1 worker: {ratio('workers_2', 'workers_1', key):.2f}; "
                f"process / thread (Python operator): "
                f"{ratio('pyfilter_process', 'pyfilter_thread', key):.2f}"
            )
    ck = results.get("checkpoint")
    if ck:
        lines += [
            "",
            "| seq_len | shuffle | lanes | steps | state bytes | header | bytes/lane "
            "| state_dict() us |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in ck["rows"]:
            lines.append(
                f"| {r['seq_len']} | {r['shuffle_buffer']} | {r['num_lanes']} | {r['steps']} "
                f"| {r['total_bytes']} | {r['header_bytes']} | {r['bytes_per_lane']:.1f} "
                f"| {r['state_dict_us']:.0f} |"
            )
    rs = results.get("resume")
    if rs:
        lines += [
            "",
            "| flush_every | resume s, mid-window | resume s, late in window | padding waste "
            "(8 epochs) | padding in the timed run | Mtok/s |",
            "|---|---|---|---|---|---|",
        ]
        for r in rs["rows"]:
            lines.append(
                f"| {r['flush_every']} | {r['resume_all_s'][0]:.2f} | "
                f"{r['resume_all_s'][-1]:.2f} | "
                f"{r['padding_epoch_frac'] * 100:.2f}% | {r['padding_frac'] * 100:.2f}% "
                f"| {r['tok_s'] / 1e6:.3f} |"
            )
    mem = results.get("memory")
    if mem:
        lines += [
            "",
            "| run | steps | peak RSS MB | RSS after first batch | at 10% | at 50% | at end |",
            "|---|---|---|---|---|---|---|",
        ]
        for name in ("short", "long"):
            m = mem[name]
            lines.append(
                f"| {name} | {m['steps']} | {m['peak_rss_mb']:.0f} | "
                f"{m['rss_after_first_mb']:.0f} | {m['rss_at_10pct_mb']:.0f} | "
                f"{m['rss_at_50pct_mb']:.0f} | {m['rss_end_mb']:.0f} |"
            )
    return lines


# ---------------------------------------------------------------------------------------
# CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    p.add_argument("--suite", default=",".join(SUITES), help=f"comma list of {SUITES}")
    p.add_argument("--rounds", type=int, default=5, help="rounds per comparison (median)")
    p.add_argument("--seconds", type=float, default=4.0, help="timed seconds per run")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds after the first batch")
    p.add_argument("--json", default=None, help="write the JSON summary here ('-': stdout)")
    p.add_argument("--tiny", action="store_true", help="tiny corpus and shapes (smoke test)")
    p.add_argument("--root", default=None, help="cache directory for corpus and tokenizer")
    p.add_argument("--memory-steps", type=int, default=60, help="steps of the short memory run")
    p.add_argument("--flush-intervals", default=",".join(map(str, FLUSH_INTERVALS)))
    p.add_argument("--timeout", type=float, default=300.0, help="limit per measurement (s)")
    p.add_argument(
        "--tokenizers", default="sp,hf", help=f"throughput: comma list of {list(TOKENIZERS)}"
    )
    p.add_argument("--first-rounds", type=int, default=3, help="rounds of first-batch timings")
    p.add_argument(
        "--peers", default=",".join(PEERS), help=f"first-batch peers (also {list(FIRST_ONLY)})"
    )
    p.add_argument(
        "--throughput-peers",
        default=",".join(PEERS),
        help="throughput peers (zephon and raw always run)",
    )
    p.add_argument(
        "--inprocess",
        action="store_true",
        help="measure in this process instead of a fresh process per run (smoke tests)",
    )
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--config", default=None, help=argparse.SUPPRESS)
    p.add_argument("--corpus-args", default=None, help=argparse.SUPPRESS)
    return p


def corpus_args(tiny: bool, root: str | None) -> dict[str, Any]:
    """Arguments of :func:`build_corpus` for a full or a tiny run."""
    args: dict[str, Any] = {"root": root or str(default_root())}
    if tiny:
        args.update(max_bytes=400_000, doc_bytes=2048, vocab_size=800, train_lines=20_000)
    return args


def _build(args: dict[str, Any]) -> Corpus:
    a = dict(args)
    return build_corpus(Path(a.pop("root")), **a)


def _names(text: str, known: Sequence[str], what: str) -> list[str]:
    """A comma list of names, each one of ``known``."""
    names = [x for x in text.split(",") if x]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise SystemExit(f"unknown {what}(s) {unknown}; choose from {list(known)}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (see the module docstring)."""
    args = _parser().parse_args(argv)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.one:
        corpus = _build(json.loads(args.corpus_args))
        res = measure_one(args.one, corpus, BenchConfig.from_json(args.config))
        print(json.dumps(res), flush=True)
        sys.stderr.flush()
        # Skip interpreter teardown: daemon worker threads still inside a C++ tokenizer call
        # abort the process when the interpreter finalizes under them.
        os._exit(0)
    suites = _names(args.suite, SUITES, "suite")
    tokenizers = _names(args.tokenizers, tuple(TOKENIZERS), "tokenizer")
    peers = _names(args.peers, PEERS + FIRST_ONLY, "peer")
    tp_peers = _names(args.throughput_peers, PEERS, "peer")
    fr = args.first_rounds
    cargs = corpus_args(args.tiny, args.root)
    corpus = _build(cargs)
    base = BenchConfig(seconds=args.seconds, warmup_s=args.warmup)
    memory_steps = args.memory_steps
    if args.tiny:
        base = replace(
            base, seq_len=128, shuffle_buffer=4, chunk_size=8, flush_every=2, warmup_s=0.1
        )
        memory_steps = min(memory_steps, 5)

    def measure(kind: str, cfg: BenchConfig) -> dict[str, Any]:
        if args.inprocess and not _is_titan_main(kind, cfg):
            return measure_one(kind, corpus, cfg)
        return run_isolated(kind, cfg, cargs, args.timeout)

    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": _machine(),
        "versions": _versions(),
        "rounds": args.rounds,
        "config": json.loads(base.to_json()),
        "corpus": {
            "documents": corpus.num_docs,
            "bytes": corpus.num_bytes,
            "sources": list(corpus.sources),
        },
        "default_flush_every": base.flush_every,
    }
    t0 = time.perf_counter()
    for suite in suites:
        _log(f"suite {suite}")
        if suite == "throughput":
            results["throughput"] = {
                tok: suite_throughput(
                    replace(base, tokenizer=tok), args.rounds, measure, fr, peers, tp_peers
                )
                for tok in tokenizers
            }
        elif suite == "first":
            results["first"] = {
                tok: suite_first(replace(base, tokenizer=tok), fr, measure, peers)
                for tok in tokenizers
            }
        elif suite == "scaling":
            results["scaling"] = suite_scaling(base, args.rounds, measure)
        elif suite == "checkpoint":
            results["checkpoint"] = suite_checkpoint(base, corpus)
        elif suite == "resume":
            intervals = [int(x) for x in args.flush_intervals.split(",") if x]
            results["resume"] = suite_resume(base, measure, intervals, corpus)
        elif suite == "memory":
            results["memory"] = suite_memory(base, measure, memory_steps)
    results["elapsed_s"] = time.perf_counter() - t0
    print(markdown(results), flush=True)
    if args.json:
        blob = json.dumps(summary(results), indent=1)
        if args.json == "-":
            print(blob)
        else:
            Path(args.json).write_text(blob + "\n")
    if args.inprocess:
        # Worker threads of the measured loaders may still be inside C++ tokenizer calls;
        # interpreter teardown under them aborts the process, so leave without it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
