"""Optional integrations stay optional: the core imports and runs without them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]
OPTIONAL = ("torchtitan", "PIL", "pyarrow", "matplotlib", "ray", "s3fs", "jinja2", "datasets")

SCRIPT = f"""
import sys
for name in {OPTIONAL!r}:
    sys.modules[name] = None  # any import of it now raises ImportError
import zephon_nodes
from zephon_nodes import Pipeline, Recipe
from zephon_nodes.cli import build_parser
build_parser()
from zephon_nodes.verification.simulate import simulate
recipe = Recipe.from_dict({{
    "seed": 1, "num_lanes": 2, "global_batch_size": 2, "seq_len": 16, "flush_every": 2,
    "tokenizer": {{"kind": "bytes"}},
    "datasets": [{{"name": "m", "paths": [sys.argv[1]]}}],
    "work": {{"chunk_size": 4, "epochs": 1}},
}})
steps = [r.step for r, _ in simulate(Pipeline(recipe), 2, 3, num_workers=0)]
assert steps == [1, 2, 3], steps
loaded = sorted(m for m in {OPTIONAL!r} if sys.modules.get(m) is not None)
print("OK", loaded)
"""


def test_core_runs_without_optional_packages(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hello world hello world"}\n' * 40, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(data)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("OK []"), proc.stdout
