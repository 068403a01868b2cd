"""A damaged cache entry is dropped, made again and counted, never served (issue 27, case 4):
the decompressed copies ``<checksum>.jsonl``, the node cache's ``zst-*`` entries and the
record indexes ``<checksum>.index.npy``; a warm damaged cache gives the cold digests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zstandard

from tests.io.test_remote_digests import recipe, run
from zephon_nodes.io.formats import copies, entrysums
from zephon_nodes.io.index import index
from zephon_nodes.io.nodecache.nodecache import set_cache_limit


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))
    index.forget()
    yield
    set_cache_limit(None)
    index.forget()


def _corpus(root: Path) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    docs = [json.dumps({"text": f"alpha {i:04d} " + "w " * (i % 9)}) for i in range(300)]
    blob = zstandard.ZstdCompressor().compress(("\n".join(docs) + "\n").encode())
    (root / "a.jsonl.zst").write_bytes(blob)
    (root / "b.jsonl").write_text("\n".join(d.replace("alpha", "beta") for d in docs) + "\n")
    return [str(root / "*.jsonl*")]


def _same_size_edit(path: Path) -> None:
    """Change text in the middle of a file, keeping its size (a silent disk or hand edit)."""
    blob = bytearray(path.read_bytes())
    at = blob.index(b"alpha 0150")
    blob[at : at + 5] = b"omega"
    path.write_bytes(bytes(blob))


def _digests(paths: list[str]) -> list[str]:
    """A run as a fresh process does it (nothing remembered from an earlier load)."""
    copies._INDEX_CACHE.clear()
    entrysums._SUMS.clear()
    return run(recipe(paths), 1, 30)


def test_a_damaged_copy_is_made_again(tmp_path):
    """A same-size edit inside <checksum>.jsonl: the shard's records, one bad entry counted.

    Pipelines keep a ``.zst``'s copy in the node cache (the next test); a shard opened on its
    own (``open_shard``) keeps this ``<checksum>.jsonl`` copy.
    """
    from zephon_nodes.io.formats.shards import open_shard

    _corpus(tmp_path / "d")
    shard = tmp_path / "d" / "a.jsonl.zst"
    first = open_shard(shard).read(0, 300)
    made = list((tmp_path / "cache").glob("*.jsonl"))
    assert len(made) == 1
    _same_size_edit(made[0])
    copies._INDEX_CACHE.clear()
    entrysums._SUMS.clear()
    before = entrysums.bad_entries()
    assert open_shard(shard).read(0, 300) == first
    assert entrysums.bad_entries() == before + 1
    assert b"omega" not in made[0].read_bytes()  # made again from the shard


def test_a_damaged_record_index_is_made_again(tmp_path):
    """A valid .npy with other offsets (records moved): the cold digests, counted."""
    paths = _corpus(tmp_path / "d")
    cold = _digests(paths)
    indexes = sorted((tmp_path / "cache").glob("*.index.npy"))
    assert len(indexes) == 2  # the .zst copy's and the .jsonl's
    for path in indexes:
        rows = np.load(path)
        rows[[3, 4]] = rows[[4, 3]]
        np.save(path, rows)
    before = entrysums.bad_entries()
    assert _digests(paths) == cold
    # Each damaged index is counted (the .zst's may be seen at open and again at its read).
    assert entrysums.bad_entries() >= before + 2


def test_a_cache_from_before_sums_is_made_again(tmp_path):
    """Entries without sums (an older cache) are not trusted: made again once."""
    paths = _corpus(tmp_path / "d")
    cold = _digests(paths)
    for path in (tmp_path / "cache").glob("*.sums.npy"):
        path.unlink()
    assert _digests(paths) == cold
    assert len(list((tmp_path / "cache").glob("*.sums.npy"))) == 2
    before = entrysums.bad_entries()
    assert _digests(paths) == cold
    assert entrysums.bad_entries() == before  # nothing more to make again


def test_a_damaged_node_cache_entry_is_fetched_again(tmp_path):
    """A same-size edit inside node/data/zst-*: the cold digests, the entry fetched again."""
    paths = _corpus(tmp_path / "d")
    cold = _digests(paths)
    set_cache_limit("64M")
    assert _digests(paths) == cold
    entries = list((tmp_path / "cache" / "node" / "data").glob("zst-*"))
    assert len(entries) == 1
    _same_size_edit(entries[0])
    before = entrysums.bad_entries()
    assert _digests(paths) == cold
    assert entrysums.bad_entries() == before + 1


def test_the_loader_metrics_count_bad_entries(tmp_path):
    """`bad_cache_entries` is in a rank's metrics."""
    from tests.core.test_metrics import drain
    from zephon_nodes import Pipeline, WorkerPool

    paths = _corpus(tmp_path / "d")
    _digests(paths)
    # The .zst's decompressed copy, in the node cache.
    _same_size_edit(next((tmp_path / "cache" / "node" / "data").glob("zst-*")))
    copies._INDEX_CACHE.clear()
    before = entrysums.bad_entries()
    node = Pipeline(recipe(paths)).rank_node(pool=WorkerPool(0, "thread"))
    node.reset(None)
    drain(node)
    assert entrysums.bad_entries() == before + 1
    assert node.metrics()["bad_cache_entries"] == before + 1  # this process's count
