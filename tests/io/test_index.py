"""The dataset index: `zephon index`, start-up without reading shards, refusal on mismatch."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.commands.run import zephon
from tests.io.conftest import S3Server, s3_put_tree
from tests.io.test_remote_digests import recipe, run, write_corpus
from zephon_nodes import DatasetSpec, Pipeline
from zephon_nodes.core.errors import DataError
from zephon_nodes.io import identity
from zephon_nodes.io.formats import copies, lines, parquet, shards, tar
from zephon_nodes.io.index import index
from zephon_nodes.io.nodecache import wholeshard
from zephon_nodes.io.storage import checksum, storage


@pytest.fixture(autouse=True)
def _fresh_manifests():
    index.forget()
    yield
    index.forget()


def no_shard_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any read of shard content fail (what an indexed start-up must not do)."""

    def refuse(*a: Any, **k: Any) -> Any:
        raise AssertionError(f"a shard was read at start-up: {a[:1]}")

    for module in (shards, tar, parquet, identity, index):
        if hasattr(module, "file_checksum"):
            monkeypatch.setattr(module, "file_checksum", refuse)
    for module in (lines, copies, wholeshard, index):  # each holds its own name of it
        monkeypatch.setattr(module, "index_file", refuse)
    monkeypatch.setattr(tar, "_index_tar", refuse)
    monkeypatch.setattr(storage, "fetch", refuse)


class TestIndexCommand:
    """`zephon index` writes a versioned manifest next to the shards."""

    def test_manifest_fields(self, tmp_path, capsys):
        """Counts, sizes, offsets of every k-th record and zstd frames are recorded."""
        lines = [f'{{"text": "{"x" * i}"}}' for i in range(10)]
        (tmp_path / "a.jsonl").write_text("\n".join([*lines[:4], "", *lines[4:]]) + "\n")
        names = write_corpus(tmp_path / "z", (0, 0, 9))
        assert zephon("index", str(tmp_path / "*.jsonl"), "--every", "3", "--quiet") == 0
        assert "1 shard(s), 10 records" in capsys.readouterr().out
        data = json.loads((tmp_path / index.INDEX_NAME).read_text())
        assert data["format"] == "zephon-index" and data["version"] == 1
        entry = data["shards"]["a.jsonl"]
        # record k starts after k earlier lines (+1 blank line before record 4)
        starts = [sum(len(x) + 1 for x in lines[:k]) + (1 if k >= 4 else 0) for k in range(10)]
        assert entry["records"] == 10 and entry["offsets"] == starts[::3]
        assert entry["bytes"] == (tmp_path / "a.jsonl").stat().st_size
        assert entry["checksum"].startswith("xxh3_128:") and entry["every"] == 3
        assert zephon("index", str(tmp_path / "z" / names[2]), "--quiet") == 0
        z = json.loads((tmp_path / "z" / index.INDEX_NAME).read_text())["shards"][names[2]]
        assert z["records"] == 9 and len(z["frames"]) == 2
        assert sum(f[1] for f in z["frames"]) == z["bytes"]

    def test_no_match_is_an_error(self, tmp_path, capsys):
        """A pattern matching nothing exits 2 with one line."""
        assert zephon("index", str(tmp_path / "*.jsonl")) == 2
        assert "matches no file" in capsys.readouterr().out

    def test_a_folder_is_named_as_one(self, tmp_path, capsys):
        """A folder given as the pattern: one line saying so and how to name its shards."""
        (tmp_path / "data").mkdir()
        (tmp_path / "data" / "a.jsonl").write_text('{"text": "x"}\n')
        assert zephon("index", str(tmp_path / "data")) == 2
        out = capsys.readouterr().out
        assert "it is a folder; name its shards" in out and "data/*.jsonl" in out


