"""Every code block in docs/ is executed or checked here, so the docs cannot rot.

- ``python`` blocks run in order, one shared namespace per page, in a fresh temporary
  working directory (a page's blocks build on each other, like a notebook); a block whose
  fence reads ```` ```python no-run ```` (it needs a cluster, a GPU or a real job) is only
  compiled;
- ``toml`` blocks must parse, and run: a recipe gives its first global batch on files of the
  formats it names (``tests/docs/toml_inputs.py`` makes those the page does not), a fragment
  inside a small recipe; the few run by a walk-through or on a server instead are listed in
  ``TOML_RUN_ELSEWHERE`` with the test that runs them;
- ``console`` blocks: each ``$ zephon ...`` line must parse with the real argument parser;
- relative links between pages must point at existing files.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex
import signal
import sys
import tomllib
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
PAGES = sorted(DOCS.glob("*.md"))
BLOCK_TIMEOUT_S = 120


def blocks(page: Path, lang: str, *, runnable: bool | None = None) -> list[str]:
    """Code of the page's ``lang`` blocks; ``runnable`` selects on the ``no-run`` marker."""
    out = []
    for m in FENCE.finditer(page.read_text()):
        if m.group(1) != lang:
            continue
        no_run = "no-run" in m.group(2).split()
        if runnable is None or runnable != no_run:
            out.append(m.group(3))
    return out


@contextlib.contextmanager
def alarm(seconds: int) -> Iterator[None]:
    def fail(*_: object) -> None:
        raise TimeoutError(f"a docs code block ran longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_there_are_pages_with_code() -> None:
    assert len(PAGES) >= 8
    assert sum(len(blocks(p, "python")) for p in PAGES) >= 10


@pytest.mark.parametrize(
    "page", [p for p in PAGES if blocks(p, "python", runnable=True)], ids=lambda p: p.name
)
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # A real module, so that dataclasses and pickling find the page's classes.
    module = types.ModuleType(f"docs_{page.stem.replace('-', '_')}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    for i, code in enumerate(blocks(page, "python", runnable=True)):
        with alarm(BLOCK_TIMEOUT_S), contextlib.redirect_stdout(io.StringIO()):
            try:
                exec(compile(code, f"{page.name}[python block {i}]", "exec"), namespace)
            except Exception as e:
                raise AssertionError(f"{page.name}: python block {i} failed: {e!r}") from e


def test_no_run_python_blocks_compile() -> None:
    """Blocks marked ``python no-run`` (they need a cluster or a GPU) must still compile."""
    for page in PAGES:
        for i, code in enumerate(blocks(page, "python", runnable=False)):
            compile(code, f"{page.name}[no-run python block {i}]", "exec")


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "toml")], ids=lambda p: p.name)
def test_toml_blocks_parse(page: Path, tmp_path: Path) -> None:
    from zephon_nodes import Recipe

    for i, code in enumerate(blocks(page, "toml")):
        data = tomllib.loads(code)
        if "datasets" in data:
            # A recipe: every field must be known and valid (files are only opened later).
            path = tmp_path / f"block{i}.toml"
            path.write_text(code)
            recipe = Recipe.from_toml(path)
            assert recipe.global_batch_size % recipe.num_lanes == 0


# TOML blocks run by another test, on the files their walk-through makes or on a server; each
# names that test (checked to exist). Every other block runs in test_toml_blocks_run.
TOML_RUN_ELSEWHERE = {
    ("tokenizers.md", 0): "tests/docs/test_walkthroughs.py::"
    "test_sft_recipe_runs_as_written_with_the_tokenizer_page",  # as text.toml, the page's files
    ("sft.md", 0): "tests/docs/test_walkthroughs.py::"
    "test_sft_recipe_runs_as_written_with_the_tokenizer_page",  # the tokenizer page's chat files
    ("storage.md", 0): "tests/docs/test_quickstart_object_store.py::"
    "test_quickstart_runs_as_typed",  # names a bucket and a web server: s3:// runs there
    ("pretokenized.md", 0): "tests/io/test_pretokenized_formats.py::"
    "test_mixed_by_tokens_with_jsonl",  # corpora written by their own libraries, and a bucket
}
# A block with only a [tokenizer] table runs between these two halves of a small recipe.
BASE_HEAD = "seed = 7\nnum_lanes = 4\nglobal_batch_size = 8\nseq_len = 64\n\n"
BASE_TAIL = '\n[[datasets]]\nname = "docs"\npaths = ["docs/*.jsonl"]\n'


def toml_blocks() -> list[tuple[Path, int]]:
    return [(p, i) for p in PAGES for i, _ in enumerate(blocks(p, "toml"))]


def test_toml_blocks_run_elsewhere_name_real_tests() -> None:
    for (page, i), where in TOML_RUN_ELSEWHERE.items():
        assert i < len(blocks(DOCS / page, "toml")), (page, i)
        module, name = where.split("::")
        mod = importlib.import_module(module.removesuffix(".py").replace("/", "."))
        assert callable(getattr(mod, name, None)), where


