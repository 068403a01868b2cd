"""The dataset-index table, its cached pattern matches and the tar member indexes kept in the
cache are checked where they are read: a damaged one is dropped, made again and counted, never
used (issue 27: every cache entry carries a checksum verified on read)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zstandard

from tests.commands.run import zephon
from tests.io.test_remote_digests import recipe, run
from tests.multimodal.helpers import write_tar
from tests.multimodal.test_tar import members
from zephon_nodes.io.formats import entrysums
from zephon_nodes.io.formats import tar as tarmod
from zephon_nodes.io.formats.tar import TarSample, open_tar_shard
from zephon_nodes.io.index import index, table, tablesums


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))
    _forget()
    yield
    _forget()


def _forget() -> None:
    """What a fresh process remembers: nothing loaded or checked."""
    index.forget()
    table._TABLES.clear()
    tablesums._CHECKED.clear()
    tarmod._INDEXES.clear()


def _corpus(root: Path) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    docs = [json.dumps({"text": f"doc {i} " + "w " * (i % 7)}) for i in range(253)]
    (root / "a.jsonl").write_text("\n".join(docs[:173]) + "\n")
    blob = zstandard.ZstdCompressor().compress(("\n".join(docs[173:]) + "\n").encode())
    (root / "b.jsonl.zst").write_bytes(blob)
    return [str(root / "*.jsonl*")]


def _digests(paths: list[str]) -> list[str]:
    _forget()
    return run(recipe(paths), 1, 20)


def _table_folder(cache: Path) -> Path:
    folders = [p for p in cache.glob("index-*") if p.is_dir()]
    assert len(folders) == 1, folders
    return folders[0]


def test_a_damaged_index_table_is_made_again(tmp_path):
    """records.npy edited in the cache (a=173 -> 172, a valid .npy): the unindexed digests."""
    paths = _corpus(tmp_path / "d")
    unindexed = _digests(paths)
    assert zephon("index", paths[0], "--quiet") == 0
    assert _digests(paths) == unindexed  # the table is built and used
    folder = _table_folder(tmp_path / "cache")
    records = np.load(folder / "records.npy")
    assert sorted(records.tolist()) == [80, 173]
    damaged = records.copy()
    damaged[records.tolist().index(173)] = 172
    np.save(folder / "records.npy", damaged, allow_pickle=False)
    before = entrysums.bad_entries()
    assert _digests(paths) == unindexed
    assert entrysums.bad_entries() == before + 1
    assert sorted(np.load(_table_folder(tmp_path / "cache") / "records.npy").tolist()) == [80, 173]


def test_a_table_without_sums_is_made_again(tmp_path):
    """A table whose sums.json is gone (or written by an older version) is not trusted."""
    paths = _corpus(tmp_path / "d")
    assert zephon("index", paths[0], "--quiet") == 0
    reference = _digests(paths)
    folder = _table_folder(tmp_path / "cache")
    (folder / tablesums.SUMS_FILE).unlink()
    before = entrysums.bad_entries()
    assert _digests(paths) == reference
    assert entrysums.bad_entries() == before + 1
    assert (_table_folder(tmp_path / "cache") / tablesums.SUMS_FILE).is_file()


def test_a_damaged_cached_match_is_made_again(tmp_path):
    """A cached glob match naming another file (a valid .npy, its tag kept): the right files."""
    paths = _corpus(tmp_path / "d")
    assert zephon("index", paths[0], "--quiet") == 0
    reference = _digests(paths)
    matches = sorted(_table_folder(tmp_path / "cache").glob("match-*.npy"))
    assert len(matches) == 1
    cached = np.load(matches[0])
    assert cached[:-1].tolist() == [0, 1]  # a.jsonl and b.jsonl.zst, then the tag
    cached[:-1] = [0, 0]  # a.jsonl twice, b.jsonl.zst gone
    np.save(matches[0], cached, allow_pickle=False)
    before = entrysums.bad_entries()
    assert _digests(paths) == reference
    assert entrysums.bad_entries() == before + 1
    assert np.load(matches[0])[:-1].tolist() == [0, 1]


EXPECTED = [
    TarSample("a/000", (("jpg", b"J0"),), b"first", None),
    TarSample("a/001", (("webp", b"W1"), ("png", b"P1")), None, b'{"text": "second"}'),
    TarSample("b.v1/000", (("png", b"P2"),), b"third", None),
]


def _move_a_member(cache: Path) -> Path:
    """Shift one member's offset in the cached member index (valid JSON, checksum kept)."""
    (path,) = cache.glob("*.tar-index-v*.json")
    data = json.loads(path.read_text())
    data["samples"][0][1][1][1] += 512  # a/000.txt now points at the next member's bytes
    path.write_text(json.dumps(data))
    return path


def test_a_damaged_tar_member_index_is_made_again_at_open(tmp_path):
    tar = write_tar(tmp_path / "s.tar", members())
    assert [s for _, s in open_tar_shard(tar).read(0, 3)] == EXPECTED
    path = _move_a_member(tmp_path / "cache")
    _forget()
    before = entrysums.bad_entries()
    shard = open_tar_shard(tar)
    assert [s for _, s in shard.read(0, 3)] == EXPECTED
    assert entrysums.bad_entries() == before + 1
    assert json.loads(path.read_text())["sum"]  # written again, with its checksum


def test_a_damaged_tar_member_index_is_made_again_when_read(tmp_path):
    """Damaged after the shard was opened (the next load checks it): the shard's samples."""
    tar = write_tar(tmp_path / "s.tar", members())
    shard = open_tar_shard(tar)
    _move_a_member(tmp_path / "cache")
    tarmod._INDEXES.clear()
    before = entrysums.bad_entries()
    assert [s for _, s in shard.read(0, 3)] == EXPECTED
    assert shard.key(2) == "b.v1/000"
    assert entrysums.bad_entries() == before + 1


def test_a_tar_edited_in_place_is_refused_when_its_index_is_remade(tmp_path):
    """The index is made again from the shard only if the shard is still the opened content."""
    from zephon_nodes.core.errors import DataError

    tar = write_tar(tmp_path / "s.tar", members())
    shard = open_tar_shard(tar)
    blob = bytearray(tar.read_bytes())
    at = blob.index(b"first")
    blob[at : at + 5] = b"FIRST"
    tar.write_bytes(bytes(blob))
    _move_a_member(tmp_path / "cache")
    tarmod._INDEXES.clear()
    with pytest.raises(DataError, match="content changed during the run"):
        shard.read(0, 3)
