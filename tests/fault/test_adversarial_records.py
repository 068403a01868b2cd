"""One hostile record never raises a traceback: under ``skip`` it is skipped and counted by
reason, under ``raise`` one line names the file, the line and the problem (issue 27, case 7)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.chat.test_sft_pipeline import chat_recipe, with_answer
from tests.io.test_remote_digests import recipe
from zephon_nodes import Pipeline, simulate
from zephon_nodes.commands.stats import compute_stats
from zephon_nodes.core.errors import DataError

# line (1-based) -> (the hostile JSON line, its skip reason)
HOSTILE = {
    5: ('{"text": "a lone surrogate \\ud800 here"}', "invalid_text_encoding"),
    9: ('{"text": "deep", "f": ' + "[" * 50_000 + "]" * 50_000 + "}", "nesting_depth"),
    14: ('{"text": "big", "n": ' + "7" * 5000 + "}", "number_size"),
    20: ('{"text": "lone low \\uDC00"}', "invalid_text_encoding"),
}


def _write(path: Path, good: list[str]) -> None:
    lines = list(good)
    for line_no, (text, _) in sorted(HOSTILE.items()):
        lines.insert(line_no - 1, text)
    path.write_text("\n".join(lines) + "\n")


def _good(n: int) -> list[str]:
    # A valid surrogate pair (an emoji as \\ud83d\\ude00) is text, not a hostile record.
    return [json.dumps({"text": f"doc {i} \ud83d\ude00 " + "w " * (i % 5)}) for i in range(n)]


def _counts() -> dict[str, int]:
    out: dict[str, int] = {}
    for _, reason in HOSTILE.values():
        out[reason] = out.get(reason, 0) + 1
    return out


def test_text_records_skipped_and_counted_by_reason(tmp_path):
    """Lone surrogates, 50,000-deep nesting and a 5,000-digit integer: skipped, counted."""
    _write(tmp_path / "a.jsonl", _good(200))
    r = recipe([str(tmp_path / "a.jsonl")])
    r = r.replace(datasets=(dataclasses.replace(r.datasets[0], on_error="skip"),))
    assert len(list(simulate(Pipeline(r), 1, 8))) == 8
    assert compute_stats(r, 30)["skipped_records"]["web"] == _counts()


@pytest.mark.parametrize("line_no", sorted(HOSTILE))
def test_text_record_raises_one_line_naming_file_and_line(tmp_path, line_no):
    """Under ``raise`` each hostile record is one DataError naming the file and line."""
    good = _good(30)
    good.insert(line_no - 1, HOSTILE[line_no][0])
    (tmp_path / "a.jsonl").write_text("\n".join(good) + "\n")
    with pytest.raises(DataError) as e:
        list(simulate(Pipeline(recipe([str(tmp_path / "a.jsonl")])), 1, 30))
    text = str(e.value)
    assert f"a.jsonl:{line_no}:" in text and "\n" not in text and len(text) < 400, text


def test_chat_records_skipped_and_counted(tmp_path):
    """A conversation whose message holds a lone surrogate is skipped, not a traceback."""
    convs = with_answer([[{"role": "user", "content": f"q{i} " * (i % 4 + 1)}] for i in range(30)])
    lines = [json.dumps({"messages": c}) for c in convs]
    lines[4] = lines[4].replace('"q4 ', '"q4 \\ud800 ')
    lines[8] = '{"messages": ' + "[" * 50_000 + "]" * 50_000 + "}"
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    r = chat_recipe(tmp_path, convs, "bestfit")
    spec = dataclasses.replace(
        r.datasets[0], records=None, paths=(str(tmp_path / "c.jsonl"),), on_error="skip"
    )
    r = r.replace(datasets=(spec,))
    assert len(list(simulate(Pipeline(r), 1, 4))) == 4
    skipped = compute_stats(r, 10)["skipped_records"]["chat"]
    assert skipped == {"invalid_text_encoding": 1, "nesting_depth": 1}
