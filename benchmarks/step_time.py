"""How much each loader slows the trainer's step it feeds (issue 33.5).

A trainer's main thread launches kernels from Python: it holds the GIL between launches. The
emulated step here is a calibrated loop of small torch ops (each releases the GIL inside
ATen, like a kernel launch), ``--step-ms`` long when it runs alone, and it consumes one
micro-batch of ``--batch-size`` x ``--seq-len`` tokens per step (a fixed token rate). Each
configuration runs in a fresh process: the step alone, then beside each loader:

- ``zephon_thread``: the rank node in the trainer's process (lanes on a thread pool,
  accumulators and collation in the trainer's process),
- ``zephon_process``: the same node in a child process
  (:class:`~zephon_nodes.engine.child.ChildRankNode`),
- ``titan030``: TorchTitan 0.3.0's ``HuggingFaceTextDataLoader`` (a torchdata
  ``StatefulDataLoader`` with ``--workers`` worker processes) over the same corpus,
- ``nodes``: a plain torchdata.nodes pipeline (thread ``ParallelMapper`` -> pack -> batch),
- ``titan_main``: TorchTitan main's ``GrainDataLoader`` (concat-then-split packing over an
  ``IndexedJsonlSource``), run with the interpreter of ``--titan-main-python``.

Reported per configuration, against the alone runs of the same invocation (alone and loader
runs alternate, ``--rounds`` times): the step's wall time (median, p95) and its inflation,
the step's CPU time in the trainer's thread, the loader's CPU seconds per 1k tokens (CPU of
the whole process tree minus the step's own), and the load average. Then the time to the
first batch after a resume at dp 1 and dp 4, for both zephon engines.

Usage::

    python -m benchmarks.step_time                       # full size (minutes)
    python -m benchmarks.step_time --smoke --json -      # a few seconds' worth of each
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.timing import tree_cpu_s

PEERS = ("zephon_thread", "zephon_process", "titan030", "nodes", "titan_main")
TITAN_MAIN_PYTHON = "/work/main/.venv-titan-main/bin/python"
REPO = Path(__file__).resolve().parents[1]


@dataclass
class StepConfig:
    """One invocation's shape (the same for every configuration)."""

    corpus_root: str = ""
    jsonl: str = ""
    shard_glob: str = ""
    model: str = ""
    seq_len: int = 2048
    batch_size: int = 2
    workers: int = 2
    num_lanes: int = 8
    step_ms: float = 100.0
    iters: int = 0  # torch-op loop iterations of one step (calibrated)
    steps: int = 60
    warmup_steps: int = 5
    extra: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------- the trainer


class Trainer:
    """The emulated step: ``iters`` rounds of small torch ops, GIL held between them."""

    def __init__(self, iters: int) -> None:
        self.iters = iters
        self.x = torch.ones(64)
        self.w = torch.full((64,), 0.999)

    def step(self, tokens: torch.Tensor) -> float:
        """One step: consume the micro-batch (a reduction) and launch ``iters`` small ops."""
        x, w = self.x, self.w
        acc = float(tokens.float().mean()) * 0.0
        for _ in range(self.iters):
            x = torch.addcmul(x, x, w, value=-1e-4)
            x = x.clamp_(-2.0, 2.0)
        self.x = x
        return acc + float(x[0])


def calibrate(step_ms: float) -> int:
    """Loop iterations of a step of ``step_ms`` of CPU time, measured here (median of a few
    runs; CPU time, not wall: on a loaded machine the wall clock also counts other processes)."""
    trainer = Trainer(200)
    tokens = torch.zeros(8, dtype=torch.int64)
    per_iter = []
    for _ in range(7):
        t0 = time.thread_time()
        trainer.step(tokens)
        per_iter.append((time.thread_time() - t0) / trainer.iters)
    return max(1, round(step_ms / 1e3 / statistics.median(per_iter)))


# ------------------------------------------------------------------------- the loaders


def _labels_tokens(labels: torch.Tensor) -> int:
    return int((labels != -100).sum())


def zephon_recipe(cfg: StepConfig) -> Any:
    """The benchmark recipe (a sentencepiece model over the corpus' shards, packed)."""
    from zephon_nodes.recipe import DatasetSpec, Recipe, ShuffleSpec, TokenizerSpec, WorkSpec

    return Recipe(
        datasets=(DatasetSpec("bench", paths=(cfg.shard_glob,)),),
        tokenizer=TokenizerSpec(kind="sentencepiece", path=Path(cfg.model)),
        seed=1,
        num_lanes=cfg.num_lanes,
        global_batch_size=max(cfg.batch_size, cfg.num_lanes),
        seq_len=cfg.seq_len,
        flush_every=8,
        work=WorkSpec(chunk_size=64, epochs=None),
        shuffle=ShuffleSpec(64),
    )


