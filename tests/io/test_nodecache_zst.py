"""Single-frame .zst shards (from a dataset index) decompress into the bounded node cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_nodes import DatasetSpec, Pipeline, Recipe, TokenizerSpec, WorkSpec
from zephon_nodes.cli import main
from zephon_nodes.io.nodecache.nodecache import LIMIT_ENV, set_cache_limit
from zephon_nodes.io.nodecache.wholeshard import NodeCachedShard
from zephon_nodes.verification.simulate import simulate

SHARDS = 16


def write_zst_corpus(root: Path) -> int:
    """16 single-frame .jsonl.zst shards of 24 records; return the decompressed bytes."""
    root.mkdir()
    total = 0
    for s in range(SHARDS):
        rows = [
            json.dumps({"text": f"zst shard {s} doc {r} " * (1 + (s + r) % 5)}) for r in range(24)
        ]
        blob = ("\n".join(rows) + "\n").encode()
        (root / f"part-{s:03d}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(blob))
        total += len(blob)
    return total


def recipe(root: Path) -> Recipe:
    return Recipe(
        datasets=(DatasetSpec("web", paths=(str(root / "*.jsonl.zst"),)),),
        tokenizer=TokenizerSpec(kind="bytes"),
        seed=3,
        num_lanes=4,
        global_batch_size=8,
        seq_len=32,
        flush_every=2,
        work=WorkSpec(chunk_size=4, epochs=1),
    )


def digests(pipeline: Pipeline) -> list[str]:
    return [r.digest for r, _ in simulate(pipeline, 2, 10_000, num_workers=2)]


def test_indexed_zst_through_node_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a limit of 10% the run ends with the same digests, the node cache never above
    its limit, and no unbounded decompressed copy left in the cache directory."""
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    corpus = write_zst_corpus(tmp_path / "data")
    assert main(["index", str(tmp_path / "data" / "*.jsonl.zst")]) == 0
    capsys.readouterr()
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "plain"))
    reference = digests(Pipeline(recipe(tmp_path / "data")))
    # Without a limit: the default-bounded node cache, no unbounded copy beside it.
    assert not list((tmp_path / "plain").glob("*.jsonl"))
    assert list((tmp_path / "plain" / "node" / "data").iterdir())

    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zc"))
    limit = corpus // 10
    set_cache_limit(limit)
    try:
        pipeline = Pipeline(recipe(tmp_path / "data"))
        assert all(isinstance(s, NodeCachedShard) for s in pipeline.datasets[0].shards)
        assert digests(pipeline) == reference
        stats = pipeline.cache_stats()
    finally:
        set_cache_limit(None)
    assert stats is not None
    assert 0 < stats["peak_bytes"] <= limit
    assert stats["fetches"] > SHARDS  # 10x the limit: shards are decompressed again
    assert not list((tmp_path / "zc").glob("*.jsonl"))  # no copy outside the node cache
    on_disk = sum(f.stat().st_size for f in (tmp_path / "zc" / "node" / "data").iterdir())
    assert on_disk <= limit
    assert not os.environ.get(LIMIT_ENV)


