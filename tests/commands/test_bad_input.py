"""Imperfect input to ``zephon`` commands, as a new user gives it: one line naming the file and
the problem, a non-zero status, never a traceback, nothing hangs and nothing is silently lost.

The commands run through :func:`zephon_nodes.cli.main`, so an exception other than a
``ZephonError`` fails the test (it would be a traceback for the user).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

from tests.commands.conftest import RECIPE, write_recipe
from tests.commands.run import zephon_process
from tests.commands.test_inspect import saved_state
from zephon_nodes import __version__, cli, save_state


def fails(capsys: Any, *argv: object) -> str:
    """Run ``zephon ARGV`` and return its one-line error (status 2, nothing on stdout)."""
    status = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert status == 2, (status, out, err)
    assert out == ""
    assert err.startswith(f"zephon {argv[0]}: error: ") and err.count("\n") == 1, err
    return err


def variant(base: dict[str, Any], directory: Path, edit: Any) -> Path:
    """Save a copy of ``base`` changed by ``edit`` (checksummed: only its shape is wrong)."""
    state = copy.deepcopy(base)
    edit(state)
    save_state(directory, state)
    return directory


# Checksummed states whose shape a resume refuses (each once made `zephon inspect` print a
# traceback or report the state as fine).
MALFORMED = {
    "step-not-int-with-micro": (
        lambda s: s.update(step="two", micro=1),
        "checkpoint step='two' must be an integer",
    ),
    "no-step-with-micro": (
        lambda s: (s.pop("step"), s.update(micro=1)),
        "misses key(s): ['step']",
    ),
    "stage-without-lanes": (lambda s: s.update(stage={"x": 1}), "'stage'"),
    "mixture-log-of-ints": (
        lambda s: s.update(mixture={"log": [5], "effects": {}}),
        "mixture log entry 0",
    ),
    "lanes-a-list": (lambda s: s.update(lanes=[1, 2]), "'lanes' must be a dict"),
    "lane-negative": (
        lambda s: s["lanes"].update({"0": [0, -5]}),
        "lane 0: expected [window, consumed]",
    ),
    "lineage-a-list": (lambda s: s.update(lineage=[5]), "lineage must be a dict"),
}


class TestInspectMalformedState:
    @pytest.mark.parametrize("case", sorted(MALFORMED))
    def test_one_line_naming_the_file_and_problem(
        self, case: str, recipe_path: Path, tmp_path: Path, capsys: Any
    ) -> None:
        base = saved_state(recipe_path, tmp_path / "good")
        edit, problem = MALFORMED[case]
        bad = variant(base, tmp_path / "bad", edit)
        for argv in (("inspect", bad), ("inspect", bad, "--json")):
            err = fails(capsys, *argv)
            assert f"{bad}: " in err and problem in err, err

    def test_a_good_state_is_still_shown(
        self, recipe_path: Path, tmp_path: Path, capsys: Any
    ) -> None:
        saved_state(recipe_path, tmp_path / "good")
        assert cli.main(["inspect", str(tmp_path / "good")]) == 0
        assert "lane positions" in capsys.readouterr().out


class TestLanesCheckpoint:
    def test_malformed_state_is_refused(
        self, recipe_path: Path, tmp_path: Path, capsys: Any
    ) -> None:
        base = saved_state(recipe_path, tmp_path / "good")
        bad = variant(base, tmp_path / "bad", lambda s: s.update(lanes=[1, 2]))
        err = fails(capsys, "lanes", "--checkpoint", bad)
        assert f"{bad}: checkpoint 'lanes' must be a dict" in err

    def test_global_batch_out_of_range_does_not_hang(
        self, recipe_path: Path, tmp_path: Path
    ) -> None:
        """A checkpoint's global batch of 2**60 was taken as --global-batch unchecked: the
        lane search counted to 2**60 (it hung)."""
        base = saved_state(recipe_path, tmp_path / "good")
        bad = variant(base, tmp_path / "bad", lambda s: s["recipe"].update(global_batch_size=2**60))
        done = zephon_process("lanes", "--checkpoint", bad, "--dp", "1", timeout=60)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        assert f"checkpoint {bad}: recipe.global_batch_size=1152921504606846976 must be" in (
            done.stderr
        )


def test_saved_state_is_valid_json(recipe_path: Path, tmp_path: Path) -> None:
    """The base of the variants above is a state a resume accepts (not a broken fixture)."""
    saved_state(recipe_path, tmp_path / "good")
    state = json.loads((tmp_path / "good" / "zephon_state.json").read_text())
    assert state["step"] == 3 and len(state["lanes"]) == 4


class TestRecompressNameClash:
    def test_two_shards_of_one_name_are_refused_before_writing(
        self, tmp_path: Path, capsys: Any
    ) -> None:
        """``a/x.jsonl`` and ``b/x.jsonl`` were both written to ``OUT/x.jsonl.zst``: the second
        replaced the first, whose records were silently lost."""
        for folder, n in (("a", 5), ("b", 7)):
            (tmp_path / folder).mkdir()
            lines = [json.dumps({"text": f"{folder} {i}"}) for i in range(n)]
            (tmp_path / folder / "x.jsonl").write_text("\n".join(lines) + "\n")
        a, b, out = tmp_path / "a" / "x.jsonl", tmp_path / "b" / "x.jsonl", tmp_path / "out"
        err = fails(capsys, "recompress", a, b, "--output-dir", out)
        assert f"{a} and {b} would both be written to {out / 'x.jsonl.zst'}" in err
        assert not (out / "x.jsonl.zst").exists()

    def test_one_shard_matched_twice_is_written_once(self, tmp_path: Path, capsys: Any) -> None:
        shard = tmp_path / "x.jsonl"
        shard.write_text(json.dumps({"text": "one"}) + "\n")
        out = tmp_path / "out"
        assert cli.main(["recompress", str(shard), str(shard), "--output-dir", str(out)]) == 0
        assert capsys.readouterr().out == f"{out / 'x.jsonl.zst'}: 1 frame(s)\n"


class TestDemo:
    def test_save_at_not_before_the_last_step_is_refused_at_once(
        self, recipe_path: Path, capsys: Any
    ) -> None:
        """``--save-at`` = ``--steps`` printed the table, then 'MISMATCH (this is a bug)'."""
        err = fails(capsys, "demo", "--recipe", recipe_path, "--steps", 3, "--save-at", 3)
        assert "--save-at=3 must be in [1, 2]" in err
        err = fails(capsys, "demo", "--recipe", recipe_path, "--steps", 3, "--save-at", 5)
        assert "--save-at=5 must be in [1, 2]" in err  # was: 'steps=-2 must be an integer'

    def test_lanes_that_dp_4_cannot_share_are_refused_at_once(
        self, tmp_path: Path, capsys: Any
    ) -> None:
        recipe = write_recipe(tmp_path, RECIPE.replace("num_lanes = 4", "num_lanes = 2"))
        err = fails(capsys, "demo", "--recipe", recipe, "--steps", 3, "--save-at", 1)
        assert "num_lanes=2 must be a multiple of 4" in err

    def test_a_recipe_whose_data_ends_first_is_no_mismatch(
        self, recipe_path: Path, capsys: Any
    ) -> None:
        """The fixture's 300 documents end before step 100: the demo called that a bug."""
        status = cli.main(
            ["demo", "--recipe", str(recipe_path), "--steps", "100", "--save-at", "5"]
        )
        out, err = capsys.readouterr()
        assert "MISMATCH" not in err and status == 0, (out, err)
        assert "(the data ends after step " in out
        assert "differs" not in out.split("naive rank-sharded")[0]


