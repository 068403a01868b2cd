"""Every bad setting is refused up front with a library error naming it, the value and the range.

Table-driven: each numeric recipe key with a wrong type, zero, a negative value, NaN, an
infinity and an absurd size; the cases of issue 14; the CLI (exit 2, one line on stderr, no
traceback) and the Python API.
"""

from __future__ import annotations

import copy
import math
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.commands.run import zephon_process
from tests.fault.common import INLINE, memory_pipeline, write_jsonl
from zephon_nodes import Pipeline, Recipe, RecipeError, WorkerPool, ZephonError, simulate
from zephon_nodes.cli import main
from zephon_nodes.engine.pipeline import lanes_for_rank
from zephon_nodes.recipe.bounds import SETTINGS, check_setting, did_you_mean

BASE_TOML = """\
seed = 3
num_lanes = 2
global_batch_size = 4
seq_len = 16
flush_every = 2
[tokenizer]
kind = "bytes"
[[datasets]]
name = "d"
paths = ["data/*.jsonl"]
weight = 1.0
chunk_size = 4
[work]
chunk_size = 5
epochs = 1
[shuffle]
buffer_size = 4
[pack]
mode = "bestfit"
pad_id = 0
bins = 4
[mixture]
estimate_records = 8
"""
BASE = tomllib.loads(BASE_TOML)

# (path into the TOML, smallest valid value); the range is SETTINGS[<table>.<key>].
KEYS = [
    (("seed",), 0),
    (("num_lanes",), 1),
    (("global_batch_size",), 1),
    (("seq_len",), 1),
    (("flush_every",), 1),
    (("work", "chunk_size"), 1),
    (("work", "epochs"), 1),
    (("datasets", 0, "weight"), None),
    (("datasets", 0, "chunk_size"), 1),
    (("shuffle", "buffer_size"), 0),
    (("pack", "pad_id"), 0),
    (("pack", "bins"), 1),
    (("mixture", "estimate_records"), 1),
]


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    node: Any = data
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return data


def _name(path: tuple[Any, ...]) -> str:
    return ".".join(str(k) for k in path if not isinstance(k, int))


def _bad_values(path: tuple[Any, ...], lowest: int | None) -> list[Any]:
    bound = SETTINGS[_name(path)]
    absurd = int(bound.hi) + 1 if bound.kind is int else 1e300
    out: list[Any] = ["12", True, [1], math.nan, math.inf, -math.inf, -1, absurd]
    if lowest is not None and lowest >= 1:
        out.append(0)
    if bound.kind is int:
        out.append(2.0)
    else:
        out.append(0.0)
    return out


CASES = [
    pytest.param(path, value, id=f"{_name(path)}={value!r}")
    for path, lowest in KEYS
    for value in _bad_values(path, lowest)
]


