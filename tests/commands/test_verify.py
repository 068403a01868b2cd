"""``zephon verify``: the matrix, the table, exit status, JSON, progress and the report."""

from __future__ import annotations

import json
import struct
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.commands.run import zephon
from zephon_nodes import Pipeline, Recipe
from zephon_nodes.commands import verify as verify_cmd
from zephon_nodes.engine.lane import Lane
from zephon_nodes.operators.chain import Chain
from zephon_nodes.operators.documents import DocBatch
from zephon_nodes.verification.baselines import naive_batches, naive_digests
from zephon_nodes.verification.matrix import (
    Setting,
    default_dp_sizes,
    default_matrix,
    first_difference,
)


class ThreadTag:
    """A wrong operator: adds 1 to every token when not on the main thread."""

    name = "thread-tag"

    def __call__(self, batch: DocBatch) -> DocBatch:
        bump = 0 if threading.current_thread() is threading.main_thread() else 1
        return DocBatch(batch.tokens + bump, batch.lengths)


class ThreadTagPipeline(Pipeline):
    def __init__(self, recipe: Recipe) -> None:
        super().__init__(recipe)
        self.stateless = Chain([*self.stateless.operators, ThreadTag()])


def table_rows(out: str) -> list[list[str]]:
    """Rows of the printed table, split on runs of 2+ spaces (header and rule excluded)."""
    lines = out.split("\n\n")[0].splitlines()[2:]
    import re

    return [re.split(r"\s{2,}", line.strip()) for line in lines]


class TestMatrix:
    def test_default_dp_sizes_are_divisors_up_to_8(self) -> None:
        assert default_dp_sizes(16) == [1, 2, 4, 8]
        assert default_dp_sizes(6) == [1, 2, 3, 6]
        assert default_dp_sizes(7) == [1, 7]
        assert default_dp_sizes(1) == [1]

    def test_default_matrix_holds_every_setting_and_resume_pair(self) -> None:
        m = default_matrix(8, checkpoint_step=3)
        plain = [s for s in m if not s.is_resume]
        resume = [s for s in m if s.is_resume]
        assert {(s.dp, s.workers, s.runner) for s in plain} == {
            (d, w, r) for d in (1, 2, 4, 8) for w in (1, 2) for r in ("thread", "process")
        }
        assert len(plain) == 16
        assert {(s.resume_from, s.dp) for s in resume} == {
            (a, b) for a in (1, 2, 4, 8) for b in (1, 2, 4, 8) if a != b
        }
        assert all(s.checkpoint_step == 3 for s in resume)

    def test_micro_batch_settings_only_where_the_size_divides_a_ranks_rows(self) -> None:
        m = default_matrix(
            4, runners=["thread"], resume=False, micro_batch_sizes=[1, 4], global_batch_size=8
        )
        micro = [(s.dp, s.local_batch_size) for s in m if s.local_batch_size is not None]
        # G/R rows per rank: 8, 4, 2 at dp 1, 2, 4
        assert micro == [(1, 1), (2, 1), (4, 1), (1, 4), (2, 4)]

    def test_a_dp_size_that_does_not_divide_the_lanes_is_refused(self) -> None:
        from zephon_nodes.core.errors import RecipeError

        with pytest.raises(RecipeError, match="does not divide"):
            default_matrix(4, dp_sizes=[3])

    def test_first_difference(self) -> None:
        assert first_difference(["a", "b"], ["a", "b"]) is None
        assert first_difference(["a", "b"], ["a", "c"]) == 2
        assert first_difference(["a", "b", "c"], ["a", "b"]) == 3
        assert first_difference(["a"], []) == 1

    def test_setting_names(self) -> None:
        assert Setting(2, 1, "process").name == "dp=2 workers=1 process"
        assert Setting(1, 0).name == "dp=1 inline"
        assert Setting(4, 2, resume_from=1, checkpoint_step=5).name == (
            "resume dp=1->4 @5 workers=2 thread"
        )


