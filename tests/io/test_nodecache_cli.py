"""``--cache-limit`` on ``zephon digest`` and ``zephon stats``, and the TorchTitan field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zstandard

from zephon_nodes.cli import main
from zephon_nodes.io.nodecache.nodecache import LIMIT_ENV

RECIPE = """
seed = 7
num_lanes = 2
global_batch_size = 4
seq_len = 16
flush_every = 2
[tokenizer]
kind = "bytes"
[[datasets]]
name = "web"
paths = ["data/*.jsonl.zst"]
[work]
chunk_size = 3
epochs = 1
"""


@pytest.fixture
def recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small recipe; the cache settings are restored after the test."""
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zc"))
    (tmp_path / "data").mkdir()
    for name in ("a", "b"):
        rows = [json.dumps({"text": f"{name} document {i} " * (i % 4 + 1)}) for i in range(40)]
        blob = zstandard.ZstdCompressor().compress(("\n".join(rows) + "\n").encode())
        (tmp_path / "data" / f"{name}.jsonl.zst").write_bytes(blob)
    assert main(["index", str(tmp_path / "data" / "*.jsonl.zst")]) == 0
    (tmp_path / "r.toml").write_text(RECIPE)
    return tmp_path / "r.toml"


def test_digest_unchanged_and_stats_report(
    recipe: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The limit never changes a digest; stats --json reports the cache's counters."""
    capsys.readouterr()
    assert main(["digest", str(recipe), "--steps", "4"]) == 0
    first = capsys.readouterr()
    plain = first.out
    assert "node cache" not in first.err  # no counters unless a limit was asked for
    # Without a limit the shards read whole still go through the (default-bounded) cache.
    assert sorted(p.name for p in (recipe.parent / "zc" / "node" / "data").iterdir())
    assert main(["digest", str(recipe), "--steps", "4", "--cache-limit", "64K"]) == 0
    out = capsys.readouterr()
    assert out.out == plain
    line = next(x for x in out.err.splitlines() if x.startswith("zephon digest: node cache "))
    counters = json.loads(line.removeprefix("zephon digest: node cache "))
    assert counters["limit_bytes"] == 65536 and counters["hits"] > 0
    assert main(["stats", str(recipe), "--steps", "2", "--json", "--cache-limit", "1M"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["cache"]["limit_bytes"] == 1 << 20
    assert {"hits", "misses", "bytes_fetched", "evictions", "peak_bytes"} <= set(stats["cache"])
    assert stats["cache"]["hits"] > 0  # warm from the digest run: same node-cache directory


def test_bad_limit_is_one_line(recipe: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A limit that is not a size exits 2 with one line naming the setting and the value."""
    assert main(["digest", str(recipe), "--steps", "1", "--cache-limit", "lots"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "--cache-limit" in err and "'lots'" in err


def test_torchtitan_config_field() -> None:
    """The TorchTitan loader's Config takes cache_limit and refuses a bad one."""
    pytest.importorskip("torchtitan")
    from zephon_nodes.core.errors import RecipeError
    from zephon_nodes.integrations.torchtitan import ZephonDataLoader

    config = ZephonDataLoader.Config(recipe="r.toml", cache_limit="50G")
    assert config.cache_limit == 50 * 1024**3  # a size in text is read as bytes
    with pytest.raises(RecipeError, match=r"dataloader\.cache_limit.*'big'"):
        ZephonDataLoader.Config(recipe="r.toml", cache_limit="big")
