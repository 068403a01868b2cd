"""A token cache shared by a cluster (issue 36.2): written once, read by every other node.

Two runs on two cache directories (two nodes) share one folder: S3, GCS and Azure on the
emulators the suite starts, and a local folder (a shared mount). The second run calls the
tokenizer 0 times (counted by wrapping it) and gives the digests of the cache off; every
entry is written to the shared folder once, by the first node.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.io.conftest import Store
from tests.io.test_token_cache import SHARDS, digests, recipe, write_corpus
from zephon_nodes.io.nodecache.sharedtokens import SharedTokens
from zephon_nodes.io.nodecache.tokenstore import ENABLED_ENV, LIMIT_ENV, token_store
from zephon_nodes.operators.tokenize import Tokenize

ITEMS = SHARDS * 5  # 20 records per shard in items of 4


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Tokenizer calls in this process (thread workers), counted by a wrapper."""
    count = [0]
    real = Tokenize.__call__

    def counted(self: Tokenize, batch: Any) -> Any:
        count[0] += 1
        return real(self, batch)

    monkeypatch.setattr(Tokenize, "__call__", counted)
    yield count


def _folder(request: pytest.FixtureRequest, where: str, tmp_path: Path) -> str:
    """A shared folder on ``where`` (a bucket made for it), as a URI."""
    if where == "local":
        return str(tmp_path / "shared-mount" / "tokens")
    from tests.io.conftest import use_store

    store: Store = request.getfixturevalue(f"{where}_server")
    use_store(store, request.getfixturevalue("monkeypatch"))
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "README").write_text("a shared token cache")
    return store.put_tree(f"tokens-{where}", seed) + "/tokens"


def _stats(tmp_path: Path, node: str, shared: str) -> dict[str, int]:
    from zephon_nodes.io.nodecache.tokenstore import token_cache_settings

    root = str(tmp_path / node / "tokens")
    return token_store(root, token_cache_settings()[1], shared).stats()


