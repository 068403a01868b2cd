"""Multimodal benchmark: decode + resize + tokenize + pack on the worker pool, thread vs
process runner, side by side with Grain doing the same decode/resize/batch; share of time
spent in decode. Prints Markdown tables (and ``--json``).

Images: crops of the photos scikit-image ships (up to ``--max-side`` pixels) re-encoded as
JPEG, PNG and WebP, plus generated Pillow images, in WebDataset tar shards (cached).

Usage::

    python -m benchmarks.multimodal            # full run (about 5 minutes on 2 cores)
    python -m benchmarks.multimodal --tiny     # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.corpus import default_root
from benchmarks.timing import tree_cpu_s
from zephon_nodes import DatasetSpec, Pipeline, Recipe, ShuffleSpec, TokenizerSpec, WorkSpec
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.io.formats.tar import TarShard, open_tar_shard
from zephon_nodes.multimodal.corpus import write_tar_shards
from zephon_nodes.multimodal.decode import decode_image
from zephon_nodes.multimodal.pack import MultimodalPacker
from zephon_nodes.operators.tokenize import ByteTokenizer
from zephon_nodes.recipe.image import ImageSpec

SPEC = ImageSpec(mode="fixed", size=(224, 224), patch_size=16, max_images=4)


@dataclass
class Result:
    """One timed run."""

    name: str
    images: int
    tokens: int
    seconds: float
    cpu_s: float

    @property
    def images_s(self) -> float:
        return self.images / self.seconds

    @property
    def tokens_s(self) -> float:
        return self.tokens / self.seconds


def make_data(root: Path, shards: int, per_shard: int, max_side: int) -> list[Path]:
    """Write (once) the tar shards under ``root`` and return them."""
    d = root / f"mm-{shards}x{per_shard}-{max_side}"
    paths = sorted(d.glob("*.tar"))
    if len(paths) != shards:
        paths = write_tar_shards(d, shards, per_shard, seed=3, max_side=max_side)
    return paths


def recipe(data_dir: Path, seq_len: int) -> Recipe:
    return Recipe(
        datasets=(DatasetSpec("photos", paths=("*.tar",), base_dir=data_dir),),
        tokenizer=TokenizerSpec(kind="bytes"),
        seed=1,
        num_lanes=8,
        global_batch_size=16,
        seq_len=seq_len,
        flush_every=4,
        work=WorkSpec(chunk_size=8, epochs=None),
        shuffle=ShuffleSpec(0),
        image=SPEC,
    )


def _timed(name: str, batches: Iterator[Any], count: Any, seconds: float) -> Result:
    count(next(batches))  # warm-up: workers started, first work items decoded
    t0, c0 = time.perf_counter(), tree_cpu_s()
    images = tokens = 0
    while time.perf_counter() - t0 < seconds:
        i, t = count(next(batches))
        images += i
        tokens += t
    return Result(name, images, tokens, time.perf_counter() - t0, tree_cpu_s() - c0)


def _zephon_count(mb: dict[str, Any]) -> tuple[int, int]:
    """Images, and tokens that are not padding (text, bos/eos and image placeholders)."""
    return int((mb["image_offsets"] >= 0).sum()), int((mb["document_ids"] >= 0).sum())


def run_zephon(
    r: Recipe,
    runner: str,
    workers: int,
    seconds: float,
    *,
    shared_memory: bool = True,
    operator_pools: dict[str, str] | None = None,
    name: str = "",
) -> Result:
    """One rank owning every lane, ``workers`` pool workers (plus per-operator pools)."""
    pipeline = Pipeline(r)
    with (
        WorkerPool(workers, runner, shared_memory=shared_memory) as pool,
        pipeline.rank_node(1, 0, pool=pool, operator_pools=operator_pools) as node,
    ):
        node.reset(None)
        name = name or f"zephon-nodes {runner} x{workers}"
        return _timed(name, node, _zephon_count, seconds)


class TarSource:
    """Grain random-access source over the same tar shards: ``(image bytes, text)``."""

    def __init__(self, shards: list[TarShard]) -> None:
        self.shards = shards
        self.ends = np.cumsum([s.num_records for s in shards])

    def __len__(self) -> int:
        return int(self.ends[-1])

    def __getitem__(self, i: int) -> tuple[bytes, str]:
        s = int(np.searchsorted(self.ends, i, side="right"))
        start = int(self.ends[s - 1]) if s else 0
        ((_, sample),) = self.shards[s].read(i - start, i - start + 1)
        text = sample.text.decode() if sample.text else json.loads(sample.json or b"{}")["text"]
        return sample.images[0][1], text


class DecodeTokenize:
    """Grain map: the same decode/resize as zephon-nodes, text ids padded to ``text_len``."""

    def __init__(self, text_len: int) -> None:
        self.text_len = text_len

    def __call__(self, pair: tuple[bytes, str]) -> dict[str, np.ndarray]:
        blob, text = pair
        img = decode_image(blob, SPEC)
        ids = np.zeros(self.text_len, dtype=np.int64)
        body = ByteTokenizer().encode_batch([text])[0][: self.text_len]
        ids[: len(body)] = body
        return {
            "patches": img.patches,
            "text": ids,
            "text_len": np.asarray(len(body), dtype=np.int64),
        }


def run_grain(shards: list[TarShard], processes: bool, workers: int, seconds: float) -> Result:
    """Grain 0.2.x: shuffled source -> map(decode, resize, tokenize) -> batch of 16."""
    import grain

    ds = grain.MapDataset.source(TarSource(shards)).shuffle(seed=1).repeat()
    ds = ds.map(DecodeTokenize(256))  # type: ignore[arg-type]
    threads = 1 if processes else workers
    it = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=64))
    it = it.batch(16)
    if processes:
        it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    per_image = SPEC.tokens_per_image

    def count(b: dict[str, np.ndarray]) -> tuple[int, int]:
        n = len(b["text_len"])
        # The same count as zephon-nodes' non-padding inputs: text + bos/eos + placeholders.
        return n, int(b["text_len"].sum()) + n * (per_image + 1)

    name = f"Grain {'mp_prefetch' if processes else 'threads'} x{workers}"
    return _timed(name, iter(it), count, seconds)


def stage_times(r: Recipe, items: int) -> dict[str, float]:
    """CPU seconds per stage over the first ``items`` work items of lane 0..7, inline.

    CPU time (this thread's), not wall time: other processes on the machine do not inflate it,
    so the decode limit derived from it holds under load too.
    """
    pipeline = Pipeline(r)
    parse, decode, tok = pipeline.stateless.operators
    work = [pipeline.work_source.work(lane, i) for i in range(items // 8 + 1) for lane in range(8)][
        :items
    ]
    out = dict.fromkeys(("parse", "decode", "tokenize", "pack"), 0.0)
    packer = MultimodalPacker(r.seq_len, pipeline.pad_id, SPEC, pipeline.placeholder_id)
    images = 0
    for item in work:
        t0 = time.thread_time()
        a = parse(item)
        t1 = time.thread_time()
        b = decode(a)
        t2 = time.thread_time()
        c = tok(b)
        t3 = time.thread_time()
        packer.feed(c)
        t4 = time.thread_time()
        for k, v in zip(out, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            out[k] += v
        images += sum(len(i) for i in c.images)
    out["images"] = images
    return out


def main() -> None:
    """Run the suites and print the tables."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tiny", action="store_true", help="smoke run: small data, 1 s per run")
    ap.add_argument("--seconds", type=float, default=10.0, help="timed seconds per run")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-side", type=int, default=512, help="largest image side in pixels")
    ap.add_argument("--no-grain", action="store_true")
    ap.add_argument(
        "--only", default="", help="comma-separated run keys (thread,process,process_pickle,...)"
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    seconds = 1.0 if args.tiny else args.seconds
    shards, per_shard = (2, 16) if args.tiny else (8, 64)
    root = default_root()
    paths = make_data(root, shards, per_shard, 128 if args.tiny else args.max_side)
    data_dir = paths[0].parent
    size = sum(p.stat().st_size for p in paths)
    r = recipe(data_dir, 1024)
    print(
        f"data: {shards * per_shard} samples in {shards} tar shards, {size / 1e6:.1f} MB; "
        f"images -> {SPEC.size[0]}x{SPEC.size[1]}, patch {SPEC.patch_size} "
        f"({SPEC.tokens_per_image} tokens/image); seq_len {r.seq_len}; "
        f"{os.cpu_count()} CPUs\n"
    )
    w = args.workers
    runs: dict[str, Any] = {
        "thread": lambda: run_zephon(r, "thread", w, seconds),
        "process": lambda: run_zephon(
            r, "process", w, seconds, name=f"zephon-nodes process x{w} (shared memory)"
        ),
        "process_pickle": lambda: run_zephon(
            r,
            "process",
            w,
            seconds,
            shared_memory=False,
            name=f"zephon-nodes process x{w} (pickled)",
        ),
        # Per-operator pools: decode in processes, parse and tokenize inline in the rank.
        "mixed": lambda: run_zephon(
            r,
            "thread",
            0,
            seconds,
            operator_pools={"decode": f"process:{w}"},
            name=f"zephon-nodes decode=process:{w}, rest inline",
        ),
        "mixed_thread": lambda: run_zephon(
            r,
            "thread",
            0,
            seconds,
            operator_pools={"decode": f"thread:{w}"},
            name=f"zephon-nodes decode=thread:{w}, rest inline",
        ),
    }
    if not args.no_grain:
        try:
            import grain  # noqa: F401

            tars = [open_tar_shard(p) for p in paths]
            runs["grain"] = lambda: run_grain(tars, False, args.workers, seconds)
            runs["grain_mp"] = lambda: run_grain(tars, True, args.workers, seconds)
        except ImportError:
            print("(Grain not installed: pip install -e '.[bench]')\n")
    if args.only:
        keep = args.only.split(",")
        runs = {k: v for k, v in runs.items() if k in keep}
    # Rounds alternate the pipelines, so load from other processes hits them alike.
    rounds: dict[str, list[Result]] = {k: [] for k in runs}
    for _ in range(1 if args.tiny else args.rounds):
        for key, fn in runs.items():
            rounds[key].append(fn())
    results = []
    n_rounds = len(next(iter(rounds.values())))
    load = os.getloadavg()[0]
    print(f"Median of {n_rounds} alternating rounds of {seconds:g} s each (load {load:.1f})\n")
    print("| pipeline | images/s | tokens/s | images/s range | CPU s per s | images per CPU s |")
    print("|---|---:|---:|---:|---:|---:|")
    for measured in rounds.values():
        rs = sorted(measured, key=lambda x: x.images_s)
        med = rs[len(rs) // 2]
        results.append(med)
        print(
            f"| {med.name} | {med.images_s:,.0f} | {med.tokens_s:,.0f} | "
            f"{rs[0].images_s:,.0f}-{rs[-1].images_s:,.0f} | {med.cpu_s / med.seconds:.2f} | "
            f"{med.images / med.cpu_s:,.0f} |"
        )
    stages = stage_times(r, 16 if args.tiny else 64)
    images = stages.pop("images")
    total = sum(stages.values())
    print(f"\nInline, one core, {int(images)} images: CPU time per stage\n")
    print("| stage | ms per image | share |")
    print("|---|---:|---:|")
    for k, v in stages.items():
        print(f"| {k} | {1000 * v / images:.2f} | {v / total:.1%} |")
    # The decode limit: the pool's workers (cores) kept busy decoding and nothing else.
    decode_ms = 1000 * stages["decode"] / images
    limit = args.workers * 1000 / decode_ms
    print(
        f"\nDecode limit: {args.workers} workers / {decode_ms:.2f} ms per image = {limit:,.0f} "
        f"images/s (beyond decode: a run's CPU ms per image minus the decode's)\n"
    )
    print("| pipeline | of the decode limit | CPU ms per image | beyond decode |")
    print("|---|---:|---:|---:|")
    for x in results:
        cpu_ms = 1000 * x.cpu_s / x.images
        print(f"| {x.name} | {x.images_s / limit:.2f} | {cpu_ms:.2f} | {cpu_ms - decode_ms:+.2f} |")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "runs": [
                        {
                            "name": x.name,
                            "images_s": x.images_s,
                            "tokens_s": x.tokens_s,
                            "cpu_s_per_s": x.cpu_s / x.seconds,
                            "images_per_cpu_s": x.images / x.cpu_s,
                            "of_decode_limit": x.images_s / limit,
                            "cpu_ms_per_image": 1000 * x.cpu_s / x.images,
                        }
                        for x in results
                    ],
                    "stages": stages,
                    "decode_share": stages["decode"] / total,
                    "decode_limit_images_s": limit,
                    "load_average": load,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
