"""The pipelines under test: one function each, timed the same way.

Every pipeline turns the corpus's documents into packed ``seq_len`` samples in batches of
``batch_size`` (tokenize -> pack -> batch; bos/eos around each document) and is timed in
steady state: the clock starts ``warmup_s`` after the first batch and stops after
``seconds``. zephon-nodes' window also covers at least ``min_flush_periods`` whole flush
periods of every lane (lanes flush in near lockstep, each shuffle buffer draining and refilling
at once: a window shorter than a period measures the buffers, not the pipeline), so it may run
longer than ``seconds``. The count is the number of real (non-padding) target tokens delivered.
Pipelines repeat their data so they never run dry.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import mmap
import os
import pickle
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from torchdata.nodes import BaseNode

from benchmarks.corpus import Corpus

IGNORE_INDEX = -100


@dataclass(frozen=True)
class BenchConfig:
    """Shape of one run (the same for every pipeline)."""

    seq_len: int = 2048
    batch_size: int = 8
    num_workers: int = 2
    num_lanes: int = 8
    shuffle_buffer: int = 64
    chunk_size: int = 64
    flush_every: int = 8
    seconds: float = 4.0
    warmup_s: float = 3.0
    min_flush_periods: int = 2
    runner: str = "thread"
    python_filter: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """Serialize (for a subprocess)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BenchConfig:
        """Deserialize."""
        return cls(**json.loads(text))


