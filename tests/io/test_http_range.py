"""HTTP done right: a server that ignores Range is refused, an index beside local files is
checked before it is applied to a served copy, and `zephon index` over URLs needs --output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.commands.run import zephon
from tests.io.conftest import HttpServer, free_port, stop_process, wait_port
from tests.io.test_remote_digests import recipe, run, write_corpus
from zephon_nodes.core.errors import DataError
from zephon_nodes.io.index import index
from zephon_nodes.io.storage import storage


@pytest.fixture(scope="module")
def plain_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    """``python -m http.server`` on 127.0.0.1: it answers a Range request with a 200."""
    root = tmp_path_factory.mktemp("plain-www")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc)
        yield HttpServer(root, port)
    finally:
        stop_process(proc)


def big_jsonl(path: Path) -> None:
    """A jsonl shard of about 1.5 MB: more than one 1 MiB block of the read cache."""
    lines = [json.dumps({"text": f"record {i} " + "x" * 300}) for i in range(4800)]
    path.write_text("\n".join(lines) + "\n")


def test_the_server_really_ignores_range(plain_http):
    """The fixture's premise: a range request gets the whole file back."""
    import urllib.request

    (plain_http.root / "r.bin").write_bytes(bytes(range(256)) * 10)
    req = urllib.request.Request(plain_http.url("r.bin"), headers={"Range": "bytes=5-9"})
    with urllib.request.urlopen(req) as answer:
        assert answer.status == 200 and len(answer.read()) == 2560


@pytest.mark.parametrize("read_cache_mb", ["128", "0"])
def test_range_ignored_is_refused_saying_so(plain_http, monkeypatch, read_cache_mb):
    """A part of a file, with or without the block cache: refused, naming the URL and why."""
    monkeypatch.setenv("ZEPHON_READ_CACHE_MB", read_cache_mb)
    big_jsonl(plain_http.root / "big.jsonl")
    url = plain_http.url("big.jsonl")
    size = storage.stat(url).size
    with pytest.raises(DataError, match=f"{url}: the server ignored a Range request") as e:
        storage.read_range(url, size - 100, size - 50, tag=f"t{read_cache_mb}")
    assert "python -m http.server" in str(e.value) and "206" in str(e.value)


def test_digest_over_a_server_without_range_exits_2_in_one_line(plain_http, tmp_path, capsys):
    """`zephon digest` over a >1 MiB shard served without Range: exit 2, one line, no
    `invalid JSON` from misplaced bytes."""
    big_jsonl(plain_http.root / "cli.jsonl")
    url = plain_http.url("cli.jsonl")
    (tmp_path / "r.toml").write_text(
        'seq_len = 64\nglobal_batch_size = 8\nnum_lanes = 2\n[tokenizer]\nkind = "bytes"\n'
        f'[[datasets]]\nname = "w"\npaths = ["{url}"]\n'
    )
    assert zephon("digest", str(tmp_path / "r.toml"), "--steps", "3") == 2
    out = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(out) == 1 and url in out[0] and "ignored a Range request" in out[0], out


def test_a_local_index_served_beside_the_files_is_checked(http_server, tmp_path):
    """`zephon index` run on local files, the folder then served by nginx: the index found
    beside the URLs is applied only after each shard's content is checked (other version
    tags), so digests equal; a served copy with other content is refused with a command
    that can work over http."""
    root = tmp_path / "data"
    names = write_corpus(root)
    reference = run(recipe([str(root / "*.jsonl*")]), 2, 4)
    assert zephon("index", str(root / "*.jsonl*"), "--quiet") == 0
    served = http_server.root / "indexed-local"
    shutil.copytree(root, served)
    urls = [http_server.url(f"indexed-local/{n}") for n in names]
    index.forget()
    try:
        found = index.find_entry(urls[0])
        beside = http_server.url("indexed-local/zephon-index.json")
        assert found is not None and found[1] == beside
        assert run(recipe(urls), 2, 4) == reference
        text = (served / "d0.jsonl").read_bytes()
        (served / "d0.jsonl").write_bytes(text.replace(b"doc 40", b"doc 04"))
        later = (served / "d0.jsonl").stat().st_mtime + 10
        os.utime(served / "d0.jsonl", (later, later))  # nginx's ETag has 1 s resolution
        index.forget()
        changed = r"d0\.jsonl: content differs from the dataset index"
        with pytest.raises(DataError, match=changed) as e:
            index.find_entry(http_server.url("indexed-local/d0.jsonl"))
        assert "--output FILE" in str(e.value) and "/*'" not in str(e.value)
    finally:
        index.forget()


def test_index_over_urls_needs_output(http_server, tmp_path, capsys):
    """`zephon index URL` without --output: exit 2 before reading, saying --output."""
    (http_server.root / "one.jsonl").write_text('{"text": "a"}\n')
    assert zephon("index", http_server.url("one.jsonl")) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "needs --output FILE" in out[0], out
    where = tmp_path / "one-index.json"
    assert zephon("index", http_server.url("one.jsonl"), "--output", str(where), "--quiet") == 0
    assert json.loads(where.read_text())["shards"]
