"""The package root exports what users write, and nothing that needs an optional package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import zephon_nodes

REPO = Path(__file__).parents[2]


class TestRoot:
    """``zephon_nodes.__all__``: what a user writes."""

    def test_every_exported_name_resolves(self) -> None:
        """Each name of ``__all__`` is an attribute of the package."""
        missing = [n for n in zephon_nodes.__all__ if not hasattr(zephon_nodes, n)]
        assert missing == []

    def test_no_name_exported_twice(self) -> None:
        """``__all__`` lists each name once."""
        assert len(set(zephon_nodes.__all__)) == len(zephon_nodes.__all__)

    def test_recipe_tables_are_the_recipe_packages(self) -> None:
        """The root's specs are the objects of ``zephon_nodes.recipe`` (one class each)."""
        from zephon_nodes import recipe

        for name in recipe.__all__:
            if name in zephon_nodes.__all__:
                assert getattr(zephon_nodes, name) is getattr(recipe, name), name

    def test_parts_are_reached_through_their_packages(self) -> None:
        """Engine parts are not re-exported at the root."""
        for name in ("Lane", "Multiplexer", "WorkSource", "WorkItem", "Flush", "Dataset"):
            assert name not in zephon_nodes.__all__, name

    def test_unknown_attribute_names_the_package(self) -> None:
        """A misspelt name raises AttributeError naming it."""
        try:
            zephon_nodes.Recpie  # type: ignore[attr-defined]  # noqa: B018
        except AttributeError as e:
            assert "'Recpie'" in str(e)
        else:
            raise AssertionError("zephon_nodes.Recpie resolved")


def test_testing_kit_is_imported_on_first_use() -> None:
    """``import zephon_nodes`` works without hypothesis; ``assert_elastic`` then needs it."""
    script = (
        "import sys\n"
        "sys.modules['hypothesis'] = None\n"
        "import zephon_nodes\n"
        "assert 'zephon_nodes.testing' not in sys.modules\n"
        "try:\n"
        "    zephon_nodes.assert_elastic\n"
        "except ImportError as e:\n"
        "    print('needs', e.name)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "needs hypothesis"


def test_assert_elastic_is_the_testing_kits() -> None:
    """With hypothesis installed the root's ``assert_elastic`` is the kit's function."""
    from zephon_nodes.testing import assert_elastic

    assert zephon_nodes.assert_elastic is assert_elastic