class TestOutputReplacesTheCheckpointRead:
    @pytest.mark.parametrize("command", ["relane", "amend"])
    def test_refused_and_the_checkpoint_kept(
        self, command: str, recipe_path: Path, tmp_path: Path, capsys: Any
    ) -> None:
        """``--output`` naming the checkpoint's own folder overwrote it: the run's only copy
        of the state it was taken at was gone."""
        saved_state(recipe_path, tmp_path / "ckpt")
        file = tmp_path / "ckpt" / "zephon_state.json"
        before = file.read_bytes()
        rest = ["--num-lanes", "8"] if command == "relane" else [recipe_path]
        for checkpoint, output in (
            (tmp_path / "ckpt", tmp_path / "ckpt"),
            (file, tmp_path / "ckpt" / "."),
        ):
            err = fails(capsys, command, recipe_path, checkpoint, *rest, "--output", output)
            assert f"--output {output} would replace the checkpoint read ({file})" in err
        assert file.read_bytes() == before

    def test_a_missing_checkpoint_creates_no_output_folder(
        self, recipe_path: Path, tmp_path: Path, capsys: Any
    ) -> None:
        out = tmp_path / "out"
        err = fails(
            capsys, "relane", recipe_path, tmp_path / "nope", "--num-lanes", 8, "--output", out
        )
        assert f"no checkpoint at {tmp_path / 'nope'}" in err
        assert not out.exists()

    @pytest.mark.parametrize("command", ["relane", "amend"])
    def test_a_refused_change_creates_no_output_folder(
        self, command: str, recipe_path: Path, tmp_path: Path, capsys: Any
    ) -> None:
        """The folders of ``--output`` were made before the change was refused: a new user
        found an empty ``out/relaned`` and took it for the result."""
        saved_state(recipe_path, tmp_path / "ckpt")
        other = tmp_path / "other.toml"  # another seed: the checkpoint's recipe differs
        other.write_text(recipe_path.read_text().replace("seed = ", "seed = 1"))
        out = tmp_path / "out" / "changed"
        rest = ["--num-lanes", "8"] if command == "relane" else [other]
        fails(capsys, command, other, tmp_path / "ckpt", *rest, "--output", out)  # refused
        assert not (tmp_path / "out").exists()

    def test_an_output_under_a_file_is_still_refused_first(
        self, recipe_path: Path, tmp_path: Path, capsys: Any
    ) -> None:
        saved_state(recipe_path, tmp_path / "ckpt")
        (tmp_path / "f").write_text("x")
        out = tmp_path / "f" / "changed"
        err = fails(
            capsys, "relane", recipe_path, tmp_path / "ckpt", "--num-lanes", 8, "--output", out
        )
        assert f"checkpoint directory {out} is not writable" in err, err


