"""The node cache under a real pipeline: a corpus 10x the limit, to the end, digests unchanged."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from zephon_nodes import DatasetSpec, Pipeline, Recipe, TokenizerSpec, WorkSpec
from zephon_nodes.io.nodecache.nodecache import node_cache, set_cache_limit
from zephon_nodes.testing.nodecache import through_node_cache
from zephon_nodes.verification.simulate import simulate

SHARDS = 20


def write_corpus(root: Path) -> int:
    """Write 20 shards of 24 records each; return the corpus bytes."""
    root.mkdir()
    total = 0
    for s in range(SHARDS):
        lines = [
            json.dumps({"text": f"shard {s} record {r} " + "abcdefghij"[: (s * 7 + r) % 10] * 3})
            for r in range(24)
        ]
        blob = ("\n".join(lines) + "\n").encode()
        (root / f"part-{s:03d}.jsonl").write_bytes(blob)
        total += len(blob)
    return total


def recipe(root: Path) -> Recipe:
    return Recipe(
        datasets=(DatasetSpec("web", paths=(str(root / "*.jsonl"),)),),
        tokenizer=TokenizerSpec(kind="bytes"),
        seed=7,
        num_lanes=4,
        global_batch_size=8,
        seq_len=32,
        flush_every=2,
        work=WorkSpec(chunk_size=4, epochs=2),
    )


def digests(pipeline: Pipeline, world: int, **kw: object) -> list[str]:
    return [r.digest for r, _ in simulate(pipeline, world, 10_000, **kw)]  # type: ignore[arg-type]


@pytest.fixture
def cache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private cache directory; the limit is removed afterwards."""
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zc"))
    yield tmp_path / "zc" / "node"
    set_cache_limit(None)


class Sampler:
    """Samples the bytes physically in the cache (entries and partial fetches) every ms.

    A sample lists part/ before data/ and counts each file once (by inode): the cache makes
    room (unlinks entries) before it starts a fetch, and a fetch is renamed from part/ into
    data/. Listing data/ first could count an entry stat'ed before its eviction together with
    the fetch that replaced it, two files never on disk together (a loaded machine makes
    that likely); listing part/ first, a file seen in both counts once.
    """

    def __init__(self, root: Path) -> None:
        self.root, self.peak, self.samples = root, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            sizes: dict[int, int] = {}
            for sub in ("part", "data"):
                try:
                    entries = list(os.scandir(self.root / sub))
                except FileNotFoundError:
                    continue
                for e in entries:
                    with contextlib.suppress(FileNotFoundError):
                        st = e.stat()
                        sizes[st.st_ino] = max(sizes.get(st.st_ino, 0), st.st_size)
            total = sum(sizes.values())
            self.peak = max(self.peak, total)
            self.samples += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize("policy", ["belady", "lru"])
def test_corpus_ten_times_the_limit(tmp_path: Path, cache_env: Path, policy: str) -> None:
    """Two epochs over 20 shards with room for 2: same digests, limit held, many refetches."""
    corpus = write_corpus(tmp_path / "data")
    reference = digests(Pipeline(recipe(tmp_path / "data")), 2)
    assert len(reference) > 10
    limit = corpus // 10
    set_cache_limit(limit, policy)
    log = tmp_path / "fetches.log"
    pipeline = through_node_cache(Pipeline(recipe(tmp_path / "data")), log)
    sampler = Sampler(cache_env)
    try:
        got = digests(pipeline, 2, num_workers=2)
    finally:
        sampler.stop()
    assert got == reference
    assert sampler.samples > 10
    assert 0 < sampler.peak <= limit
    stats = pipeline.cache_stats()
    assert stats is not None
    assert stats["peak_bytes"] <= limit
    fetches = log.read_text().split()
    assert len(fetches) == stats["fetches"]
    assert len(set(fetches)) == SHARDS  # every shard was read through the cache
    assert len(fetches) > 2 * SHARDS  # the cache was too small to hold the corpus
    assert stats["evictions"] >= len(fetches) - SHARDS


def test_resume_at_another_dp_size(tmp_path: Path, cache_env: Path) -> None:
    """Save at dp 1 with a warm cache, resume at dp 2: the digests continue unchanged."""
    corpus = write_corpus(tmp_path / "data")
    reference = digests(Pipeline(recipe(tmp_path / "data")), 1)
    set_cache_limit(corpus // 10)
    pipeline = through_node_cache(Pipeline(recipe(tmp_path / "data")))
    saved: list[dict[str, object]] = []
    first = [r.digest for r, _ in simulate(pipeline, 1, 5, save_at=5, on_save=saved.append)]
    again = through_node_cache(Pipeline(recipe(tmp_path / "data")))
    rest = [r.digest for r, _ in simulate(again, 2, 10_000, resume_state=saved[0])]
    assert first + rest == reference
    cache = node_cache()
    assert cache is not None and cache.stats()["hits"] > 0
