"""A cache entry read under another key is refused, counted and made again (issue 35.2).

Every kind of entry carries the key it was written for: the token cache's entries (in their
header), the record indexes with their sums and the decompressed copies (through the sums,
which hold the key). Files swapped, one copied over another, all rotated, a directory where
an entry should be and an entry of the older layout (no key) each give the digests of a run
that never saw them (the token cache off, or a cache directory of its own), and the damage
is counted, never a traceback.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import xxhash
import zstandard

from tests.io.test_remote_digests import recipe, run
from zephon_nodes.io.formats import copies, entrysums
from zephon_nodes.io.index import index
from zephon_nodes.io.nodecache.nodecache import set_cache_limit
from zephon_nodes.io.nodecache.tokenstore import ENABLED_ENV, LIMIT_ENV, token_store

STEPS = 12


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(ENABLED_ENV, "off")
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    index.forget()
    yield
    set_cache_limit(None)
    index.forget()


def _corpus(root: Path, zst: bool = False) -> list[str]:
    """Four shards of 24 records, each shard's lines of its own lengths (offsets differ)."""
    root.mkdir(parents=True)
    for s in range(4):
        docs = [
            json.dumps({"text": f"s{s} doc {i:02d} " + "xy" * ((i * (s + 1)) % 7)})
            for i in range(24)
        ]
        text = ("\n".join(docs) + "\n").encode()
        if zst:
            (root / f"p{s}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(text))
        else:
            (root / f"p{s}.jsonl").write_bytes(text)
    return [str(root / ("*.jsonl.zst" if zst else "*.jsonl"))]


def _digests(paths: list[str]) -> list[str]:
    """A run as a fresh process does it (nothing remembered from an earlier load)."""
    copies._INDEX_CACHE.clear()
    entrysums._SUMS.clear()
    return run(recipe(paths), 1, STEPS)


def _swap(files: list[Path]) -> None:
    a, b = files[0], files[1]
    tmp = a.with_name(a.name + ".swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


def _copy_over(files: list[Path]) -> None:
    shutil.copyfile(files[0], files[1])


def _rotate(files: list[Path]) -> None:
    blobs = [f.read_bytes() for f in files]
    for f, blob in zip(files, blobs[1:] + blobs[:1], strict=True):
        f.write_bytes(blob)


def _directory(files: list[Path]) -> None:
    files[0].unlink()
    files[0].mkdir()
    (files[0] / "inside").write_text("not an entry")


MOVES: dict[str, Callable[[list[Path]], None]] = {
    "swapped": _swap,
    "copied-over": _copy_over,
    "rotated": _rotate,
    "directory": _directory,
}


def _pairs(cache: Path, suffixes: tuple[str, ...]) -> list[list[Path]]:
    """For each suffix, the cache's files with it (sorted by entry key, same order each)."""
    keys = sorted(p.name[: -len(".index.npy")] for p in cache.glob("*.index.npy"))
    return [[cache / f"{k}{suffix}" for k in keys] for suffix in suffixes]


@pytest.mark.parametrize("move", list(MOVES))
def test_record_indexes_and_sums_moved_together(move: str, tmp_path: Path) -> None:
    """Index and sums moved as pairs (each pair consistent): refused by their key."""
    paths = _corpus(tmp_path / "d")
    cold = _digests(paths)
    index_files, sums_files = _pairs(tmp_path / "cache", (".index.npy", ".sums.npy"))
    assert len(index_files) == 4
    MOVES[move](index_files)
    if move != "directory":
        MOVES[move](sums_files)
    before = entrysums.bad_entries()
    assert _digests(paths) == cold
    moved = 1 if move in ("copied-over", "directory") else 2 if move == "swapped" else 4
    assert entrysums.bad_entries() >= before + moved
    assert all(p.is_file() for p in index_files + sums_files)  # made again
    before = entrysums.bad_entries()
    assert _digests(paths) == cold
    assert entrysums.bad_entries() == before  # nothing left to make again


@pytest.mark.parametrize("move", ["swapped", "rotated", "directory"])
def test_whole_shard_indexes_and_node_cache_copies_moved(move: str, tmp_path: Path) -> None:
    """Single-frame .zst: record indexes, sums and decompressed copies moved together."""
    paths = _corpus(tmp_path / "d", zst=True)
    cold = _digests(paths)
    set_cache_limit("64M")
    assert _digests(paths) == cold
    cache = tmp_path / "cache"
    index_files, sums_files = _pairs(cache, (".index.npy", ".sums.npy"))
    data = sorted((cache / "node" / "data").glob("zst-*"))
    assert len(index_files) == len(data) == 4
    # A node-cache entry is named by its key's first 40 digits, an index by its first 32.
    data = [
        next(p for p in data if p.name.split("-")[-1].startswith(f.name[:32])) for f in index_files
    ]
    for files in (index_files, sums_files, data):
        if move != "directory" or files is index_files:
            MOVES[move](files)
    before = entrysums.bad_entries()
    assert _digests(paths) == cold
    assert entrysums.bad_entries() >= before + (1 if move == "directory" else 2)


def test_sums_of_the_older_layout_are_not_trusted(tmp_path: Path) -> None:
    """A sums table as written before keys (index hash, block hashes): made again, counted."""
    paths = _corpus(tmp_path / "d")
    cold = _digests(paths)
    index_files, sums_files = _pairs(tmp_path / "cache", (".index.npy", ".sums.npy"))
    for ipath, spath in zip(index_files, sums_files, strict=True):
        rows = np.load(ipath)
        old = np.asarray([xxhash.xxh3_64_intdigest(rows.tobytes())], dtype=np.uint64)
        np.save(spath, old, allow_pickle=False)
    before = entrysums.bad_entries()
    assert _digests(paths) == cold
    assert entrysums.bad_entries() == before + 4


# ----------------------------------------------------------------------- the token cache


def _tokens(tmp_path: Path) -> tuple[list[str], list[str], Path]:
    """The corpus, its digests with the token cache off, and a warm token cache."""
    paths = _corpus(tmp_path / "d")
    off = _digests(paths)
    return paths, off, tmp_path / "cache" / "tokens"


def _token_stats(root: Path) -> dict[str, int]:
    from zephon_nodes.io.nodecache.tokenstore import token_cache_settings

    return token_store(str(root), token_cache_settings()[1]).stats()


@pytest.mark.parametrize("move", list(MOVES))
def test_token_cache_entries_moved(
    move: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries swapped, copied over, rotated or replaced by a directory: the off digests."""
    paths, off, root = _tokens(tmp_path)
    monkeypatch.setenv(ENABLED_ENV, "on")
    assert _digests(paths) == off  # cold: stored
    entries = sorted((root / "data").iterdir())
    assert len(entries) >= 4
    MOVES[move](entries)
    moved = 1 if move in ("copied-over", "directory") else 2 if move == "swapped" else len(entries)
    damaged = _token_stats(root)["damaged"]
    assert _digests(paths) == off
    assert _token_stats(root)["damaged"] == damaged + moved
    damaged = _token_stats(root)["damaged"]
    assert _digests(paths) == off
    assert _token_stats(root)["damaged"] == damaged  # all made again


def test_token_cache_entry_without_a_key_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry of the older layout (version 1, no key in its header): recomputed, counted."""
    paths, off, root = _tokens(tmp_path)
    monkeypatch.setenv(ENABLED_ENV, "on")
    assert _digests(paths) == off
    entries = sorted((root / "data").iterdir())
    prefix = struct.Struct("<8sIIQ")
    for path in entries:  # rewritten as version 1 wrote them: same sections, no key
        blob = path.read_bytes()
        _, hlen, _, _ = prefix.unpack_from(blob, 0)
        head = json.loads(blob[prefix.size : prefix.size + hlen])
        del head["key"]
        raw = json.dumps(head, sort_keys=True).encode()
        start = prefix.size + hlen + (-(prefix.size + hlen) % 8)
        new = prefix.pack(b"ZTOK\x01\x00\x00\x00", len(raw), 0, xxhash.xxh3_64_intdigest(raw)) + raw
        path.write_bytes(new + b"\0" * (-len(new) % 8) + blob[start:])
    damaged = _token_stats(root)["damaged"]
    assert _digests(paths) == off
    assert _token_stats(root)["damaged"] == damaged + len(entries)
