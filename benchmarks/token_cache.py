"""Token cache benchmark: an ablation's second run, and start-up dealt by tokens, cold vs warm.

On the benchmark corpus (:mod:`benchmarks.corpus`: the standard library's sources cut into
documents, a sentencepiece BPE trained on them), side by side in one run:

1. **Ablation.** Two datasets (the corpus's shards split in halves, ``on_exhausted =
   "repeat"``), one rank, thread runner. ``off``: run 1's recipe with the cache off.
   ``run 1``: seed 1, weights 0.5/0.5, cache on and empty (cold). ``run 2``: seed 2, weights
   0.3/0.7, the cache run 1 left (warm). Each delivers the same number of global batches
   (about one corpus of tokens); reported: sample tokens per CPU-second of the process
   (user + system, all threads), the cache's hits and misses.
2. **Pre-tokenized copy.** The same documents' token ids written to an MDS dataset
   (``mosaicml-streaming``'s ``MDSWriter``, uint16 ids), then read back whole with its
   ``StreamingDataset``: tokens per CPU-second and disk bytes per token (when the
   ``streaming`` package can be imported from ``--mds-path``; it is run in a subprocess).
3. **Start-up.** All shards as one dataset of ``--records`` records dealt by tokens
   (``work.deal = "balanced"``): seconds to build the pipeline with the cache off, cold
   (empty) and warm.
4. **Disk.** Token-cache bytes per token stored, against the MDS copy's.

Usage::

    python -m benchmarks.token_cache --json out.json           # 65,536 records, minutes
    python -m benchmarks.token_cache --quick --json out.json   # smoke run (seconds)
    # MDS: pip install --no-deps --target /tmp/mds-pkgs mosaicml-streaming brotli \\
    #      python-snappy cramjam; then --mds-path /tmp/mds-pkgs
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.corpus import Corpus, build_corpus
from zephon_nodes import DatasetSpec, MixtureSpec, Pipeline, Recipe, TokenizerSpec, WorkSpec
from zephon_nodes.io.nodecache.tokenstore import clear, default_root, set_token_cache

SEQ_LEN = 512
BATCH = 32
CHUNK = 64


def cpu_s() -> float:
    """CPU seconds of this process (all threads) and its finished children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _clear_cache() -> None:
    clear()


def _cache_bytes() -> int:
    data = default_root() / "data"
    return sum(p.stat().st_size for p in data.iterdir()) if data.is_dir() else 0


def ablation_recipe(corpus: Corpus, seed: int, weights: tuple[float, float]) -> Recipe:
    """Two datasets (the halves of the shards), repeated, mixed by ``weights``."""
    half = len(corpus.shards) // 2
    parts = (corpus.shards[:half], corpus.shards[half:])
    return Recipe(
        datasets=tuple(
            DatasetSpec(
                name,
                paths=tuple(str(p) for p in files),
                weight=w,
                on_exhausted="repeat",
            )
            for name, files, w in zip(("a", "b"), parts, weights, strict=True)
        ),
        tokenizer=TokenizerSpec(kind="sentencepiece", path=corpus.model),
        seed=seed,
        num_lanes=4,
        global_batch_size=BATCH,
        seq_len=SEQ_LEN,
        flush_every=4,
        work=WorkSpec(chunk_size=CHUNK),
        mixture=MixtureSpec(),
    )


