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


def local_own_imports(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, function, module)`` of each own-module import inside a function of ``tree``.

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
            for module in modules:
                own = module == "zephon_nodes" or module.startswith("zephon_nodes.")
                if own and function is not None:
                    found.append((child.lineno, function, module))
            visit(child, function)

    visit(tree, None)
    return sorted(found)


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
