"""A cache directory left by an earlier version is made again, counted, never a traceback.

An earlier version kept record indexes (``<key>.index.npy``) without sums, or with sums of
the older layout (no magic, no key); files may also carry another entry's sums. A run over
such a cache gives the batches of a run with an empty cache and counts the bad entries
(``bad_cache_entries``), on every path that reads one: the node cache's decompressed copies
of single-frame ``.jsonl.zst`` shards (while other readers pin them), a decompressed copy
of an older cache found by :func:`open_shard`, and a record index read first by ``where``.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
import zstandard

from tests.fault.test_adversarial_cache_keys import _corpus
from tests.fault.test_adversarial_cache_keys import _digests as fresh_digests
from tests.multimodal.helpers import write_tar
from zephon_nodes.io.formats import copies, entrysums
from zephon_nodes.io.formats import tar as tarmod
from zephon_nodes.io.formats.shards import open_shard
from zephon_nodes.io.formats.tar import open_tar_shard
from zephon_nodes.io.index import index
from zephon_nodes.io.nodecache.cache import NodeCache
from zephon_nodes.io.nodecache.nodecache import set_cache_limit
from zephon_nodes.io.nodecache.tokenstore import ENABLED_ENV, LIMIT_ENV

LIMIT = "64M"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(ENABLED_ENV, "off")  # batches are made from the shards each run
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    index.forget()
    yield
    set_cache_limit(None)
    index.forget()


def _digests(paths: list[str]) -> list[str]:
    """A run as a fresh process does it, under a node-cache limit."""
    set_cache_limit(LIMIT)
    return fresh_digests(paths)


def _lines(shard: Path) -> list[str]:
    """The shard's records, as the file holds them (blank lines left out)."""
    blob = shard.read_bytes()
    if shard.suffix == ".zst":
        blob = zstandard.ZstdDecompressor().stream_reader(blob).read()
    return [line for line in blob.decode().split("\n") if line]


def _no_sums(cache: Path) -> None:
    for path in cache.glob("*.sums.npy"):
        path.unlink()


def _old_sums(cache: Path) -> None:
    """Sums as the first version wrote them for an index: its hash alone, no magic, no key."""
    for path in cache.glob("*.index.npy"):
        rows = np.load(path)
        old = np.asarray([xxhash.xxh3_64_intdigest(rows.tobytes())], dtype=np.uint64)
        np.save(entrysums.sums_path(path), old, allow_pickle=False)


def _other_keys(cache: Path) -> None:
    """Each entry's sums replaced by the next entry's (each table whole and readable)."""
    files = sorted(cache.glob("*.sums.npy"))
    blobs = [f.read_bytes() for f in files]
    for f, blob in zip(files, blobs[1:] + blobs[:1], strict=True):
        f.write_bytes(blob)


OLD: dict[str, Callable[[Path], None]] = {
    "no-sums": _no_sums,
    "old-sums": _old_sums,
    "other-key": _other_keys,
}


@contextlib.contextmanager
def _pinned_by_another_reader(
    monkeypatch: pytest.MonkeyPatch, root: Path, hold_s: float
) -> Iterator[None]:
    """Every node-cache entry pinned by another reader until ``hold_s`` after the run's first
    open: a reader that finds an entry bad meets the others' pins, as in a run of many."""
    other = NodeCache(root, 64 << 20)
    stack = contextlib.ExitStack()
    for entry in sorted((root / "data").iterdir()):
        stack.enter_context(other.open(entry.name, 1, _never_fetched))
    timer = threading.Timer(hold_s, stack.close)
    opened = NodeCache.open

    once = threading.Lock()

    def open_(self: NodeCache, *args: Any, **kwargs: Any) -> Any:
        if once.acquire(blocking=False):  # the run's first open starts the clock
            timer.start()
        return opened(self, *args, **kwargs)

    monkeypatch.setattr(NodeCache, "open", open_)
    try:
        yield
    finally:
        timer.cancel()
        stack.close()
        other.close()


def _never_fetched(dest: Path) -> None:
    raise AssertionError(f"the entry was expected in the cache ({dest})")


