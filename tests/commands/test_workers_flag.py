"""`--num-workers` (alias `--workers`) means pool workers per rank in every command (issue 23.4).

`zephon index` reads shards with `--jobs`; its old `--workers` is refused with one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.io.test_nodecache_zst import write_zst_corpus
from zephon_nodes.cli import main

TOML = """\
seed = 1
num_lanes = 2
global_batch_size = 2
seq_len = 8
flush_every = 1
[tokenizer]
kind = "bytes"
[[datasets]]
name = "d"
paths = ["{root}/*.jsonl.zst"]
"""


def test_one_meaning_everywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--workers and --num-workers give the same digests; index takes --jobs and refuses
    --workers, naming the new flag."""
    write_zst_corpus(tmp_path / "data")
    toml = tmp_path / "r.toml"
    toml.write_text(TOML.format(root=tmp_path / "data"))
    assert main(["index", str(tmp_path / "data" / "*.jsonl.zst"), "--jobs", "2", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["digest", str(toml), "--steps", "3", "--num-workers", "0"]) == 0
    a = capsys.readouterr().out
    assert main(["digest", str(toml), "--steps", "3", "--workers", "2"]) == 0
    assert capsys.readouterr().out == a and a.count("digest") == 3
    assert main(["index", str(tmp_path / "data" / "*.jsonl.zst"), "--workers", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--jobs" in err and "pool workers per rank" in err
