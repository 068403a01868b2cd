"""Walk-throughs run the way a user types them: shell lines through bash, no helper fixing them.

- docs/tokenizers.md makes a corpus, a sentencepiece model and a chat ``tokenizer.json``; the
  TOML recipe of docs/sft.md, saved as the page says, then runs with the page's commands.
- The README's quick start is exactly two commands, each a target of the Makefile.
- The TorchTitan walk-through (examples/torchtitan/README.md, docs/torchtitan.md): the asset
  and digest steps run as typed; the ``torchrun`` lines are parsed as TorchTitan parses them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.docs.test_docs import DOCS, blocks

REPO = DOCS.parent


def _shell_lines(page: Path) -> list[str]:
    return [
        line[2:]
        for block in blocks(page, "console")
        for line in block.splitlines()
        if line.startswith("$ ")
    ]


def _typed(line: str, cwd: Path, *flags: str) -> str:
    """Run ``line`` with bash as a user types it; its stdout (a failure names the line)."""
    done = subprocess.run(
        ["bash", *flags, line],
        cwd=cwd,
        env=_user_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"$ {line}\n{done.stderr}"
    return done.stdout


def _user_env() -> dict[str, str]:
    """The environment of a user whose virtualenv is active (``zephon`` on the PATH)."""
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    env["PYTHONPATH"] = str(REPO)  # this checkout, as an editable install would give
    return env


def test_sft_recipe_runs_as_written_with_the_tokenizer_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert shutil.which("zephon", path=_user_env()["PATH"]), "zephon is not installed"
    monkeypatch.chdir(tmp_path)
    page = DOCS / "tokenizers.md"
    module = types.ModuleType("docs_tokenizers_walkthrough")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for i, code in enumerate(blocks(page, "python", runnable=True)):
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, f"tokenizers.md[python block {i}]", "exec"), module.__dict__)
    # "saved as text.toml in this folder": the page's own text recipe, verbatim (issue 36.4:
    # it pointed at the plain-text corpus.txt and failed with `invalid JSON`).
    (tmp_path / "text.toml").write_text(blocks(page, "toml")[0])
    # "save it as sft.toml in this folder": the first TOML block of the chat page, verbatim.
    (tmp_path / "sft.toml").write_text(blocks(DOCS / "sft.md", "toml")[0])
    lines = _shell_lines(page)
    assert lines == [
        "zephon digest text.toml --steps 4",
        "zephon digest sft.toml --steps 4",
        "zephon stats sft.toml --steps 4",
    ]
    outs = []
    for line in lines:
        outs.append(_typed(line, tmp_path, "-c"))
    for out in outs[:2]:
        digests = [ln for ln in out.splitlines() if ln.startswith('{"step"')]
        assert [int(re.search(r'"step": (\d+)', d).group(1)) for d in digests] == [1, 2, 3, 4]
    trained, non_padding = map(
        int, re.search(r"(\d+) trained tokens \((\d+) non-padding\)", outs[2]).groups()
    )
    # Labels are on assistant turns only: fewer trained tokens than input tokens.
    assert 0 < trained < non_padding


def test_readme_quick_start_is_two_make_targets() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1)
    commands = [ln.split("#")[0].strip() for ln in block.splitlines() if ln.strip()]
    assert commands == ["make demo", "make test"]
    makefile = (REPO / "Makefile").read_text()
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), target


def test_changing_recipes_worked_example_runs_as_written(tmp_path: Path) -> None:
    """docs/changing-recipes.md: the planned and the amended run give the same batches."""
    from zephon_nodes.commands.demo import prepare_default

    for name in ("stages", "default"):
        shutil.copytree(REPO / "examples" / name, tmp_path / "examples" / name)
    prepare_default(tmp_path / "examples" / "default" / "recipe.toml")
    page = DOCS / "changing-recipes.md"
    block = next(b for b in blocks(page, "console") if "$ cd examples/stages" in b)
    lines = [ln[2:] for ln in block.splitlines() if ln.startswith("$ ")]
    assert lines[-1].endswith("&& echo identical")
    done = subprocess.run(
        ["bash", "-e", "-c", "\n".join(lines)],
        cwd=tmp_path,
        env=_user_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "identical"
    assert "dropped by the run's changes so far" in done.stdout
    amended = (tmp_path / "examples" / "stages" / "amended.jsonl").read_text().splitlines()
    assert len(amended) == 10


def _bash_commands(block: str) -> list[str]:
    """The commands of a ``bash`` block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [ln.split(" #")[0].strip() for ln in joined.splitlines() if ln.strip() and ln[0] != "#"]


def _argv(command: str, cwd: Path) -> list[str]:
    """The arguments bash hands the command's program (quotes and ``$PWD`` expanded)."""
    rest = command.split(" ", 1)[1]
    done = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {rest}"], cwd=cwd, capture_output=True, check=True
    )
    return done.stdout.decode().split("\0")[:-1]


