"""A remote object's remembered checksum is trusted only under the key it was written for."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fault.test_adversarial_cache_keys import _corpus, _digests, _rotate
from tests.io.conftest import S3Server, s3_put_tree
from zephon_nodes.io.index import index
from zephon_nodes.io.storage import remote


def test_remote_checksum_memos_rotated(
    s3_env: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memos of four objects' checksums rotated: each object fetched again, same digests.

    Trusted, a memo would pair an object with another one's record index (other offsets).
    """
    cache = tmp_path / "cache"
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(cache))
    index.forget()
    try:
        cold = _digests(_corpus(tmp_path / "d"))
        paths = [s3_put_tree(s3_env, "memos", tmp_path / "d") + "/*.jsonl"]
        assert _digests(paths) == cold
        remote.finish_progress()
        memos = sorted(cache.glob("*.remote.json"))
        assert len(memos) == 4
        _rotate(memos)
        assert _digests(paths) == cold
    finally:
        remote.finish_progress()
        index.forget()
