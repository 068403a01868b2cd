"""Bad data files: a clear error naming the file and line, never a hang."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import zstandard

from zephon_nodes import DataError, Pipeline, Recipe, RecipeError, ZephonError, simulate


def write_recipe(tmp: Path, pattern: str = "data/*.jsonl*") -> Path:
    path = tmp / "recipe.toml"
    path.write_text(
        f"""
seed = 7
num_lanes = 2
global_batch_size = 2
seq_len = 8
flush_every = 2
[tokenizer]
kind = "bytes"
[[datasets]]
name = "web"
paths = ["{pattern}"]
[work]
chunk_size = 2
"""
    )
    return path


def lines(n: int, start: int = 0) -> bytes:
    return b"".join(
        json.dumps({"text": f"document {i}"}).encode() + b"\n" for i in range(start, start + n)
    )


def run_all(recipe_path: Path) -> int:
    pipeline = Pipeline(Recipe.from_toml(recipe_path))
    return sum(1 for _ in simulate(pipeline, 1, 1000, num_workers=2))


@pytest.fixture
def data(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    return d


def test_valid_jsonl_and_zst_shards_run(tmp_path, data):
    """Plain and compressed shards mixed in one dataset produce every document."""
    (data / "a.jsonl").write_bytes(lines(10))
    (data / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines(10, 10)))
    assert run_all(write_recipe(tmp_path)) > 0


def test_empty_shard_contributes_no_work_items(tmp_path, data):
    """An empty shard is valid and the result equals the run without it."""
    (data / "a.jsonl").write_bytes(lines(12))
    before = [
        r.digest for r, _ in simulate(Pipeline(Recipe.from_toml(write_recipe(tmp_path))), 1, 100)
    ]
    (data / "b.jsonl").write_bytes(b"")
    pipeline = Pipeline(Recipe.from_toml(write_recipe(tmp_path)))
    assert pipeline.datasets[0].shards[1].num_records == 0
    after = [r.digest for r, _ in simulate(pipeline, 1, 100)]
    assert after == before and len(after) > 0


def test_line_without_final_newline_is_a_record(tmp_path, data):
    """The last line counts even without a newline at EOF; blank lines are not records."""
    (data / "a.jsonl").write_bytes(b'{"text": "one"}\n\n{"text": "two"}\r\n\r\n{"text": "three"}')
    pipeline = Pipeline(Recipe.from_toml(write_recipe(tmp_path)))
    assert pipeline.datasets[0].num_records == 3


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"text": "ok"}\n{"text": "ok"}\n{"text": broken}\n', "a.jsonl:3: invalid JSON"),
        (b'{"text": "ok"}\n{"body": "no text"}\n', "a.jsonl:2: missing text field 'text'"),
        (b'{"text": 5}\n', "a.jsonl:1: field 'text' must be a string, got int"),
        (b'["not", "an object"]\n', "a.jsonl:1: a record must be a JSON object"),
        (b'{"text": "ok"}\n\n{"text": "caf\xe9"}\n', "a.jsonl:3: invalid UTF-8"),
    ],
)
def test_bad_record_names_file_and_line(tmp_path, data, content, message):
    """Invalid JSON, missing/non-string field, non-object, non-UTF-8: file and line named."""
    (data / "a.jsonl").write_bytes(content)
    with pytest.raises(DataError, match=message.replace("(", r"\(")):
        run_all(write_recipe(tmp_path))


def test_corrupt_zstd_names_file(tmp_path, data):
    """A corrupt zstd frame is reported with the shard's path."""
    blob = bytearray(zstandard.ZstdCompressor().compress(lines(200)))
    blob[20:40] = b"\x00" * 20
    (data / "a.jsonl.zst").write_bytes(bytes(blob))
    with pytest.raises(DataError, match=r"a\.jsonl\.zst: corrupt zstd data"):
        run_all(write_recipe(tmp_path))


def test_truncated_zstd_names_file(tmp_path, data):
    """A truncated zstd stream is reported, not silently read short."""
    blob = zstandard.ZstdCompressor().compress(lines(500))
    (data / "a.jsonl.zst").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(DataError, match=r"a\.jsonl\.zst: (truncated|corrupt)"):
        run_all(write_recipe(tmp_path))


def test_truncated_jsonl_line_names_line(tmp_path, data):
    """A jsonl file cut in the middle of a record fails on that record's line."""
    (data / "a.jsonl").write_bytes(lines(4)[:-7])
    with pytest.raises(DataError, match=r"a\.jsonl:4: invalid JSON"):
        run_all(write_recipe(tmp_path))


def test_glob_matching_nothing_is_named(tmp_path, data):
    """A pattern that matches no file is an error naming the pattern."""
    with pytest.raises(RecipeError, match=r"pattern 'data/\*\.jsonl\*' matches no file"):
        Pipeline(Recipe.from_toml(write_recipe(tmp_path)))


def test_missing_file_is_named(tmp_path, data):
    """A literal path that does not exist is reported by name."""
    with pytest.raises(RecipeError, match=r"missing\.jsonl"):
        Pipeline(Recipe.from_toml(write_recipe(tmp_path, "data/missing.jsonl")))


@pytest.mark.parametrize("target", ["gone.jsonl", "loop.jsonl"])
def test_a_link_that_leads_nowhere_is_named(tmp_path, data, target):
    """A matched symbolic link to a missing file, or one that loops, is an error naming it.

    Left out, its records would be lost without a word (a half-copied folder, a cache link
    to a deleted blob); the other shard alone runs.
    """
    (data / "a.jsonl").write_bytes(lines(6))
    os.symlink(data / target, data / "loop.jsonl")
    with pytest.raises(RecipeError, match=r"loop\.jsonl is a symbolic link to .*cannot be opened"):
        Pipeline(Recipe.from_toml(write_recipe(tmp_path)))


def test_a_fifo_among_the_shards_is_named(tmp_path, data):
    """A FIFO matched by the pattern is refused, not read (it would block) nor left out."""
    (data / "a.jsonl").write_bytes(lines(6))
    os.mkfifo(data / "b.jsonl")
    with pytest.raises(RecipeError, match=r"b\.jsonl is not a regular file"):
        Pipeline(Recipe.from_toml(write_recipe(tmp_path)))


def test_a_folder_named_as_the_pattern_says_so(tmp_path, data):
    """A pattern naming a folder (no wildcard) says it is one and how to name its files."""
    (data / "a.jsonl").write_bytes(lines(6))
    with pytest.raises(RecipeError, match=r"it is a folder: name its files \('data/\*\.jsonl'\)"):
        Pipeline(Recipe.from_toml(write_recipe(tmp_path, "data")))


def test_errors_are_zephon_errors(tmp_path, data):
    """Data errors derive from ZephonError so callers can catch one type."""
    (data / "a.jsonl").write_bytes(b"{oops\n")
    with pytest.raises(ZephonError):
        run_all(write_recipe(tmp_path))