@pytest.mark.parametrize(
    ("page", "index"),
    [b for b in toml_blocks() if (b[0].name, b[1]) not in TOML_RUN_ELSEWHERE],
    ids=lambda v: v.name if isinstance(v, Path) else str(v),
)
def test_toml_blocks_run(page: Path, index: int, tmp_path: Path) -> None:
    """Every TOML block runs: a recipe gives its first global batch at dp 1, on the files the
    page makes or, for those it only names, files of the named format
    (``tests/docs/toml_inputs.py``); a fragment runs inside a small recipe, or (TorchTitan's
    ``[dataloader]`` table) is parsed by the function the adapter reads it with."""
    from tests.docs.toml_inputs import materialize
    from zephon_nodes import Pipeline, Recipe, simulate

    data = tomllib.loads(blocks(page, "toml")[index])
    if "dataloader" in data:  # a TorchTitan job config table (docs/performance.md)
        from zephon_nodes.engine.operator_pools import parse_operator_workers

        assert set(data) == {"dataloader"} and set(data["dataloader"]) == {"operator_workers"}
        assert parse_operator_workers(data["dataloader"]["operator_workers"])
        return
    code = blocks(page, "toml")[index]
    if "datasets" not in data:
        assert set(data) == {"tokenizer"}, f"{page.name}: a TOML fragment this test cannot run"
        code = BASE_HEAD + code + BASE_TAIL
    path = tmp_path / "recipe.toml"
    path.write_text(code)
    materialize(tomllib.loads(code), tmp_path)
    with alarm(BLOCK_TIMEOUT_S):
        recipe = Recipe.from_toml(path)
        results = [r for r, _ in simulate(Pipeline(recipe), 1, 1, num_workers=1)]
    assert [r.step for r in results] == [1], f"{page.name}: TOML block {index} gave no step 1"


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "console")], ids=lambda p: p.name)
def test_console_commands_parse(page: Path) -> None:
    commands = [
        line[2:].strip()
        for code in blocks(page, "console")
        for line in code.splitlines()
        if line.startswith("$ zephon ")
    ]
    assert commands, f"{page.name}: console blocks without a `$ zephon` line"
    for command in commands:
        tokens = shlex.split(command)
        # The zephon command ends where the shell takes over (a redirection, pipe or &&).
        ends = [i for i, t in enumerate(tokens) if t in {">", ">>", "<", "|", "&&", "2>"}]
        argv = tokens[1 : ends[0] if ends else len(tokens)]
        try:
            command_parser(argv[0]).parse_args(argv)
        except SystemExit as e:
            raise AssertionError(f"{page.name}: `{command}` does not parse") from e


def command_parser(name: str) -> argparse.ArgumentParser:
    """The real parser of one subcommand (built alone, as ``cli.build_parser`` builds it)."""
    from zephon_nodes import cli

    parser = argparse.ArgumentParser(prog="zephon")
    sub = parser.add_subparsers(dest="command", required=True)
    importlib.import_module(f"zephon_nodes.commands.{cli.COMMANDS[name][0]}").add_parser(sub)
    return parser


# Pages other engineers are writing, linked from here before they land. Remove a name once
# its page is on main.
PENDING = {"performance.md"}

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
            continue
        if target in PENDING and not (page.parent / target).exists():
            continue
        assert (page.parent / target).exists(), f"{page.name}: broken link to {target}"


def test_digest_page_holds_the_exact_layout() -> None:
    """docs/digest.md quotes the byte layout of ``verification.digest`` word for word."""
    import zephon_nodes.verification.digest as digest

    doc = digest.__doc__ or ""
    layout = doc[doc.index("For one step") : doc.index("The digest is the lower-case")]
    page = (DOCS / "digest.md").read_text()
    squash = lambda s: " ".join(s.split())  # noqa: E731
    assert squash(layout) in squash(page)


def test_checkpoint_page_documents_every_state_key() -> None:
    from zephon_nodes.state import layout, schema

    page = (DOCS / "checkpoint.md").read_text()
    for key in schema.STATE_KEYS:
        assert f"`{key}`" in page, key
    assert schema.FORMAT in page
    assert layout.COMMIT_FILE in page


def test_cli_page_documents_every_command() -> None:
    from zephon_nodes import cli

    page = (DOCS / "cli.md").read_text()
    for name in cli.COMMANDS:
        assert f"## `zephon {name}`" in page, name
        assert f"[`zephon {name}`](#zephon-{name})" in page, name


@pytest.mark.parametrize("name", sorted(__import__("zephon_nodes.cli").cli.COMMANDS))
def test_cli_page_documents_every_option(name: str) -> None:
    page = (DOCS / "cli.md").read_text()
    parser = command_parser(name)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        assert f"## `zephon {name}`" in page, name
        for action in command._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    assert f"`{flag}" in page, f"zephon {name} {flag}"


# Command lines a user types from these pages, the README and the examples' READMEs.
TYPED = [*PAGES, DOCS.parent / "README.md", *sorted(DOCS.parent.glob("examples/*/README.md"))]
UNDERSCORE_OPTION = re.compile(r"(?<![\w-])--[a-z0-9]+_[a-z0-9_]+")


def test_options_are_spelled_with_hyphens() -> None:
    """One spelling for every option (argparse's, and torchrun's): ``--nproc-per-node``, never
    ``--nproc_per_node`` (issue 36.4: pages used both)."""
    for page in TYPED:
        found = UNDERSCORE_OPTION.findall(page.read_text())
        assert not found, f"{page.relative_to(DOCS.parent)}: {sorted(set(found))}"
