"""Parquet and tar shards read from S3 equal the local ones, with and without an index."""

from __future__ import annotations

import io
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq

from tests.commands.run import zephon
from tests.io.conftest import S3Server, s3_put_tree
from tests.io.test_remote_digests import recipe, run
from zephon_nodes.io.formats.tar import open_tar_shard
from zephon_nodes.io.index import index


def test_parquet_over_s3(s3_env: S3Server, tmp_path):
    """Row groups read with range requests from S3 give the local digests, index or not."""
    for k in range(2):
        table = pa.table({"text": [f"row {k} {i} " * (i % 4 + 1) for i in range(40)]})
        pq.write_table(table, tmp_path / f"p{k}.parquet", row_group_size=9)
    reference = run(recipe([str(tmp_path / "*.parquet")]), 2, 4)
    base = s3_put_tree(s3_env, "parquets", tmp_path)
    assert run(recipe([base + "/*.parquet"]), 2, 4) == reference
    assert zephon("index", base + "/*.parquet", "--quiet") == 0
    index.forget()
    assert run(recipe([base + "/*.parquet"]), 2, 4) == reference
    index.forget()


def test_tar_over_s3(s3_env: S3Server, tmp_path):
    """A tar shard in S3 reads the same samples as the local file (one range per item)."""
    with tarfile.open(tmp_path / "s.tar", "w") as t:
        for i in range(6):
            for ext, blob in (("txt", f"caption {i}".encode()), ("png", bytes([i]) * 33)):
                info = tarfile.TarInfo(f"k{i}.{ext}")
                info.size = len(blob)
                t.addfile(info, io.BytesIO(blob))
    base = s3_put_tree(s3_env, "tars", tmp_path)
    local, remote = open_tar_shard(tmp_path / "s.tar"), open_tar_shard(base + "/s.tar")
    assert remote.checksum == local.checksum and remote.num_records == 6
    assert remote.read(1, 5) == local.read(1, 5)
    assert remote.read(4, 5)[0][1].images == (("png", bytes([4]) * 33),)
