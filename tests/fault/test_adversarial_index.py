"""A tampered dataset index is refused naming the shard and `zephon index`; index builds write
nothing next to the shards (issue 27, cases 1 and 8)."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
import zstandard

from tests.commands.run import zephon
from tests.io.test_remote_digests import recipe, run
from zephon_nodes import Pipeline, simulate
from zephon_nodes.core.errors import DataError
from zephon_nodes.io.index import index
from zephon_nodes.io.index.indexcheck import seal


@pytest.fixture(autouse=True)
def _fresh_manifests():
    index.forget()
    yield
    index.forget()


def _corpus(root: Path) -> None:
    """a.jsonl: 173 records; b.jsonl.zst: 40 records in one frame; c.jsonl.zst: 2 frames."""
    root.mkdir(parents=True, exist_ok=True)
    docs = [json.dumps({"text": f"doc {i} " + "w " * (i % 7)}) for i in range(253)]
    (root / "a.jsonl").write_text("\n".join(docs[:173]) + "\n")
    z = zstandard.ZstdCompressor()
    (root / "b.jsonl.zst").write_bytes(z.compress(("\n".join(docs[173:213]) + "\n").encode()))
    (root / "c.jsonl.zst").write_bytes(
        z.compress(("\n".join(docs[213:233]) + "\n").encode())
        + z.compress(("\n".join(docs[233:]) + "\n").encode())
    )


def _indexed(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    _corpus(tmp_path / "d")
    assert zephon("index", str(tmp_path / "d" / "*.jsonl*"), "--every", "16", "--quiet") == 0
    location = tmp_path / "d" / index.INDEX_NAME
    return location, json.loads(location.read_text())


def _reseal(location: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` with a valid seal (what a careful forger, or a bug, would write)."""
    manifest = {k: v for k, v in manifest.items() if k != "seal"}
    blob = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
    location.write_bytes(seal(blob))
    index.forget()


def _digests(tmp_path: Path, steps: int = 12) -> list[str]:
    return run(recipe([str(tmp_path / "d" / "*.jsonl*")]), 1, steps)


def _refused(tmp_path: Path, *needles: str) -> str:
    with pytest.raises(DataError) as e:
        _digests(tmp_path, 40)
    text = str(e.value)
    assert "zephon index" in text, text
    for needle in needles:
        assert needle in text, text
    assert "\n" not in text
    return text


def test_the_written_index_is_sealed_and_gives_the_unindexed_digests(tmp_path):
    """Sealing changes nothing of the output: indexed digests == unindexed digests."""
    _corpus(tmp_path / "d")
    before = _digests(tmp_path, 40)
    _, manifest = _indexed(tmp_path)
    assert manifest["seal"].startswith("xxh3_128:")
    assert _digests(tmp_path, 40) == before


def test_a_flipped_bit_in_records_is_refused(tmp_path):
    """ "records":173 -> 172 (one bit), not resealed: refused before any batch."""
    location, _ = _indexed(tmp_path)
    raw = location.read_bytes()
    assert raw.count(b'"records":173') == 1
    location.write_bytes(raw.replace(b'"records":173', b'"records":172'))
    _refused(tmp_path, "does not match its seal", index.INDEX_NAME)


def test_an_unsealed_index_is_refused(tmp_path):
    """An index without a seal (older writer, or hand-written) is not trusted."""
    location, manifest = _indexed(tmp_path)
    del manifest["seal"]
    location.write_text(json.dumps(manifest))
    _refused(tmp_path, "no seal")


def test_a_duplicated_key_is_refused_even_when_sealed(tmp_path):
    """{"records":173,...,"records":172} (last wins in json.loads) is refused."""
    location, manifest = _indexed(tmp_path)
    del manifest["seal"]
    blob = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
    blob = blob.replace(b'"records":173', b'"records":173,"records":172')
    location.write_bytes(seal(blob))
    _refused(tmp_path, "'records' twice")