def _trainer_args(argv: list[str], launcher: str) -> list[str]:
    """The Trainer's own arguments of a ``torchrun ... -m LAUNCHER ...`` command line."""
    at = argv.index("-m")
    assert argv[at + 1] == launcher, argv
    return argv[at + 2 :]


def test_torchtitan_walkthrough_commands_as_written(tmp_path: Path) -> None:
    """examples/torchtitan/README.md's steps and docs/torchtitan.md's commands, as typed.

    Runs step 1 (the assets) and the ``zephon digest`` line of step 4 through bash in a
    fresh folder, and parses every ``torchrun`` line's Trainer options exactly as TorchTitan
    does (and as the launcher's path check does) without training: the Trainer jobs take
    minutes each and are run by ``tests/examples/test_torchtitan_walkthrough.py`` through
    ``run.py``. The ``digest-dump`` lines need those jobs' batches and are not run here.
    """
    pytest.importorskip("torchtitan")
    from zephon_nodes.integrations.torchtitan import API
    from zephon_nodes.integrations.torchtitan.train import check_paths

    if API != "0.3":
        pytest.skip("the walk-through's step-by-step options are TorchTitan 0.3.0's")
    from torchtitan.config import ConfigManager, apply_overrides

    from zephon_nodes import Recipe

    shutil.copytree(REPO / "examples" / "torchtitan", tmp_path / "examples" / "torchtitan")
    readme = (REPO / "examples" / "torchtitan" / "README.md").read_text()
    section = readme.split("The steps one by one", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1)
    commands = _bash_commands(block)
    assert [c.split()[0] for c in commands] == [
        "python", "torchrun", "torchrun", "torchrun",
        "zephon", "zephon", "zephon", "zephon", "diff", "tail", "tail",
    ]  # fmt: skip

    def shell(line: str) -> str:
        return _typed(line, tmp_path, "-e", "-c")

    shell(commands[0])  # 1. make_assets.py "$PWD/work/"
    work = tmp_path / "work"
    recipe = Recipe.from_toml(work / "recipe.toml")

    folders = []
    for line in commands[1:4]:  # 2. train on 2 ranks; 3. resume on 4, then on 1
        argv = _argv(line, tmp_path)
        args = _trainer_args(argv, "zephon_nodes.integrations.torchtitan.train")
        assert check_paths(args) is None, line
        config = ConfigManager().parse_args(args)
        apply_overrides(config.override, config)  # as the Trainer does, before any build
        assert Path(config.dataloader.recipe) == work / "recipe.toml"
        assert (Path(config.hf_assets_path) / "tokenizer.json").is_file()
        assert config.training.seq_len == recipe.seq_len
        assert config.training.global_batch_size == recipe.global_batch_size
        assert config.checkpoint.interval == 3 and config.training.steps == 6
        dp = argv[argv.index("--nproc-per-node") + 1]
        folders.append((dp, config.dump_folder, config.dataloader.dump_batches))
        if line is not commands[1]:
            assert config.checkpoint.initial_load_path == str(work / "runs/dp2/checkpoint/step-3")
    # Each job its own folders: a dump folder holding a checkpoint would be resumed instead.
    assert folders == [
        (dp, str(work / "runs" / f"dp{dp}"), str(work / "batches" / f"dp{dp}"))
        for dp in ("2", "4", "1")
    ]

    shell(commands[4])  # 4. zephon digest "$PWD/work/recipe.toml" --steps 6 > expected.jsonl
    expected = (work / "expected.jsonl").read_text().splitlines()
    assert [json.loads(ln)["step"] for ln in expected] == [1, 2, 3, 4, 5, 6]

    # docs/torchtitan.md: the hf_assets command gives the folder make_assets.py wrote.
    page = (DOCS / "torchtitan.md").read_text()
    hf_line = next(
        c
        for b in blocks(DOCS / "torchtitan.md", "bash")
        for c in _bash_commands(b)
        if "hf_assets " in c
    )
    (tmp_path / "mine").mkdir()
    shutil.copy(work / "tok.model", tmp_path / "mine" / hf_line.split()[3])
    subprocess.run(["bash", "-c", hf_line], cwd=tmp_path / "mine", env=_user_env(), check=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "mine" / "hf_assets" / name).read_bytes() == (
            work / "hf_assets" / name
        ).read_bytes(), name

    # docs/torchtitan.md's 0.3.0 job commands parse as typed (main's only under main).
    jobs = [
        c
        for b in blocks(DOCS / "torchtitan.md", "bash")
        for c in _bash_commands(b)
        if c.startswith("torchrun") and "max-context-length" not in c
    ]
    assert len(jobs) == 2 and "## Running a job" in page
    for line in jobs:
        args = _trainer_args(_argv(line, tmp_path), "torchtitan.train")
        assert check_paths(args) is None, line
        config = ConfigManager().parse_args(args)
        assert config.training.seq_len == 2048 and config.training.global_batch_size == 32