@dataclass
class RunResult:
    """What one timed run measured."""

    tokens: int
    seconds: float
    first_batch_s: float
    batches: int
    ckpt_bytes: int | None = None
    padding_tokens: int = 0
    cpu_s: float | None = None
    flush_periods: int | None = None  # whole flush periods of every lane inside the window

    @property
    def tok_s(self) -> float:
        """Tokens per second in steady state."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process and all its descendants (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0.0))[1]
        todo.extend(children.get(pid, []))
    return total


def _timed(
    batches: Iterator[Any],
    count: Callable[[Any], tuple[int, int]],
    cfg: BenchConfig,
    windows: Callable[[], list[int]] | None = None,
) -> RunResult:
    """Pull batches; the clock starts ``warmup_s`` after the first one.

    The warm-up drains what the pipeline computed ahead while it filled its buffers before
    the first batch (a lane's look-ahead, a prefetch queue), so the timed window measures
    steady state, not work done before the clock started. With ``windows`` (each lane's
    current flush window), the clock also runs until every lane has passed
    ``cfg.min_flush_periods`` whole flush periods.
    """
    t0 = time.perf_counter()
    first = next(batches)
    count(first)
    t1 = time.perf_counter()
    while time.perf_counter() < t1 + cfg.warmup_s:
        count(next(batches))
    first_s = t1 - t0
    t1 = time.perf_counter()
    c1 = tree_cpu_s()
    tokens = pad = n = 0
    deadline = t1 + cfg.seconds
    start = windows() if windows is not None else []
    periods = 0  # whole periods of every lane: a lane k windows further covered k - 1 whole

    def covered() -> int:
        return min(w - w0 for w, w0 in zip(windows(), start, strict=True)) - 1

    now = t1
    while now < deadline or (windows is not None and periods < cfg.min_flush_periods):
        real, padding = count(next(batches))
        tokens += real
        pad += padding
        n += 1
        now = time.perf_counter()
        if windows is not None:
            periods = covered()
    cpu = tree_cpu_s() - c1
    return RunResult(
        tokens,
        now - t1,
        first_s,
        n,
        padding_tokens=pad,
        cpu_s=cpu,
        flush_periods=periods if windows is not None else None,
    )


def _count_labels(labels: Any) -> tuple[int, int]:
    arr = labels.numpy() if hasattr(labels, "numpy") else np.asarray(labels)
    pad = int((arr == IGNORE_INDEX).sum())
    return int(arr.size) - pad, pad


# ---------------------------------------------------------------------------------------
# zephon-nodes


def zephon_recipe(corpus: Corpus, cfg: BenchConfig) -> Any:
    """The benchmark recipe for zephon-nodes."""
    from zephon_nodes.recipe import DatasetSpec, Recipe, ShuffleSpec, TokenizerSpec, WorkSpec

    return Recipe(
        datasets=(DatasetSpec("bench", paths=(corpus.shard_glob,)),),
        tokenizer=TokenizerSpec(kind="sentencepiece", path=corpus.model),
        seed=1,
        num_lanes=cfg.num_lanes,
        global_batch_size=max(cfg.batch_size, cfg.num_lanes),
        seq_len=cfg.seq_len,
        flush_every=cfg.flush_every,
        work=WorkSpec(chunk_size=cfg.chunk_size, epochs=None),
        shuffle=ShuffleSpec(cfg.shuffle_buffer),
    )


class PythonFilter:
    """A pure-Python operator (holds the GIL): drop lines that are mostly punctuation."""

    name = "python_filter"

    def __call__(self, batch: Any) -> Any:
        from zephon_nodes.operators.documents import TextBatch

        texts = []
        for text in batch.texts:
            kept = []
            for line in text.split("\n"):
                letters = sum(1 for ch in line if ch.isalnum() or ch == " ")
                if letters * 2 >= len(line):
                    kept.append(line)
            texts.append("\n".join(kept))
        return TextBatch(texts, batch.source)


def zephon_pipeline(corpus: Corpus, cfg: BenchConfig) -> tuple[Any, Any, Any]:
    """Build (pipeline, rank node, pool) for the config."""
    from zephon_nodes.engine.pipeline import Pipeline
    from zephon_nodes.engine.pool import WorkerPool
    from zephon_nodes.operators.chain import Chain
    from zephon_nodes.operators.parse import ParseJsonl
    from zephon_nodes.operators.tokenize import Tokenize

    pipeline = Pipeline(zephon_recipe(corpus, cfg))
    if cfg.python_filter:
        pipeline.stateless = Chain(
            [ParseJsonl(), PythonFilter(), Tokenize(pipeline.recipe.tokenizer)]
        )
    pool = WorkerPool(cfg.num_workers, cfg.runner)
    node = pipeline.rank_node(1, 0, pool=pool, local_batch_size=cfg.batch_size)
    return pipeline, node, pool


def run_zephon(corpus: Corpus, cfg: BenchConfig) -> RunResult:
    """zephon-nodes: one rank, ``num_lanes`` lanes, shuffle buffer, pool of workers."""
    _, node, pool = zephon_pipeline(corpus, cfg)
    try:

        def windows() -> list[int]:
            return [int(w) for w, _ in node.state_dict()["lanes"].values()]

        result = _timed(iter(node), lambda b: _count_labels(b["labels"]), cfg, windows)
        result.ckpt_bytes = len(json.dumps(node.state_dict()).encode())
    finally:
        pool.close()
    return result


# ---------------------------------------------------------------------------------------
# Raw tokenizer: the physical limit


def load_texts(corpus: Corpus) -> list[str]:
    """All documents' texts, in file order."""
    with open(corpus.jsonl, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def run_raw(corpus: Corpus, cfg: BenchConfig) -> RunResult:
    """Raw sentencepiece encode of groups of documents on ``num_workers`` threads."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(corpus.model))
    texts = load_texts(corpus)
    groups = [texts[i : i + cfg.chunk_size] for i in range(0, len(texts), cfg.chunk_size)]

    def encode(group: list[str]) -> int:
        ids = sp.encode(group, out_type=int, num_threads=1)
        return sum(map(len, ids)) + len(ids)  # + eos: one more target per document

    def stream() -> Iterator[int]:
        with cf.ThreadPoolExecutor(max(1, cfg.num_workers)) as ex:
            while True:
                yield from ex.map(encode, groups)

    return _timed(stream(), lambda n: (n, 0), cfg)


# ---------------------------------------------------------------------------------------
# Grain


class JsonlSource:
    """Grain random-access source over a jsonl file (mmap + a line index); picklable."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as f:
            data = f.read()
        nl = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
        self.starts = np.concatenate([[0], nl[:-1] + 1]).astype(np.int64)
        self.ends = nl.astype(np.int64)
        self._mm: mmap.mmap | None = None

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> str:
        if self._mm is None:
            with open(self.path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        raw = self._mm[int(self.starts[i]) : int(self.ends[i])]
        return json.loads(raw)["text"]

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "starts": self.starts, "ends": self.ends, "_mm": None}


class SpEncode:
    """Grain map: text -> {"inputs", "targets"} (TorchTitan-style shift inside a document)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._sp: Any = None

    def __call__(self, text: str) -> dict[str, np.ndarray]:
        if self._sp is None:
            import sentencepiece as spm

            self._sp = spm.SentencePieceProcessor(model_file=self.model)
        ids = np.asarray(self._sp.encode(text, add_bos=True, add_eos=True), dtype=np.int32)
        return {"inputs": ids[:-1], "targets": ids[1:]}

    def __getstate__(self) -> dict[str, Any]:
        return {"model": self.model, "_sp": None}


def grain_iter(corpus: Corpus, cfg: BenchConfig, processes: bool) -> Any:
    """Grain: shuffled source -> map(encode) -> concat-then-split packing -> batch."""
    import grain
    from grain.experimental import ConcatThenSplitIterDataset

    ds = grain.MapDataset.source(JsonlSource(str(corpus.jsonl))).shuffle(seed=1).repeat()
    ds = ds.map(SpEncode(str(corpus.model)))
    threads = 1 if processes else cfg.num_workers
    it = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=64))
    it = ConcatThenSplitIterDataset(
        it, length_struct={"inputs": cfg.seq_len, "targets": cfg.seq_len}
    )
    it = it.batch(cfg.batch_size)
    if processes:
        it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg.num_workers))
    return iter(it)


def _grain_count(batch: dict[str, np.ndarray]) -> tuple[int, int]:
    seg = batch["targets_segment_ids"]
    real = int((seg > 0).sum())
    return real, int(seg.size) - real


def run_grain(corpus: Corpus, cfg: BenchConfig, processes: bool = False) -> RunResult:
    """Grain 0.2.x with thread prefetch (or ``processes``: mp_prefetch workers)."""
    it = grain_iter(corpus, cfg, processes)
    result = _timed(it, _grain_count, cfg)
    result.ckpt_bytes = len(json.dumps(it.get_state(), default=str).encode())
    close = getattr(it, "close", None)
    if callable(close):
        close()
    return result


# ---------------------------------------------------------------------------------------
# TorchTitan 0.3.0 default loader


class TitanSpTokenizer:
    """TorchTitan tokenizer interface over the sentencepiece model."""

    def __init__(self, model: str) -> None:
        import sentencepiece as spm

        self.model = model
        self.sp = spm.SentencePieceProcessor(model_file=model)
        self.bos_id = self.sp.bos_id()
        self.eos_id = self.sp.eos_id()

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        return self.sp.encode(text, add_bos=add_bos, add_eos=add_eos)

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode(ids)

    def get_vocab_size(self) -> int:
        return self.sp.get_piece_size()


def _text(sample: dict[str, Any]) -> str:
    return sample["text"]


def titan_loader(corpus: Corpus, cfg: BenchConfig) -> Any:
    """TorchTitan's ``HuggingFaceTextDataLoader`` on the local jsonl (HF ``json`` builder)."""
    from functools import partial

    from datasets import load_dataset
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets import text_datasets as td

    cache = str(corpus.root / "hf_cache")
    td.DATASETS["zephon_bench"] = DatasetConfig(
        path=str(corpus.jsonl),
        loader=partial(_load_json, cache_dir=cache),
        sample_processor=_text,
    )
    config = td.HuggingFaceTextDataLoader.Config(
        dataset="zephon_bench",
        dataset_path=str(corpus.jsonl),
        num_workers=cfg.num_workers,
        infinite=True,
    )
    del load_dataset
    return td.HuggingFaceTextDataLoader(
        config,
        dp_world_size=1,
        dp_rank=0,
        tokenizer=TitanSpTokenizer(str(corpus.model)),  # type: ignore[arg-type]
        seq_len=cfg.seq_len,
        local_batch_size=cfg.batch_size,
    )


def _load_json(path: str, cache_dir: str) -> Any:
    from datasets import load_dataset

    return load_dataset("json", data_files=path, split="train", cache_dir=cache_dir)


def run_titan(corpus: Corpus, cfg: BenchConfig) -> RunResult:
    """TorchTitan 0.3.0 ``HuggingFaceTextDataLoader`` with ``num_workers`` processes."""
    loader = titan_loader(corpus, cfg)
    it = iter(loader)
    result = _timed(it, lambda b: _count_labels(b[1]), cfg)
    result.ckpt_bytes = len(pickle.dumps(loader.state_dict()))
    del it
    return result


# ---------------------------------------------------------------------------------------
# Plain torchdata.nodes


class _PackNode(BaseNode[dict[str, np.ndarray]]):
    """Concatenate documents into ``seq_len`` rows (a plain stateful torchdata node)."""

    def __init__(self, source: BaseNode[np.ndarray], seq_len: int) -> None:
        super().__init__()
        self.source = source
        self.seq_len = seq_len
        self._inp = np.zeros(0, dtype=np.int64)
        self._lab = np.zeros(0, dtype=np.int64)

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(initial_state["source"] if initial_state else None)
        if initial_state:
            self._inp = np.asarray(initial_state["inputs"], dtype=np.int64)
            self._lab = np.asarray(initial_state["labels"], dtype=np.int64)
        else:
            self._inp = np.zeros(0, dtype=np.int64)
            self._lab = np.zeros(0, dtype=np.int64)

    def next(self) -> dict[str, np.ndarray]:
        s = self.seq_len
        if len(self._inp) < s:
            inp, lab, held = [self._inp], [self._lab], len(self._inp)
            while held < s:
                ids = next(self.source)
                inp.append(ids[:-1])
                lab.append(ids[1:])
                held += len(ids) - 1
            self._inp, self._lab = np.concatenate(inp), np.concatenate(lab)
        out = {"input": self._inp[:s], "labels": self._lab[:s]}
        self._inp, self._lab = self._inp[s:], self._lab[s:]
        return out

    def get_state(self) -> dict[str, Any]:
        return {
            "source": self.source.state_dict(),
            "inputs": self._inp.tolist(),
            "labels": self._lab.tolist(),
        }


def run_nodes(corpus: Corpus, cfg: BenchConfig) -> RunResult:
    """torchdata.nodes: documents -> ParallelMapper(encode, threads) -> pack -> Batcher."""
    import sentencepiece as spm
    import torch
    from torchdata.nodes import Batcher, IterableWrapper, Loader, Mapper, ParallelMapper

    sp = spm.SentencePieceProcessor(model_file=str(corpus.model))
    texts = load_texts(corpus)
    order = np.random.default_rng(1).permutation(len(texts))

    def docs() -> Iterator[str]:
        while True:
            for i in order.tolist():
                yield texts[i]

    def encode(text: str) -> np.ndarray:
        return np.asarray(sp.encode(text, add_bos=True, add_eos=True), dtype=np.int64)

    def collate(rows: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(np.stack([r[k] for r in rows])) for k in rows[0]}

    mapped = ParallelMapper(
        IterableWrapper(docs()), encode, num_workers=cfg.num_workers, method="thread"
    )
    packed = _PackNode(mapped, cfg.seq_len)
    node = Mapper(Batcher(packed, cfg.batch_size), collate)
    loader = Loader(node)
    it = iter(loader)
    result = _timed(it, lambda b: _count_labels(b["labels"]), cfg)
    result.ckpt_bytes = len(pickle.dumps(loader.state_dict()))
    return result


RUNNERS: dict[str, Callable[[Corpus, BenchConfig], RunResult]] = {
    "zephon": run_zephon,
    "grain": lambda c, cfg: run_grain(c, cfg, processes=False),
    "grain_proc": lambda c, cfg: run_grain(c, cfg, processes=True),
    "torchtitan": run_titan,
    "nodes": run_nodes,
    "raw": run_raw,
}