@settings(max_examples=5)
@given(
    sizes=st.lists(st.integers(16, 40), min_size=1, max_size=6),
    room=st.floats(0.0, 1.0),
    policy=st.sampled_from(["belady", "lru"]),
)
def test_random_corpora_and_limits(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], room: float, policy: str
) -> None:
    """Random shard counts and sizes, limits from one shard to the corpus: same digests."""
    root = tmp_path_factory.mktemp("zst")
    blobs = []
    for s, n in enumerate(sizes):
        rows = [
            json.dumps({"text": f"s{s} r{r} " + "x" * (30 + (s * 13 + r) % 40)}) for r in range(n)
        ]
        blob = ("\n".join(rows) + "\n").encode()
        blobs.append(blob)
        (root / f"s{s:02d}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(blob))
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(LIMIT_ENV, raising=False)
        mp.setenv("ZEPHON_CACHE_DIR", str(root / "plain"))
        assert main(["index", str(root / "*.jsonl.zst")]) == 0
        reference = digests(Pipeline(recipe(root)))
        assert reference  # at least one global batch
        mp.setenv("ZEPHON_CACHE_DIR", str(root / "zc"))
        one, total = max(len(b) for b in blobs), sum(len(b) for b in blobs)
        limit = one + int(room * (total - one))
        set_cache_limit(limit, policy)
        try:
            pipeline = Pipeline(recipe(root))
            assert digests(pipeline) == reference
            stats = pipeline.cache_stats()
        finally:
            set_cache_limit(None)
        assert stats is not None and 0 < stats["peak_bytes"] <= limit
        assert stats["fetches"] >= len(sizes)  # every shard went through the cache


def test_unindexed_zst_through_node_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a dataset index too: same digests, the node cache within its limit, and no
    decompressed copy outside it (only the small record indexes)."""
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    monkeypatch.setenv("ZEPHON_NO_INDEX", "1")
    corpus = write_zst_corpus(tmp_path / "data")
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "plain"))
    reference = digests(Pipeline(recipe(tmp_path / "data")))
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zc"))
    limit = corpus // 10
    set_cache_limit(limit)
    try:
        for build in range(2):  # the second build reuses the record indexes: reads nothing
            pipeline = Pipeline(recipe(tmp_path / "data"))
            shards = pipeline.datasets[0].shards
            assert all(isinstance(s, NodeCachedShard) for s in shards)
            assert sum(s.num_records for s in shards) == SHARDS * 24
            assert digests(pipeline) == reference
            stats = pipeline.cache_stats()
            assert stats is not None and 0 < stats["peak_bytes"] <= limit, build
    finally:
        set_cache_limit(None)
    assert not list((tmp_path / "zc").glob("*.jsonl"))  # no copy outside the node cache
    kept = {f.name.partition(".")[2] for f in (tmp_path / "zc").iterdir() if f.is_file()}
    # Record indexes, their sums (key, size) and the empty file locks they are written under.
    assert kept <= {"index.npy", "sums.npy", "lock"}


def test_stream_line_index_matches_file_index(tmp_path: Path) -> None:
    """The streaming record index equals the file one, blank and CRLF lines included."""
    from zephon_nodes.io.formats.lines import LineCounter as _LineCounter
    from zephon_nodes.io.formats.lines import index_file as _index_file

    text = b'{"a":1}\r\n\r\n\n{"b":2}\n\r\n{"c":3}\r\n\r'
    (tmp_path / "f.jsonl").write_bytes(text)
    for cut in range(len(text) + 1):
        counter = _LineCounter()
        counter.write(text[:cut])
        counter.write(text[cut:])
        assert counter.index().tolist() == [[0, 8], [12, 19], [22, 30]], cut
    assert _index_file(tmp_path / "f.jsonl").tolist() == [[0, 8], [12, 19], [22, 30]]


def test_process_workers_counters_are_collected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With process workers, their node-cache fetches reach cache_stats() and metrics()."""
    from zephon_nodes import WorkerPool

    monkeypatch.delenv(LIMIT_ENV, raising=False)
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zc"))
    corpus = write_zst_corpus(tmp_path / "data")
    assert main(["index", str(tmp_path / "data" / "*.jsonl.zst"), "--quiet"]) == 0
    # Room for the whole corpus and no prefetch in the rank: the workers fetch every shard.
    set_cache_limit(corpus, prefetch=0)
    pool = WorkerPool(1, "process")
    try:
        pipeline = Pipeline(recipe(tmp_path / "data"))
        node = pipeline.rank_node(1, 0, pool=pool)
        node.reset(None)
        steps = sum(1 for _ in node)
        metrics = node.metrics()
        stats = pipeline.cache_stats()
    finally:
        pool.close()
        set_cache_limit(None)
        monkeypatch.delenv("ZEPHON_CACHE_PREFETCH", raising=False)
    assert steps > 0 and stats is not None
    assert stats["fetches"] == SHARDS and stats["bytes_fetched"] == corpus
    assert stats["hits"] + stats["misses"] >= SHARDS and stats["evictions"] == 0
    assert metrics["node_cache"] == stats
