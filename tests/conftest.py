"""Shared pytest configuration: Hypothesis profiles and a private shard cache per session."""

from __future__ import annotations

import os
import tempfile

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=20,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    deadline=None,
    max_examples=10,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# Record indexes and decompressed shards go to a private directory, never the user's cache.
os.environ.setdefault("ZEPHON_CACHE_DIR", tempfile.mkdtemp(prefix="zephon-test-cache-"))
