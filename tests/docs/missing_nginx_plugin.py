"""A pytest plugin for test_make_stamp: the storage tests' conftest sees nginx as missing."""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems() -> None:
    import tests.io.conftest as storage

    storage._missing = lambda: {"nginx"}