class TestRecipeKeys:
    """Each numeric recipe key x wrong type / zero / negative / NaN / inf / absurd."""

    def test_base_recipe_is_valid(self) -> None:
        """Control: the unmodified table parses."""
        assert Recipe.from_dict(BASE).seq_len == 16

    @pytest.mark.parametrize(("path", "value"), CASES)
    def test_refused_naming_key_value_and_range(self, path: tuple[Any, ...], value: Any) -> None:
        """RecipeError naming the dotted key and the value; a range for out-of-range numbers."""
        with pytest.raises(RecipeError) as info:
            Recipe.from_dict(_with(path, value))
        msg = str(info.value)
        key = path[-1]
        assert f".{key}=" in msg or msg.startswith(f"{key}=") or f"{key}={value!r}" in msg, msg
        assert repr(value) in msg
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert "must be" in msg

    @pytest.mark.parametrize(("path", "lowest"), KEYS, ids=[_name(p) for p, _ in KEYS])
    def test_bounds_themselves_are_accepted(self, path: tuple[Any, ...], lowest: Any) -> None:
        """Control: the smallest and the largest allowed values pass."""
        bound = SETTINGS[_name(path)]
        hi = bound.hi if bound.kind is float else int(bound.hi)
        data = _with(path, hi)
        if path[0] in ("num_lanes", "global_batch_size"):  # G must stay a multiple of L
            data["global_batch_size"] = hi if path[0] == "num_lanes" else 2 * int(bound.hi // 2)
        Recipe.from_dict(data)
        if lowest is not None:
            data = _with(path, lowest)
            if path[0] in ("num_lanes", "global_batch_size"):
                data["num_lanes"] = data["global_batch_size"] = 1
            Recipe.from_dict(data)

    @pytest.mark.parametrize(
        ("table", "key", "hint"),
        [
            (("datasets", 0), "path", "paths"),
            ((), "seqlen", "seq_len"),
            ((), "num_lane", "num_lanes"),
            (("work",), "epoch", "epochs"),
            (("shuffle",), "buffersize", "buffer_size"),
            (("pack",), "padid", "pad_id"),
        ],
    )
    def test_unknown_key_names_the_closest(self, table: tuple[Any, ...], key: str, hint: str):
        """``path =`` instead of ``paths =``: the message names both."""
        data = copy.deepcopy(BASE)
        node: Any = data
        for k in table:
            node = node[k]
        node[key] = 1
        with pytest.raises(
            RecipeError, match=rf"unknown key\(s\) \['{key}'\] \(did you mean `{hint}`"
        ):
            Recipe.from_dict(data)


def _recipe_dir(tmp_path: Path, toml: str = BASE_TOML, docs: int = 40) -> Path:
    write_jsonl(tmp_path / "data" / "a.jsonl", [f"document {i} " * 3 for i in range(docs)])
    path = tmp_path / "r.toml"
    path.write_text(toml)
    return path


class TestIssueCases:
    """The settings of issue 14 that crashed, hung or were silently accepted."""

    def test_huge_seq_len(self) -> None:
        """``seq_len = 100000000000`` used to die with a numpy MemoryError."""
        with pytest.raises(RecipeError, match=r"seq_len=100000000000 must be an integer in \[1"):
            Recipe.from_dict(_with(("seq_len",), 100_000_000_000))

    def test_infinite_weight(self) -> None:
        """``weight = inf`` used to give NaN shares (Python API too)."""
        with pytest.raises(RecipeError, match=r"weight=inf must be a finite number"):
            Recipe.from_dict(_with(("datasets", 0, "weight"), math.inf))
        from zephon_nodes import DatasetSpec

        with pytest.raises(RecipeError, match=r"dataset 'x': weight=nan must be"):
            DatasetSpec("x", records=({"text": "a"},), weight=math.nan)

    @pytest.mark.parametrize("pad_id", [-5, 10**17, 259])
    def test_pad_id_outside_the_vocabulary(self, tmp_path: Path, pad_id: int) -> None:
        """``pad_id = -5`` or ``1e17`` (and 259 for the 259-id byte tokenizer) are refused."""
        path = _recipe_dir(tmp_path, BASE_TOML.replace("pad_id = 0", f"pad_id = {pad_id}"))
        with pytest.raises(RecipeError, match=rf"pack.pad_id={pad_id} must be an integer in"):
            Pipeline(Recipe.from_toml(path))

    def test_float_pad_id(self) -> None:
        """``pad_id = 1e17`` written as a float is a wrong type."""
        with pytest.raises(RecipeError, match=r"pack.pad_id=1e\+17 must be int, got float"):
            Recipe.from_dict(_with(("pack", "pad_id"), 1e17))

    def test_a_million_lanes(self) -> None:
        """``num_lanes = 1000000`` used to run 61 s and 3.4 GB for zero batches."""
        with pytest.raises(RecipeError, match=r"num_lanes=1000000 must be an integer in \[1, 2"):
            Recipe.from_dict(_with(("num_lanes",), 1_000_000))

    def test_more_lanes_than_work_items(self, tmp_path: Path) -> None:
        """A recipe whose last lane gets no work item can produce no batch: an error."""
        toml = BASE_TOML.replace("num_lanes = 2", "num_lanes = 64").replace(
            "global_batch_size = 4", "global_batch_size = 64"
        )
        pipeline = Pipeline(Recipe.from_toml(_recipe_dir(tmp_path, toml, docs=20)))
        with pytest.raises(RecipeError, match=r"lane 63 gets none, so the recipe can produce no"):
            pipeline.check_produces()

    def test_all_files_empty(self, tmp_path: Path) -> None:
        """Every file empty: no records, an error (not exit 0 with zero batches)."""
        path = _recipe_dir(tmp_path)
        (tmp_path / "data" / "a.jsonl").write_bytes(b"")
        with pytest.raises(RecipeError, match="hold no records, so it can produce no batch"):
            Pipeline(Recipe.from_toml(path))

    def test_rank_out_of_range_is_a_library_error(self) -> None:
        """``dp_rank >= dp_world_size`` used to raise a plain ValueError."""
        with pytest.raises(RecipeError, match=r"dp_rank=2 must be an integer in \[0, dp_world"):
            lanes_for_rank(4, 2, 2)

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"dp_world_size": 0}, r"dp_world_size=0 must be an integer in \[1, "),
            ({"dp_world_size": -1}, r"dp_world_size=-1 must be"),
            ({"dp_world_size": 2.0}, r"dp_world_size=2.0 must be an integer .* got float"),
            ({"dp_world_size": 2, "dp_rank": 5}, r"dp_rank=5 must be an integer in \[0, dp"),
            ({"local_batch_size": 0}, r"local_batch_size=0 must be an integer in \[1, "),
            ({"local_batch_size": -4}, r"local_batch_size=-4 must be"),
            ({"local_batch_size": 2.0}, r"local_batch_size=2.0 must be an integer"),
            ({"lanes": [0, 0]}, r"lanes=\[0, 0\] must be distinct integers in \[0, 4\)"),
            ({"lanes": [0, 4]}, r"lanes=\[0, 4\] must be distinct integers"),
            ({"lanes": [0.0]}, r"lanes=\[0.0\] must be distinct integers"),
            ({"lookahead": 0}, r"lookahead=0 must be an integer in \[1, "),
        ],
    )
    def test_rank_node_settings(self, kwargs: dict[str, Any], match: str) -> None:
        """Physical settings of the Python API, refused before any lane is built."""
        with pytest.raises(RecipeError, match=match):
            PIPE.rank_node(pool=INLINE, **kwargs)

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"dp_world_size": 0, "steps": 1}, r"dp_world_size=0 must be"),
            ({"dp_world_size": 1, "steps": -1}, r"steps=-1 must be an integer in \[0, "),
            ({"dp_world_size": 1, "steps": 1, "save_at": 0}, r"save_at=0 must be an integer"),
            ({"dp_world_size": 1, "steps": 1, "num_workers": -1}, r"num_workers=-1 must be"),
        ],
    )
    def test_simulate_settings(self, kwargs: dict[str, Any], match: str) -> None:
        """simulate() checks its arguments before building ranks."""
        with pytest.raises(RecipeError, match=match):
            list(simulate(PIPE, **kwargs))

    def test_worker_pool_settings(self) -> None:
        """WorkerPool refuses a negative or absurd worker count and a non-finite timeout."""
        for bad in (-1, 10**6, 1.5):
            with pytest.raises(RecipeError, match="num_workers="):
                WorkerPool(bad)  # type: ignore[arg-type]
        with pytest.raises(RecipeError, match="timeout_s=inf"):
            WorkerPool(1, timeout_s=math.inf)


