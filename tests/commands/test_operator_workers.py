"""``--operator-workers`` on ``zephon digest`` and ``zephon verify``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.commands.conftest import write_recipe
from tests.commands.run import zephon


def _digests(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert zephon("digest", *argv) == 0
    return [json.loads(line)["digest"] for line in capsys.readouterr().out.splitlines()]


def test_digest_with_operator_workers_is_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = str(write_recipe(tmp_path))
    plain = _digests(capsys, recipe, "--steps", "6", "--num-workers", "0")
    mixed = _digests(
        capsys, recipe, "--steps", "6", "--dp-world-size", "2",
        "--operator-workers", "parse=inline,tokenize=thread:2",
    )  # fmt: skip
    assert len(plain) == 6 and mixed == plain


def test_verify_with_operator_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = str(write_recipe(tmp_path))
    status = zephon(
        "verify", recipe, "--steps", "4", "--dp", "1,2", "--workers", "1", "--runners",
        "thread", "--micro-batch-sizes", "0", "--operator-workers", "tokenize=thread:1", "--json",
    )  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert status == 0 and out["ok"] is True
    assert len(out["settings"]) >= 3 and all(s["steps"] == 4 for s in out["settings"])


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("tokenize=gpu:2", "runner 'gpu' must be one of"),
        ("tokenize", "must read OPERATOR=RUNNER"),
    ],
)
def test_malformed_flag_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, message: str
) -> None:
    recipe = str(write_recipe(tmp_path))
    with pytest.raises(SystemExit) as e:
        zephon("digest", recipe, "--steps", "1", "--operator-workers", flag)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_unknown_operator_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = str(write_recipe(tmp_path))
    assert zephon("digest", recipe, "--steps", "1", "--operator-workers", "decode=thread:2") == 2
    out = capsys.readouterr().out
    assert "'decode', which is not an operator of this recipe" in out and "'tokenize'" in out
