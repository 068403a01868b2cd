"""Start-up from a dataset index: no shard touched, lazily opened shards, glob semantics."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.commands.run import zephon
from tests.io.test_remote_digests import recipe, write_corpus
from zephon_nodes import DatasetSpec, Pipeline, WorkSpec, simulate
from zephon_nodes.errors import DataError
from zephon_nodes.io.identity import dataset_identities, file_identity
from zephon_nodes.io.index import index
from zephon_nodes.io.index.lazyshards import LazyShards
from zephon_nodes.io.index.table import resolve_indexed
from zephon_nodes.io.storage import storage
from zephon_nodes.recipe.canonical import canonical_json


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zc"))
    monkeypatch.delenv("ZEPHON_VERIFY_DATA", raising=False)
    index.forget()
    yield
    index.forget()


def _drain(r: Any) -> list[str]:
    return [x.digest for x, _ in simulate(Pipeline(r), 1, 10**6)]


def _tree(root: Path) -> None:
    """Shards in sub-folders (one of them two deep), a hidden one and a non-jsonl file."""
    write_corpus(root / "a", (5, 7))
    write_corpus(root / "b", (6, 0, 4))
    write_corpus(root / "b" / "c", (3,))
    (root / "a" / ".hidden.jsonl").write_text('{"text": "hidden"}\n')
    (root / "b" / "c" / "notes.json").write_text('{"text": "not a shard"}\n')
    (root / "top.jsonl").write_text('{"text": "top"}\n')


class TestNoShardTouched:
    """Building a pipeline from an index lists no folder and stats or reads no shard."""

    def test_build_then_same_digests(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        """Lazy shards, opened only when read; digests and fingerprint as without an index."""
        write_corpus(tmp_path / "d" / "x", (9, 0, 11))
        write_corpus(tmp_path / "d" / "y", (8, 5))
        # Round-robin dealing: balanced dealing by tokens (the default for a finite dataset
        # of at most 65,536 records) reads every work item when the pipeline is built.
        r = recipe([str(tmp_path / "d" / "*" / "*.jsonl*")], work=WorkSpec(4, deal="round_robin"))
        monkeypatch.setenv("ZEPHON_NO_INDEX", "1")
        plain = Pipeline(r)
        reference = _drain(r)
        monkeypatch.delenv("ZEPHON_NO_INDEX")
        assert zephon("index", str(tmp_path / "d" / "*" / "*.jsonl*"), "--quiet") == 0
        assert (tmp_path / "d" / index.INDEX_NAME).exists()
        Pipeline(r)  # the first build converts the index into cached columns
        touched: list[str] = []
        real_stat = storage.stat

        def spy_stat(uri: Any) -> Any:
            touched.append(str(uri))
            return real_stat(uri)

        def no_glob(*a: Any, **k: Any) -> Any:
            raise AssertionError(f"a folder was listed at start-up: {a[:1]}")

        with monkeypatch.context() as m:
            m.setattr(storage, "stat", spy_stat)
            m.setattr(glob, "glob", no_glob)
            m.setattr(index, "file_checksum", no_glob)
            pipeline = Pipeline(r)
        assert touched == []
        shards = pipeline.datasets[0].shards
        assert isinstance(shards, LazyShards) and len(shards) == 5
        assert pipeline.skipped_files == {"web": {"empty_file": 1}} == plain.skipped_files
        assert pipeline.fingerprint == plain.fingerprint == r.fingerprint()
        assert pipeline.summary == plain.summary
        assert [x.digest for x, _ in simulate(pipeline, 1, 10**6)] == reference

    def test_changed_shard_refused_when_opened_even_under_skip(self, tmp_path: Path):
        """A shard changed after indexing is refused when read, named, under on_error=skip."""
        write_corpus(tmp_path, (9, 8))
        assert zephon("index", str(tmp_path / "*.jsonl*"), "--quiet") == 0
        with open(tmp_path / "b0.jsonl", "a") as f:
            f.write('{"text": "late"}\n')
        spec = DatasetSpec("web", paths=(str(tmp_path / "*.jsonl*"),), on_error="skip")
        r = recipe([str(tmp_path / "*.jsonl*")]).replace(datasets=(spec,))
        with pytest.raises(DataError, match=r"b0\.jsonl: the dataset index says .*zephon index"):
            list(simulate(Pipeline(r), 1, 10**6))  # at build under balanced dealing

    def test_deleted_shard_refused_when_opened(self, tmp_path: Path):
        """A shard the index lists but the folder lost: refused when read, named."""
        write_corpus(tmp_path, (9, 8))
        assert zephon("index", str(tmp_path / "*.jsonl*"), "--quiet") == 0
        (tmp_path / "a0.jsonl").unlink()
        with pytest.raises(DataError, match=r"a0\.jsonl: data file not found"):
            _drain(recipe([str(tmp_path / "*.jsonl*")]))


PATTERNS = [
    ("*/*.jsonl",),
    ("**/*.jsonl",),
    ("b/**",),
    ("a/?0.jsonl",),
    ("[ab]/*.jsonl*",),
    ("*/[!a]*",),
    ("b/*.jsonl*", "*/*.jsonl*", "top.jsonl*"),
    ("*/c/*", "b/*/*.jsonl"),
]


@pytest.mark.parametrize("patterns", PATTERNS, ids=[" ".join(p) for p in PATTERNS])
def test_patterns_match_like_glob(tmp_path: Path, patterns: tuple[str, ...]):
    """The index's names matched as glob matches the folders: same files, order, identity."""
    root = tmp_path / "t"
    _tree(root)
    every = [str(root / p) for p in ("*.jsonl*", "*/*.jsonl*", "*/*/*.jsonl*", "*/*/*.json")]
    hidden = str(root / "a" / ".hidden.jsonl")
    assert zephon("index", *every, hidden, "--quiet") == 0
    spec = DatasetSpec("web", paths=tuple(str(root / p) for p in patterns))
    files = resolve_indexed(spec)
    assert files is not None
    listed = [str(p) for p in spec.files()]  # the folders, listed by glob
    assert files.uris() == listed
    want = json.dumps([file_identity(p) for p in listed], sort_keys=True, separators=(",", ":"))
    assert canonical_json(dataset_identities(spec, lazy=True)) == want


