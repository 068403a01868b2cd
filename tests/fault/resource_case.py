"""Helper process for the resource-limit tests: build one case, run it, report peak RSS.

Usage: ``python -m tests.fault.resource_case CASE DIR``. Prints one JSON line: the case, peak
RSS (MiB, ``ru_maxrss``) before and after the run, and what the test checks (counts, digests).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _recipe(directory: Path, pattern: str, **kw: Any) -> Any:
    from zephon_nodes import DatasetSpec, Recipe, ShuffleSpec, TokenizerSpec, WorkSpec

    base: dict[str, Any] = {
        "datasets": (DatasetSpec("r", paths=(pattern,), base_dir=directory),),
        "tokenizer": TokenizerSpec(kind="bytes", add_bos=False, add_eos=True),
        "seed": 1,
        "num_lanes": 2,
        "global_batch_size": 2,
        "seq_len": 4096,
        "flush_every": 4,
        "work": WorkSpec(chunk_size=64, epochs=1),
        "shuffle": ShuffleSpec(0),
    }
    base.update(kw)
    return Recipe(**base)


def _drain(pipe: Any, world: int = 1, workers: int = 1) -> dict[str, Any]:
    """Run every step; return step count, label-token count and the histogram's SHA-256."""
    from zephon_nodes import simulate

    hist = np.zeros(259, dtype=np.int64)
    steps = tokens = 0
    for res, mbs in simulate(pipe, world, 10**9, num_workers=workers, keep_batches=True):
        steps += 1
        tokens += res.tokens
        for mb in mbs or []:
            ids = mb["input"].numpy()[mb["labels"].numpy() != -100]
            hist += np.bincount(ids, minlength=259)[:259]
    return {
        "steps": steps,
        "tokens": tokens,
        "hist_sha": hashlib.sha256(hist.tobytes()).hexdigest(),
    }


def big_document(d: Path) -> dict[str, Any]:
    """One big document (``ZEPHON_BIG_DOC_MB``, default 100) between two small ones."""
    from zephon_nodes import Pipeline

    unit = "abcdefghij klmnopqrst uvwxyz 0123456789 é ".encode()
    reps = int(float(os.environ.get("ZEPHON_BIG_DOC_MB", "100")) * 2**20) // len(unit)
    size = reps * len(unit)
    docs = [b"small one", b"small two"]
    with open(d / "big.jsonl", "wb") as f:
        f.write(b'{"text": "small one"}\n{"text": "')
        for lo in range(0, reps, 20_000):
            f.write(unit * min(20_000, reps - lo))
        f.write(b'"}\n{"text": "small two"}')  # and no newline at the end
    base = _rss_mib()
    pipe = Pipeline(_recipe(d, "big.jsonl", num_lanes=1, global_batch_size=1, work=_work(1)))
    out = _drain(pipe)
    # What the test checks the output against, from the bytes alone: label tokens = UTF-8
    # bytes of each text (eos appended, no bos), and the histogram of unmasked input ids.
    hist = reps * np.bincount(np.frombuffer(unit, np.uint8).astype(np.int64) + 3, minlength=259)
    for small in docs:
        hist += np.bincount(np.frombuffer(small, np.uint8).astype(np.int64) + 3, minlength=259)
    out["expected_tokens"] = int(hist.sum())
    out["expected_hist_sha"] = hashlib.sha256(hist.tobytes()).hexdigest()
    out["doc_bytes"] = size
    return out | {"rss_before_mib": base}


def _work(chunk: int) -> Any:
    from zephon_nodes import WorkSpec

    return WorkSpec(chunk_size=chunk, epochs=1)


def million_records(d: Path) -> dict[str, Any]:
    """One shard of 1,000,000 tiny records."""
    from zephon_nodes import Pipeline

    n = 1_000_000
    with open(d / "tiny.jsonl", "wb") as f:
        for lo in range(0, n, 10_000):
            f.write(b"".join(b'{"text":"r%d"}\n' % i for i in range(lo, lo + 10_000)))
    base = _rss_mib()
    pipe = Pipeline(_recipe(d, "tiny.jsonl", seq_len=256, global_batch_size=8, num_lanes=1,
                            work=_work(1024)))  # fmt: skip
    out = _drain(pipe, workers=2)
    shard = pipe.datasets[0].shards[0]
    out["records"] = shard.num_records
    out["spot_checks_ok"] = all(
        shard.read(i, i + 1)[0][1] == b'{"text":"r%d"}' % i for i in (0, 1, 4097, 500_000, n - 1)
    )
    # every record "r<i>" gives len("r<i>") label tokens (eos, no bos); the last partial
    # global batch (< 8 samples of 256) is not a step
    out["expected_tokens"] = sum(len(b"r%d" % i) for i in range(n))
    out["max_dropped_tokens"] = 8 * 256
    return out | {"rss_before_mib": base}


def no_newline_at_eof(d: Path) -> dict[str, Any]:
    """Three shards whose last line has no newline (one of them compressed)."""
    import zstandard

    from zephon_nodes import Pipeline

    (d / "a.jsonl").write_bytes(b'{"text": "first"}\n{"text": "last a"}')
    (d / "b.jsonl").write_bytes(b'{"text": "only b"}')
    raw = b'{"text": "c1"}\r\n\r\n{"text": "last c"}'
    (d / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    base = _rss_mib()
    pipe = Pipeline(_recipe(d, "*.jsonl*", seq_len=8, work=_work(1), flush_every=1,
                            num_lanes=1, global_batch_size=1))  # fmt: skip
    texts: list[str] = []
    for item in range(pipe.datasets[0].num_work_items):
        shard, start, stop = pipe.datasets[0].locate(item)
        for _, line in pipe.datasets[0].shards[shard].read(start, stop):
            texts.append(json.loads(line)["text"])
    out = _drain(pipe)
    out["expected_tokens"] = len("firstlast aonly bc1last c")
    return out | {"texts": sorted(texts), "rss_before_mib": base}


def many_shards(d: Path) -> dict[str, Any]:
    """10,000 shards of 3 records each (every record read once)."""
    from zephon_nodes import Pipeline

    for s in range(10_000):
        blob = b'{"text":"s%da"}\n{"text":"s%db"}\n{"text":"x"}\n' % (s, s)
        (d / f"s{s:05d}.jsonl").write_bytes(blob)
    base = _rss_mib()
    t0 = time.monotonic()
    pipe = Pipeline(_recipe(d, "s*.jsonl", seq_len=64, global_batch_size=1, num_lanes=1,
                            work=_work(2)))  # fmt: skip
    open_s = time.monotonic() - t0
    out = _drain(pipe, workers=2)
    out["expected_tokens"] = sum(len(b"s%da" % s) * 2 + 1 for s in range(10_000))
    out["records"] = pipe.datasets[0].num_records
    out["shards"] = len(pipe.datasets[0].shards)
    return out | {"rss_before_mib": base, "open_s": round(open_s, 1)}


CASES = {
    "big_document": big_document,
    "million_records": million_records,
    "no_newline_at_eof": no_newline_at_eof,
    "many_shards": many_shards,
}


def main() -> None:
    case, directory = sys.argv[1], Path(sys.argv[2])
    directory.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    out = CASES[case](directory)
    out.update(
        case=case, peak_rss_mib=round(_rss_mib(), 1), seconds=round(time.monotonic() - t0, 1)
    )
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