def zephon_node(cfg: StepConfig, dp: int = 1, rank: int = 0) -> Any:
    """The rank node with its own pool of ``cfg.workers`` threads (a child's factory)."""
    from zephon_nodes.engine.pipeline import Pipeline
    from zephon_nodes.engine.pool import WorkerPool

    pipeline = Pipeline(zephon_recipe(cfg))
    pool = WorkerPool(cfg.workers, "thread")
    node = pipeline.rank_node(dp, rank, pool=pool, local_batch_size=cfg.batch_size)
    node.own([pool])
    return node


def _zephon_child(cfg: StepConfig, dp: int = 1, rank: int = 0) -> Any:
    from zephon_nodes.engine.child import ChildRankNode

    return ChildRankNode(functools.partial(zephon_node, cfg, dp, rank))


def loader_zephon_thread(cfg: StepConfig) -> tuple[Iterator[Any], Callable[[Any], Any]]:
    node = zephon_node(cfg)
    return iter(node), lambda b: b["labels"]


def loader_zephon_process(cfg: StepConfig) -> tuple[Iterator[Any], Callable[[Any], Any]]:
    node = _zephon_child(cfg)
    return iter(node), lambda b: b["labels"]


def loader_titan030(cfg: StepConfig) -> tuple[Iterator[Any], Callable[[Any], Any]]:
    from benchmarks.corpus import Corpus
    from benchmarks.pipelines import BenchConfig, titan_loader

    corpus = Corpus(
        root=Path(cfg.corpus_root), shards=(), jsonl=Path(cfg.jsonl), model=Path(cfg.model),
        num_docs=0, num_bytes=0, sources=(),
    )  # fmt: skip
    bench = BenchConfig(seq_len=cfg.seq_len, batch_size=cfg.batch_size, num_workers=cfg.workers)
    return iter(titan_loader(corpus, bench)), lambda b: b[1]


def loader_nodes(cfg: StepConfig) -> tuple[Iterator[Any], Callable[[Any], Any]]:
    import numpy as np
    import sentencepiece as spm
    from torchdata.nodes import Batcher, IterableWrapper, Loader, Mapper, ParallelMapper

    from benchmarks.pipelines import _PackNode

    sp = spm.SentencePieceProcessor(model_file=cfg.model)
    with open(cfg.jsonl, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    order = np.random.default_rng(1).permutation(len(texts)).tolist()

    def docs() -> Iterator[str]:
        while True:
            for i in order:
                yield texts[i]

    def encode(text: str) -> Any:
        return np.asarray(sp.encode(text, add_bos=True, add_eos=True), dtype=np.int64)

    def collate(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(np.stack([r[k] for r in rows])) for k in rows[0]}

    mapped = ParallelMapper(
        IterableWrapper(docs()), encode, num_workers=cfg.workers, method="thread"
    )
    node = Mapper(Batcher(_PackNode(mapped, cfg.seq_len), cfg.batch_size), collate)
    return iter(Loader(node)), lambda b: b["labels"]


class SpTokenizer:
    """The encode/bos/eos interface TorchTitan's text processors call, over sentencepiece."""

    def __init__(self, model: str) -> None:
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_file=model)
        self.bos_id, self.eos_id = self.sp.bos_id(), self.sp.eos_id()

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        return self.sp.encode(text, add_bos=add_bos, add_eos=add_eos)

    def get_vocab_size(self) -> int:
        return self.sp.get_piece_size()


def loader_titan_main(cfg: StepConfig) -> tuple[Iterator[Any], Callable[[Any], Any]]:
    from torchtitan.components.data.dataset import SingleDatasetConfig
    from torchtitan.components.data.loader import GrainDataLoader
    from torchtitan.components.data.packing import ConcatThenSplitPackingConfig
    from torchtitan.components.data.sources import IndexedJsonlSource
    from torchtitan.hf_datasets.text_datasets import TextProcessor

    dataset = ConcatThenSplitPackingConfig(
        dataset=SingleDatasetConfig(
            source=IndexedJsonlSource.Config(patterns=(cfg.jsonl,)),
            processor=TextProcessor.Config(),
        )
    )
    loader = GrainDataLoader(
        GrainDataLoader.Config(dataset=dataset),
        dp_world_size=1,
        dp_rank=0,
        tokenizer=SpTokenizer(cfg.model),
        max_context_length=cfg.seq_len,
        num_tokens_per_batch=cfg.batch_size * cfg.seq_len,
    )
    return iter(loader), lambda b: b[1]


