"""docs/architecture.md names every module of the package (issue 32: the tree shows the design)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "zephon_nodes"
PAGE = ROOT / "docs" / "architecture.md"


def _modules() -> list[str]:
    """Every module's path under the package (a package's ``__init__.py`` included)."""
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py"))


def _listed() -> list[str]:
    """The module paths the page's "Every module" table lists, in its order."""
    section = PAGE.read_text().split("## Every module", 1)[1]
    return re.findall(r"^\| `([^`]+\.py)` \|", section, flags=re.M)


def test_every_module_is_listed() -> None:
    """A module missing from the table is named, with where to add it."""
    missing = sorted(set(_modules()) - set(_listed()))
    assert not missing, f"add a row for each to docs/architecture.md's 'Every module': {missing}"


def test_every_listed_module_exists() -> None:
    """No row names a module that was moved or removed."""
    stale = sorted(set(_listed()) - set(_modules()))
    assert not stale, f"docs/architecture.md lists modules that do not exist: {stale}"


def test_the_table_is_in_path_order_without_repeats() -> None:
    """One row per module, sorted, so a new row has one place to go."""
    rows = _listed()
    assert rows == sorted(set(rows))