class TestIndexedStartup:
    """With an index, building the pipeline reads no shard; digests do not change."""

    def test_local(self, tmp_path, monkeypatch):
        """Indexed local jsonl and jsonl.zst: no read at build, same digests."""
        write_corpus(tmp_path)
        r = recipe([str(tmp_path / "*.jsonl*")])
        reference = run(r, 2, 4)
        assert zephon("index", str(tmp_path / "*.jsonl*"), "--every", "2", "--quiet") == 0
        with monkeypatch.context() as m:
            no_shard_reads(m)
            pipeline = Pipeline(r)
        assert pipeline.fingerprint == Pipeline(r).fingerprint
        assert [x.digest for x in _steps(pipeline, 4)] == reference

    def test_index_above_sub_folders(self, tmp_path, monkeypatch):
        """An index in a parent folder covers shards in its sub-folders."""
        write_corpus(tmp_path / "a")
        write_corpus(tmp_path / "b", (5, 9))
        r = recipe([str(tmp_path / "*" / "*.jsonl*")])
        reference = run(r, 2, 4)
        assert zephon("index", str(tmp_path / "*" / "*.jsonl*"), "--quiet") == 0
        assert (tmp_path / index.INDEX_NAME).exists()
        with monkeypatch.context() as m:
            no_shard_reads(m)
            pipeline = Pipeline(r)
        assert [x.digest for x in _steps(pipeline, 4)] == reference

    def test_s3(self, tmp_path, s3_env: S3Server, monkeypatch):
        """An index written next to S3 shards is found there; no shard read at build."""
        write_corpus(tmp_path)
        reference = run(recipe([str(tmp_path / "*.jsonl*")]), 2, 4)
        base = s3_put_tree(s3_env, "indexed", tmp_path, "c")
        assert zephon("index", base + "/*.jsonl*", "--quiet") == 0
        assert storage.stat(base + "/" + index.INDEX_NAME).size > 0
        import s3fs

        heads: list[str] = []
        real_info = s3fs.S3FileSystem._info

        async def counting_info(self: Any, path: str, **kw: Any) -> Any:
            heads.append(path)
            return await real_info(self, path, **kw)

        with monkeypatch.context() as m:
            no_shard_reads(m)
            m.setattr(s3fs.S3FileSystem, "_info", counting_info)
            pipeline = Pipeline(recipe([base + "/*.jsonl*"]))
        # No request per shard (no listing either: the index lists the shards).
        assert [h for h in heads if h.endswith((".jsonl", ".zst"))] == []
        assert [x.digest for x in _steps(pipeline, 4)] == reference

    def test_parquet_and_named_index(self, tmp_path, monkeypatch):
        """Parquet row groups from an index kept elsewhere (`index = ...`): same digests."""
        data = tmp_path / "data"
        data.mkdir()
        for k in range(2):
            table = pa.table({"text": [f"row {k} {i} " * (i % 5 + 1) for i in range(30)]})
            pq.write_table(table, data / f"p{k}.parquet", row_group_size=7)
        r = recipe([str(data / "*.parquet")])
        reference = run(r, 2, 4)
        out = tmp_path / "meta" / "idx.json"
        assert zephon("index", str(data / "*.parquet"), "--output", str(out), "--quiet") == 0
        spec = DatasetSpec("web", paths=(str(data / "*.parquet"),), index=str(out))
        with monkeypatch.context() as m:
            no_shard_reads(m)
            pipeline = Pipeline(r.replace(datasets=(spec,)))
        assert [x.digest for x in _steps(pipeline, 4)] == reference

    def test_tar_entry_reads_like_an_opened_shard(self, tmp_path):
        """A tar shard from its index entry reads the same samples as one opened directly."""
        import io
        import tarfile

        with tarfile.open(tmp_path / "s.tar", "w") as t:
            for i in range(5):
                for ext, blob in (("txt", f"caption {i}".encode()), ("jpg", bytes([i]) * 9)):
                    info = tarfile.TarInfo(f"k{i}.{ext}")
                    info.size = len(blob)
                    t.addfile(info, io.BytesIO(blob))
        entry = index.build_entry(str(tmp_path / "s.tar"))
        direct = tar.open_tar_shard(tmp_path / "s.tar")
        via = tar.indexed_tar_shard(str(tmp_path / "s.tar"), entry)
        assert via.num_records == 5 and via.read(1, 4) == direct.read(1, 4)
        assert via.read(2, 3)[0][1].text == b"caption 2"


class TestMismatch:
    """An index that does not match its shard is refused, naming it and the rebuild."""

    def test_size_change_is_refused(self, tmp_path):
        """An appended shard: refused when it is opened, with its name and `zephon index`."""
        write_corpus(tmp_path)
        assert zephon("index", str(tmp_path / "*.jsonl*"), "--quiet") == 0
        with open(tmp_path / "a0.jsonl", "a") as f:
            f.write('{"text": "more"}\n')
        # Refused when the shard is opened: at build under balanced dealing by tokens (the
        # default for a small finite dataset reads every item then), else when first read.
        with pytest.raises(DataError, match=r"a0\.jsonl: the dataset index says .*zephon index"):
            _drain(Pipeline(recipe([str(tmp_path / "*.jsonl*")])))

    def test_copy_with_new_mtime_is_accepted_but_other_content_is_not(self, tmp_path):
        """A copy (new mtime, same bytes) passes; a same-size edit fails naming the file."""
        write_corpus(tmp_path / "src")
        assert zephon("index", str(tmp_path / "src" / "*.jsonl*"), "--quiet") == 0
        shutil.copytree(tmp_path / "src", tmp_path / "dst", copy_function=shutil.copyfile)
        index.forget()
        reference = run(recipe([str(tmp_path / "src" / "*.jsonl*")]), 1)
        assert run(recipe([str(tmp_path / "dst" / "*.jsonl*")]), 1) == reference
        f = tmp_path / "dst" / "a0.jsonl"
        blob = f.read_bytes()
        f.write_bytes(blob.replace(b"doc 1 ", b"doc 9 "))
        os.utime(f, ns=(1, 1))
        index.forget()
        with pytest.raises(DataError, match=r"a0\.jsonl: content differs from the dataset index"):
            _drain(Pipeline(recipe([str(tmp_path / "dst" / "*.jsonl*")])))


