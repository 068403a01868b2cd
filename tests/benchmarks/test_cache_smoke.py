"""Smoke test of benchmarks/cache.py: a quick run prints well-formed, consistent JSON.

No thresholds on the policies' numbers here: they live in the benchmark output and the docs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.cache import POLICIES, main


def test_quick_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every policy runs to the end with the digests unchanged and the peak within the limit."""
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zc"))
    out = tmp_path / "cache.json"
    assert (
        main(["--quick", "--latency-ms", "0", "--root", str(tmp_path / "b"), "--json", str(out)])
        == 0
    )
    assert "| belady+prefetch |" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert set(result["runs"]) == set(POLICIES)
    assert result["limit_bytes"] == int(result["corpus_bytes"] * 0.1)
    for stats in result["runs"].values():
        assert stats["digests_equal"] and stats["peak_within_limit"]
        assert stats["samples"] > 0
        # Every shard is fetched at least once, and at most once per access.
        assert result["corpus_bytes"] <= stats["bytes_fetched"] <= stats["bytes_read"]
        # Reads past the last full global batch depend on timing: at most every access.
        assert 0 < stats["hits"] + stats["misses"] <= result["accesses"]
    assert set(result["offline_planned_sequence"]) == {"belady", "lru"}