LOADERS: dict[str, Callable[[StepConfig], tuple[Iterator[Any], Callable[[Any], Any]]]] = {
    "zephon_thread": loader_zephon_thread,
    "zephon_process": loader_zephon_process,
    "titan030": loader_titan030,
    "nodes": loader_nodes,
    "titan_main": loader_titan_main,
}


# ------------------------------------------------------------------------- one run


def _same(x: Any) -> Any:
    return x


def _sched() -> tuple[float, float]:
    """This thread's CPU time and run-queue wait so far, in seconds.

    The wait is schedstat's ``run_delay`` (Linux; 0 without it): time the thread was ready
    but another one had the core. Read while running, it counts every wait that ended.
    """
    try:
        with open("/proc/thread-self/schedstat") as f:
            wait_ns = int(f.read().split()[1])
    except OSError:
        wait_ns = 0
    return time.thread_time(), wait_ns / 1e9


def run_one(peer: str, cfg: StepConfig) -> dict[str, Any]:
    """Run ``cfg.steps`` steps alone (``peer == "alone"``) or fed by ``peer``; measure.

    Per step: the wall time of ``next()`` (waiting for data, copying it), and of the
    emulated step's compute, split into the thread's CPU time, its run-queue wait (another
    process had the core: the machine's load) and the rest (blocked: waiting for the GIL).
    """
    torch.set_num_threads(1)
    trainer = Trainer(cfg.iters)
    t0 = time.perf_counter()
    batches: Iterator[Any]
    labels: Callable[[Any], Any]
    if peer == "alone":
        fixed = torch.zeros(cfg.batch_size, cfg.seq_len, dtype=torch.int64)
        batches, labels = iter(lambda: fixed, None), _same
    else:
        batches, labels = LOADERS[peer](cfg)
    first = labels(next(batches))
    first_s = time.perf_counter() - t0
    for _ in range(cfg.warmup_steps):
        trainer.step(labels(next(batches)))
    rows: dict[str, list[float]] = {k: [] for k in ("next", "wall", "cpu", "runq")}
    tokens = 0
    load0 = os.getloadavg()[0]
    c0, w0 = tree_cpu_s(), time.perf_counter()
    for _ in range(cfg.steps):
        s0 = time.perf_counter()
        lab = labels(next(batches))
        s1 = time.perf_counter()
        cpu0, q0 = _sched()
        trainer.step(lab)
        cpu1, q1 = _sched()
        s2 = time.perf_counter()
        rows["next"].append((s1 - s0) * 1e3)
        rows["wall"].append((s2 - s1) * 1e3)
        rows["cpu"].append((cpu1 - cpu0) * 1e3)
        rows["runq"].append((q1 - q0) * 1e3)
        tokens += _labels_tokens(lab)
    total_cpu = tree_cpu_s() - c0
    elapsed = time.perf_counter() - w0
    del first
    return {
        "peer": peer,
        **{f"{k}_ms": v for k, v in rows.items()},
        "tokens": tokens,
        "tree_cpu_s": total_cpu,
        "elapsed_s": elapsed,
        "first_batch_s": first_s,
        "load": [load0, os.getloadavg()[0]],
    }


def resume_first_batch(engine: str, dp: int, cfg: StepConfig, steps: int) -> float:
    """Seconds from nothing to rank 0's first batch at ``dp``, resumed after ``steps``."""
    node = zephon_node(cfg)
    it = iter(node)
    for _ in range(steps * node.micro_per_step):
        next(it)
    state = node.state_dict()
    node.close()
    t0 = time.perf_counter()
    resumed = zephon_node(cfg, dp, 0) if engine == "thread" else _zephon_child(cfg, dp, 0)
    resumed.reset(state)
    next(resumed)
    elapsed = time.perf_counter() - t0
    resumed.close()
    return elapsed


# ------------------------------------------------------------------------- orchestration


def _worker(argv: list[str]) -> int:
    cfg = StepConfig(**json.loads(argv[1]))
    if argv[0].startswith("resume:"):
        _, engine, dp, steps = argv[0].split(":")
        out: dict[str, Any] = {"seconds": resume_first_batch(engine, int(dp), cfg, int(steps))}
    else:
        out = run_one(argv[0], cfg)
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)  # loaders' threads and workers go with the process


