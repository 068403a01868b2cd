"""The README's Python blocks run as written (on a small recipe in place of the demo's).

The README's recipe is the demo's (``examples/default/recipe.toml``, its corpus built by
``make demo``, minutes); here the blocks run on a bytes-tokenizer recipe of the same shape
(8 lanes, global batch 16) written to a temporary folder, the path swapped in the code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO_RECIPE = "examples/default/recipe.toml"

RECIPE = """\
seed = 7
num_lanes = 8
global_batch_size = 16
seq_len = 32
flush_every = 2

[tokenizer]
kind = "bytes"

[[datasets]]
name = "web"
paths = ["data/*.jsonl"]

[work]
chunk_size = 4
epochs = 1
"""


def python_blocks() -> list[str]:
    readme = (REPO / "README.md").read_text()
    return re.findall(r"^```python\n(.*?)^```", readme, re.MULTILINE | re.DOTALL)


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    with open(tmp_path / "data" / "part-0.jsonl", "w") as f:
        for i in range(400):
            f.write(json.dumps({"text": f"document {i} " + "word " * (i % 17)}) + "\n")
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE)
    return path


def test_readme_python_blocks_run(recipe: Path) -> None:
    """Each block runs; the restore at dp 4 gives rank 1 of dp 4 the step 4 it would have
    had from the start (compared with a dp 4 run that never stopped)."""
    from torchdata.nodes import Loader

    from zephon_nodes import Pipeline, Recipe, WorkerPool

    codes = python_blocks()
    assert len(codes) == 2 and all(DEMO_RECIPE in code for code in codes)
    assert all("with WorkerPool(" in code for code in codes)  # each closes its pool
    spaces = []
    for i, code in enumerate(codes):
        namespace: dict[str, object] = {}
        exec(compile(code.replace(DEMO_RECIPE, str(recipe)), f"README[{i}]", "exec"), namespace)
        spaces.append(namespace)
    restored = spaces[1]["batch"]
    pipeline = Pipeline(Recipe.from_toml(recipe))
    with WorkerPool(num_workers=0, runner="thread") as pool:
        it = iter(Loader(pipeline.rank_node(dp_world_size=4, dp_rank=1, pool=pool)))
        for _ in range(3):
            next(it)
        expected = next(it)
    assert set(restored) == set(expected)  # type: ignore[arg-type]
    for key in expected:
        assert restored[key].tolist() == expected[key].tolist(), key  # type: ignore[index]
