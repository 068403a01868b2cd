"""The command line under hostile conditions (issue 35, item 5): one line, a status, no
traceback, nothing left behind.

Signals to ``digest`` and ``verify`` (with a process runner: every worker and the resource
tracker reaped, no semaphore reported leaked), stdout that is full or closed, a token cache
whose file system is full, a directory given as the recipe and a 10 MB unknown key.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.commands.run import zephon_process
from zephon_nodes import RecipeError
from zephon_nodes.cli import main
from zephon_nodes.recipe import Recipe

ROOT = Path(__file__).resolve().parents[2]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, prctl")

RECIPE = """seed = 3
num_lanes = 4
global_batch_size = 8
seq_len = 32
flush_every = 2
[tokenizer]
kind = "bytes"
[[datasets]]
name = "d"
paths = ["data/*.jsonl"]
[work]
chunk_size = 8
epochs = {epochs}
[shuffle]
buffer_size = 4
"""


def write_corpus(root: Path, epochs: str = "1") -> Path:
    """Two shards of 60 records (about 400-700 bytes each) and a recipe over them."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    for s in range(2):
        lines = [json.dumps({"text": f"doc {s}-{i} " + "word " * (80 + i)}) for i in range(60)]
        (root / "data" / f"s{s}.jsonl").write_text("\n".join(lines) + "\n")
    recipe = root / "r.toml"
    recipe.write_text(RECIPE.format(epochs=epochs))
    return recipe


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "ZEPHON_CACHE_DIR": str(tmp_path / "cache")}


def zephon(tmp_path: Path, *argv: str, **popen: object) -> subprocess.CompletedProcess[str]:
    """Run ``python -m zephon_nodes.cli ARGV...`` in ``tmp_path``, with a cache of its own."""
    return zephon_process(*argv, cwd=tmp_path, env=_env(tmp_path), **popen)


def assert_one_line_error(stderr: str, *words: str) -> None:
    """``stderr`` is one line, names ``words`` and holds no traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr[-3000:]
    for word in words:
        assert word in lines[0], lines[0]


class TestRecipeFile:
    """Odd recipe files are one-line errors."""

    def test_directory_is_a_recipe_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A directory given as the recipe names the path (not an IsADirectoryError)."""
        with pytest.raises(RecipeError, match="is a directory"):
            Recipe.from_toml(tmp_path)
        assert main(["explain", str(tmp_path)]) == 2
        assert_one_line_error(capsys.readouterr().err, str(tmp_path), "is a directory")

    def test_huge_unknown_key_is_named_short(self, tmp_path: Path) -> None:
        """A 1 MB unknown key: refused, its name shortened and its length given (the
        suggestion of a close key is not searched over a huge key: it took minutes)."""
        recipe = write_corpus(tmp_path)
        key = "k" * 1_000_000
        recipe.write_text(recipe.read_text().replace("seed = 3", f"seed = 3\n{key} = 1"))
        with pytest.raises(RecipeError, match=r"unknown key.*\(1,000,000 characters\)") as e:
            Recipe.from_toml(recipe)
        assert len(str(e.value)) < 400


@linux_only
class TestSignals:
    """SIGINT and SIGTERM end a command with 130 / 143 and one line; nothing is left."""

    @pytest.mark.parametrize(
        ("name", "status", "command"),
        [
            ("SIGINT", 130, ["digest", "--runner", "process", "--num-workers", "2"]),
            ("SIGTERM", 143, ["digest", "--runner", "process", "--num-workers", "2"]),
            ("SIGINT", 130, ["verify"]),
        ],
    )
    def test_signal(self, tmp_path: Path, name: str, status: int, command: list[str]) -> None:
        recipe = write_corpus(tmp_path, epochs='"inf"')
        wait_for = 3 if "process" in command else 0  # two workers, the resource tracker
        argv = [command[0], str(recipe), "--steps", "1000000", *command[1:]]
        done = subprocess.run(
            [sys.executable, "-m", "tests.fault.signal_probe", name, str(wait_for), *argv],
            cwd=ROOT,
            env=_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert not report["hung"]
        err = report["stderr_after"]  # what the signal made the command print
        assert report["rc"] == status, report["stderr"][-3000:]
        assert "Traceback" not in err and "leaked" not in err, err[-3000:]
        signame = signal.Signals[name].name
        assert err.strip().splitlines()[-1] == f"zephon {command[0]}: " + (
            "interrupted (SIGINT)" if signame == "SIGINT" else "terminated (SIGTERM)"
        )
        assert len(err.strip().splitlines()) == 1, err
        assert report["seen"] >= wait_for
        assert report["left"] == [], report  # every worker and helper reaped


class TestOutput:
    """A stdout that cannot be written is an error, never a silent success."""

    def test_stdout_full(self, tmp_path: Path) -> None:
        recipe = write_corpus(tmp_path)
        with open("/dev/full", "w") as full:
            done = zephon(
                tmp_path,
                "digest",
                str(recipe),
                "--steps",
                "2",
                stdout=full,
                stderr=subprocess.PIPE,
                capture_output=False,
            )
        assert done.returncode != 0
        assert_one_line_error(done.stderr, "cannot write to stdout", "No space left")

    def test_stdout_closed(self, tmp_path: Path) -> None:
        recipe = write_corpus(tmp_path)
        done = subprocess.run(
            [
                "sh",
                "-c",
                f'exec "{sys.executable}" -m zephon_nodes.cli digest "{recipe}" --steps 2 >&-',
            ],
            cwd=tmp_path,
            env=_env(tmp_path),
            capture_output=False,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
        assert done.returncode != 0
        assert_one_line_error(done.stderr, "stdout is closed")


def _file_size_limit() -> None:  # in the child: writes past 4 KiB fail with EFBIG
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def test_token_cache_on_a_full_file_system_runs_uncached(tmp_path: Path) -> None:
    """Every token-cache entry (about 5 KB) fails to be written: the run goes on uncached,
    with one warning, and gives the batches of ``--token-cache off``."""
    recipe = write_corpus(tmp_path)
    off = zephon(tmp_path, "digest", str(recipe), "--steps", "3", "--token-cache", "off")
    assert off.returncode == 0, off.stderr[-3000:]
    full = zephon(
        tmp_path,
        "digest",
        str(recipe),
        "--steps",
        "3",
        "--token-cache",
        "on",
        preexec_fn=_file_size_limit,
    )
    assert full.returncode == 0, full.stderr[-3000:]
    assert full.stdout == off.stdout and len(off.stdout.splitlines()) == 3
    assert "Traceback" not in full.stderr
    warnings = [
        line
        for line in full.stderr.splitlines()
        if "goes on without storing tokenized items" in line
    ]
    assert len(warnings) == 1, full.stderr
    assert "File too large" in warnings[0]
