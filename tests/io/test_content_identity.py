"""Caches keyed by content: a same-size edit with the mtime restored is seen, warm or cold."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from zephon_nodes.errors import DataError
from zephon_nodes.io.formats.arrow import open_arrow_shard
from zephon_nodes.io.formats.parquet import open_parquet_shard
from zephon_nodes.io.formats.shards import open_shard
from zephon_nodes.io.formats.tar import open_tar_shard

WORDS = ["alpha", "bravo", "charlie", "delta"]


def _jsonl(words: list[str]) -> bytes:
    return "".join(f'{{"text": "{w}"}}\n' for w in words).encode()


def write_jsonl(p: Path, words: list[str]) -> None:
    p.write_bytes(_jsonl(words))


def write_zst(p: Path, words: list[str]) -> None:
    p.write_bytes(zstandard.ZstdCompressor(level=1).compress(_jsonl(words)))


def write_parquet(p: Path, words: list[str]) -> None:
    pq.write_table(pa.table({"text": words}), p, compression="none")


def write_arrow(p: Path, words: list[str]) -> None:
    table = pa.table({"text": words})
    with pa.OSFile(str(p), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


def write_tar(p: Path, words: list[str]) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for i, w in enumerate(words):
            info = tarfile.TarInfo(f"k{i}.txt")
            info.size = len(w)
            info.mtime = 0
            t.addfile(info, io.BytesIO(w.encode()))
    p.write_bytes(buf.getvalue())


def texts(shard: Any) -> list[str]:
    rows = shard.read(0, shard.num_records)
    out = []
    for _, r in rows:
        if isinstance(r, bytes):
            out.append(r.decode())
        elif isinstance(r, dict):
            out.append(r["text"])
        else:
            out.append(r.text.decode())
    return out


FORMATS: list[tuple[str, Callable[[Path, list[str]], None], Callable[[Path], Any]]] = [
    ("d.jsonl", write_jsonl, open_shard),
    ("d.jsonl.zst", write_zst, open_shard),
    ("d.parquet", write_parquet, lambda p: open_parquet_shard(p, "text")),
    ("d.tar", write_tar, open_tar_shard),
    ("d.arrow", write_arrow, lambda p: open_arrow_shard(p, ["text"])),
]


@pytest.mark.parametrize(("name", "write", "opener"), FORMATS, ids=[f[0] for f in FORMATS])
def test_same_size_edit_with_mtime_restored(tmp_path, monkeypatch, name, write, opener):
    """Warm and cold caches both serve the edited content, under a new checksum."""
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "warm"))
    p = tmp_path / name
    write(p, WORDS)
    before = opener(p)
    assert any("alpha" in t for t in texts(before))
    st = p.stat()
    size = st.st_size
    write(p, ["ALPHA", *WORDS[1:]])
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.stat().st_size == size and p.stat().st_mtime_ns == st.st_mtime_ns
    warm = opener(p)
    assert any("ALPHA" in t for t in texts(warm)) and not any("alpha" in t for t in texts(warm))
    assert warm.checksum != before.checksum
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cold"))
    cold = opener(p)
    assert texts(cold) == texts(warm) and cold.checksum == warm.checksum


def test_deleted_zst_is_not_served_from_the_cache(tmp_path):
    """A deleted shard is an error even with its decompressed copy in the cache."""
    p = tmp_path / "gone.jsonl.zst"
    write_zst(p, WORDS)
    open_shard(p)
    p.unlink()
    with pytest.raises(DataError, match=r"gone\.jsonl\.zst: data file not found"):
        open_shard(p)


def test_immutable_data_skips_the_rehash(tmp_path, monkeypatch):
    """ZEPHON_IMMUTABLE_DATA=1 trusts size+mtime: the documented blind spot."""
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("ZEPHON_IMMUTABLE_DATA", "1")
    p = tmp_path / "d.jsonl"
    write_jsonl(p, WORDS)
    first = open_shard(p)
    st = p.stat()
    write_jsonl(p, ["ALPHA", *WORDS[1:]])
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert open_shard(p).checksum == first.checksum
    monkeypatch.delenv("ZEPHON_IMMUTABLE_DATA")
    assert open_shard(p).checksum != first.checksum
