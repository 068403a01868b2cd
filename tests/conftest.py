"""Shared pytest configuration: Hypothesis profiles and a private shard cache per session."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=20,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# make test-long: the ci profile's settings with new random examples at every run (ci is
# derandomized: the same examples each time); a failure prints the blob that reproduces it.
settings.register_profile("long", settings.get_profile("ci"), derandomize=False)
settings.register_profile(
    "dev",
    deadline=None,
    max_examples=10,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# Record indexes and decompressed shards go to a private directory, never the user's cache.
os.environ.setdefault("ZEPHON_CACHE_DIR", tempfile.mkdtemp(prefix="zephon-test-cache-"))


@pytest.fixture(autouse=True)
def _process_settings() -> Iterator[None]:
    """Each test starts from the environment's physical settings (``core.settings.reset``).

    ``set_cache_limit`` and ``--cache-limit`` change the process's settings (as they once
    changed ``os.environ``, which ``monkeypatch`` undid); this undoes them after each test.
    """
    from zephon_nodes.core import settings as physical

    yield
    physical.reset()
