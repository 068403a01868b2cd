"""The token cache is transparent: digests identical off, cold, warm, evicted, shared, damaged.

Every case compares against digests computed with the cache off (never by the cache's code),
and checks the counters that prove the case happened (hits, evictions, damaged entries).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mixing.conftest import train_hf_tokenizer
from zephon_nodes import DatasetSpec, Pipeline, Recipe, TokenizerSpec, WorkSpec
from zephon_nodes.io.nodecache.tokenstore import (
    ENABLED_ENV,
    LIMIT_ENV,
    DamagedEntry,
    Entry,
    read_entry,
    token_store,
    write_entry,
)
from zephon_nodes.verification.simulate import simulate

SHARDS = 6


def write_corpus(root: Path, salt: str = "") -> None:
    root.mkdir(exist_ok=True)
    for s in range(SHARDS):
        lines = [
            json.dumps({"text": f"{salt}shard {s} record {r} " + "abcdefgh"[: (s * 5 + r) % 8] * 4})
            for r in range(20)
        ]
        (root / f"part-{s:02d}.jsonl").write_text("\n".join(lines) + "\n")


def recipe(
    root: Path, seed: int = 7, tokenizer: TokenizerSpec | None = None, **kw: object
) -> Recipe:
    return Recipe(
        datasets=(DatasetSpec("web", paths=(str(root / "*.jsonl"),)),),
        tokenizer=tokenizer or TokenizerSpec(kind="bytes"),
        seed=seed,
        num_lanes=4,
        global_batch_size=8,
        seq_len=24,
        flush_every=2,
        work=WorkSpec(chunk_size=4, **kw),  # type: ignore[arg-type]
    )


def digests(r: Recipe, world: int = 1, **kw: object) -> list[str]:
    return [x.digest for x, _ in simulate(Pipeline(r), world, 10_000, **kw)]  # type: ignore[arg-type]


def entries(root: Path) -> list[Path]:
    return sorted((root / "data").iterdir()) if (root / "data").exists() else []


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private cache directory; returns the token cache's folder. Cache off at first."""
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zc"))
    monkeypatch.setenv(ENABLED_ENV, "off")
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    yield tmp_path / "zc" / "tokens"


def on(monkeypatch: pytest.MonkeyPatch, limit: str | None = None) -> None:
    monkeypatch.setenv(ENABLED_ENV, "on")
    if limit is not None:
        monkeypatch.setenv(LIMIT_ENV, limit)


def stats(root: Path) -> dict[str, int]:
    from zephon_nodes.io.nodecache.tokenstore import token_cache_settings

    return token_store(str(root), token_cache_settings()[1]).stats()


