"""``zephon amend`` from the command line: the checkpoint it writes, and one-line refusals."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any

from tests.commands.run import zephon_process

BASE = """
seed = 7
num_lanes = 4
global_batch_size = 8
seq_len = {seq_len}
flush_every = 2
[tokenizer]
kind = "bytes"
{datasets}
[work]
chunk_size = 4
epochs = "inf"
"""


def _write(root: Path, name: str, seq_len: int, names: str, extra: str = "") -> Path:
    datasets = "".join(f'[[datasets]]\nname = "{n}"\npaths = ["{n}/*.jsonl"]\n' for n in names)
    path = root / name
    path.write_text(BASE.format(seq_len=seq_len, datasets=datasets) + extra)
    tomllib.loads(path.read_text())
    return path


def _zephon(*args: Any, cwd: Path) -> subprocess.CompletedProcess[str]:
    return zephon_process(*args, cwd=cwd)


def _digests(out: str) -> list[str]:
    return [json.loads(line)["digest"] for line in out.splitlines() if line.startswith("{")]


def test_amend_then_resume_gives_the_stage(corpus: tuple[Path, Any]) -> None:
    root, _ = corpus
    old = _write(root, "old.toml", 32, "ab")
    new = _write(root, "new.toml", 64, "ac")
    staged = _write(
        root,
        "staged.toml",
        32,
        "ab",
        '[[stages]]\nstart_step = 5\nseq_len = 64\nremove_datasets = ["b"]\n'
        '[[stages.datasets]]\nname = "c"\npaths = ["c/*.jsonl"]\n',
    )
    ref = _zephon("digest", staged, "--steps", 8, "--dp-world-size", 2, cwd=root)
    assert ref.returncode == 0, ref.stderr
    ck = _zephon("digest", old, "--steps", 3, "--save-at", 3, "--checkpoint-dir", "ck", cwd=root)
    assert ck.returncode == 0, ck.stderr
    # The change follows step 5: amend runs the old recipe from step 3 to step 5 first.
    am = _zephon("amend", old, "ck", new, "--at-step", 5, "--output", "am", "--json", cwd=root)
    assert am.returncode == 0, am.stderr
    out = json.loads(am.stdout)
    assert out["step"] == 5 and out["datasets"] == ["a", "b", "c"] and out["amendments"] == 1
    assert "seq_len: old recipe has 32, new has 64" in out["changed"]
    res = _zephon(
        "digest", new, "--steps", 3, "--resume-from", "am", "--dp-world-size", 4, cwd=root
    )
    assert res.returncode == 0, res.stderr
    assert _digests(res.stdout) == _digests(ref.stdout)[5:]
    wrong = _zephon("digest", old, "--steps", 1, "--resume-from", "am", cwd=root)
    assert wrong.returncode == 2
    assert wrong.stderr.count("\n") == 1 and "different recipe" in wrong.stderr
    assert "seq_len: checkpoint has 64, recipe has 32" in wrong.stderr
    assert "amended from this recipe" in wrong.stderr
    seen = _zephon("inspect", "am", "--recipe", new, cwd=root)
    assert seen.returncode == 0 and "resume with" in seen.stdout and ": yes" in seen.stdout
    assert "recipe change: stage 0 in force since step 5 (1 amendment(s))" in seen.stdout


def test_amend_refusals_are_one_line(corpus: tuple[Path, Any]) -> None:
    root, _ = corpus
    old = _write(root, "old2.toml", 32, "ab")
    assert (
        _zephon(
            "digest", old, "--steps", 3, "--save-at", 3, "--checkpoint-dir", "ck2", cwd=root
        ).returncode
        == 0
    )
    seeded = root / "seeded.toml"
    seeded.write_text(old.read_text().replace("seed = 7", "seed = 8"))
    cases = [
        ((old, "ck2", seeded, "--output", "x1"), "seed cannot change within a run"),
        ((old, "ck2", old, "--at-step", 2, "--output", "x2"), "before the checkpoint's step 3"),
        ((old, "nowhere", old, "--output", "x3"), "no checkpoint at nowhere"),
        ((seeded, "ck2", old, "--output", "x4"), "different recipe"),
    ]
    for args, message in cases:
        done = _zephon("amend", *args, cwd=root)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr


def test_decisions_a_run_cannot_take_are_refused_at_start_up(corpus: tuple[Path, Any]) -> None:
    """Issue 27.10: a decision after a re-lane or a recipe change is refused before step 1."""
    root, _ = corpus
    old = _write(root, "mix4.toml", 32, "ab")
    two = root / "mix2.toml"
    two.write_text(old.read_text().replace("num_lanes = 4", "num_lanes = 2"))
    staged = _write(root, "mixs.toml", 32, "ab", "[[stages]]\nstart_step = 3\nseq_len = 64\n")
    updates = root / "updates.json"
    updates.write_text(json.dumps([{"step": 4, "weights": {"a": 0.3, "b": 0.7}}]))
    assert (
        _zephon(
            "digest", old, "--steps", 2, "--save-at", 2, "--checkpoint-dir", "ck4", cwd=root
        ).returncode
        == 0
    )
    assert (
        _zephon("relane", old, "ck4", "--num-lanes", 2, "--output", "ck2", cwd=root).returncode == 0
    )
    cases = [
        (("digest", two, "--steps", 4, "--resume-from", "ck2"), "not supported after a re-lane"),
        (("digest", staged, "--steps", 6), "not supported after a recipe change"),
    ]
    for args, message in cases:
        done = _zephon(*args, "--mixture-updates", updates, cwd=root)
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and done.stderr.count("\n") == 1, done.stderr
        assert done.stdout == ""  # refused before the first step, not when reached