PIPE = memory_pipeline()


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        status = main(argv)
    except SystemExit as e:  # argparse errors
        status = int(e.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


class TestCli:
    """``zephon ...``: exit 2 and exactly one line on stderr, for every bad setting."""

    @pytest.mark.parametrize(
        ("flags", "match"),
        [
            (["--dp-world-size", "0"], "--dp-world-size=0 must be an integer in [1, "),
            (["--dp-world-size", "-1"], "--dp-world-size=-1 must be"),
            (["--local-batch-size", "-4"], "--local-batch-size=-4 must be"),
            (["--local-batch-size", "-1"], "--local-batch-size=-1 must be"),
            (["--local-batch-size", "0"], "--local-batch-size=0 must be"),
            (["--local-batch-size", "2.0"], "argument --local-batch-size: invalid int value"),
            (["--steps", "-1"], "--steps=-1 must be"),
            (["--num-workers", "-2"], "--num-workers=-2 must be"),
            (["--save-at", "0", "--checkpoint-dir", "CK"], "--save-at=0 must be"),
            (["--save-at", "-1", "--checkpoint-dir", "CK"], "--save-at=-1 must be"),
            (["--save-at", "99", "--checkpoint-dir", "CK"], "--save-at=99 must be a step this"),
            (["--save-at", "4", "--checkpoint-dir", "FILE/ck"], "is not writable"),
            (["--resume-from", "CK"], "no checkpoint state at"),
        ],
    )
    def test_digest_flags(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], match: str
    ) -> None:
        """Refused before any digest line is printed."""
        recipe = _recipe_dir(tmp_path)
        (tmp_path / "FILE").write_text("a file, not a directory")
        flags = [f.replace("CK", str(tmp_path / "ck")).replace("FILE", str(tmp_path / "FILE"))
                 for f in flags]  # fmt: skip
        status, out, err = _cli(["digest", str(recipe), "--steps", "6", *flags], capsys)
        assert status == 2 and out == ""
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert match in err

    @pytest.mark.parametrize(
        ("old", "new", "match"),
        [
            ("seq_len = 16", "seq_len = 100000000000", "seq_len=100000000000 must be"),
            ("weight = 1.0", "weight = inf", "weight=inf must be a finite number"),
            ('paths = ["data/*.jsonl"]', 'path = "data/*.jsonl"', "did you mean `paths`?"),
            ("pad_id = 0", "pad_id = -5", "pad_id=-5 must be"),
            ("pad_id = 0", "pad_id = 1e17", "pad_id=1e+17 must be int"),
            ("num_lanes = 2", "num_lanes = 1000000", "num_lanes=1000000 must be"),
            ("epochs = 1", "epochs = nan", "work.epochs=nan must be int or str, got float"),
        ],
    )
    def test_recipe_values(
        self,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
        old: str,
        new: str,
        match: str,
    ) -> None:
        """Bad recipe values through the CLI: one line naming the key."""
        recipe = _recipe_dir(tmp_path, BASE_TOML.replace(old, new))
        status, out, err = _cli(["digest", str(recipe), "--steps", "2"], capsys)
        assert status == 2 and out == ""
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert match in err

    def test_no_batch_is_exit_2(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """More lanes than work items: exit 2 before any lane is built."""
        toml = BASE_TOML.replace("num_lanes = 2", "num_lanes = 64").replace(
            "global_batch_size = 4", "global_batch_size = 64"
        )
        recipe = _recipe_dir(tmp_path, toml, docs=20)
        status, out, err = _cli(["digest", str(recipe), "--steps", "2"], capsys)
        assert status == 2 and out == "" and "can produce no global batch" in err

    def test_save_at_beyond_the_end_of_the_data(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``--save-at`` inside --steps but after the data ends: exit 2, nothing saved."""
        recipe = _recipe_dir(tmp_path, docs=12)
        ck = tmp_path / "ck"
        argv = ["digest", str(recipe), "--steps", "50", "--save-at", "40"]
        status, out, err = _cli([*argv, "--checkpoint-dir", str(ck)], capsys)
        assert status == 2
        assert "before --save-at=40: no state was saved" in err
        assert not (ck / "zephon_state.json").exists()
        assert len(out.splitlines()) >= 1  # the steps that exist were printed

    def test_lanes_dp_zero(self, capsys: pytest.CaptureFixture[str]) -> None:
        """``zephon lanes --dp 0,8``: the dp size is named."""
        status, _, err = _cli(["lanes", "--dp", "0,8", "--global-batch", "64"], capsys)
        assert status == 2 and "--dp=0 must be an integer in [1, " in err

    def test_real_process_has_no_traceback(self, tmp_path: Path) -> None:
        """The installed entry point: exit 2, one line, no traceback (a real subprocess)."""
        recipe = _recipe_dir(tmp_path)
        proc = zephon_process("digest", recipe, "--steps", 2, "--dp-world-size", -1, timeout=120)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert "--dp-world-size=-1 must be an integer in [1, " in proc.stderr


class TestTable:
    """The mechanism other settings plug into."""

    def test_every_row_is_consistent(self) -> None:
        """lo <= hi, kinds are int or float, and each row refuses NaN and its own hi + 1."""
        for name, bound in SETTINGS.items():
            assert bound.kind in (int, float) and bound.lo <= bound.hi, name
            with pytest.raises(RecipeError, match=name.split(".")[-1]):
                check_setting(name, math.nan)
            with pytest.raises(RecipeError):
                check_setting(name, int(bound.hi) + 1)

    def test_did_you_mean(self) -> None:
        """Closest known key, or nothing when none is close."""
        assert did_you_mean("path", ["paths", "name"]) == " (did you mean `paths`?)"
        assert did_you_mean("zzz", ["paths", "name"]) == ""

    def test_unknown_names_pass_through(self) -> None:
        """A name with no row is not checked (a string flag, say)."""
        assert check_setting("--runner", "thread") == "thread"

    def test_errors_are_library_errors(self) -> None:
        """RecipeError is a ZephonError: the CLI turns it into exit 2."""
        with pytest.raises(ZephonError):
            check_setting("seq_len", 0)
