"""A hostile ``--mixture-updates`` file exits 2 in one line at start-up (issue 27, cases 7, 9
and 10): overflowing weights, deep nesting, duplicated keys, weights whose sum overflows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.commands.run import zephon
from zephon_nodes.core.errors import RecipeError
from zephon_nodes.engine.mixture_log import read_updates

NAMES = ["web", "code"]


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "updates.json"
    path.write_text(text)
    return str(path)


CASES = {
    "float_literal_overflow": ('[{"step": 2, "weights": {"web": 1e400, "code": 1}}]', "inf"),
    "integer_literal_overflow": (
        '[{"step": 2, "weights": {"web": 1' + "0" * 400 + ', "code": 1}}]',
        "401 digits",
    ),
    "deep_nesting": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "duplicated_key": (
        '[{"step": 2, "weights": {"web": 1, "code": 1, "web": 5}}]',
        "'web' appears twice",
    ),
    "duplicated_step": ('[{"step": 2, "step": 3, "weights": {"web": 1, "code": 1}}]', "twice"),
    "sum_overflows": (
        '[{"step": 2, "weights": {"web": 1e308, "code": 1e308}}]',
        "more than a float holds",
    ),
    "sum_is_zero": ('[{"step": 2, "weights": {"web": 0, "code": 0}}]', "sum to 0"),
    "huge_integer_in_step": ('[{"step": ' + "9" * 5000 + ', "weights": {}}]', "JSON"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_read_updates_refuses_in_one_line(tmp_path, case):
    """Each is a RecipeError naming the file, at load, before any step."""
    text, needle = CASES[case]
    path = _file(tmp_path, text)
    with pytest.raises(RecipeError) as e:
        read_updates(path, NAMES)
    message = str(e.value)
    assert needle in message and path in message and "\n" not in message, message
    assert len(message) < 400


def test_valid_updates_still_parse(tmp_path):
    """Large but summable weights are fine; only their ratios matter."""
    path = _file(tmp_path, json.dumps([{"step": 2, "weights": {"web": 1e300, "code": 3e300}}]))
    assert read_updates(path, NAMES) == [(2, {"web": 0.25, "code": 0.75})]


def test_the_cli_exits_2(tmp_path, capsys):
    """`zephon digest --mixture-updates` with 1e400: exit 2, one line, no traceback."""
    for name in NAMES:
        (tmp_path / f"{name}.jsonl").write_text(
            "\n".join(json.dumps({"text": f"{name} {i} " * 3}) for i in range(50)) + "\n"
        )
    toml = tmp_path / "r.toml"
    datasets = "".join(
        f'[[datasets]]\nname = "{n}"\npaths = ["{tmp_path}/{n}.jsonl"]\nweight = 1.0\n'
        for n in NAMES
    )
    toml.write_text(
        "seed = 1\nnum_lanes = 2\nglobal_batch_size = 4\nseq_len = 16\n"
        '[tokenizer]\nkind = "bytes"\n[work]\nchunk_size = 4\n' + datasets
    )
    path = _file(tmp_path, CASES["float_literal_overflow"][0])
    capsys.readouterr()
    assert zephon("digest", str(toml), "--steps", "4", "--mixture-updates", path) == 2
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "weight of 'web' is inf" in out, out
