"""Cost of the integrity checks of issue 27, each beside the unchecked peer in the same run.

1. Reading a cache copy: :func:`zephon_nodes.io.formats.entrysums.read_checked` (each
   16 KiB block touched is hashed) against a plain ``seek`` + ``read`` of the same ranges,
   for reads of 4 KiB, 64 KiB and 1 MiB at random offsets of a 256 MiB copy in the page
   cache. Reported as CPU nanoseconds per byte returned (process time).
2. Opening a dataset index of N shards: the sealed, duplicate-refusing parse with every
   entry range-checked against a plain ``json.loads``, CPU seconds.

    python -m benchmarks.integrity [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from zephon_nodes.core.errors import DataError


def _reads(path: Path, index_path: str, size: int, span: int, n: int) -> dict[str, float]:
    from zephon_nodes.io.formats.entrysums import read_checked

    rng = random.Random(span)
    ranges = [(lo, lo + span) for lo in (rng.randrange(0, size - span) for _ in range(n))]
    out: dict[str, float] = {}
    for name in ("plain", "checked", "plain_again", "checked_again"):
        t = time.process_time()
        got = 0
        for lo, hi in ranges:
            if name.startswith("plain"):
                with open(path, "rb") as f:
                    f.seek(lo)
                    got += len(f.read(hi - lo))
            else:
                got += len(read_checked(str(path), index_path, lo, hi))
        out[name] = (time.process_time() - t) / got * 1e9
    return {
        "plain_ns_per_byte": min(out["plain"], out["plain_again"]),
        "checked_ns_per_byte": min(out["checked"], out["checked_again"]),
    }


def bench_reads(quick: bool) -> dict[str, Any]:
    from zephon_nodes.io.formats.entrysums import write_sums

    size = (16 if quick else 256) << 20
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.jsonl"
        path.write_bytes(os.urandom(size))
        index_path = str(Path(tmp) / "k.index.npy")
        write_sums(path, np.zeros((1, 2), np.int64), index_path)
        path.read_bytes()  # in the page cache
        out = {}
        for span in (4 << 10, 64 << 10, 1 << 20):
            n = max(20, (64 << 20) // span // (8 if quick else 1))
            n = min(n, 20000)
            out[f"{span >> 10}KiB"] = _reads(path, index_path, size, span, n)
        return out


def bench_index(shards: int) -> dict[str, float]:
    from zephon_nodes.io.index.indexcheck import check_entry, parse_manifest, seal

    entry = {
        "bytes": 100000,
        "checksum": "xxh3_128:" + "0" * 32,
        "end": 99990,
        "every": 64,
        "kind": "jsonl",
        "offsets": [0, 50000],
        "records": 100,
        "version": "1700000000000000000",
    }
    manifest = {
        "format": "zephon-index",
        "version": 1,
        "every": 64,
        "shards": {f"p/part-{k:06d}.jsonl": dict(entry) for k in range(shards)},
    }
    blob = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
    sealed = seal(blob)
    t = time.process_time()
    json.loads(blob)
    plain = time.process_time() - t
    t = time.process_time()
    data = parse_manifest(sealed, "x", "h")
    parsed = time.process_time() - t
    t = time.process_time()
    for name, e in data["shards"].items():
        check_entry(name, e, lambda n, p: DataError(p))
    checked = time.process_time() - t
    return {
        "index_mb": len(sealed) / 1e6,
        "plain_parse_cpu_s": plain,
        "sealed_parse_cpu_s": parsed,
        "entry_checks_cpu_s": checked,
    }


def main(argv: list[str] | None = None) -> None:
    """Run both and print (or write) the JSON."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    out = {
        "load_average": os.getloadavg()[0],
        "reads": bench_reads(args.quick),
        "index": bench_index(2000 if args.quick else 100_000),
    }
    text = json.dumps(out, indent=1)
    if args.json:
        Path(args.json).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