def _drain(pipeline: Pipeline) -> int:
    """Run a finite pipeline to its end (every shard is opened); return the step count."""
    from zephon_nodes import simulate

    return sum(1 for _ in simulate(pipeline, 1, 10**6))


def _steps(pipeline: Pipeline, n: int) -> list[Any]:
    from zephon_nodes import simulate

    return [x for x, _ in simulate(pipeline, 2, n)]


@settings(max_examples=3)
@given(
    sizes=st.lists(st.integers(0, 25), min_size=1, max_size=6).filter(lambda s: sum(s) >= 8),
    indexed=st.booleans(),
    every=st.integers(1, 5),
)
def test_random_corpora_remote_equals_local(
    sizes, indexed, every, s3_server: S3Server, tmp_path_factory
):
    """Random shard counts and sizes, index present or absent: S3 digests equal local ones."""
    root: Path = tmp_path_factory.mktemp("h")
    write_corpus(root, tuple(sizes))
    reference = run(recipe([str(root / "*.jsonl*")]), 1, 4, num_workers=1)
    with pytest.MonkeyPatch.context() as m:
        for k, v in s3_server.env.items():
            m.setenv(k, v)
        storage._forget_filesystems()
        index.forget()
        bucket = "h" + checksum.Hasher().hexdigest()[-8:] + root.name.replace("_", "").lower()
        base = s3_put_tree(s3_server, bucket[:40], root)
        if indexed:
            assert zephon("index", base + "/*.jsonl*", "--every", str(every), "--quiet") == 0
        assert run(recipe([base + "/*.jsonl*"]), 2, 4) == reference
    storage._forget_filesystems()


def test_multi_frame_zst_is_read_frame_by_frame(tmp_path, monkeypatch):
    """With an index, a work item in the second frame reads only that frame's bytes."""
    import zstandard

    lines = [json.dumps({"text": f"record {i} " * 4}) for i in range(60)]
    frames = [("\n".join(lines[k : k + 20]) + "\n").encode() for k in (0, 20, 40)]
    blobs = [zstandard.ZstdCompressor().compress(f) for f in frames]
    (tmp_path / "m.jsonl.zst").write_bytes(b"".join(blobs))
    assert zephon("index", str(tmp_path / "m.jsonl.zst"), "--every", "8", "--quiet") == 0
    entry, _ = index.find_entry(str(tmp_path / "m.jsonl.zst"))
    shard = shards.indexed_shard(str(tmp_path / "m.jsonl.zst"), entry)
    seen: list[tuple[int, int]] = []
    real = storage.read_range

    def spy(uri: str, start: int, stop: int, **kw: Any) -> bytes:
        seen.append((start, stop))
        return real(uri, start, stop, **kw)

    monkeypatch.setattr(storage, "read_range", spy)
    got = shard.read(25, 30)
    assert [r.decode() for _, r in got] == lines[25:30]
    assert seen == [(len(blobs[0]), len(blobs[0]) + len(blobs[1]))]
    assert [r.decode() for _, r in shard.read(0, 60)] == lines


def test_an_index_in_its_data_folder_is_never_a_shard(tmp_path):
    """``zephon index 'data/*'`` writes ``data/zephon-index.json``; the next ``data/*``
    (another ``zephon index``, or a recipe's pattern) must not read it as a shard.

    Before: the second index listed 3 shards (its own manifest one of them), and a recipe
    over ``data/*`` was refused ("the dataset index says 487 bytes, the file has 670;
    rebuild it"), which rebuilding only repeated.
    """
    data = tmp_path / "data"
    names = write_corpus(data)
    for _ in range(2):
        assert zephon("index", str(data / "*"), "--quiet") == 0
        manifest = json.loads((data / index.INDEX_NAME).read_text())
        assert sorted(manifest["shards"]) == sorted(names)
    wildcard = run(recipe([str(data / "*")]))
    assert wildcard == run(recipe([str(data / n) for n in sorted(names)]))
    assert index.is_index_file("s3://bucket/data/zephon-index.json")
    assert not index.is_index_file("s3://bucket/data/zephon-index.json.zst")
