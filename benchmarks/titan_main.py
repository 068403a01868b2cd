"""Peer: TorchTitan main's ``GrainDataLoader`` (the vendored snapshot), in its own venv.

TorchTitan main cannot share a venv with TorchTitan 0.3.0, so the runner starts this module
with ``.venv-titan-main``'s Python (see :func:`titan_main_python`); it imports only the
stdlib-only parts of ``benchmarks`` (the corpus cache and the timing loop) plus TorchTitan.

The loader is the one TorchTitan main's text pretraining builds: ``IndexedJsonlSource`` over
the corpus's jsonl -> ``TextProcessor`` (bos/eos around each document) -> leaf shuffle and
dp sharding -> ``ConcatThenSplitPackingConfig`` -> ``TextCollator`` (flat batches of
``batch_size x seq_len`` tokens) -> thread prefetch; Grain reads with ``num_workers``
threads (``ReadOptions``), prefetch 64, as the Grain peers.

Usage (what the runner does)::

    .venv-titan-main/bin/python -m benchmarks.titan_main --mode throughput \\
        --config '{...}' --corpus-args '{...}'
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.corpus import BenchTokenizer, Corpus, build_corpus, hf_dir
from benchmarks.timing import BenchConfig, timed, tree_cpu_s

IGNORE_INDEX = -100
REPO = Path(__file__).resolve().parent.parent


def titan_main_python() -> str | None:
    """The TorchTitan-main venv's Python (``$ZEPHON_TITAN_MAIN_PYTHON`` or the lead's), if any.

    A venv counts once TorchTitan is installed in it (the lead builds it while others run).
    """
    env = os.environ.get("ZEPHON_TITAN_MAIN_PYTHON")
    candidates = [env] if env else []
    candidates += [
        str(REPO / ".venv-titan-main" / "bin" / "python"),
        "/work/main/.venv-titan-main/bin/python",
    ]
    for c in candidates:
        venv = Path(c).parent.parent
        if os.access(c, os.X_OK) and any(venv.glob("lib/python*/site-packages/torchtitan")):
            return c
    return None


def _tokenizer(corpus: Corpus, cfg: BenchConfig) -> Any:
    if cfg.tokenizer == "hf":
        from torchtitan.components.tokenizer import HuggingFaceTokenizer

        return HuggingFaceTokenizer(tokenizer_path=hf_dir(corpus))
    return BenchTokenizer("sp", str(corpus.model))


def _text(row: dict[str, Any]) -> str:
    return str(row["text"])


def loader(corpus: Corpus, cfg: BenchConfig) -> Any:
    """TorchTitan main's ``GrainDataLoader`` on the corpus (rank 0 of ``cfg.dp``)."""
    import grain.python as grain
    from torchtitan.components.data import (
        ConcatThenSplitPackingConfig,
        GrainDataLoader,
        IndexedJsonlSource,
        SingleDatasetConfig,
    )
    from torchtitan.hf_datasets.text_datasets import TextProcessor

    ds = SingleDatasetConfig(
        source=IndexedJsonlSource.Config(patterns=(str(corpus.jsonl),)),
        processor=TextProcessor.Config(text_fn=_text),
    )
    config = GrainDataLoader.Config(
        dataset=ConcatThenSplitPackingConfig(dataset=ds),
        seed=1,
        read_options=grain.ReadOptions(num_threads=cfg.num_workers, prefetch_buffer_size=64),
    )
    return GrainDataLoader(
        config,
        dp_world_size=cfg.dp,
        dp_rank=0,
        tokenizer=_tokenizer(corpus, cfg),
        max_context_length=cfg.seq_len,
        num_tokens_per_batch=cfg.seq_len * cfg.batch_size,
    )


def _count(batch: Any) -> tuple[int, int]:
    labels = batch[1]
    pad = int((labels == IGNORE_INDEX).sum())
    return int(labels.numel()) - pad, pad


def throughput(corpus: Corpus, cfg: BenchConfig) -> dict[str, Any]:
    """Steady-state tokens per second (the same clock as every peer)."""
    import pickle

    ld = loader(corpus, cfg)
    try:
        r = timed(iter(ld), _count, cfg)
        ckpt = len(pickle.dumps(ld.state_dict()))
    finally:
        ld.close()
    return {
        "tok_s": r.tok_s,
        "tokens": r.tokens,
        "seconds": r.seconds,
        "first_batch_s": r.first_batch_s,
        "ckpt_bytes": ckpt,
        "padding_tokens": r.padding_tokens,
        "tok_per_cpu_s": r.tokens / r.cpu_s if r.cpu_s else None,
        "flush_periods": None,
    }


def first_batch(corpus: Corpus, cfg: BenchConfig, steps: int) -> float:
    """Seconds from building the loader (and ``load_state_dict``) to its first batch."""
    import time

    state = None
    if steps:
        ld = loader(corpus, cfg)
        it = iter(ld)
        for _ in range(steps):
            next(it)
        state = ld.state_dict()
        ld.close()
    t0 = time.perf_counter()
    ld = loader(corpus, cfg)
    if state is not None:
        ld.load_state_dict(state)
    next(iter(ld))
    out = time.perf_counter() - t0
    ld.close()
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure once; print one JSON line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.titan_main")
    p.add_argument("--mode", choices=("throughput", "first"), required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--corpus-args", required=True)
    p.add_argument("--steps", type=int, default=0)
    args = p.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cargs = json.loads(args.corpus_args)
    corpus = build_corpus(Path(cargs.pop("root")), **cargs)
    cfg = BenchConfig.from_json(args.config)
    import torchtitan.components.data  # noqa: F401  (imports outside the clock)

    if args.mode == "throughput":
        out = throughput(corpus, cfg)
    else:
        out = {"first_batch_s": first_batch(corpus, cfg, args.steps)}
    out["cpu_s_total"] = tree_cpu_s()
    print(json.dumps(out), flush=True)
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