@pytest.mark.parametrize(
    ("shard", "key", "value", "needle"),
    [
        ("a.jsonl", "records", -1, "records=-1"),
        ("a.jsonl", "records", -50, "records=-50"),
        ("a.jsonl", "records", 0, "offsets"),
        ("a.jsonl", "records", 273, "offsets"),  # +100
        ("a.jsonl", "records", 10**12, "cannot fit"),
        ("a.jsonl", "records", True, "records=True"),
        ("b.jsonl.zst", "records", -1, "records=-1"),
        ("a.jsonl", "offsets", [], "offsets"),
        ("a.jsonl", "every", 0, "every=0"),
        ("a.jsonl", "kind", "parquet", "kind='parquet'"),
        ("a.jsonl", "bytes", -5, "bytes=-5"),
        ("a.jsonl", "end", 10**15, "end="),
        ("c.jsonl.zst", "frames", [[0, 5, 5]], "frames"),
        ("a.jsonl", "checksum", "md5:00", "checksum="),
    ],
)
def test_impossible_values_are_refused_naming_the_shard(tmp_path, shard, key, value, needle):
    """Every value is range-checked, even in an index with a valid seal."""
    location, manifest = _indexed(tmp_path)
    manifest["shards"][shard][key] = value
    _reseal(location, manifest)
    _refused(tmp_path, needle, f"d/{shard}")


def test_a_resealed_record_count_off_by_one_is_refused_when_read(tmp_path):
    """173 -> 172 resealed passes every range check: the read of the tail refuses it."""
    location, manifest = _indexed(tmp_path)
    manifest["shards"]["a.jsonl"]["records"] = 172
    _reseal(location, manifest)
    _refused(tmp_path, "a.jsonl", "the index says 12")


def test_the_cli_exits_2_in_one_line(tmp_path, capsys):
    """`zephon digest` on a tampered index: exit 2, one line, no traceback."""
    location, manifest = _indexed(tmp_path)
    manifest["shards"]["a.jsonl"]["records"] = -1
    _reseal(location, manifest)
    toml = tmp_path / "r.toml"
    toml.write_text(
        f'seed = 1\nnum_lanes = 2\nglobal_batch_size = 4\nseq_len = 16\n[tokenizer]\nkind = "bytes"'
        f'\n[[datasets]]\nname = "web"\npaths = ["{tmp_path}/d/*.jsonl*"]\n'
    )
    capsys.readouterr()
    assert zephon("digest", str(toml), "--steps", "3") == 2
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "records=-1" in out and "zephon index" in out


def test_index_of_a_read_only_folder_with_output_elsewhere(tmp_path):
    """No temporary file is written next to the shards: a read-only data folder works."""
    _corpus(tmp_path / "d")
    folder = tmp_path / "d"
    before = sorted(os.listdir(folder))
    seen: set[str] = set()
    stop = threading.Event()

    def watch() -> None:  # as root the mode does not stop a write: watch the folder too
        while not stop.is_set():
            seen.update(os.listdir(folder))

    watcher = threading.Thread(target=watch)
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    watcher.start()
    try:
        out = tmp_path / "elsewhere" / index.INDEX_NAME
        assert zephon("index", str(folder / "*.jsonl*"), "--output", str(out), "--quiet") == 0
        assert json.loads(out.read_text())["shards"]["b.jsonl.zst"]["records"] == 40
    finally:
        stop.set()
        watcher.join()
        folder.chmod(0o755)
    assert sorted(os.listdir(folder)) == before and seen == set(before)


def test_concurrent_index_builds_of_the_same_shards(tmp_path):
    """Several `zephon index` runs at once over the same .zst shards all succeed."""
    _corpus(tmp_path / "d")
    errors: list[BaseException] = []
    seen: set[str] = set()
    stop = threading.Event()

    def watch() -> None:  # any temporary file next to the shards is a failure
        while not stop.is_set():
            seen.update(os.listdir(tmp_path / "d"))

    def build(k: int) -> None:
        try:
            directory, manifest = index.build_index([str(tmp_path / "d" / "*.zst")], workers=2)
            index.write_index(manifest, str(tmp_path / f"out{k}" / index.INDEX_NAME), directory)
        except BaseException as e:  # collected and asserted below
            errors.append(e)

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=build, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    assert errors == []
    assert seen == {"a.jsonl", "b.jsonl.zst", "c.jsonl.zst"}
    texts = {(tmp_path / f"out{k}" / index.INDEX_NAME).read_bytes() for k in range(4)}
    assert len(texts) == 1


def test_an_indexed_start_still_reads_nothing(tmp_path, monkeypatch):
    """Checking the seal and values reads the index only: no shard is opened at build."""
    from tests.io.test_index import no_shard_reads

    _indexed(tmp_path)
    r = recipe([str(tmp_path / "d" / "*.jsonl*")])
    with monkeypatch.context() as m:
        no_shard_reads(m)
        pipeline = Pipeline(r)
    assert len([x for x, _ in simulate(pipeline, 1, 3)]) == 3