class TestIndexIsTheList:
    """With an index, files added later join when it is rebuilt; verify mode refuses them."""

    def test_new_file(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        """A file added after `zephon index` is not read; ZEPHON_VERIFY_DATA names it."""
        write_corpus(tmp_path, (9, 8))
        assert zephon("index", str(tmp_path / "*.jsonl*"), "--quiet") == 0
        (tmp_path / "z9.jsonl").write_text('{"text": "new"}\n')
        spec = DatasetSpec("web", paths=(str(tmp_path / "*.jsonl*"),))
        files = resolve_indexed(spec)
        assert files is not None and len(files) == 2
        monkeypatch.setenv("ZEPHON_VERIFY_DATA", "1")
        with pytest.raises(DataError, match=r"z9\.jsonl matches .* not in its dataset index"):
            Pipeline(recipe([str(tmp_path / "*.jsonl*")]))

    def test_verify_mode_catches_a_same_size_edit(self, tmp_path: Path, monkeypatch):
        """Size and mtime miss a same-size edit with the time restored; verify mode does not."""
        write_corpus(tmp_path, (9, 8))
        assert zephon("index", str(tmp_path / "*.jsonl*"), "--quiet") == 0
        r = recipe([str(tmp_path / "*.jsonl*")])
        reference = _drain(r)
        f = tmp_path / "a0.jsonl"
        st = f.stat()
        f.write_bytes(f.read_bytes().replace(b"doc 1 ", b"doc 7 "))
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert f.stat().st_size == st.st_size
        assert _drain(r) != reference  # the documented blind spot: the edit is read
        monkeypatch.setenv("ZEPHON_VERIFY_DATA", "1")
        with pytest.raises(DataError, match=r"a0\.jsonl: content differs from the dataset index"):
            _drain(r)


def test_index_deeper_than_the_pattern_falls_back(tmp_path: Path):
    """An index below the pattern's folder (an older layout) is still used shard by shard."""
    write_corpus(tmp_path / "d" / "only", (9, 8))
    r = recipe([str(tmp_path / "d" / "*" / "*.jsonl*")])
    reference = _drain(r)
    assert zephon("index", str(tmp_path / "d" / "only" / "*.jsonl*"), "--quiet") == 0
    assert (tmp_path / "d" / "only" / index.INDEX_NAME).exists()
    pipeline = Pipeline(r)
    assert not isinstance(pipeline.datasets[0].shards, LazyShards)
    assert _drain(r) == reference


def test_relaned_fingerprint_of_an_indexed_dataset(tmp_path: Path):
    """Re-laning copies a canonical form holding the index's lazy file list: same hash."""
    from zephon_nodes.engine.relane import pipeline_at

    write_corpus(tmp_path, (9, 8, 12))
    assert zephon("index", str(tmp_path / "*.jsonl*"), "--quiet") == 0
    r = recipe([str(tmp_path / "*.jsonl*")])
    pipeline = Pipeline(r)
    assert isinstance(pipeline.datasets[0].shards, LazyShards)
    moved = pipeline_at(pipeline, 2)
    assert moved.fingerprint == Pipeline(r.replace(num_lanes=2)).fingerprint
    assert moved.fingerprint != pipeline.fingerprint
