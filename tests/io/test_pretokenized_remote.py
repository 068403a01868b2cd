"""Pre-tokenized corpora on S3 (moto) read with range requests give the local digests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.io import pretokenized_corpora as pc
from tests.io.conftest import S3Server, s3_put_tree
from tests.io.test_pretokenized_formats import recipe, run
from zephon_nodes import DatasetSpec
from zephon_nodes.io.formats.mds import open_mds_shards
from zephon_nodes.io.formats.megatron import open_megatron_shard


def test_megatron_and_mds_over_s3(s3_env: S3Server, tmp_path: Path) -> None:
    """A Megatron corpus and an MDS folder in a bucket: same documents, same digests."""
    docs = pc.documents(48)
    root = tmp_path / "data"
    root.mkdir()
    pc.write_megatron(root / "corpus", docs)
    pc.write_mds(root / "mds", docs)  # uncompressed shards: one range per work item
    base = s3_put_tree(s3_env, "pretok", root)
    remote = open_megatron_shard(base + "/corpus.idx")
    assert remote.num_records == 48
    assert all(np.array_equal(a, d) for (_, a), d in zip(remote.read(0, 48), docs, strict=True))
    shards = open_mds_shards(base + "/mds/index.json", "tokens")
    read = [ids for s in shards for _, ids in s.read(0, s.num_records)]
    assert len(shards) > 1 and all(np.array_equal(a, d) for a, d in zip(read, docs, strict=True))
    for local, uri, fmt in (
        ("corpus.idx", base + "/corpus.idx", None),
        ("mds", base + "/mds", "mds"),  # a remote folder is named by its format
    ):
        reference = run(recipe((DatasetSpec("c", paths=(local,), base_dir=root),)), 1)
        spec = DatasetSpec("c", paths=(uri,), format=fmt)
        assert run(recipe((spec,)), 2) == reference