@pytest.mark.parametrize("old", list(OLD))
def test_whole_shard_entries_of_an_older_cache_while_pinned(
    old: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Single-frame .zst: record indexes without sums, with old sums or another entry's sums,
    beside the node cache's copies that other readers hold: the empty cache's batches."""
    paths = _corpus(tmp_path / "d", zst=True)
    cold = _digests(paths)  # an empty cache: indexes, sums and node-cache copies made
    cache = tmp_path / "cache"
    assert (
        len(list(cache.glob("*.index.npy"))) == len(list((cache / "node" / "data").iterdir())) == 4
    )
    OLD[old](cache)
    before = entrysums.bad_entries()
    with _pinned_by_another_reader(monkeypatch, cache / "node", hold_s=1.0):
        assert _digests(paths) == cold
    # Each shard: its record index (refused when it is opened) and its node-cache copy
    # (whose sums, made again from the shard, no longer vouch for it).
    assert entrysums.bad_entries() == before + 8
    assert all(p.is_file() for p in cache.glob("*.sums.npy"))
    before = entrysums.bad_entries()
    assert _digests(paths) == cold
    assert entrysums.bad_entries() == before  # nothing left to make again


def test_open_shard_finds_an_older_decompressed_copy(tmp_path: Path) -> None:
    """A ``<key>.jsonl`` copy of an older cache without its index and sums: made again."""
    _corpus(tmp_path / "d", zst=True)
    shard = tmp_path / "d" / "p1.jsonl.zst"
    data_path, index_path = copies.artifacts(open_shard(shard).checksum)
    entrysums.drop(index_path, entrysums.sums_path(index_path))
    data_path.write_bytes(b'{"text": "an older copy"}\n' * 3)  # not even this content
    copies._INDEX_CACHE.clear()
    entrysums._SUMS.clear()
    before = entrysums.bad_entries()
    reopened = open_shard(shard)
    rows = reopened.read(0, reopened.num_records)
    assert [raw.decode() for _, raw in rows] == _lines(shard)
    assert entrysums.bad_entries() == before + 1


@pytest.mark.parametrize("old", list(OLD))
def test_where_reads_an_older_record_index_first(old: str, tmp_path: Path) -> None:
    """``where`` (a record's line, for a message) is the first to read an older index."""
    _corpus(tmp_path / "d", zst=False)
    path = tmp_path / "d" / "p2.jsonl"
    path.write_text("\n" + path.read_text().replace("\n", "\n\n", 3))  # line != record + 1
    line = path.read_text().split("\n").index(_lines(path)[5]) + 1
    open_shard(tmp_path / "d" / "p1.jsonl")  # a second entry (whose sums "other-key" gives)
    shard = open_shard(path)
    OLD[old](tmp_path / "cache")
    copies._INDEX_CACHE.clear()
    entrysums._SUMS.clear()
    before = entrysums.bad_entries()
    assert shard.where(5) == f"{path}:{line}"
    assert entrysums.bad_entries() == before + 1


def _tar_members(first: bytes) -> list[tuple[str, bytes]]:
    return [
        ("a/000.txt", first),
        ("a/001.txt", b"second"),
        ("b/000.txt", b"third"),
    ]


def test_tar_member_index_of_another_key_or_an_older_cache(tmp_path: Path) -> None:
    """A member index copied over another's (same sample count, other offsets), or one of an
    older cache (no key): refused, made again, counted; the shard's own samples are read."""
    one = write_tar(tmp_path / "one.tar", _tar_members(b"1" * 700))  # members a block further
    two = write_tar(tmp_path / "two.tar", _tar_members(b"first"))
    open_tar_shard(one)
    shard = open_tar_shard(two)
    cache = tmp_path / "cache"
    index_one = next(
        p for p in cache.glob("*.tar-index-v*.json") if p.name != Path(shard.index_path).name
    )
    index_one_blob = index_one.read_bytes()
    want = [b"first", b"second", b"third"]
    for what in ("other-key", "old"):
        if what == "other-key":
            Path(shard.index_path).write_bytes(index_one_blob)
        else:
            data = json.loads(Path(shard.index_path).read_text())
            data.pop("entry", None)
            Path(shard.index_path).write_text(json.dumps(data))
        tarmod._INDEXES.clear()
        before = entrysums.bad_entries()
        assert [s.text for _, s in shard.read(0, 3)] == want, what
        assert entrysums.bad_entries() == before + 1, what


def test_readers_in_parallel_remake_a_damaged_copy_once(tmp_path: Path) -> None:
    """Lanes reading one damaged copy at once: every read is the shard's, one remake counted.

    Each reader that finds the copy bad remakes it only if it is still bad, one at a time:
    before, each dropped the copy (and its sums) under the others' reads, so a reader could
    fail with "no readable checksums", and every reader counted a bad entry.
    """
    _corpus(tmp_path / "d", zst=True)
    path = tmp_path / "d" / "p1.jsonl.zst"
    shard = open_shard(path)
    data_path, _ = copies.artifacts(shard.checksum)
    blob = bytearray(data_path.read_bytes())
    blob[len(blob) // 2] ^= 0x20  # one flipped bit in the middle of the copy
    data_path.write_bytes(bytes(blob))
    copies._INDEX_CACHE.clear()
    entrysums._SUMS.clear()
    before = entrysums.bad_entries()
    want = _lines(path)
    start = threading.Barrier(8)
    results: list[list[str] | BaseException] = []

    def read() -> None:
        start.wait()
        try:
            rows = shard.read(0, shard.num_records)
            results.append([raw.decode() for _, raw in rows])
        except BaseException as e:  # reported by the assertion below
            results.append(e)

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [want] * 8
    assert entrysums.bad_entries() == before + 1
