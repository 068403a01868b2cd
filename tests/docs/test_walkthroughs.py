"""Walk-throughs run the way a user types them: shell lines through bash, no helper fixing them.

- docs/tokenizers.md makes a corpus, a sentencepiece model and a chat ``tokenizer.json``; the
  TOML recipe of docs/sft.md, saved as the page says, then runs with the page's commands.
- The README's quick start is exactly two commands, each a target of the Makefile.
"""

from __future__ import annotations

import contextlib
import io
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
    # "save it as sft.toml in this folder": the first TOML block of the chat page, verbatim.
    (tmp_path / "sft.toml").write_text(blocks(DOCS / "sft.md", "toml")[0])
    lines = _shell_lines(page)
    assert lines == ["zephon digest sft.toml --steps 4", "zephon stats sft.toml --steps 4"]
    outs = []
    for line in lines:
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=tmp_path,
            env=_user_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"$ {line}\n{done.stderr}"
        outs.append(done.stdout)
    digests = [ln for ln in outs[0].splitlines() if ln.startswith('{"step"')]
    assert [int(re.search(r'"step": (\d+)', d).group(1)) for d in digests] == [1, 2, 3, 4]
    trained, non_padding = map(
        int, re.search(r"(\d+) trained tokens \((\d+) non-padding\)", outs[1]).groups()
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