def startup_dataset(corpus: Corpus, records: int, out: Path) -> list[Path]:
    """Write ``records`` records into jsonl shards of 4,096 records.

    The corpus's documents in order, each cut in pieces when the corpus holds fewer.
    """
    docs = _documents(corpus)
    pieces = max(1, -(-records // len(docs)))  # cut each document in this many records
    texts: list[str] = []
    for d in docs:
        step = max(1, -(-len(d) // pieces))
        texts.extend(d[k : k + step] for k in range(0, len(d), step))
    texts = (texts * (1 + records // max(1, len(texts))))[:records]
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for k in range(0, records, 4096):
        p = out / f"part-{k // 4096:04d}.jsonl"
        p.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[k : k + 4096]))
        files.append(p)
    return files


def startup_recipe(corpus: Corpus, files: list[Path]) -> Recipe:
    """``files`` as one finite dataset, dealt by tokens."""
    return Recipe(
        datasets=(DatasetSpec("all", paths=tuple(str(p) for p in files)),),
        tokenizer=TokenizerSpec(kind="sentencepiece", path=corpus.model),
        seed=1,
        num_lanes=8,
        global_batch_size=BATCH,
        seq_len=SEQ_LEN,
        flush_every=4,
        work=WorkSpec(chunk_size=CHUNK, epochs=1, deal="balanced"),
    )


def run_steps(recipe: Recipe, steps: int, cache: str) -> dict[str, Any]:
    """Build and run ``steps`` global batches on one rank; CPU, tokens, cache counters."""
    from zephon_nodes.io.nodecache.tokenstore import process_stats

    set_token_cache(cache)
    before = process_stats()
    c0, t0 = cpu_s(), time.perf_counter()
    pipeline = Pipeline(recipe)
    node = pipeline.rank_node(1, 0)
    tokens = 0
    try:
        for _ in range(steps):
            batch = next(node)
            tokens += sum(int(mb["input"].numel()) for mb in _micro(batch))
    finally:
        node.close()
    cpu, wall = cpu_s() - c0, time.perf_counter() - t0
    after = process_stats()
    stats = {k: after.get(k, 0) - before.get(k, 0) for k in ("hits", "misses")}
    return {
        "steps": steps,
        "tokens": tokens,
        "cpu_s": round(cpu, 3),
        "wall_s": round(wall, 3),
        "tokens_per_cpu_s": round(tokens / cpu, 1),
        "hits": stats.get("hits", 0),
        "misses": stats.get("misses", 0),
    }


def _documents(corpus: Corpus) -> list[str]:
    with open(corpus.jsonl, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def _corpus_tokens(corpus: Corpus) -> int:
    """Tokens of the corpus (bos and eos included), counted with its tokenizer once."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(corpus.model))
    docs = _documents(corpus)
    return sum(len(x) + 2 for x in sp.encode(docs))


def _micro(batch: Any) -> list[Any]:
    return batch if isinstance(batch, list) else [batch]


def _cache_tokens() -> int:
    """Token ids stored in the cache (from the entries' lengths)."""
    from zephon_nodes.io.nodecache.tokenstore import read_entry

    data = default_root() / "data"
    # A token-cache key is its entry's file name.
    return sum(int(read_entry(p, p.name, True).lengths.sum()) for p in data.iterdir())


def startup(recipe: Recipe, cache: str) -> dict[str, Any]:
    """Seconds (wall and CPU) to build a pipeline dealt by tokens."""
    set_token_cache(cache)
    c0, t0 = cpu_s(), time.perf_counter()
    p = Pipeline(recipe)
    out = {
        "wall_s": round(time.perf_counter() - t0, 3),
        "cpu_s": round(cpu_s() - c0, 3),
        "measure": p.work_source.measure,  # type: ignore[attr-defined]
        "tokens": int(p.work_source.item_sizes.sum()),  # type: ignore[attr-defined]
    }
    return out


def write_mds_docs(corpus: Corpus, out: Path) -> int:
    """Tokenize every document once into ``out/ids.npy`` (uint16) and ``out/lengths.npy``."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(corpus.model))
    ids: list[np.ndarray] = []
    with open(corpus.jsonl, encoding="utf-8") as f:
        for line in f:
            body = sp.encode(json.loads(line)["text"])
            ids.append(np.asarray([sp.bos_id(), *body, sp.eos_id()], dtype=np.uint16))
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "lengths.npy", np.array([len(x) for x in ids], dtype=np.int64))
    np.save(out / "ids.npy", np.concatenate(ids))
    return sum(len(x) for x in ids)


MDS_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import importlib.machinery as m, types
for name, attrs in (("torchvision", {}), ("torchvision.transforms", {}),
                    ("torchvision.datasets", {"VisionDataset": object}),
                    ("torchvision.transforms.functional", {"to_tensor": None})):
    if name not in sys.modules:  # streaming's vision module imports torchvision; not used
        mod = types.ModuleType(name); mod.__spec__ = m.ModuleSpec(name, None, is_package=True)
        mod.__path__ = []; mod.__dict__.update(attrs); sys.modules[name] = mod
import numpy as np
from streaming import MDSWriter, StreamingDataset
src, out = sys.argv[2], sys.argv[3]
ids, lengths = np.load(src + "/ids.npy"), np.load(src + "/lengths.npy")
ends = np.cumsum(lengths)
with MDSWriter(out=out + "/mds", columns={"tokens": "bytes"}, compression=None) as w:
    for lo, hi in zip((ends - lengths).tolist(), ends.tolist()):
        w.write({"tokens": ids[lo:hi].tobytes()})
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
c0 = cpu()
ds = StreamingDataset(local=out + "/mds", shuffle=False, batch_size=1)
n = 0
for sample in ds:
    n += len(np.frombuffer(sample["tokens"], dtype=np.uint16))
c = cpu() - c0
import os
size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out + "/mds") for f in fs)
print(json.dumps({"tokens": n, "cpu_s": round(c, 3), "tokens_per_cpu_s": round(n / c, 1),
                  "disk_bytes": size, "bytes_per_token": round(size / n, 4)}))
"""


def mds(corpus: Corpus, mds_path: str, work: Path) -> dict[str, Any]:
    """Write the pre-tokenized MDS copy and read it back, in a subprocess (its own venv)."""
    src = work / "ids"
    write_mds_docs(corpus, src)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([mds_path, os.environ.get("PYTHONPATH", "")]),
    }
    got = subprocess.run(
        [sys.executable, "-c", MDS_CHILD, mds_path, str(src), str(work)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if got.returncode != 0:
        return {"error": got.stderr.strip().splitlines()[-1] if got.stderr else "failed"}
    return dict(json.loads(got.stdout.strip().splitlines()[-1]))


def eviction(corpus: Corpus, steps: int, fraction: float) -> dict[str, Any]:
    """Run 1 then run 2 with a limit of ``fraction`` of run 1's entries, per policy.

    ``lru``: the least recently used entry goes first. ``key order``: the node cache's
    ``"belady"`` policy with no plan published (the token cache publishes none), which evicts
    in key order: a fixed, content-hashed order, unrelated to use.
    """
    from zephon_nodes.io.nodecache import tokenstore

    r1 = ablation_recipe(corpus, 1, (0.5, 0.5))
    r2 = ablation_recipe(corpus, 2, (0.3, 0.7))
    _clear_cache()
    set_token_cache(None, "64G")
    run_steps(r1, steps, "on")
    full = _cache_bytes()
    out: dict[str, Any] = {"fraction": fraction, "run1_bytes": full}
    saved = tokenstore.POLICY
    try:
        for name, policy in (("lru", "lru"), ("key_order", "belady")):
            tokenstore.POLICY = policy  # type: ignore[assignment]
            tokenstore._STORES.clear()
            _clear_cache()
            set_token_cache(None, str(int(full * fraction)))
            first = run_steps(r1, steps, "on")
            second = run_steps(r2, steps, "on")
            hits, misses = second["hits"], second["misses"]
            out[name] = {
                "run1_hits": first["hits"],
                "run2_hits": hits,
                "run2_misses": misses,
                "run2_hit_rate": round(hits / max(1, hits + misses), 4),
                "run2_tokens_per_cpu_s": second["tokens_per_cpu_s"],
            }
    finally:
        tokenstore.POLICY = saved
        tokenstore._STORES.clear()
        set_token_cache(None, "64G")
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a table and optionally write JSON."""
    # The token cache alone is measured: work-item sizes are not kept per node, so every
    # build sizes its items through the token cache as a cluster without them would.
    os.environ.setdefault("ZEPHON_ITEM_SIZES", "off")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny corpus (smoke test)")
    ap.add_argument("--root", default=None, help="corpus cache directory")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument(
        "--eviction",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="also compare eviction rules with a limit of FRACTION of run 1's cache bytes",
    )
    ap.add_argument("--records", type=int, default=65536, help="start-up dataset records")
    ap.add_argument("--mds-path", default="", help="a folder from which `streaming` imports")
    a = ap.parse_args(argv)
    root = Path(a.root) if a.root else None
    if a.quick:
        corpus = build_corpus(
            root,
            max_bytes=400_000,
            doc_bytes=512,
            docs_per_shard=100,
            vocab_size=300,
            train_lines=3000,
            log=False,
        )
    else:
        corpus = build_corpus(
            root,
            max_bytes=34_000_000,
            doc_bytes=512,
            docs_per_shard=2048,
            vocab_size=8000,
            train_lines=60_000,
        )
    prev = {k: os.environ.get(k) for k in ("ZEPHON_TOKEN_CACHE", "ZEPHON_TOKEN_CACHE_LIMIT")}
    set_token_cache(None, "64G")
    result: dict[str, Any] = {"records": corpus.num_docs, "corpus_bytes": corpus.num_bytes}
    try:
        work = Path(tempfile.mkdtemp(prefix="zephon-startup-"))
        sr = startup_recipe(corpus, startup_dataset(corpus, a.records, work))
        result["startup"] = {"off": startup(sr, "off")}
        _clear_cache()
        result["startup"]["cold"] = startup(sr, "on")
        result["startup"]["warm"] = startup(sr, "on")
        result["cache_bytes"] = _cache_bytes()
        result["cache_tokens"] = _cache_tokens()
        shutil.rmtree(work, ignore_errors=True)
        _clear_cache()
        r1 = ablation_recipe(corpus, 1, (0.5, 0.5))
        set_token_cache("off")
        total = _corpus_tokens(corpus)
        steps = max(2, total // (BATCH * SEQ_LEN))
        r2 = ablation_recipe(corpus, 2, (0.3, 0.7))
        result["ablation"] = {"off": run_steps(r1, steps, "off")}
        result["ablation"]["run1_cold"] = run_steps(r1, steps, "on")
        result["ablation"]["run2_warm"] = run_steps(r2, steps, "on")
        if a.eviction:
            result["eviction"] = eviction(corpus, steps, a.eviction)
        if a.mds_path:
            with tempfile.TemporaryDirectory(prefix="zephon-mds-") as work:
                result["mds"] = mds(corpus, a.mds_path, Path(work))
    finally:
        for k, v in prev.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    ab, st = result["ablation"], result["startup"]
    result["ratios"] = {
        "run2_over_run1_tokens_per_cpu_s": round(
            ab["run2_warm"]["tokens_per_cpu_s"] / ab["run1_cold"]["tokens_per_cpu_s"], 3
        ),
        "startup_warm_over_cold_wall": round(st["warm"]["wall_s"] / st["cold"]["wall_s"], 4),
        "cache_bytes_per_token": round(result["cache_bytes"] / max(1, result["cache_tokens"]), 4),
    }
    if "tokens_per_cpu_s" in result.get("mds", {}):
        result["ratios"]["run2_over_mds_tokens_per_cpu_s"] = round(
            ab["run2_warm"]["tokens_per_cpu_s"] / result["mds"]["tokens_per_cpu_s"], 3
        )
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print("| run | tokens | CPU s | tokens / CPU s | hits | misses |")
    print("|---|---|---|---|---|---|")
    for name, r in ab.items():
        print(
            f"| {name} | {r['tokens']} | {r['cpu_s']} | {r['tokens_per_cpu_s']} | {r['hits']} "
            f"| {r['misses']} |"
        )
    print("| start-up | wall s | CPU s |\n|---|---|---|")
    for name, r in st.items():
        print(f"| {name} | {r['wall_s']} | {r['cpu_s']} |")
    print(json.dumps(result["ratios"]))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
