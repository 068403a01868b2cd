"""Smoke test of benchmarks/token_cache.py: a quick run prints well-formed, consistent JSON.

No thresholds on speed here: the numbers live in the benchmark output and docs/performance.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.token_cache import main


def test_quick_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zc"))
    monkeypatch.setenv("ZEPHON_ITEM_SIZES", "off")  # as main() sets it, undone after the test
    out = tmp_path / "tc.json"
    argv = ["--quick", "--records", "600", "--root", str(tmp_path / "b"), "--json", str(out)]
    assert main([*argv, "--eviction", "0.5"]) == 0
    assert "| run2_warm |" in capsys.readouterr().out
    r = json.loads(out.read_text())
    ab, st = r["ablation"], r["startup"]
    assert ab["off"]["hits"] == ab["off"]["misses"] == 0  # off: the cache is not touched
    assert ab["run1_cold"]["misses"] > 0
    assert ab["run2_warm"]["misses"] == 0 and ab["run2_warm"]["hits"] > 0  # same records
    assert ab["off"]["tokens"] == ab["run1_cold"]["tokens"] == ab["run2_warm"]["tokens"]
    assert st["off"]["measure"] == st["cold"]["measure"] == st["warm"]["measure"] == "tokens"
    assert st["off"]["tokens"] == st["cold"]["tokens"] == st["warm"]["tokens"]
    assert r["cache_tokens"] > 0 and r["cache_bytes"] > 2 * r["cache_tokens"]  # uint16 + headers
    ev = r["eviction"]
    for name in ("lru", "key_order"):
        assert 0 <= ev[name]["run2_hit_rate"] <= 1
