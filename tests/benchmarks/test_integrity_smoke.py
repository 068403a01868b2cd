"""Smoke test of benchmarks/integrity.py: a quick run writes well-formed JSON."""

from __future__ import annotations

import json

from benchmarks.integrity import main


def test_quick_run(tmp_path):
    out = tmp_path / "integrity.json"
    main(["--quick", "--json", str(out)])
    data = json.loads(out.read_text())
    for span in ("4KiB", "64KiB", "1024KiB"):
        row = data["reads"][span]
        assert row["plain_ns_per_byte"] > 0 and row["checked_ns_per_byte"] > 0
    assert data["index"]["sealed_parse_cpu_s"] > 0 and data["index"]["index_mb"] > 0