class TestVerify:
    def test_identical_everywhere_exits_0(self, recipe_path: Path, capsys: Any) -> None:
        status = zephon("verify", str(recipe_path), "--steps", "6", "--runners", "thread")
        out = capsys.readouterr().out
        rows = table_rows(out)
        # reference + 3 dp sizes x 2 worker counts + 3 micro-batch splits + 6 resume pairs
        assert len(rows) == 1 + 6 + 3 + 6
        assert rows[0][:3] == ["dp=1 inline", "6", "(reference)"]
        assert all(r[2] == "identical" and r[1] == "6" for r in rows[1:])
        assert "15/15 settings identical to the reference over 6 steps" in out
        assert [r[0] for r in rows[7:10]] == [
            "dp=1 workers=2 thread micro=1",
            "dp=2 workers=2 thread micro=1",
            "dp=4 workers=2 thread micro=1",
        ]
        assert status == 0

    def test_a_thread_dependent_operator_fails_with_step_1(
        self, recipe_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(verify_cmd, "Pipeline", ThreadTagPipeline)
        status = zephon(
            "verify", str(recipe_path), "--steps", "4", "--runners", "thread", "--no-resume"
        )
        out = capsys.readouterr().out
        rows = table_rows(out)
        assert status == 1
        assert len(rows) == 1 + 6 + 3
        assert all(r[2] == "differs at step 1" for r in rows[1:])
        assert "MISMATCH" in out

    def test_a_wrong_lane_checkpoint_fails_only_the_resumes(
        self, recipe_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        real = Lane.get_state

        def off_by_one(self: Lane) -> dict[str, Any]:
            state = real(self)
            state[Lane.CONSUMED_KEY] += 1
            return state

        monkeypatch.setattr(Lane, "get_state", off_by_one)
        status = zephon(
            "verify", str(recipe_path), "--steps", "6", "--runners", "thread",
            "--workers", "1", "--dp", "1,2", "--checkpoint-step", "2",
        )  # fmt: skip
        rows = table_rows(capsys.readouterr().out)
        assert status == 1
        verdicts = {r[0]: r[2] for r in rows}
        assert verdicts["dp=1 workers=1 thread"] == "identical"
        assert verdicts["dp=2 workers=1 thread"] == "identical"
        # The off-by-one positions contradict the step (2 steps x 2 samples per lane, all in
        # window 0), so the resume is refused before a batch rather than differing later.
        for row in ("resume dp=1->2 @2 workers=2 thread", "resume dp=2->1 @2 workers=2 thread"):
            assert verdicts[row].startswith("error: CheckpointError: checkpoint lane 0: pos")

    def test_json_output(self, recipe_path: Path, capsys: Any) -> None:
        status = zephon(
            "verify", str(recipe_path), "--steps", "3", "--runners", "thread",
            "--dp", "1,4", "--workers", "2", "--json",
        )  # fmt: skip
        data = json.loads(capsys.readouterr().out)
        assert status == 0
        assert data["ok"] is True
        names = [s["setting"] for s in data["settings"]]
        assert names == [
            "dp=1 workers=2 thread",
            "dp=4 workers=2 thread",
            "dp=1 workers=2 thread micro=1",
            "dp=4 workers=2 thread micro=1",
            "resume dp=1->4 @1 workers=2 thread",
            "resume dp=4->1 @1 workers=2 thread",
        ]
        ref = data["reference"]["digests"]
        assert len(ref) == 3 and all(len(d) == 64 for d in ref)
        assert all(s["digests"] == ref for s in data["settings"])

    def test_progress_is_plain_lines_without_a_terminal(
        self, recipe_path: Path, capsys: Any
    ) -> None:
        zephon("verify", str(recipe_path), "--steps", "2", "--runners", "thread", "--no-resume")
        captured = capsys.readouterr()
        err = captured.err.splitlines()
        assert "\r" not in captured.err
        assert err[0].startswith("zephon verify: a reference run, then 9 settings of 2 steps")
        assert err[1].startswith("[reference] dp=1 inline: 2 steps")
        assert "9 settings to go, about " in err[1]
        assert err[-1].startswith("[9/9] dp=4 workers=2 thread micro=1: identical")
        # The count in the progress lines is the count of the summary.
        assert "9/9 settings identical to the reference" in captured.out

    def test_the_data_ending_early_limits_the_steps(self, tmp_path: Path, capsys: Any) -> None:
        from tests.commands.conftest import write_recipe

        path = write_recipe(tmp_path, docs=40)
        status = zephon("verify", str(path), "--steps", "50", "--runners", "thread", "--json")
        data = json.loads(capsys.readouterr().out)
        produced = len(data["reference"]["digests"])
        assert 1 < produced < 50
        assert status == 0
        assert all(len(s["digests"]) == produced for s in data["settings"])

    @pytest.mark.slow
    def test_process_runner_matrix(self, recipe_path: Path, capsys: Any) -> None:
        status = zephon(
            "verify", str(recipe_path), "--steps", "3", "--runners", "process",
            "--no-resume", "--micro-batch-sizes", "0", "--json",
        )  # fmt: skip
        data = json.loads(capsys.readouterr().out)
        assert status == 0
        assert len(data["settings"]) == 6
        assert {s["runner"] for s in data["settings"]} == {"process"}


def png_size(path: Path) -> tuple[int, int]:
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    assert raw[12:16] == b"IHDR"
    width, height = struct.unpack(">II", raw[16:24])
    return width, height


class TestReport:
    def test_png_report(self, recipe_path: Path, tmp_path: Path) -> None:
        png = tmp_path / "report.png"
        status = zephon(
            "verify", str(recipe_path), "--steps", "8", "--runners", "thread",
            "--report", str(png),
        )  # fmt: skip
        assert status == 0
        width, height = png_size(png)
        # 13 settings rows and two panels: wide and tall enough to read.
        assert 900 <= width <= 3000
        assert 300 <= height <= 2000
        assert width > height
        assert 20_000 < png.stat().st_size < 2_000_000

    def test_html_report_colours_each_cell(self, recipe_path: Path, tmp_path: Path) -> None:
        from zephon_nodes.verification.report import GREEN, RED

        page = tmp_path / "report.html"
        status = zephon(
            "verify", str(recipe_path), "--steps", "5", "--runners", "thread", "--dp", "1,2",
            "--workers", "1", "--no-resume", "--report", str(page),
        )  # fmt: skip
        assert status == 0
        text = page.read_text()
        assert text.startswith("<!DOCTYPE html>") and "<svg" in text
        # ours: reference + 2 settings + 2 micro-batch splits, all green;
        # naive: dp=1 green, dp=2 red on every step.
        assert text.count(f'fill="{GREEN}"') == 5 * 5 + 5
        assert text.count(f'fill="{RED}"') == 5
        assert "naive rank-sharded" in text

    def test_unknown_report_suffix_is_refused(self, recipe_path: Path, capsys: Any) -> None:
        assert zephon("verify", str(recipe_path), "--report", "out.pdf") == 2
        assert "expected a .html or .png" in capsys.readouterr().out


class TestNaiveBaseline:
    def test_changes_with_dp_but_is_repeatable(self, recipe_path: Path) -> None:
        p = Pipeline(Recipe.from_toml(recipe_path))
        one = naive_digests(p, 1, 5)
        assert len(one) == 5
        assert naive_digests(p, 1, 5) == one
        assert naive_digests(p, 2, 5)[0] != one[0]

    def test_first_sample_starts_with_the_first_document(self, recipe_path: Path) -> None:
        p = Pipeline(Recipe.from_toml(recipe_path))
        item = p.work_source.work(0, 0)
        assert item is not None
        lines = (recipe_path.parent / "data.jsonl").read_text().splitlines()
        text = json.loads(lines[item.start])["text"]
        doc = [1] + [b + 3 for b in text.encode()] + [2]  # bos, bytes + 3, eos
        batch = next(naive_batches(p, 2, 1))
        assert len(batch) == 8
        first = batch[0]["input"].tolist()
        n = min(len(doc) - 1, 64)
        assert first[:n] == doc[:-1][:n]


def test_a_checkpoint_step_beyond_the_data_is_refused(recipe_path: Path, capsys: Any) -> None:
    status = zephon("verify", str(recipe_path), "--steps", "4", "--checkpoint-step", "4")
    assert status == 2
    assert "checkpoint step 4 must be in [1, 4)" in capsys.readouterr().out


def test_progress_bar_on_a_terminal() -> None:
    import io

    from zephon_nodes.verification.matrix import REFERENCE, SettingResult

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    progress = verify_cmd._Progress(2, stream)
    progress(SettingResult(REFERENCE, ["d"], 10, 0.1))
    progress(SettingResult(Setting(2, 1), ["d"], 10, 0.1))
    progress.close()
    text = stream.getvalue()
    assert "setting/s" in text and "\r" in text  # a tqdm bar, redrawn in place
    assert "dp=2 workers=1 thread" in text
    assert "[1/2]" not in text  # not the plain lines