class TestDigestDumpDamagedFile:
    @pytest.fixture
    def dump(self, recipe_path: Path, tmp_path: Path, capsys: Any) -> Path:
        folder = tmp_path / "dump"
        argv = ["digest", str(recipe_path), "--steps", "2", "--dump-batches", str(folder)]
        assert cli.main(argv) == 0
        capsys.readouterr()
        return folder

    @pytest.mark.parametrize(
        ("case", "problem"),
        [
            ("empty", "cannot read batch dump"),  # was EOFError
            ("truncated", "cannot read batch dump"),  # was zipfile.BadZipFile
            ("no-lane-field", "expected a 'lane' field of one integer per row"),  # KeyError
            ("short-field", "field 'labels' has 1 rows, 'lane' has 8"),
        ],
    )
    def test_one_line_naming_the_file(
        self, case: str, problem: str, dump: Path, capsys: Any
    ) -> None:
        step = dump / "step-00000002.npz"
        data = step.read_bytes()
        if case == "empty":
            step.write_bytes(b"")
        elif case == "truncated":
            step.write_bytes(data[:100])
        else:
            with np.load(step) as f:
                fields = {k: f[k] for k in f.files}
            if case == "no-lane-field":
                del fields["lane"]
            else:
                fields["labels"] = fields["labels"][:1]
            with open(step, "wb") as out:
                np.savez(out, **fields)
        err = fails(capsys, "digest-dump", dump)
        assert f"{step}: " in err and problem in err, err


class TestVerifyRefusesBeforeRunning:
    """What failed only after the whole matrix (minutes to hours) fails before the reference."""

    @pytest.mark.parametrize(
        ("flags", "problem"),
        [
            (["--report", "/nonexistent-zephon-folder/r.html"], "folder /nonexistent-zephon-"),
            (["--report", "FOLDER"], "expected a .html or .png file name"),
            (["--workers", "-1"], "--num-workers=-1 must be an integer in [0, 1024]"),
            (["--checkpoint-step", "0"], "checkpoint step 0 must be in [1, 2)"),
        ],
    )
    def test_one_line_and_no_setting_run(
        self, flags: list[str], problem: str, recipe_path: Path, tmp_path: Path, capsys: Any
    ) -> None:
        folder = tmp_path / "a.html"
        folder.mkdir()
        flags = [str(folder) if f == "FOLDER" else f for f in flags]
        err = fails(capsys, "verify", recipe_path, "--steps", 2, "--dp", 1, *flags)
        assert problem in err, err  # and fails() checked it is the only line: no [reference]