@pytest.mark.parametrize("where", ["local", "s3", "gcs", "azure"])
def test_two_nodes_share_one_token_cache(
    where: str,
    calls: list[int],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Node B, on its own empty cache directory, tokenizes nothing node A tokenized."""
    write_corpus(tmp_path / "d")
    r = recipe(tmp_path / "d")
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "node-off"))
    monkeypatch.setenv(ENABLED_ENV, "off")
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    off = digests(r)
    assert calls[0] >= ITEMS
    shared = _folder(request, where, tmp_path)
    monkeypatch.setenv(ENABLED_ENV, "on")
    monkeypatch.setenv("ZEPHON_TOKEN_CACHE_SHARED", shared)
    for node in ("node-a", "node-b"):
        monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / node))
        calls[0] = 0
        assert digests(r) == off
        assert (calls[0] > 0) == (node == "node-a"), (node, calls[0])
    a, b = _stats(tmp_path, "node-a", shared), _stats(tmp_path, "node-b", shared)
    assert a["shared_writes"] == ITEMS and a["shared_hits"] == 0
    assert b["shared_writes"] == 0 and b["shared_hits"] == ITEMS
    assert b["damaged"] == 0
    assert len(list((tmp_path / "node-b" / "tokens" / "data").iterdir())) == ITEMS  # kept


@pytest.mark.parametrize(
    "where",
    [
        "local",
        "s3",
        pytest.param(
            "gcs",
            marks=pytest.mark.skip(
                reason="gcp-storage-emulator ignores ifGenerationMatch=0 (real GCS honours it)"
            ),
        ),
        "azure",
    ],
)
def test_an_entry_is_written_once(
    where: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A second write of a key is refused by the store; the first entry stays."""
    folder = SharedTokens(_folder(request, where, tmp_path))
    assert folder.read("t-once") is None
    assert folder.write("t-once", b"first") is True
    assert folder.write("t-once", b"second") is False
    assert folder.read("t-once") == b"first"


def test_a_damaged_shared_entry_is_computed_here(
    calls: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shared entries flipped or swapped: counted damaged, computed locally, same digests."""
    write_corpus(tmp_path / "d")
    r = recipe(tmp_path / "d")
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "node-off"))
    monkeypatch.setenv(ENABLED_ENV, "off")
    off = digests(r)
    shared = str(tmp_path / "mount")
    monkeypatch.setenv(ENABLED_ENV, "on")
    monkeypatch.setenv("ZEPHON_TOKEN_CACHE_SHARED", shared)
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "node-a"))
    assert digests(r) == off
    entries = sorted((tmp_path / "mount").rglob("t-*"))
    assert len(entries) == ITEMS
    blob = bytearray(entries[0].read_bytes())
    blob[-1] ^= 1
    entries[0].write_bytes(bytes(blob))
    a, b = entries[1].read_bytes(), entries[2].read_bytes()
    entries[1].write_bytes(b)
    entries[2].write_bytes(a)
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "node-b"))
    calls[0] = 0
    assert digests(r) == off
    assert calls[0] == 3
    assert _stats(tmp_path, "node-b", shared)["damaged"] == 3


def test_the_cli_takes_a_shared_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--token-cache <folder>` on two nodes: the second's counters are shared hits only."""
    import json

    from tests.commands.test_token_cache_cli import RECIPE, _counters
    from zephon_nodes.cli import main
    from zephon_nodes.io.nodecache.tokenstore import process_stats

    monkeypatch.setenv(ENABLED_ENV, "off")
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    (tmp_path / "data").mkdir()
    for name in ("a", "b"):
        rows = [json.dumps({"text": f"{name} document {i} " * (i % 4 + 1)}) for i in range(40)]
        (tmp_path / "data" / f"{name}.jsonl").write_text("\n".join(rows) + "\n")
    (tmp_path / "r.toml").write_text(RECIPE)
    argv = ["digest", str(tmp_path / "r.toml"), "--steps", "6"]
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "node-off"))
    assert main(argv) == 0
    off = capsys.readouterr().out
    shared = str(tmp_path / "mount" / "tokens")
    before = process_stats()
    got = {}
    for node in ("node-a", "node-b"):
        monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / node))
        assert main([*argv, "--token-cache", shared]) == 0
        out = capsys.readouterr()
        assert out.out == off
        got[node] = _counters(out.err)
    # The counters printed are this process's (every store it opened): b's include a's,
    # a's those of earlier tests.
    a = {k: got["node-a"][k] - before.get(k, 0) for k in ("shared_writes", "shared_hits")}
    b = {k: got["node-b"][k] - got["node-a"][k] for k in ("shared_writes", "shared_hits")}
    assert a["shared_writes"] > 0 and a["shared_hits"] == 0
    assert b["shared_hits"] == a["shared_writes"] and b["shared_writes"] == 0
    monkeypatch.setenv("ZEPHON_TOKEN_CACHE_SHARED", shared)
    assert main(["cache", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["shared"] == shared


@pytest.mark.parametrize("code", ["ENOSYS", "EOPNOTSUPP", "EPERM"])
def test_a_mount_without_hard_links(
    code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mount whose ``link`` fails as gcsfuse's (ENOSYS), SMB's or vfat's: entries are renamed.

    ENOSYS (FUSE file systems that do not implement ``link``) used to stop the shared tier
    for the process (one warning, every later node tokenizing again).
    """
    import errno
    import os

    def no_link(src: object, dst: object) -> None:
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))

    monkeypatch.setattr(os, "link", no_link)
    folder = SharedTokens(str(tmp_path / "fuse" / "tokens"))
    assert folder.write("t-nolink", b"entry") is True
    assert folder.read("t-nolink") == b"entry"
    left = [p.name for p in (tmp_path / "fuse").rglob("*") if p.is_file()]
    assert left == ["t-nolink"]  # no temporary file stays
