"""A shard edited during a run is refused at its next read, naming it; a warm cache and a cold
one never disagree silently about a shard edited before the run (issue 27, cases 2 and 3)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
import zstandard

from tests.commands.run import zephon
from tests.io.test_remote_digests import recipe
from zephon_nodes import Pipeline, simulate
from zephon_nodes.core.errors import DataError
from zephon_nodes.io.index import index


@pytest.fixture(autouse=True)
def _fresh_manifests():
    index.forget()
    yield
    index.forget()


def _docs(tag: str, n: int) -> list[str]:
    return [json.dumps({"text": f"{tag} {i:04d} " + "w " * (i % 5)}) for i in range(n)]


def _write(path: Path, lines: list[str]) -> None:
    blob = ("\n".join(lines) + "\n").encode()
    if path.name.endswith(".zst"):
        blob = zstandard.ZstdCompressor().compress(blob)
    path.write_bytes(blob)


def _same_size_edit(path: Path) -> None:
    """Rewrite ``path`` in place with other text of the same size ("A" -> "B")."""
    st = path.stat()
    lines = [x.replace("alpha", "omega") for x in _lines(path)]
    _write(path, lines)
    assert path.stat().st_size == st.st_size or path.name.endswith(".zst")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def _lines(path: Path) -> list[str]:
    blob = path.read_bytes()
    if path.name.endswith(".zst"):
        blob = zstandard.ZstdDecompressor().stream_reader(blob, read_across_frames=True).read()
    return blob.decode().splitlines()


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("indexed", [False, True])
@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.zst"])
def test_an_edit_during_the_run_is_refused_at_the_next_read(tmp_path, name, indexed, on_error):
    """Steps before the edit run; the first read after it refuses the shard, named.

    Even under ``skip``: what a skip leaves out would depend on when the edit happened.
    """
    _write(tmp_path / name, _docs("alpha", 400))
    if indexed:
        assert zephon("index", str(tmp_path / "*.jsonl*"), "--every", "8", "--quiet") == 0
    r = recipe([str(tmp_path / "*.jsonl*")])
    r = r.replace(datasets=(dataclasses.replace(r.datasets[0], on_error=on_error),))
    pipeline = Pipeline(r)
    steps = simulate(pipeline, 1, 60)
    for _ in range(3):
        next(steps)
    _same_size_edit(tmp_path / name)
    # A read racing the rewrite itself (the edit truncates, then writes) meets the index's
    # check first; either way the shard is refused, named.
    changed = "(the file changed during the run|file changed since it was indexed)"
    with pytest.raises(DataError, match=f"{re.escape(name)}: {changed}"):
        for _ in steps:
            pass


def test_an_unchanged_shard_reads_through(tmp_path):
    """The check costs a stat and refuses nothing when no file changes."""
    _write(tmp_path / "a.jsonl", _docs("alpha", 400))
    assert len(list(simulate(Pipeline(recipe([str(tmp_path / "*.jsonl")])), 1, 30))) == 30


@pytest.mark.parametrize("mode", ["index", "immutable"])
def test_a_zst_copy_is_never_made_of_other_content(tmp_path, monkeypatch, mode):
    """Same size, mtime restored, the decompressed copy gone (cold, or evicted): refused.

    The copy is checked against the shard's checksum while it is made, so the cache never
    holds other text under the old checksum (docs/storage.md says what a warm copy trusts).
    """
    cache = tmp_path / "cache"
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(cache))
    path = tmp_path / "d" / "a.jsonl.zst"
    path.parent.mkdir()
    _write(path, _docs("alpha", 300))
    if mode == "index":
        assert zephon("index", str(path), "--quiet") == 0
    else:
        monkeypatch.setenv("ZEPHON_IMMUTABLE_DATA", "1")
    r = recipe([str(path.parent / "*.jsonl.zst")])
    before = [x.digest for x, _ in simulate(Pipeline(r), 1, 20)]
    st = path.stat()
    lines = [x.replace("alpha", "omega") for x in _lines(path)]
    blob = zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode())
    assert len(blob) == st.st_size
    path.write_bytes(blob)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    # The decompressed copy: in the node cache (node/data/zst-*), or a <checksum>.jsonl copy.
    copies = list(cache.glob("*.jsonl")) + list((cache / "node" / "data").glob("zst-*"))
    assert copies
    for copy in copies:
        copy.unlink()
    index.forget()
    with pytest.raises(DataError, match=r"a\.jsonl\.zst: .*checksum"):
        after = [x.digest for x, _ in simulate(Pipeline(r), 1, 20)]
        assert after == before  # what the old code got wrong, never reached
