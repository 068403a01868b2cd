"""A remote Parquet shard overwritten with the same size during a run: its reads are pinned
to the version seen when the shard was opened, like the other formats'
(``tests/io/test_remote_midrun.py``). pyarrow reads the footer and each row group through a
file object whose every read is a pinned range read."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.io.test_remote_midrun import CHANGED, _digests, _run_with_overwrite, recipe
from zephon_nodes.io.index import index


def _parquet(path: Path, word: str) -> Path:
    """Uncompressed, no dictionary: the same size whatever the case of ``word``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [f"doc {i} " + f"{word} " * (i % 9 + 1) for i in range(200)]
    pq.write_table(
        pa.table({"text": rows}),
        path,
        row_group_size=10,
        compression="NONE",
        use_dictionary=False,
        write_statistics=False,
    )
    return path


@pytest.mark.parametrize("indexed", [False, True], ids=["opened", "indexed"])
def test_s3_parquet_overwrite_stops_with_the_error(s3_env, tmp_path, monkeypatch, indexed):
    """``ZEPHON_READ_CACHE_MB=0``: the first row-group read after the overwrite gets 412;
    every batch before it is the unchanged run's (computed from the local file)."""
    monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "0")
    local = _parquet(tmp_path / "data" / "a.parquet", "word")
    edited = _parquet(tmp_path / "edited" / "a.parquet", "WORD")
    assert edited.stat().st_size == local.stat().st_size
    assert edited.read_bytes() != local.read_bytes()
    baseline = _digests(recipe([str(local)]))
    bucket = "midrun-pq-" + ("idx" if indexed else "open")
    uri = s3_env.put_tree(bucket, local.parent) + "/a.parquet"
    if indexed:
        from tests.commands.run import zephon

        assert zephon("index", uri.rsplit("/", 1)[0] + "/*.parquet", "--quiet") == 0
    index.forget()
    try:
        got, error = _run_with_overwrite(
            recipe([uri]), lambda: s3_env.put_tree(bucket, edited.parent)
        )
    finally:
        index.forget()
    assert error is not None, f"{len(got)} batches, no error after the overwrite"
    assert "a.parquet" in str(error) and re.search(CHANGED, str(error))
    assert 1 <= len(got) < len(baseline)
    assert got == baseline[: len(got)]


def test_s3_parquet_cached_blocks_serve_the_pinned_bytes(s3_env, tmp_path, monkeypatch):
    """Default block cache: the small file is one block, cached at the pinned version by the
    first reads; the run after the overwrite is exactly the unchanged run."""
    monkeypatch.delenv("ZEPHON_READ_CACHE_MB", raising=False)
    local = _parquet(tmp_path / "data" / "a.parquet", "word")
    edited = _parquet(tmp_path / "edited" / "a.parquet", "WORD")
    baseline = _digests(recipe([str(local)]))
    uri = s3_env.put_tree("midrun-pq-cached", local.parent) + "/a.parquet"
    got, error = _run_with_overwrite(
        recipe([uri]), lambda: s3_env.put_tree("midrun-pq-cached", edited.parent)
    )
    assert error is None, str(error)
    assert got == baseline and len(baseline) > 20