def test_off_cold_warm_process_and_dp_give_the_same_digests(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_corpus(tmp_path / "d")
    r = recipe(tmp_path / "d")
    off = digests(r)
    assert off and not cache.exists()
    on(monkeypatch)
    assert digests(r) == off  # cold: computed and stored
    stored = entries(cache)
    assert len(stored) == SHARDS * 5  # 20 records in items of 4, per shard
    before = stats(cache)["hits"]
    assert digests(r, 2) == off  # warm, two ranks
    assert stats(cache)["hits"] >= before + len(stored)
    p = Pipeline(r)
    before = p.token_cache_stats()
    assert before is not None
    got = [x.digest for x, _ in simulate(p, 1, 10_000, runner="process")]
    assert got == off  # warm, read by worker processes
    after = p.token_cache_stats()
    assert after is not None  # the workers' hits come back with their results
    assert after["hits"] >= before["hits"] + len(stored)
    assert entries(cache) == stored  # nothing rewritten


def test_another_seed_hits_every_item(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_corpus(tmp_path / "d")
    off = digests(recipe(tmp_path / "d", seed=11))
    on(monkeypatch)
    digests(recipe(tmp_path / "d", seed=7))
    misses = stats(cache)["misses"]
    assert digests(recipe(tmp_path / "d", seed=11)) == off
    assert stats(cache)["misses"] == misses  # the ablation tokenized nothing


def test_partly_evicted_cache_gives_the_same_digests(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_corpus(tmp_path / "d")
    r = recipe(tmp_path / "d")
    off = digests(r)
    # Without the node's item sizes, building sizes every item through the token cache
    # (stored, then read back by the lanes: hits in a cache a third of the entries fill).
    shutil.rmtree(cache.parent / "sizes")
    monkeypatch.setenv("ZEPHON_ITEM_SIZES", "off")
    on(monkeypatch, "3K")  # about a third of the entries fit
    assert digests(r) == off
    assert digests(r, 2) == off
    s = stats(cache)
    assert s["evictions"] > 0 and s["hits"] > 0
    assert sum(p.stat().st_size for p in entries(cache)) <= 3 << 10


def test_a_damaged_entry_is_detected_recomputed_and_counted(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_corpus(tmp_path / "d")
    r = recipe(tmp_path / "d")
    off = digests(r)
    on(monkeypatch)
    digests(r)
    victims = entries(cache)[:3]
    for k, p in enumerate(victims):
        blob = bytearray(p.read_bytes())
        blob[-1 - k] ^= 0x01 if k < 2 else 0  # flip a token bit; the third is truncated
        p.write_bytes(bytes(blob) if k < 2 else bytes(blob[:20]))
    damaged = stats(cache)["damaged"]
    assert digests(r) == off
    assert stats(cache)["damaged"] == damaged + 3
    for p in victims:  # rewritten whole
        read_entry(p, p.name)  # a token-cache key is its entry's file name


def test_entry_checks_every_section() -> None:
    import io

    import numpy as np

    f = io.BytesIO()
    entry = Entry(np.array([1, 2, 300, 70000], np.int32), np.array([1, 3]), (("x", 2),))
    write_entry(f, entry, "t-key")
    blob = f.getvalue()
    assert b'"<u4"' in blob  # a 70000 id needs uint32
    for at in (9, 30, len(blob) - 20, len(blob) - 1):  # prefix, header, lengths, tokens
        bad = bytearray(blob)
        bad[at] ^= 0x10
        p = Path(f"/tmp/zephon-entry-{at}")
        p.write_bytes(bytes(bad))
        try:
            with pytest.raises(DamagedEntry):
                read_entry(p, "t-key")
        finally:
            p.unlink()


def test_small_vocabulary_is_stored_as_uint16(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_corpus(tmp_path / "d")
    on(monkeypatch)
    digests(recipe(tmp_path / "d"))
    for p in entries(cache):
        head = p.read_bytes()[24:400]
        assert b'"dtype": "<u2"' in head


def test_changed_shard_or_tokenizer_never_hits_an_old_entry(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = train_hf_tokenizer(tmp_path / "tokenizer.json")
    spec = TokenizerSpec(kind="hf", path=tok, add_bos=True, add_eos=True)
    write_corpus(tmp_path / "d")
    on(monkeypatch)
    warm = digests(recipe(tmp_path / "d", tokenizer=spec))
    n = len(entries(cache))
    # Another tokenizer file (one more token, "record"; at another path: the same path is
    # test_token_cache_key's): every item is a miss, the digests the cache-free run's.
    from tokenizers import Tokenizer

    edited = Tokenizer.from_file(str(tok))
    edited.add_tokens(["record"])
    (tmp_path / "t2").mkdir()
    tok = tmp_path / "t2" / "tokenizer.json"
    edited.save(str(tok))
    spec = TokenizerSpec(kind="hf", path=tok, add_bos=True, add_eos=True)
    monkeypatch.setenv(ENABLED_ENV, "off")
    off = digests(recipe(tmp_path / "d", tokenizer=spec))
    on(monkeypatch)
    assert off != warm
    misses = stats(cache)["misses"]
    assert digests(recipe(tmp_path / "d", tokenizer=spec)) == off
    assert stats(cache)["misses"] == misses + n
    # bos/eos are part of the key too.
    plain = TokenizerSpec(kind="hf", path=tok, add_bos=False, add_eos=True)
    misses = stats(cache)["misses"]
    digests(recipe(tmp_path / "d", tokenizer=plain))
    assert stats(cache)["misses"] == misses + n
    # A shard whose content changed: its items miss, the others hit.
    first = tmp_path / "d" / "part-00.jsonl"
    first.write_text(first.read_text().replace("record", "RECORD"))
    monkeypatch.setenv(ENABLED_ENV, "off")
    off = digests(recipe(tmp_path / "d", tokenizer=spec))
    on(monkeypatch)
    misses = stats(cache)["misses"]
    assert digests(recipe(tmp_path / "d", tokenizer=spec)) == off
    assert stats(cache)["misses"] == misses + 5


def test_building_a_pipeline_dealt_by_tokens_reads_no_document_when_warm(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zephon_nodes.io.formats.shards import FileShard

    write_corpus(tmp_path / "d")
    r = recipe(tmp_path / "d", epochs=1, deal="balanced")
    off = Pipeline(r)
    on(monkeypatch)
    digests(r)  # warm-up: every item tokenized and stored
    # The build sizes its items from the token cache (not from the node's item sizes).
    shutil.rmtree(cache.parent / "sizes")
    reads = []
    real = FileShard.read

    def failing(self: FileShard, start: int, stop: int) -> object:
        reads.append((self.path, start))
        raise AssertionError("a document was read")

    monkeypatch.setattr(FileShard, "read", failing)
    warm = Pipeline(r)
    assert reads == []
    assert warm.fingerprint == off.fingerprint
    assert list(warm.work_source.item_sizes) == list(off.work_source.item_sizes)
    monkeypatch.setattr(FileShard, "read", real)
    monkeypatch.setenv(ENABLED_ENV, "off")
    expected = [x.digest for x, _ in simulate(off, 1, 10_000)]
    on(monkeypatch)
    monkeypatch.setattr(FileShard, "read", failing)
    assert [x.digest for x, _ in simulate(warm, 1, 10_000)] == expected  # served from the cache
    assert reads == []


def test_concurrent_writers_of_one_key_compute_and_write_it_once(tmp_path: Path) -> None:
    import threading
    import time

    import numpy as np

    from zephon_nodes.io.nodecache.tokenstore import TokenStore

    store = TokenStore(tmp_path / "tokens", 1 << 20)
    calls: list[int] = []

    def compute() -> Entry:
        calls.append(1)
        time.sleep(0.2)  # the others arrive while it is being written
        return Entry(np.arange(10, dtype=np.int32), np.array([4, 6]))

    got: list[Entry] = []
    threads = [
        threading.Thread(target=lambda: got.append(store.get("t-key", compute))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(got) == 4
    for e in got:
        assert e.tokens.tolist() == list(range(10)) and e.lengths.tolist() == [4, 6]
    s = store.stats()
    assert (s["misses"], s["hits"]) == (1, 3)