def _here(peer: str, cfg: StepConfig) -> dict[str, Any]:
    """Run one configuration in this process (``--smoke``: no interpreter start per run)."""
    import gc

    try:
        if peer.startswith("resume:"):
            _, engine, dp, steps = peer.split(":")
            return {"seconds": resume_first_batch(engine, int(dp), cfg, int(steps))}
        return run_one(peer, cfg)
    finally:
        gc.collect()  # the loader's node, pool and child go now


def spawn(
    peer: str, cfg: StepConfig, python: str = sys.executable, here: bool = False
) -> dict[str, Any]:
    """Run one configuration in a fresh process (or ``here``); its result (or its error)."""
    if here and python == sys.executable:
        return _here(peer, cfg)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [python, "-m", "benchmarks.step_time", "--worker", peer, json.dumps(asdict(cfg))],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=1800,
    )  # fmt: skip
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"peer": peer, "error": " | ".join(tail) or f"exit {proc.returncode}"}


def _p95(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


def _series(rs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per-step series of runs: the step as the trainer sees it (``next`` + compute), and
    the same without run-queue wait (``own``: what the machine's load does not explain)."""
    out: dict[str, list[float]] = {"step": [], "own": [], "next": [], "cpu": [], "gil": []}
    for r in rs:
        for n, w, c, q in zip(r["next_ms"], r["wall_ms"], r["cpu_ms"], r["runq_ms"], strict=True):
            out["step"].append(n + w)
            out["own"].append(n + w - q)
            out["next"].append(n)
            out["cpu"].append(c)
            out["gil"].append(max(0.0, w - q - c))  # blocked in the compute: the GIL
    return out


def _pct(x: float, base: float) -> float:
    return 100 * (x / base - 1) if base > 0 else float("nan")


def summarize(runs: list[dict[str, Any]], step_ms: float) -> dict[str, Any]:
    """Median/p95 step time per configuration, inflation vs alone, loader CPU per 1k tokens.

    ``step``: wall time of a step (``next()`` + compute); ``own``: the same less the
    trainer thread's run-queue wait (time another process held the core: the machine's
    load, not the loader's GIL); ``cpu``: the trainer thread's CPU time in the compute;
    ``gil``: the compute's wall time less its CPU time and run-queue wait (the thread was
    blocked: waiting for the GIL).
    """
    by: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["peer"], []).append(r)
    base = _series([r for r in by.get("alone", []) if "error" not in r])
    out: dict[str, Any] = {}
    for peer, rs in by.items():
        if any("error" in r for r in rs):
            out[peer] = {"error": next(r["error"] for r in rs if "error" in r)}
            continue
        se = _series(rs)
        tokens = sum(r["tokens"] for r in rs)
        step_cpu_s = sum(sum(r["cpu_ms"]) for r in rs) / 1e3
        loader_cpu = max(0.0, sum(r["tree_cpu_s"] for r in rs) - step_cpu_s)
        row: dict[str, Any] = {
            "runs": len(rs),
            "first_batch_s": statistics.median(r["first_batch_s"] for r in rs),
            "loader_cpu_s_per_1k_tok": loader_cpu / tokens * 1e3 if peer != "alone" else 0.0,
            "load": [min(r["load"][0] for r in rs), max(r["load"][1] for r in rs)],
            "tok_s": tokens / sum(r["elapsed_s"] for r in rs),
            "next_median_ms": statistics.median(se["next"]),
            "gil_wait_median_ms": statistics.median(se["gil"]),
            "gil_wait_mean_ms": statistics.fmean(se["gil"]),
        }
        for key in ("step", "own", "cpu"):
            row[f"{key}_median_ms"] = statistics.median(se[key])
            row[f"{key}_p95_ms"] = _p95(se[key])
            if base[key]:
                row[f"{key}_inflation_median_pct"] = _pct(
                    row[f"{key}_median_ms"], statistics.median(base[key])
                )
                row[f"{key}_inflation_p95_pct"] = _pct(row[f"{key}_p95_ms"], _p95(base[key]))
        out[peer] = row
    return {"step_ms_target": step_ms, "configs": out}


def _infl(r: dict[str, Any], key: str) -> str:
    m = r.get(f"{key}_inflation_median_pct", float("nan"))
    p = r.get(f"{key}_inflation_p95_pct", float("nan"))
    return f"{m:+.1f}% / {p:+.1f}%"


def table(summary: dict[str, Any], resume: dict[str, float]) -> str:
    """The Markdown tables of a summary."""
    lines = [
        "| loader | step ms median / p95 | inflation median / p95 | step less run-queue "
        "wait ms median / p95 | its inflation median / p95 | next() ms median | GIL wait ms "
        "mean | step CPU inflation | loader CPU s / 1k tok | tok/s | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for peer, r in summary["configs"].items():
        if "error" in r:
            lines.append(f"| {peer} | error: {r['error'][:160]} |" + " |" * 9)
            continue
        infl = functools.partial(_infl, r)
        lines.append(
            f"| {peer} | {r['step_median_ms']:.1f} / {r['step_p95_ms']:.1f} | {infl('step')} | "
            f"{r['own_median_ms']:.1f} / {r['own_p95_ms']:.1f} | {infl('own')} | "
            f"{r['next_median_ms']:.2f} | {r['gil_wait_mean_ms']:.2f} | "
            f"{r.get('cpu_inflation_median_pct', float('nan')):+.1f}% | "
            f"{r['loader_cpu_s_per_1k_tok']:.4f} | {r['tok_s']:.0f} | "
            f"{r['load'][0]:.1f}-{r['load'][1]:.1f} |"
        )
    if resume:
        lines += ["", "| resume: time to rank 0's first batch | seconds |", "|---|---|"]
        lines += [f"| {k} | {v:.2f} |" for k, v in resume.items()]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny corpus, a few steps, in this process, peers zephon_thread, zephon_process "
        "and nodes unless --peers is given (a check that the script runs, not a measurement)",
    )
    p.add_argument("--steps", type=int, default=None, help="timed steps per run (default 60)")
    p.add_argument("--rounds", type=int, default=2, help="alone/loader alternations")
    p.add_argument("--step-ms", type=float, default=100.0, help="the step alone (50-200)")
    p.add_argument("--batch-size", type=int, default=2, help="rows per micro-batch")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--workers", type=int, default=2, help="each loader's workers")
    p.add_argument("--peers", default=None, help=f"comma-separated loaders (default {PEERS})")
    p.add_argument("--resume-steps", type=int, default=20, help="steps before the resume")
    p.add_argument("--no-resume", action="store_true", help="skip the resume timings")
    p.add_argument("--titan-main-python", default=TITAN_MAIN_PYTHON)
    p.add_argument("--root", default=None, help="corpus cache directory")
    p.add_argument("--json", default=None, help="write the results as JSON here ('-': stdout)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Build the corpus, calibrate the step, run every configuration, print the table."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return _worker(argv[1:])
    args = parse_args(argv)
    from benchmarks.corpus import build_corpus
    from benchmarks.run import corpus_args

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    cargs = corpus_args(args.smoke, args.root)
    corpus = build_corpus(Path(cargs.pop("root")), log=False, **cargs)
    smoke = args.smoke
    cfg = StepConfig(
        corpus_root=str(corpus.root), jsonl=str(corpus.jsonl), shard_glob=corpus.shard_glob,
        model=str(corpus.model), seq_len=128 if smoke else args.seq_len,
        batch_size=args.batch_size, workers=args.workers,
        step_ms=5.0 if smoke else args.step_ms,
        steps=args.steps or (3 if smoke else 60), warmup_steps=1 if smoke else 5,
    )  # fmt: skip
    cfg.iters = calibrate(cfg.step_ms)
    default = "zephon_thread,zephon_process,nodes" if smoke else ",".join(PEERS)
    peers = [p for p in (args.peers or default).split(",") if p]
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        raise SystemExit(f"--peers: unknown {unknown}; choose from {PEERS}")
    runs: list[dict[str, Any]] = []
    for _ in range(1 if smoke else args.rounds):
        for peer in peers:
            runs.append(spawn("alone", cfg, here=smoke))
            python = args.titan_main_python if peer == "titan_main" else sys.executable
            if peer == "titan_main" and not Path(python).exists():
                runs.append({"peer": peer, "error": f"{python} not found"})
                continue
            runs.append(spawn(peer, cfg, python, here=smoke))
    summary = summarize(runs, cfg.step_ms)
    resume: dict[str, float] = {}
    if not args.no_resume:
        for engine in ("thread", "process"):
            for dp in (1, 4):
                what = f"resume:{engine}:{dp}:{1 if smoke else args.resume_steps}"
                got = spawn(what, cfg, here=smoke)
                resume[f"zephon {engine}, dp {dp}"] = got.get("seconds", float("nan"))
    meta = {
        "command": "python -m benchmarks.step_time " + " ".join(argv),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("extra",)},
        "tokens_per_step": cfg.batch_size * cfg.seq_len,
    }
    result = {"meta": meta, "summary": summary, "resume_first_batch_s": resume}
    print(table(summary, resume))
    print(f"\nload average at the end: {meta['loadavg']}; cpus: {meta['cpus']}")
    if args.json:
        text = json.dumps(result, indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
