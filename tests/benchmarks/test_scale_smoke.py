"""Smoke test of benchmarks/scale.py: two tiny configurations, the table and the JSON."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.scale import main


def test_smoke_rows_and_checkpoint_bytes_per_lane(tmp_path: Path, capsys) -> None:
    out = tmp_path / "r.json"
    assert main(["--smoke", "--inline", "--root", str(tmp_path), "--json", str(out)]) == 0
    small, large = json.loads(out.read_text())["rows"]
    assert [(r["shards"], r["lanes"], r["dp"], r["rank_lanes"]) for r in (small, large)] == [
        (200, 64, 8, 8),
        (200, 64, 16, 4),
    ]
    # The corpus was indexed: every shard is named in the state's content identities.
    assert len(list(tmp_path.glob("200/*.jsonl"))) == 200
    for r in (small, large):
        assert r["build_s"] > 0 and r["first_s"] > 0 and r["rss_mb"] > 0 and r["first_build_s"] > 0
        assert r["file_bytes"] > r["contents_bytes"] > 200 * len('"s000000.jsonl": ""')
        assert r["dcp_bytes"] > r["dcp_lane_bytes_per_lane"] * r["rank_lanes"] > 0
    # The design's promise: a lane's checkpoint bytes do not depend on the rank count.
    assert small["dcp_lane_bytes_per_lane"] == large["dcp_lane_bytes_per_lane"]
    assert small["lanes_json_per_lane"] == large["lanes_json_per_lane"]
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| shards | lanes | dp |") and len(table) == 5
    assert table[2].startswith("| 200 | 64 | 8 | 8 |")
    assert table[3].startswith("| 200 | 64 | 16 | 4 |")
