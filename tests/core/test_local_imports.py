"""Function-local imports of the library's own modules only for optional extras (issue 32).

An ``import``/``from`` of a ``zephon_nodes`` module inside a function hides a dependency (and
often a cycle) from the module's top. The command line keeps its start-up light with a lazy
command table (``zephon_nodes.cli``: modules named by path, imported with
``importlib.import_module`` at dispatch), not with imports inside functions; the only ones left
import a module that needs an optional extra, listed here with why.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "zephon_nodes"

# Own modules that need an optional extra (pyproject.toml), so a function may import them
# where the feature is used: prefix -> the extra.
OPTIONAL = {
    "zephon_nodes.integrations": "torchtitan (TorchTitan, tokenizers)",
    "zephon_nodes.chat": "chat (jinja2)",
    "zephon_nodes.multimodal": "multimodal (pillow, scikit-image)",
    "zephon_nodes.engine.ray_executor": "ray",
    "zephon_nodes.io.formats.parquet": "parquet (pyarrow)",
    "zephon_nodes.io.formats.arrow": "parquet (pyarrow)",
}


def local_imports(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, function, module)`` of each absolute import inside a function of ``tree``.

    ``function`` is the innermost function holding the import.
    """
    found: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            modules: list[str] = []
            if isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                modules = [child.module]
            elif isinstance(child, ast.Import):
                modules = [a.name for a in child.names]
            if function is not None:
                found.extend((child.lineno, function, module) for module in modules)
            visit(child, function)

    visit(tree, None)
    return sorted(found)


def _own(module: str) -> bool:
    return module == "zephon_nodes" or module.startswith("zephon_nodes.")


def local_own_imports(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, function, module)`` of each own-module import inside a function of ``tree``."""
    return [(line, fn, m) for line, fn, m in local_imports(tree) if _own(m)]


def local_other_imports(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, function, top-level module)`` of each import of another library in a function."""
    return [(line, fn, m.split(".")[0]) for line, fn, m in local_imports(tree) if not _own(m)]


def _optional(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in OPTIONAL)


def test_the_scan_sees_a_function_local_import() -> None:
    """The scan finds what it is meant to forbid (and only inside functions)."""
    src = (
        "from zephon_nodes.core import errors\n"
        "def f():\n"
        "    import zephon_nodes.engine.pipeline\n"
        "    def g():\n"
        "        from zephon_nodes.chat import template\n"
        "    from numpy import array\n"
    )
    found = local_own_imports(ast.parse(src))
    assert found == [(3, "f", "zephon_nodes.engine.pipeline"), (5, "g", "zephon_nodes.chat")]
    assert [m for _, _, m in found if not _optional(m)] == ["zephon_nodes.engine.pipeline"]


def test_function_local_imports_of_own_modules_are_optional_extras_only() -> None:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, fn, module in local_own_imports(ast.parse(path.read_text())):
            if not _optional(module):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({fn}): {module}")
    assert not bad, (
        "move these imports to the module's top (a cycle it makes is a design problem to "
        "solve, docs/architecture.md); a command's start-up stays light through the lazy "
        f"command table of zephon_nodes/cli.py: {bad}"
    )


# Other libraries a function may import: the optional extras (pyproject.toml), and the few
# base dependencies whose import a command that does not need them should not pay (measured
# with ``python -X importtime``: torch 1.4 s, tqdm 49 ms, sentencepiece 21 ms), plus the
# standard library's 1 MB of documentation text only ``zephon demo`` reads.
ALLOWED_LOCAL = {
    "torchtitan": "extra torchtitan",
    "tokenizers": "extra torchtitan",
    "triton": "extra trainer",
    "matplotlib": "extra report",
    "pyarrow": "extra parquet",
    "PIL": "extra multimodal",
    "skimage": "extra multimodal",
    "ray": "extra ray",
    "jinja2": "extra chat",
    "fsspec": "extras s3, gcs, azure",
    "s3fs": "extra s3",
    "gcsfs": "extra gcs",
    "adlfs": "extra azure",
    "azure": "extra azure",
    "grain": "extra bench",
    "torch": "start-up: 1.4 s, for commands that never build a pipeline",
    "tqdm": "start-up: 49 ms, only when a progress bar is shown",
    "sentencepiece": "start-up: 21 ms, only when a sentencepiece model is loaded",
    "pydoc_data": "1 MB of text, only for `zephon demo`'s corpus",
}


def test_the_scan_sees_a_function_local_import_of_another_library() -> None:
    src = "import json\ndef f():\n    import re\n    from torch import nn\n"
    assert local_other_imports(ast.parse(src)) == [(3, "f", "re"), (4, "f", "torch")]


def test_function_local_imports_of_other_libraries_are_extras_or_measured_start_up() -> None:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, fn, top in local_other_imports(ast.parse(path.read_text())):
            if top not in ALLOWED_LOCAL:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({fn}): {top}")
    assert not bad, f"move these imports to the module's top: {bad}"
