"""What a new user reads in ``--help`` and gets from ``zephon lanes --checkpoint`` (issue 36.4).

- every option with a default shows it (or says what it defaults to) in ``--help``;
- ``zephon lanes --checkpoint`` costs the replay with the checkpoint's ``flush_every``, not
  the planning guess 8 (its ``[work]`` table is only a hash: ``--chunk-size`` stays a flag).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path

import pytest

from zephon_nodes import cli


def help_of(name: str) -> str:
    parser = cli.build_parser([name])  # that subcommand in full, as `zephon NAME --help`
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return " ".join(sub.choices[name].format_help().split())


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("demo", ["global batches per setting (default: 24)", "(default: 10)"]),
        ("cache", ["(default: show)"]),
        ("digest", ["worker runner (default: thread)", "--local-batch-size", "(default: the"]),
        ("explain", ["data-parallel ranks (default: 1)"]),
        ("lanes", ["(default: the checkpoint's, else 8)", "(default: 64)"]),
    ],
)
def test_help_shows_defaults(command: str, expected: list[str]) -> None:
    text = help_of(command)
    for words in expected:
        assert words in text, (command, words)


def test_every_option_default_is_in_help() -> None:
    """No option with a value default hides it (None and flags have none to show)."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        for action in command._actions:
            if not action.option_strings or action.default in (None, False, argparse.SUPPRESS):
                continue
            line = " ".join(command.format_help().split())
            assert "default" in (action.help or "") or (f"(default: {action.default})" in line), (
                f"zephon {name} {action.option_strings[0]}"
            )


RECIPE = """\
seed = 7
num_lanes = 4
global_batch_size = 8
seq_len = 16
flush_every = 3

[tokenizer]
kind = "bytes"

[[datasets]]
name = "notes"
paths = ["notes.jsonl"]

[work]
chunk_size = 5
epochs = 1
"""


def zephon(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(list(argv)) == 0
    return out.getvalue()


def test_lanes_checkpoint_uses_its_flush_every(tmp_path: Path) -> None:
    (tmp_path / "notes.jsonl").write_text(
        "".join(json.dumps({"text": f"note {i} " * 4}) + "\n" for i in range(200))
    )
    (tmp_path / "r.toml").write_text(RECIPE)
    ckpt = tmp_path / "ckpt"
    zephon("digest", str(tmp_path / "r.toml"), "--steps", "2", "--save-at", "2",
           "--checkpoint-dir", str(ckpt))  # fmt: skip
    options = json.loads(zephon("lanes", "--checkpoint", str(ckpt), "--dp", "4", "--json"))
    assert [o["num_lanes"] for o in options] == [4, 8]  # G = 8 from the checkpoint
    assert {o["replay_items_per_lane"] for o in options} == {3}
    assert {o["replay_records_per_lane"] for o in options} == {3 * 64}  # --chunk-size 64
    table = zephon("lanes", "--checkpoint", str(ckpt), "--dp", "4")
    assert "--flush-every=3" in table
    # A flag still wins over the checkpoint's value.
    options = json.loads(
        zephon("lanes", "--checkpoint", str(ckpt), "--dp", "4", "--json", "--flush-every", "5")
    )
    assert {o["replay_items_per_lane"] for o in options} == {5}
