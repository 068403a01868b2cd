"""The one settings object: read from the environment in one module, checked, passed explicitly.

Covers issue 23 item 4 (one ``Settings``, errors naming the variable, settings travelling to
thread, process and Ray... workers with each call, no environment read elsewhere) and the
node cache's default limit of issue 26 item 3 (a share of the free disk, injected here as a
small fake free-space value instead of filling a disk).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from tests.io.test_nodecache_zst import recipe, write_zst_corpus
from zephon_nodes import Pipeline, RecipeError, WorkerPool
from zephon_nodes.cli import main
from zephon_nodes.core import settings as physical
from zephon_nodes.core.settings import (
    CACHE_CAP_BYTES,
    ENVIRONMENT,
    Settings,
    current,
    using,
)
from zephon_nodes.io.nodecache.nodecache import CacheFullError, node_cache
from zephon_nodes.verification.simulate import simulate

PACKAGE = Path(__file__).resolve().parents[2] / "zephon_nodes"


def test_environment_is_read_in_one_module_only() -> None:
    """No module but core/settings.py reads os.environ or getenv (issue 23's done-when)."""
    readers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if re.search(r"os\.environ|getenv\(|environ\.get\(", text):
            readers.append(str(path.relative_to(PACKAGE)))
    assert readers == ["core/settings.py"]


def test_every_variable_sets_its_field_with_the_documented_meaning() -> None:
    """Each ZEPHON_* variable gives its field the value it always meant."""
    env = {
        "ZEPHON_CACHE_DIR": "/tmp/x",
        "ZEPHON_CACHE_LIMIT": "50G",
        "ZEPHON_CACHE_POLICY": "lru",
        "ZEPHON_CACHE_PREFETCH": "0",
        "ZEPHON_READ_CACHE_MB": "0",
        "ZEPHON_STORAGE_RETRY_S": "0.5",
        "ZEPHON_STORAGE_BACKOFF_MAX_S": "2",
        "ZEPHON_SHM_ARENA_MB": "1",
        "ZEPHON_VERIFY_DATA": "1",
        "ZEPHON_IMMUTABLE_DATA": "yes",
        "ZEPHON_NO_INDEX": "1",
        "ZEPHON_RAY_MAX_RETRIES": "1",
        "RAY_ADDRESS": "127.0.0.1:6379",
        "ZEPHON_TOKEN_CACHE": "on",
        "ZEPHON_TOKEN_CACHE_LIMIT": "2G",
        "ZEPHON_TOKEN_CACHE_SHARED": "s3://bucket/tokens",
        "ZEPHON_ITEM_SIZES": "off",
        "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9023",
    }
    assert sorted(env) == sorted(v.name for v in ENVIRONMENT)
    s = Settings.from_env(env)
    assert (s.cache_dir, s.cache_limit, s.cache_policy, s.cache_prefetch) == (
        "/tmp/x",
        50 << 30,
        "lru",
        0,
    )
    assert (s.read_cache_mb, s.storage_retry_s, s.storage_backoff_max_s) == (0.0, 0.5, 2.0)
    assert (s.shm_arena_mb, s.verify_data, s.immutable_data, s.use_index) == (
        1.0,
        True,
        True,
        False,
    )
    assert (s.ray_max_retries, s.ray_address) == (1, "127.0.0.1:6379")
    assert (s.token_cache, s.token_cache_limit) == (True, 2 << 30)
    assert s.token_cache_shared == "s3://bucket/tokens"
    assert s.item_sizes is False
    assert s.gcs_emulator_host == "http://127.0.0.1:9023"
    unset = Settings.from_env({})
    assert unset == Settings()
    assert (unset.cache_limit, unset.read_cache_mb, unset.use_index) == (None, 128.0, True)
    assert unset.item_sizes is True


@pytest.mark.parametrize(
    ("name", "raw", "expected"),
    [
        ("ZEPHON_READ_CACHE_MB", "abc", "expected megabytes, got 'abc'"),
        ("ZEPHON_READ_CACHE_MB", "-1", r"must be a finite number in \[0, 1e\+07\]"),
        ("ZEPHON_STORAGE_RETRY_S", "nan", "must be a finite number"),
        ("ZEPHON_CACHE_LIMIT", "lots", "expected a byte size such as 512M or 50G"),
        ("ZEPHON_CACHE_POLICY", "fifo", "expected 'belady' or 'lru', got 'fifo'"),
        ("ZEPHON_CACHE_PREFETCH", "-2", r"must be an integer in \[0, 2\*\*16\]"),
        ("ZEPHON_RAY_MAX_RETRIES", "2.5", "expected an integer, got '2.5'"),
        ("ZEPHON_VERIFY_DATA", "maybe", r"expected 1/0 \(true/false, yes/no\), got 'maybe'"),
    ],
)
def test_a_bad_variable_is_one_line_naming_it(name: str, raw: str, expected: str) -> None:
    """The error names the variable, what was expected and what was got, on one line."""
    with pytest.raises(RecipeError) as e:
        Settings.from_env({name: raw})
    text = str(e.value)
    assert text.startswith(f"{name}={raw!r}") and "\n" not in text
    assert re.search(expected, text), text


def test_bad_variable_reaches_the_cli_as_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ZEPHON_READ_CACHE_MB=abc: exit 2, one line naming the variable, no traceback."""
    write_zst_corpus(tmp_path / "data")
    toml = tmp_path / "r.toml"
    toml.write_text(
        "seed = 1\nnum_lanes = 2\nglobal_batch_size = 2\nseq_len = 8\nflush_every = 1\n"
        '[tokenizer]\nkind = "bytes"\n[[datasets]]\nname = "d"\n'
        f'paths = ["{tmp_path}/data/*.jsonl.zst"]\n'
    )
    monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "abc")
    assert main(["digest", str(toml), "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "ZEPHON_READ_CACHE_MB='abc'" in err and "Traceback" not in err


def test_constructor_and_replace_check_bounds() -> None:
    """A field out of bounds names the field; replace takes sizes and refuses unknown names."""
    with pytest.raises(RecipeError, match=r"Settings.read_cache_mb=-1 must be"):
        Settings(read_cache_mb=-1)
    with pytest.raises(RecipeError, match=r"Settings.cache_policy='fifo'"):
        Settings(cache_policy="fifo")  # type: ignore[arg-type]
    assert Settings().replace(cache_limit="1M").cache_limit == 1 << 20
    assert Settings(cache_limit=5).replace(cache_limit="auto").cache_limit is None
    with pytest.raises(RecipeError, match="unknown physical setting"):
        Settings().replace(cache_size=1)
    with pytest.raises(RecipeError, match="--cache-limit='lots'"):
        Settings().replace(cache_limit="lots")
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().cache_limit = 3  # type: ignore[misc]


def test_scopes_overrides_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """using() beats update(), which beats the environment; reset() goes back to it."""
    monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "3")
    assert current().read_cache_mb == 3.0
    monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "4")  # a changed variable is seen at once
    assert current().read_cache_mb == 4.0
    physical.update(read_cache_mb=5.0)
    assert current().read_cache_mb == 5.0
    with using(Settings(read_cache_mb=6.0)):
        assert current().read_cache_mb == 6.0
    assert current().read_cache_mb == 5.0
    with pytest.raises(RecipeError):
        physical.update(read_cache_mb=-1.0)
    assert current().read_cache_mb == 5.0  # a refused change changes nothing
    physical.reset()
    assert current().read_cache_mb == 4.0


def _seen(_: object) -> tuple[float, float, str]:
    """What a worker sees: its settings' read cache, arena and cache directory."""
    s = current()
    return s.read_cache_mb, s.shm_arena_mb, s.cache_dir


@pytest.mark.parametrize(("runner", "workers"), [("thread", 0), ("thread", 2), ("process", 1)])
def test_workers_get_the_settings_with_each_call(
    runner: str, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool's calls run in its settings, whatever the workers' environment says."""
    monkeypatch.setenv("ZEPHON_READ_CACHE_MB", "1")
    given = Settings(read_cache_mb=7.0, shm_arena_mb=2.0, cache_dir="/tmp/zc-given")
    with WorkerPool(workers, runner, timeout_s=60, settings=given) as pool:
        assert pool.submit(_seen, None).result(timeout=60) == (7.0, 2.0, "/tmp/zc-given")
    with WorkerPool(workers, runner, timeout_s=60) as pool:  # the submitter's settings
        with using(given):
            fut = pool.submit(_seen, None)
        assert fut.result(timeout=60) == (7.0, 2.0, "/tmp/zc-given")
        assert pool.submit(_seen, None).result(timeout=60)[0] == 1.0


def test_default_limit_is_a_share_of_free_space_capped(tmp_path: Path) -> None:
    """Half of the (fake) free space, at most 100 GiB; entries already cached count as room."""
    s = Settings(cache_dir=str(tmp_path), cache_free_bytes=10 << 20)
    assert s.cache_limit_bytes() == 5 << 20
    assert "the default" in s.limit_source() and str(tmp_path) in s.limit_source()
    (tmp_path / "node" / "data").mkdir(parents=True)
    (tmp_path / "node" / "data" / "entry").write_bytes(b"x" * (2 << 20))
    assert s.cache_limit_bytes() == 6 << 20  # (10 MiB free + 2 MiB evictable) / 2
    big = Settings(cache_dir=str(tmp_path), cache_free_bytes=1 << 50)
    assert big.cache_limit_bytes() == CACHE_CAP_BYTES
    assert Settings(cache_dir=str(tmp_path), cache_limit=123).cache_limit_bytes() == 123
    assert node_cache(s).limit_bytes == 6 << 20


def test_measured_default_is_bounded(tmp_path: Path) -> None:
    """Without an injected value the real disk is measured: positive, at most the cap."""
    assert 0 < Settings(cache_dir=str(tmp_path)).cache_limit_bytes() <= CACHE_CAP_BYTES


def test_without_a_limit_whole_shards_stay_within_the_default(tmp_path: Path) -> None:
    """No --cache-limit, small (fake) free space: the same digests, and the node cache never
    holds more than the default share; no decompressed copy outside it."""
    corpus = write_zst_corpus(tmp_path / "data")
    reference_dir = tmp_path / "ref"
    reference = Settings(cache_dir=str(reference_dir), cache_limit=corpus * 4)
    ref = [
        r.digest
        for r, _ in simulate(Pipeline(recipe(tmp_path / "data"), settings=reference), 2, 10_000)
    ]
    small = Settings(cache_dir=str(tmp_path / "zc"), cache_free_bytes=corpus // 4)
    pipeline = Pipeline(recipe(tmp_path / "data"), settings=small)
    got = [r.digest for r, _ in simulate(pipeline, 2, 10_000, num_workers=2)]
    assert got == ref and len(ref) > 0
    stats = pipeline.cache_stats()
    assert stats is not None and stats["limit_bytes"] == corpus // 8
    assert 0 < stats["peak_bytes"] <= corpus // 8 and stats["evictions"] > 0
    assert not list((tmp_path / "zc").glob("*.jsonl"))


def test_disk_too_small_for_one_shard_is_refused_at_start_up(tmp_path: Path) -> None:
    """Free space under two shards: the build fails at once, naming the shard and the limit."""
    write_zst_corpus(tmp_path / "data")
    tiny = Settings(cache_dir=str(tmp_path / "zc"), cache_free_bytes=200)
    with pytest.raises(CacheFullError) as e:
        Pipeline(recipe(tmp_path / "data"), settings=tiny)
    text = str(e.value)
    assert "\n" not in text and "part-0" in text and "limit of 100 bytes" in text
    assert "the default" in text and "--cache-limit" in text


def test_every_variable_is_documented() -> None:
    """docs/cli.md's settings table has a row for every variable, with its field."""
    text = (PACKAGE.parent / "docs" / "cli.md").read_text()
    for var in ENVIRONMENT:
        assert f"| `{var.name}` | `{var.field}`" in text, var.name
