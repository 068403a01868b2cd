"""A hostile environment gives one line naming the true cause (issue 27, cases 8 and 9): a
cache directory that cannot be written, a full disk under the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zstandard

from tests.commands.run import zephon
from tests.io.test_remote_digests import recipe, run
from zephon_nodes.core.errors import DataError
from zephon_nodes.io.nodecache.nodecache import set_cache_limit


def _toml(tmp_path: Path) -> Path:
    docs = [json.dumps({"text": f"doc {i} {tmp_path.name} " * 4}) for i in range(200)]
    blob = zstandard.ZstdCompressor().compress(("\n".join(docs) + "\n").encode())
    (tmp_path / "a.jsonl.zst").write_bytes(blob)
    toml = tmp_path / "r.toml"
    toml.write_text(
        "seed = 1\nnum_lanes = 2\nglobal_batch_size = 4\nseq_len = 16\n"
        '[tokenizer]\nkind = "bytes"\n[work]\nchunk_size = 4\n'
        f'[[datasets]]\nname = "web"\npaths = ["{tmp_path}/*.jsonl.zst"]\n'
    )
    return toml


def test_an_unwritable_node_cache_with_a_limit(tmp_path, monkeypatch, capsys):
    """`--cache-limit` with a cache folder that cannot hold node/: exit 2, one line."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "node").write_text("a file where the node cache's folder should be")
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(cache))
    toml = _toml(tmp_path)
    capsys.readouterr()
    try:
        assert zephon("digest", str(toml), "--steps", "2", "--cache-limit", "1G") == 2
    finally:
        set_cache_limit(None)
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and f"node cache {cache}/node" in out, out
    assert "ZEPHON_CACHE_DIR" in out


def test_an_uncreatable_cache_directory(tmp_path, monkeypatch):
    """ZEPHON_CACHE_DIR below a file: a DataError naming it, not a traceback."""
    (tmp_path / "f").write_text("x")
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "f" / "cache"))
    _toml(tmp_path)
    with pytest.raises(DataError, match=r"cache directory .*/f/cache: cannot create it"):
        run(recipe([str(tmp_path / "*.jsonl.zst")]), 1, 2)