class TestIndexOutput:
    @pytest.mark.parametrize("case", ["under-a-file", "a-folder"])
    def test_refused_before_any_shard_is_read(
        self, case: str, recipe_path: Path, tmp_path: Path, capsys: Any
    ) -> None:
        """The shards were all read (an hour over a large bucket) before the write failed."""
        shard = recipe_path.parent / "data.jsonl"
        output = shard / "i.json" if case == "under-a-file" else tmp_path
        err = fails(capsys, "index", shard, "--output", output)
        assert "indexing shards" not in err  # the one line is the refusal, no progress
        want = f"{shard} is not a folder" if case == "under-a-file" else "is a folder"
        assert f"--output {output}: {want}" in err, err


class TestDigestFlagsNamedInErrors:
    def test_cache_limit_zero_names_the_flag(self, recipe_path: Path, capsys: Any) -> None:
        """It named the Settings field (``Settings.cache_limit=0``), not the user's flag."""
        err = fails(capsys, "digest", recipe_path, "--steps", 1, "--cache-limit", "0")
        assert "error: --cache-limit=0 must be an integer in [1, 2**62]" in err, err

    def test_dump_folder_that_cannot_be_made_names_the_flag(
        self, recipe_path: Path, capsys: Any
    ) -> None:
        """It was '<path>: Not a directory', status 1, from the first step's write."""
        folder = recipe_path / "dump"  # under a file
        err = fails(capsys, "digest", recipe_path, "--steps", 1, "--dump-batches", folder)
        assert f"--dump-batches {folder}: cannot make the dump folder: Not a directory" in err


def test_lanes_checkpoint_without_a_global_batch_asks_for_the_flag(
    recipe_path: Path, tmp_path: Path, capsys: Any
) -> None:
    """It said '--dp and --global-batch are required (or give --checkpoint)' to a user who
    gave --checkpoint."""
    base = saved_state(recipe_path, tmp_path / "good")
    ckpt = variant(base, tmp_path / "bare", lambda s: s.pop("recipe"))
    status = cli.main(["lanes", "--checkpoint", str(ckpt), "--dp", "2"])
    out, err = capsys.readouterr()
    assert status == 2 and out.startswith(f"checkpoint {ckpt}: num_lanes=4"), out
    assert f"--global-batch is required: checkpoint {ckpt} records no global batch size" in err


@pytest.mark.parametrize("value", ["inf", "1e-300"])
def test_explain_tokens_per_s_out_of_range(value: str, recipe_path: Path, capsys: Any) -> None:
    """inf printed '~0.0 s at inf Mtok/s'; 1e-300 a first-batch time of 300 digits."""
    err = fails(capsys, "explain", recipe_path, "--tokens-per-s", value)
    assert f"--tokens-per-s={float(value)} must be a number in [1, 1e12]" in err


def test_version(capsys: Any) -> None:
    """``zephon --version`` said 'the following arguments are required: COMMAND'."""
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"zephon-nodes {__version__}\n"


class TestIndexOfWhatIsNoShard:
    def test_a_recipe_given_as_a_shard_is_refused(self, recipe_path: Path, capsys: Any) -> None:
        """``zephon index recipe.toml`` indexed the recipe as 3+ JSON lines records (exit 0)."""
        err = fails(capsys, "index", recipe_path)
        assert f"{recipe_path}: record 1 is not a JSON object" in err, err
        assert "not a recipe" in err, err
        assert not (recipe_path.parent / "zephon-index.json").exists()

    @pytest.mark.parametrize("name", ["notes.txt", "notes.txt.zst"])
    def test_json_lines_under_another_name_are_indexed(
        self, name: str, tmp_path: Path, capsys: Any
    ) -> None:
        """Any name is read as JSON lines (the default kind): a text of JSON lines still is."""
        lines = "".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(5)).encode()
        if name.endswith(".zst"):
            lines = zstandard.ZstdCompressor().compress(lines)
        (tmp_path / name).write_bytes(lines)
        assert cli.main(["index", str(tmp_path / name), "--quiet"]) == 0
        assert "1 shard(s), 5 records" in capsys.readouterr().out

    def test_a_text_file_is_refused_in_a_compressed_shard_too(
        self, tmp_path: Path, capsys: Any
    ) -> None:
        shard = tmp_path / "notes.txt.zst"
        shard.write_bytes(zstandard.ZstdCompressor().compress(b"just some notes\nmore\n"))
        err = fails(capsys, "index", shard)
        assert f"{shard}: record 1 is not a JSON object (b'just some notes')" in err, err
