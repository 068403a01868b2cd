"""Reading pre-tokenized corpora: tokens per CPU-second, ours beside each library's reader.

One corpus of documents of random ids (lengths 64 to 1,024 tokens) is written by each
library's own writer (megatron-core's ``IndexedDatasetBuilder``, mosaicml-streaming's
``MDSWriter`` with an ``ndarray:int32`` column, uncompressed and zstd, litdata's
``BinaryWriter``), from the side folder ``make install-test`` fills (``.side-formats``).
Then every document is read once, in order, by:

- ``zephon``: the dataset's shards (``open_dataset``), ``read`` over work items of
  ``--chunk`` documents (what the parse operator does for each work item), local files;
- ``library``: the library's own random-access reader, document by document
  (``IndexedDataset[i]``, ``StreamingDataset[i]["tokens"]`` with ``shuffle=False``,
  litdata's ``StreamingDataset[i]["input_ids"]``), the way their loaders fetch samples.

Both sum every id they read (a memory-mapped view is touched, not only sized) and check the
count and sum against the corpus. The figure is tokens per
CPU-second of this process (``time.process_time``, so a loaded machine changes it less than
wall time); each reader runs ``--repeats`` times, the best is kept, after a warm-up pass that
fills the page cache.

Usage::

    python -m benchmarks.pretokenized --json out.json            # 4M tokens per corpus
    python -m benchmarks.pretokenized --quick --json out.json    # smoke run (seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SIDE = Path(os.environ.get("ZEPHON_SIDE_FORMATS", ROOT / ".side-formats"))


def _side() -> None:
    if not (SIDE / "megatron").is_dir():
        sys.exit(f"{SIDE}: the writers' side folder is not installed: run `make install-test`")
    for name in ("streaming.vision", "streaming.multimodal", "streaming.text"):
        sys.modules.setdefault(name, types.ModuleType(name))
    if str(SIDE) not in sys.path:
        sys.path.append(str(SIDE))


def documents(tokens: int, seed: int = 0) -> list[np.ndarray]:
    """Documents of random ids below 50,000, lengths 64 to 1,024, about ``tokens`` in all."""
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    total = 0
    while total < tokens:
        n = int(rng.integers(64, 1025))
        out.append(rng.integers(0, 50_000, n, dtype=np.int32))
        total += n
    return out


def write_all(root: Path, docs: list[np.ndarray]) -> dict[str, Path]:
    """Each library's corpus of ``docs`` under ``root``; ``{name: path}``."""
    import torch
    from litdata.streaming.writer import BinaryWriter
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from streaming import MDSWriter

    builder = IndexedDatasetBuilder(str(root / "corpus.bin"), dtype=np.uint16)
    for d in docs:
        builder.add_document(torch.from_numpy(d.astype(np.int64)), [len(d)])
    builder.finalize(str(root / "corpus.idx"))
    for name, compression in (("mds", None), ("mds-zstd", "zstd")):
        with MDSWriter(
            out=str(root / name),
            columns={"tokens": "ndarray:int32"},
            compression=compression,
            size_limit=1 << 22,
        ) as w:
            for d in docs:
                w.write({"tokens": d})
    writer = BinaryWriter(str(root / "litdata"), chunk_bytes=1 << 22)
    for i, d in enumerate(docs):
        writer[i] = {"input_ids": torch.from_numpy(d)}
    writer.done()
    writer.merge()
    return {
        "megatron": root / "corpus.idx",
        "mds": root / "mds",
        "mds-zstd": root / "mds-zstd",
        "litdata": root / "litdata",
    }


def ours(path: Path, chunk: int) -> Callable[[], tuple[int, int]]:
    """Read every document through zephon's shards, ``chunk`` documents per read."""
    from zephon_nodes import DatasetSpec
    from zephon_nodes.io.sources import open_dataset

    fmt = "megatron" if path.suffix == ".idx" else None
    spec = DatasetSpec("c", paths=(str(path),), format=fmt)
    shards = open_dataset(spec, chunk).dataset.shards

    def run() -> tuple[int, int]:
        n = total = 0
        for s in shards:
            for lo in range(0, s.num_records, chunk):
                for _, ids in s.read(lo, min(lo + chunk, s.num_records)):
                    n += len(ids)
                    total += int(ids.sum(dtype=np.int64))
        return n, total

    return run


def _count(docs: Any) -> tuple[int, int]:
    n = total = 0
    for ids in docs:
        n += len(ids)
        total += int(np.asarray(ids).sum(dtype=np.int64))
    return n, total


def theirs(name: str, path: Path) -> Callable[[], tuple[int, int]]:
    """Read every document with the library's own reader."""
    if name == "megatron":
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        ds = IndexedDataset(str(path)[: -len(".idx")])
        return lambda: _count(ds[i] for i in range(len(ds)))
    if name.startswith("mds"):
        from streaming import StreamingDataset

        sd = StreamingDataset(local=str(path), shuffle=False, batch_size=1)
        return lambda: _count(sd[i]["tokens"] for i in range(sd.num_samples))
    from litdata import StreamingDataset as LitDataset

    ld = LitDataset(str(path))
    return lambda: _count(ld[i]["input_ids"].numpy() for i in range(len(ld)))


def measure(
    fn: Callable[[], tuple[int, int]], expected: tuple[int, int], repeats: int
) -> dict[str, float]:
    """Best tokens per CPU-second (and per wall second) of ``repeats`` runs after a warm-up.

    Each run sums the ids it read (every token is touched), checked against the corpus.
    """
    assert fn() == expected, "the reader did not return the corpus's tokens"
    best: dict[str, float] = {}
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        got = fn()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        assert got == expected
        n = got[0]
        if not best or n / cpu > best["tokens_per_cpu_s"]:
            best = {"tokens_per_cpu_s": n / cpu, "tokens_per_wall_s": n / wall, "cpu_s": cpu}
    return best


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print the table (``--json`` also writes it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4_000_000, help="tokens per corpus")
    parser.add_argument("--chunk", type=int, default=64, help="documents per work item")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="50k tokens, 1 repeat")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.repeats = 50_000, 1
    _side()
    os.environ.setdefault("ZEPHON_CACHE_DIR", tempfile.mkdtemp(prefix="zephon-bench-"))
    docs = documents(args.tokens)
    expected = _count(docs)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_all(Path(tmp), docs)
        for name, path in paths.items():
            for reader, fn in (("zephon", ours(path, args.chunk)), ("library", theirs(name, path))):
                result = measure(fn, expected, args.repeats)
                rows.append({"format": name, "reader": reader, **result})
                print(
                    f"{name:9s} {reader:8s} {result['tokens_per_cpu_s'] / 1e6:8.1f} M tokens/CPU-s"
                    f" {result['tokens_per_wall_s'] / 1e6:8.1f} M tokens/wall-s",
                    flush=True,
                )
    out = {
        "documents": len(docs),
        "tokens": expected[0],
        "chunk": args.chunk,
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "rows": rows,
    }
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
