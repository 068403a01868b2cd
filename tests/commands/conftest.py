"""Fixtures for the command-line tests: a tiny recipe on disk and a way to run commands."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

RECIPE = """\
seed = 7
num_lanes = 4
global_batch_size = 8
seq_len = 64
flush_every = 3

[tokenizer]
kind = "bytes"

[[datasets]]
name = "tiny"
paths = ["data.jsonl"]

[work]
chunk_size = 8
epochs = 1

[shuffle]
buffer_size = 4
"""

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "lanes",
    "flush",
    "and",
    "replay",
]


def write_recipe(directory: Path, text: str = RECIPE, docs: int = 300) -> Path:
    """Write ``data.jsonl`` (non-empty documents) and ``recipe.toml``; return the recipe."""
    rng = random.Random(0)
    with open(directory / "data.jsonl", "w", encoding="utf-8") as f:
        for _ in range(docs):
            words = [rng.choice(WORDS) for _ in range(rng.randint(1, 40))]
            f.write(json.dumps({"text": " ".join(words)}) + "\n")
    path = directory / "recipe.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def recipe_path(tmp_path: Path) -> Path:
    return write_recipe(tmp_path)
