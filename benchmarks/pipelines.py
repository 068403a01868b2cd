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
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from torchdata.nodes import BaseNode

from benchmarks.corpus import BenchTokenizer, Corpus, hf_dir
from benchmarks.timing import BenchConfig, RunResult, timed

__all__ = ["BenchConfig", "RunResult"]

IGNORE_INDEX = -100


def _count_labels(labels: Any) -> tuple[int, int]:
    arr = labels.numpy() if hasattr(labels, "numpy") else np.asarray(labels)
    pad = int((arr == IGNORE_INDEX).sum())
    return int(arr.size) - pad, pad


# ---------------------------------------------------------------------------------------
# Tokenizers: the corpus's sentencepiece model ("sp") or its byte-level BPE tokenizer.json ("hf")


def bench_tokenizer(corpus: Corpus, cfg: BenchConfig) -> BenchTokenizer:
    """The run's tokenizer."""
    if cfg.tokenizer == "hf":
        return BenchTokenizer("hf", hf_dir(corpus))
    return BenchTokenizer("sp", str(corpus.model))


# ---------------------------------------------------------------------------------------
# zephon-nodes


def zephon_recipe(corpus: Corpus, cfg: BenchConfig) -> Any:
    """The benchmark recipe for zephon-nodes."""
    from zephon_nodes.recipe import DatasetSpec, Recipe, ShuffleSpec, TokenizerSpec, WorkSpec

    return Recipe(
        datasets=(DatasetSpec("bench", paths=(corpus.shard_glob,)),),
        tokenizer=(
            TokenizerSpec(kind="hf", path=os.path.join(hf_dir(corpus), "tokenizer.json"))
            if cfg.tokenizer == "hf"
            else TokenizerSpec(kind="sentencepiece", path=corpus.model)
        ),
        seed=1,
        num_lanes=cfg.num_lanes,
        global_batch_size=max(cfg.batch_size * cfg.dp, cfg.num_lanes),
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
    node = pipeline.rank_node(cfg.dp, 0, pool=pool, local_batch_size=cfg.batch_size)
    return pipeline, node, pool


def run_zephon(corpus: Corpus, cfg: BenchConfig) -> RunResult:
    """zephon-nodes: one rank, ``num_lanes`` lanes, shuffle buffer, pool of workers."""
    _, node, pool = zephon_pipeline(corpus, cfg)
    try:

        def windows() -> list[int]:
            return [int(w) for w, _ in node.state_dict()["lanes"].values()]

        result = timed(iter(node), lambda b: _count_labels(b["labels"]), cfg, windows)
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
    """Raw ``encode_batch`` of groups of documents on ``num_workers`` threads (the limit).

    Sentencepiece's batch encode (one thread each) or Hugging Face ``tokenizers``'
    ``encode_batch`` (``TOKENIZERS_PARALLELISM=false``: no Rust pool beside the threads).
    """
    tok = bench_tokenizer(corpus, cfg)
    texts = load_texts(corpus)
    groups = [texts[i : i + cfg.chunk_size] for i in range(0, len(texts), cfg.chunk_size)]

    def encode(group: list[str]) -> int:
        ids = tok.encode_batch(group)
        return sum(map(len, ids)) + len(ids)  # + eos: one more target per document

    def stream() -> Iterator[int]:
        with cf.ThreadPoolExecutor(max(1, cfg.num_workers)) as ex:
            while True:
                yield from ex.map(encode, groups)

    return timed(stream(), lambda n: (n, 0), cfg)


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

    def __init__(self, tok: BenchTokenizer) -> None:
        self.tok = tok

    def __call__(self, text: str) -> dict[str, np.ndarray]:
        ids = np.asarray(self.tok.encode(text, add_bos=True, add_eos=True), dtype=np.int32)
        return {"inputs": ids[:-1], "targets": ids[1:]}


def grain_iter(corpus: Corpus, cfg: BenchConfig, processes: bool) -> Any:
    """Grain: shuffled source -> map(encode) -> concat-then-split packing -> batch."""
    import grain
    from grain.experimental import ConcatThenSplitIterDataset

    ds = grain.MapDataset.source(JsonlSource(str(corpus.jsonl))).shuffle(seed=1)
    ds = ds[0 :: cfg.dp].repeat()  # rank 0 of dp
    ds = ds.map(SpEncode(bench_tokenizer(corpus, cfg)))
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
    result = timed(it, _grain_count, cfg)
    result.ckpt_bytes = len(json.dumps(it.get_state(), default=str).encode())
    close = getattr(it, "close", None)
    if callable(close):
        close()
    return result


# ---------------------------------------------------------------------------------------
# TorchTitan 0.3.0 default loader


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
        dp_world_size=cfg.dp,
        dp_rank=0,
        tokenizer=bench_tokenizer(corpus, cfg),  # type: ignore[arg-type]
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
    result = timed(it, lambda b: _count_labels(b[1]), cfg)
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


def nodes_loader(corpus: Corpus, cfg: BenchConfig) -> Any:
    """torchdata.nodes: documents -> ParallelMapper(encode, threads) -> pack -> Batcher."""
    import torch
    from torchdata.nodes import Batcher, IterableWrapper, Loader, Mapper, ParallelMapper

    tok = bench_tokenizer(corpus, cfg)
    texts = load_texts(corpus)
    order = np.random.default_rng(1).permutation(len(texts))[0 :: cfg.dp]

    class Docs:  # re-iterable (IterableWrapper's resume restarts it and skips ahead)
        def __iter__(self) -> Iterator[str]:
            while True:
                for i in order.tolist():
                    yield texts[i]

    def encode(text: str) -> np.ndarray:
        return np.asarray(tok.encode(text, add_bos=True, add_eos=True), dtype=np.int64)

    def collate(rows: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(np.stack([r[k] for r in rows])) for k in rows[0]}

    mapped = ParallelMapper(
        IterableWrapper(Docs()), encode, num_workers=cfg.num_workers, method="thread"
    )
    packed = _PackNode(mapped, cfg.seq_len)
    node = Mapper(Batcher(packed, cfg.batch_size), collate)
    return Loader(node)


def run_nodes(corpus: Corpus, cfg: BenchConfig) -> RunResult:
    """torchdata.nodes: documents -> ParallelMapper(encode, threads) -> pack -> Batcher."""
    loader = nodes_loader(corpus, cfg)
    it = iter(loader)
    result = timed(it, lambda b: _count_labels(b["labels"]), cfg)
    result.ckpt_bytes = len(pickle.dumps(loader.state_dict()))
    return result


# ---------------------------------------------------------------------------------------
# Time to the first batch, fresh or resumed: from building the pipeline (imports done) to
# its first batch; a resume first runs ``steps`` batches on another instance and saves.


def _clock_first(
    build: Callable[[], Any],
    first: Callable[[Any], Any],
    close: Callable[[Any], None],
    steps: int,
    save: Callable[[Any], Any],
    load: Callable[[Any, Any], None],
) -> float:
    state = None
    if steps:
        h = build()
        try:
            for _ in range(steps):
                first(h)
            state = save(h)
        finally:
            close(h)
    t0 = time.perf_counter()
    h = build()
    try:
        if state is not None:
            load(h, state)
        first(h)
        return time.perf_counter() - t0
    finally:
        close(h)


def _fresh_token_cache() -> str:
    """Turn the token cache on, in an empty directory of its own; return the directory.

    For this measurement's process only (each runs in a fresh one): the store's directory
    is the cache directory's ``tokens`` (``tokencache.default_root``), pointed here at a new
    temporary one so that a fresh start finds nothing and a resume finds what the run
    before the save stored; the rest of the cache directory (decompressed shards) is kept.
    """
    from zephon_nodes.io.nodecache.tokenstore import set_token_cache
    from zephon_nodes.operators import tokencache

    root = tempfile.mkdtemp(prefix="zephon-bench-tokens-")
    set_token_cache(True)
    tokencache.default_root = lambda: Path(root)
    return root


def first_zephon(corpus: Corpus, cfg: BenchConfig, steps: int) -> float:
    """zephon-nodes: build the rank node, ``reset(state)`` (what ``load_state_dict`` does).

    With ``cfg.extra["token_cache"]`` the token cache is on (empty at the start, see
    :func:`_fresh_token_cache`): a resume's replay then reads the ids the run before the
    save stored instead of tokenizing them again.
    """
    from zephon_nodes.operators import tokenize

    tokenize._TOKENIZERS.clear()  # a restart loads its tokenizer again
    if cfg.extra.get("token_cache"):
        root = _fresh_token_cache()
        try:
            return _first_zephon(corpus, cfg, steps)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return _first_zephon(corpus, cfg, steps)


def _first_zephon(corpus: Corpus, cfg: BenchConfig, steps: int) -> float:

    def build() -> Any:
        _, node, pool = zephon_pipeline(corpus, cfg)
        return [node, pool, None]

    def first(h: Any) -> Any:
        if h[2] is None:
            h[2] = iter(h[0])
        return next(h[2])

    def load(h: Any, state: Any) -> None:
        h[0].reset(state)
        h[2] = h[0]

    def close(h: Any) -> None:
        h[0].close() if hasattr(h[0], "close") else None
        h[1].close()

    return _clock_first(build, first, close, steps, lambda h: h[0].state_dict(), load)


def first_grain(corpus: Corpus, cfg: BenchConfig, steps: int, processes: bool) -> float:
    """Grain: build the iterator, ``set_state``."""

    def close(it: Any) -> None:
        c = getattr(it, "close", None)
        if callable(c):
            c()

    return _clock_first(
        lambda: grain_iter(corpus, cfg, processes),
        next,
        close,
        steps,
        lambda it: it.get_state(),
        lambda it, st: it.set_state(st),
    )


def first_titan(corpus: Corpus, cfg: BenchConfig, steps: int) -> float:
    """TorchTitan 0.3.0: build the loader, ``load_state_dict``."""

    def build() -> Any:
        return [titan_loader(corpus, cfg), None]

    def first(h: Any) -> Any:
        if h[1] is None:
            h[1] = iter(h[0])
        return next(h[1])

    return _clock_first(
        build,
        first,
        lambda h: None,
        steps,
        lambda h: h[0].state_dict(),
        lambda h, st: h[0].load_state_dict(st),
    )


def first_nodes(corpus: Corpus, cfg: BenchConfig, steps: int) -> float:
    """Plain torchdata.nodes: build the ``Loader``, ``load_state_dict``."""

    def build() -> Any:
        return [nodes_loader(corpus, cfg), None]

    def first(h: Any) -> Any:
        if h[1] is None:
            h[1] = iter(h[0])
        return next(h[1])

    return _clock_first(
        build,
        first,
        lambda h: None,
        steps,
        lambda h: h[0].state_dict(),
        lambda h, st: h[0].load_state_dict(st),
    )


def first_raw(corpus: Corpus, cfg: BenchConfig, steps: int) -> float:
    """Raw tokenizer: load it and the texts, encode the group (stateless: resume = fresh)."""
    t0 = time.perf_counter()
    tok = bench_tokenizer(corpus, cfg)
    texts = load_texts(corpus)
    k = steps * cfg.chunk_size % max(1, len(texts))
    tok.encode_batch(texts[k : k + cfg.chunk_size])
    return time.perf_counter() - t0


FIRST: dict[str, Callable[[Corpus, BenchConfig, int], float]] = {
    "zephon": first_zephon,
    "zephon_cache": lambda c, cfg, n: first_zephon(
        c, replace(cfg, extra={**cfg.extra, "token_cache": True}), n
    ),
    "grain": lambda c, cfg, n: first_grain(c, cfg, n, processes=False),
    "grain_proc": lambda c, cfg, n: first_grain(c, cfg, n, processes=True),
    "torchtitan": first_titan,
    "nodes": first_nodes,
    "raw": first_raw,
}


RUNNERS: dict[str, Callable[[Corpus, BenchConfig], RunResult]] = {
    "zephon": run_zephon,
    "grain": lambda c, cfg: run_grain(c, cfg, processes=False),
    "grain_proc": lambda c, cfg: run_grain(c, cfg, processes=True),
    "torchtitan": run_titan,
    "nodes": run_nodes,
    "raw": run_raw,
}
