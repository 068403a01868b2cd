"""``--token-cache`` on ``zephon digest``/``stats``/``verify``, ``zephon cache``, the TorchTitan
field: digests unchanged, counters reported, bad values one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zephon_nodes.cli import main
from zephon_nodes.io.nodecache.tokenstore import ENABLED_ENV, LIMIT_ENV

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
paths = ["data/*.jsonl"]
[work]
chunk_size = 3
epochs = 1
"""


@pytest.fixture
def recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small recipe in a private cache directory; the settings are restored afterwards."""
    monkeypatch.setenv(ENABLED_ENV, "off")
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zc"))
    (tmp_path / "data").mkdir()
    for name in ("a", "b"):
        rows = [json.dumps({"text": f"{name} document {i} " * (i % 4 + 1)}) for i in range(40)]
        (tmp_path / "data" / f"{name}.jsonl").write_text("\n".join(rows) + "\n")
    (tmp_path / "r.toml").write_text(RECIPE)
    return tmp_path / "r.toml"


def _counters(err: str) -> dict[str, float]:
    line = next(x for x in err.splitlines() if x.startswith("zephon digest: token cache "))
    return dict(json.loads(line.removeprefix("zephon digest: token cache ")))


def test_digest_stats_verify_and_cache_command(
    recipe: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["digest", str(recipe), "--steps", "6"]) == 0
    out = capsys.readouterr()
    plain = out.out
    assert "token cache" not in out.err  # off: nothing reported
    assert main(["digest", str(recipe), "--steps", "6", "--token-cache", "on"]) == 0
    out = capsys.readouterr()
    assert out.out == plain
    cold = _counters(out.err)
    assert cold["misses"] > 0 and cold["bytes_written"] > 0
    assert main(["stats", str(recipe), "--steps", "3", "--json", "--token-cache", "on"]) == 0
    stats = json.loads(capsys.readouterr().out)
    t = stats["token_cache"]
    assert t["hits"] > 0 and t["cpu_s_saved"] > 0 and t["tokens_served"] > 0
    assert {"bytes_read", "evictions", "damaged", "limit_bytes"} <= set(t)
    assert main(["stats", str(recipe), "--steps", "3", "--token-cache", "on"]) == 0
    assert "token cache:" in capsys.readouterr().out
    verify = ["verify", str(recipe), "--steps", "3", "--runners", "thread", "--no-resume"]
    assert main([*verify, "--workers", "1", "--token-cache", "on", "--json"]) == 0
    capsys.readouterr()
    assert main(["cache", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["entries"] > 0 and shown["bytes"] > 0
    assert main(["cache", "clear", "--json"]) == 0
    cleared = json.loads(capsys.readouterr().out)
    assert cleared["entries"] == 0 and cleared["removed"] == shown["entries"]
    assert main(["cache"]) == 0
    assert "0 entries" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--token-cache-limit", "lots"], "--token-cache-limit"),
        (["--token-cache", "maybe"], "--token-cache"),
    ],
)
def test_bad_values_are_one_line(
    recipe: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    try:
        code = main(["digest", str(recipe), "--steps", "1", *argv])
    except SystemExit as e:  # argparse's usage errors
        code = int(e.code or 0)
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and needle in err and "Traceback" not in err


def test_bad_environment_value_is_one_line(
    recipe: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENABLED_ENV, "sometimes")
    assert main(["digest", str(recipe), "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and ENABLED_ENV in err and "'sometimes'" in err


def test_torchtitan_config_fields() -> None:
    pytest.importorskip("torchtitan")
    from zephon_nodes.core.errors import RecipeError
    from zephon_nodes.integrations.torchtitan import ZephonDataLoader

    c = ZephonDataLoader.Config(recipe="r.toml", token_cache="on", token_cache_limit="2G")
    assert (c.token_cache, c.token_cache_limit) == (True, 2 * 1024**3)  # read as their types
    with pytest.raises(RecipeError, match=r"dataloader\.token_cache_limit.*'big'"):
        ZephonDataLoader.Config(recipe="r.toml", token_cache_limit="big")
    with pytest.raises(RecipeError, match=r"dataloader\.token_cache='sometimes'"):
        ZephonDataLoader.Config(recipe="r.toml", token_cache="sometimes")
    shared = ZephonDataLoader.Config(recipe="r.toml", token_cache="s3://bucket/tokens")
    assert shared.token_cache == "s3://bucket/tokens"  # a token cache shared by the cluster
