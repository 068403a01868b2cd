"""Damaged MDS and LitData corpora: a DataError naming file, record and problem, never a raw one.

Each corpus is written by its own library (the side folder), then damaged as real data is:
a shard or chunk cut short, an ``index.json`` edited or of other shards. Under
``on_error = "raise"`` the read is refused naming the dataset, the file and the record;
under ``"skip"`` the bad work items are left out and counted, and every record delivered is
the corpus's own (as its library reads it). A damage that a raw ``ValueError`` or
``KeyError`` used to escape (past the skip policy) or that lost records silently is here.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.io import pretokenized_corpora as pc
from zephon_nodes import DatasetSpec, Recipe, TokenizerSpec
from zephon_nodes.core.errors import DataError, RecipeError
from zephon_nodes.core.work_item import WorkItem
from zephon_nodes.io.formats.pretokenized import corpus_files
from zephon_nodes.io.sources import open_dataset
from zephon_nodes.operators.documents import DocBatch
from zephon_nodes.operators.parse import ParseJsonl

N = 12


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[np.ndarray]]:
    """MDS and LitData corpora of ``N`` documents (several shards each), plain and zstd."""
    root = tmp_path_factory.mktemp("corpora")
    docs = pc.documents(N)
    pc.write_mds(root / "mds", docs)
    pc.write_mds(root / "mdsz", docs, compression="zstd")
    pc.write_litdata(root / "lit", docs)
    pc.write_litdata(root / "litz", docs, compression="zstd")
    for folder in ("lit", "litz"):
        assert all(
            np.array_equal(a, b) for a, b in zip(pc.read_litdata(root / folder), docs, strict=True)
        )
    assert all(np.array_equal(a, b) for a, b in zip(pc.read_mds(root / "mds"), docs, strict=True))
    return root, docs


def _first(folder: Path) -> Path:
    index = json.loads((folder / "index.json").read_text())
    if "shards" in index:
        return folder / index["shards"][0]["raw_data"]["basename"]
    return folder / index["chunks"][0]["filename"]


def _edit(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    index = json.loads((folder / "index.json").read_text())
    change(index)
    (folder / "index.json").write_text(json.dumps(index))


def _cut_framed_header(folder: Path) -> None:
    chunk = _first(folder)
    chunk.write_bytes(chunk.read_bytes()[:30])


def _int64_column(folder: Path) -> None:
    _edit(folder, lambda j: j["shards"][0]["column_encodings"].__setitem__(1, "ndarray:int64"))


def _one_sample_fewer(folder: Path) -> None:
    _edit(folder, lambda j: j["shards"][0].__setitem__("samples", j["shards"][0]["samples"] - 1))


def _one_item_fewer(folder: Path) -> None:
    _edit(
        folder, lambda j: j["chunks"][0].__setitem__("chunk_size", j["chunks"][0]["chunk_size"] - 1)
    )


def _size_field(folder: Path) -> None:
    """Sample / item 0's first size (uint32) one byte short: its parts no longer add up."""
    path = _first(folder)
    blob = bytearray(path.read_bytes())
    at = struct.unpack_from("<I", blob, 4)[0]
    struct.pack_into("<I", blob, at, struct.unpack_from("<I", blob, at)[0] - 1)
    path.write_bytes(bytes(blob))


def _shape_field(folder: Path) -> None:
    """Sample 0's ndarray shape (after its size and the 8-byte id) says one id more."""
    path = _first(folder)
    blob = bytearray(path.read_bytes())
    at = struct.unpack_from("<I", blob, 4)[0] + 4 + 8 + 1
    blob[at] += 1
    path.write_bytes(bytes(blob))


READ_DAMAGE: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "framed chunk cut in its header": ("litz", _cut_framed_header, r": a truncated framed chunk"),
    "index.json says int64, shard int32": (
        "mds",
        _int64_column,
        r" sample 0: a token column of 48 bytes is not 12 ids of int64",
    ),
    "index.json lists a sample fewer": (
        "mds",
        _one_sample_fewer,
        r": the shard holds 2 samples, and its index\.json lists it with 1",
    ),
    "index.json lists an item fewer": (
        "lit",
        _one_item_fewer,
        r": the chunk holds \d+ items, and its index\.json lists it with \d+",
    ),
    "sample size field": ("mds", _size_field, r" sample 0: a sample of \d+ bytes, its columns'"),
    "item size field": ("lit", _size_field, r" item 0: an item of \d+ bytes, its leaves'"),
    "ndarray shape": ("mds", _shape_field, r" sample 0: a token column of 48 bytes is not 13 ids"),
}


def _items(shards: tuple[Any, ...], size: int = 2) -> list[WorkItem]:
    out = []
    for i, shard in enumerate(shards):
        for a in range(0, shard.num_records, size):
            b = min(a + size, shard.num_records)
            out.append(WorkItem(0, "c", "text", len(out), 0, shard, a, b, 0, len(out), i))
    return out


@pytest.mark.parametrize("case", list(READ_DAMAGE))
def test_damage_read(case: str, corpora: tuple[Path, list[np.ndarray]], tmp_path: Path) -> None:
    """Refused naming dataset, file and record; under skip counted, the rest the corpus's."""
    root, docs = corpora
    folder, damage, message = READ_DAMAGE[case]
    shutil.copytree(root / folder, tmp_path / folder)
    damage(tmp_path / folder)
    ds = open_dataset(DatasetSpec("c", paths=(folder,), base_dir=tmp_path), 4).dataset
    whole = open_dataset(DatasetSpec("c", paths=(folder,), base_dir=root), 4).dataset
    first = np.cumsum([0] + [s.num_records for s in whole.shards])  # as the writer wrote them
    items = _items(ds.shards)
    with pytest.raises(DataError, match=rf"dataset 'c': \S*/{folder}/\S+{message}"):
        for item in items:
            ParseJsonl()(item)
    skipped = 0
    for item in items:
        batch = ParseJsonl(skip=frozenset({0}))(item)
        skipped += sum(n for _, n in batch.skipped)
        if isinstance(batch, DocBatch):  # what is delivered is the corpus's own documents
            cuts = np.cumsum(batch.lengths)[:-1]
            for record, ids in zip(batch.records, np.split(batch.tokens, cuts), strict=True):
                assert np.array_equal(ids, docs[first[item.shard_index] + record])
    assert skipped > 0


def _no_zip_name(folder: Path) -> None:
    _edit(folder, lambda j: j["shards"][0].__setitem__("raw_data", None))


def _columns_unequal(folder: Path) -> None:
    _edit(folder, lambda j: j["shards"][0]["column_sizes"].pop())


def _no_filename(folder: Path) -> None:
    _edit(folder, lambda j: j["chunks"][0].pop("filename"))


def _bad_spec(folder: Path) -> None:
    _edit(folder, lambda j: j["config"].__setitem__("data_spec", "not json"))


def _bad_format(folder: Path) -> None:
    _edit(folder, lambda j: j["config"].__setitem__("data_format", ["no_header_tensor:x", "int"]))


def _no_config(folder: Path) -> None:
    _edit(folder, lambda j: j.pop("config"))


INDEX_DAMAGE: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "shard entry without its file": (
        "mds",
        _no_zip_name,
        r"index\.json shard 0: not an MDS shard entry \(TypeError",
    ),
    "column lists of other lengths": (
        "mds",
        _columns_unequal,
        r"index\.json shard 0: 2 column names, 2 encodings and 1 sizes",
    ),
    "chunk entry without its file": (
        "lit",
        _no_filename,
        r"index\.json: not a LitData index\.json \(KeyError: 'filename'\)",
    ),
    "data_spec not JSON": ("lit", _bad_spec, r"index\.json: not a LitData index\.json \(JSON"),
    "data_format code not a number": (
        "lit",
        _bad_format,
        r"index\.json: not a LitData index\.json \(ValueError",
    ),
    "no config": ("lit", _no_config, r"index\.json: no data_format in its config"),
}


@pytest.mark.parametrize("case", list(INDEX_DAMAGE))
def test_damage_index(case: str, corpora: tuple[Path, list[np.ndarray]], tmp_path: Path) -> None:
    """An edited index.json: refused naming it, or its corpus skipped and counted."""
    root, docs = corpora
    folder, damage, message = INDEX_DAMAGE[case]
    shutil.copytree(root / folder, tmp_path / "bad")
    shutil.copytree(root / folder, tmp_path / "good")
    damage(tmp_path / "bad")
    spec = DatasetSpec("c", paths=("good", "bad"), base_dir=tmp_path)
    with pytest.raises(DataError, match=rf"dataset 'c': .*bad/{message}"):
        open_dataset(spec, 4)
    skip = DatasetSpec("c", paths=("good", "bad"), base_dir=tmp_path, on_error="skip")
    # The identity lists the files an entry names (the bad entry none): no raw KeyError.
    recipe = Recipe(datasets=(skip,), tokenizer=TokenizerSpec(kind="bytes"), seq_len=16)
    files = recipe.canonical()["datasets"][0]["files"]
    shards = len(list((tmp_path / "good").iterdir())) - 1
    assert len(files) >= 2 + 2 * shards - 1
    opened = open_dataset(skip, 4)
    assert opened.skipped_files == {"unreadable_file": 1}
    got = [ids for s in opened.dataset.shards for _, ids in s.read(0, s.num_records)]
    assert len(got) == N and all(np.array_equal(a, b) for a, b in zip(got, docs, strict=True))


def _rewrite(path: Path, replace: bool) -> None:
    """Change one byte of ``path`` (same size), in place or by a new file renamed over it.

    The modification time is set a second later, as any edit after the run started has it
    (a write in the same clock tick as the corpus was opened could keep it).
    """
    before = path.stat().st_mtime_ns
    blob = bytearray(path.read_bytes())
    blob[-3] ^= 1
    if replace:
        new = path.with_name(path.name + ".new")
        new.write_bytes(bytes(blob))
        new.replace(path)
    else:
        with open(path, "r+b") as f:
            f.write(bytes(blob))
    os.utime(path, ns=(before + 10**9, before + 10**9))


@pytest.mark.parametrize("replace", [False, True], ids=["in place", "replaced"])
@pytest.mark.parametrize("fmt", ["megatron", "mds"])
def test_changed_after_open(
    fmt: str, replace: bool, corpora: tuple[Path, list[np.ndarray]], tmp_path: Path
) -> None:
    """A file edited after the corpus was opened is refused, under skip too: never other ids."""
    root, docs = corpora
    if fmt == "megatron":
        pc.write_megatron(tmp_path / "meg", docs)
        path, changed = "meg.idx", tmp_path / "meg.bin"
    else:
        shutil.copytree(root / "mds", tmp_path / "mds")
        path, changed = "mds", _first(tmp_path / "mds")
    for on_error in ("raise", "skip"):
        spec = DatasetSpec("c", paths=(path,), base_dir=tmp_path, on_error=on_error)
        ds = open_dataset(spec, 4).dataset
        item = _items(ds.shards, size=1)[0]
        _rewrite(changed, replace)
        with pytest.raises(DataError, match=rf"{changed.name}: the file changed during the run"):
            ParseJsonl(skip=frozenset({0} if on_error == "skip" else ()))(item)


@pytest.mark.parametrize("other", ["web.jsonl", "mds"])
def test_mixed_formats_refused(
    other: str, corpora: tuple[Path, list[np.ndarray]], tmp_path: Path
) -> None:
    """A Megatron corpus and a jsonl file or an MDS folder in one dataset: refused, naming them.

    The .idx was read as text before (invalid UTF-8 under raise; under skip its lines were
    skipped as bad records and the corpus lost without an error).
    """
    root, docs = corpora
    pc.write_megatron(tmp_path / "meg", docs)
    (tmp_path / "web.jsonl").write_text('{"text": "web 0"}\n')
    shutil.copytree(root / "mds", tmp_path / "mds")
    message = rf"dataset 'c' mixes formats \('meg\.idx': megatron, '{other}': "
    for on_error in ("raise", "skip"):
        spec = DatasetSpec("c", paths=("meg.idx", other), base_dir=tmp_path, on_error=on_error)
        with pytest.raises(RecipeError, match=message):
            open_dataset(spec, 4)
        with pytest.raises(RecipeError, match=message):
            Recipe(datasets=(spec,), tokenizer=TokenizerSpec(kind="bytes"), seq_len=16).canonical()


_IDX_HEADER = 9 + 8 + 1 + 8 + 8  # magic, version, dtype code, sequence and document counts


def _poke_idx(idx: Path, array: str, k: int, change: Callable[[int], int]) -> None:
    """Change entry ``k`` of one of the ``.idx`` arrays (of a corpus of one sequence a doc)."""
    blob = bytearray(idx.read_bytes())
    s = struct.unpack_from("<Q", blob, 9 + 8 + 1)[0]
    at, fmt = {
        "lengths": (_IDX_HEADER + 4 * k, "<i"),
        "pointers": (_IDX_HEADER + 4 * s + 8 * k, "<q"),
        "documents": (_IDX_HEADER + 12 * s + 8 * k, "<q"),
    }[array]
    struct.pack_into(fmt, blob, at, change(struct.unpack_from(fmt, blob, at)[0]))
    idx.write_bytes(bytes(blob))


IDX_DAMAGE: dict[str, tuple[str, int, Callable[[int], int], int, str]] = {
    # array, entry, change, documents per work item, message
    "first document starts at sequence 1": (
        "documents",
        0,
        lambda v: 1,
        3,
        r"document indices of documents \[0, 3\) \(from 1 to 3 of 12 sequences\)",
    ),
    "last document ends a sequence early": (
        "documents",
        N,
        lambda v: v - 1,
        3,
        r"document indices of documents \[9, 12\) \(from 9 to 11 of 12 sequences\)",
    ),
    "a pointer into the previous document": (
        "pointers",
        5,
        lambda v: v - 2,
        1,
        r"sequence pointers of documents \[5, 6\)",
    ),
    "the first pointer past byte 0": (
        "pointers",
        0,
        lambda v: v + 2,
        1,
        r"sequence pointers of documents \[0, 1\)",
    ),
}


@pytest.mark.parametrize("case", list(IDX_DAMAGE))
def test_megatron_idx_damage(
    case: str, corpora: tuple[Path, list[np.ndarray]], tmp_path: Path
) -> None:
    """A .idx whose documents or pointers do not tile .bin: refused, never other ids."""
    _, docs = corpora
    array, k, change, size, message = IDX_DAMAGE[case]
    pc.write_megatron(tmp_path / "meg", docs)
    _poke_idx(tmp_path / "meg.idx", array, k, change)
    ds = open_dataset(DatasetSpec("c", paths=("meg.idx",), base_dir=tmp_path), 4).dataset
    items = _items(ds.shards, size)
    with pytest.raises(DataError, match=rf"dataset 'c': \S*/meg\.idx: {message} do not fit"):
        for item in items:
            ParseJsonl()(item)
    skipped = 0
    for item in items:
        batch = ParseJsonl(skip=frozenset({0}))(item)
        skipped += sum(n for _, n in batch.skipped)
        if isinstance(batch, DocBatch):
            cuts = np.cumsum(batch.lengths)[:-1]
            for record, ids in zip(batch.records, np.split(batch.tokens, cuts), strict=True):
                assert np.array_equal(ids, docs[record])
    assert skipped > 0


@pytest.mark.parametrize("folder", ["mds", "lit"])
def test_folder_with_a_cut_index_json(
    folder: str, corpora: tuple[Path, list[np.ndarray]], tmp_path: Path
) -> None:
    """A corpus folder whose index.json is cut short: named, not "matches no file".

    Detection gave up on it, so the folder was taken as a text pattern and refused as
    `pattern 'mds' matches no file ... name its files ('mds/*.jsonl')`. With `format`
    named, the corpus is refused or skipped by its on_error.
    """
    root, _ = corpora
    shutil.copytree(root / folder, tmp_path / folder)
    index = tmp_path / folder / "index.json"
    index.write_text(index.read_text()[:50])
    for on_error in ("raise", "skip"):
        spec = DatasetSpec("c", paths=(folder,), base_dir=tmp_path, on_error=on_error)
        with pytest.raises(
            RecipeError,
            match=rf"dataset 'c': pattern '{folder}': \S+/{folder}/index\.json: not a JSON file"
            r".*name the dataset's `format`",
        ):
            open_dataset(spec, 4)
    fmt = "mds" if folder == "mds" else "litdata"
    skip = DatasetSpec("c", paths=(folder,), base_dir=tmp_path, on_error="skip", format=fmt)
    with pytest.raises(DataError, match=r"no readable corpus in 1 \(skipped: \{'unreadable"):
        open_dataset(skip, 4)


def test_a_text_column_beside_the_tokens(tmp_path: Path) -> None:
    """Corpora that keep their text beside the ids: the default text_field 'text' names the
    text; the refusal names the token columns to give instead, which then read as written."""
    docs = pc.documents(5)
    texts = pc.texts(5)
    with pc.side():
        import torch
        from litdata.streaming.writer import BinaryWriter
        from streaming import MDSWriter

        columns = {"text": "str", "tokens": "ndarray:int32"}
        with MDSWriter(out=str(tmp_path / "m"), columns=columns) as w:
            for t, d in zip(texts, docs, strict=True):
                w.write({"text": t, "tokens": d})
        lit = BinaryWriter(str(tmp_path / "l"), chunk_bytes=400)
        for i, (t, d) in enumerate(zip(texts, docs, strict=True)):
            lit[i] = {"text": t, "input_ids": torch.from_numpy(d)}
        lit.done()
        lit.merge()
    for folder, leaf in (("m", "tokens"), ("l", "input_ids")):
        with pytest.raises(
            DataError,
            match=rf"'text' is 'str'; a token (column|leaf) is .*; name one of \['{leaf}'\] "
            r"with the dataset's text_field",
        ):
            open_dataset(DatasetSpec("c", paths=(folder,), base_dir=tmp_path), 4)
        spec = DatasetSpec("c", paths=(folder,), base_dir=tmp_path, text_field=leaf)
        ds = open_dataset(spec, 4).dataset
        got = [ids for s in ds.shards for _, ids in s.read(0, s.num_records)]
        assert all(np.array_equal(a, b) for a, b in zip(got, docs, strict=True))


def test_a_bin_without_its_idx(corpora: tuple[Path, list[np.ndarray]], tmp_path: Path) -> None:
    """A .bin whose .idx is missing (and a .idx whose .bin is): named, or skipped and counted.

    The .bin was taken for JSON lines ("m.bin:1: invalid JSON"; under skip every line
    skipped, the corpus gone without a word), and a missing .bin stopped the fingerprint
    even under skip.
    """
    _, docs = corpora
    pc.write_megatron(tmp_path / "m", docs[:4])
    pc.write_megatron(tmp_path / "n", docs)
    (tmp_path / "m.idx").unlink()
    theirs = pc.read_megatron(tmp_path / "n")
    for pattern in ("m.bin", "*.bin"):
        spec = DatasetSpec("c", paths=(pattern,), base_dir=tmp_path)
        with pytest.raises(DataError, match=r"dataset 'c': \S+/m\.idx: data file not found"):
            open_dataset(spec, 4)
    skip = DatasetSpec("c", paths=("*.bin",), base_dir=tmp_path, on_error="skip")
    opened = open_dataset(skip, 4)
    assert opened.skipped_files == {"missing_file": 1}
    got = [ids for s in opened.dataset.shards for _, ids in s.read(0, s.num_records)]
    assert len(got) == N and all(np.array_equal(a, b) for a, b in zip(got, theirs, strict=True))
    (tmp_path / "m.bin").rename(tmp_path / "m.idx")  # now a .idx without its .bin
    skip = DatasetSpec("c", paths=("*.idx",), base_dir=tmp_path, on_error="skip")
    recipe = Recipe(datasets=(skip,), tokenizer=TokenizerSpec(kind="bytes"), seq_len=16)
    assert [Path(f).name for f in corpus_files(skip, "megatron")] == ["m.idx", "n.idx", "n.bin"]
    files = recipe.canonical()["datasets"][0]["files"]  # no "m.bin: cannot read"
    assert [f["bytes"] for f in files] == [
        (tmp_path / n).stat().st_size for n in ("m.idx", "n.idx", "n.bin")
    ]


def _count(folder: Path, count: int) -> None:
    def change(j: dict[str, Any]) -> None:
        entry = j["shards"][0] if "shards" in j else j["chunks"][0]
        entry["samples" if "shards" in j else "chunk_size"] = count

    _edit(folder, change)


@pytest.mark.parametrize("folder", ["mds", "mdsz", "lit", "litz"])
def test_a_count_no_file_can_hold(
    folder: str, corpora: tuple[Path, list[np.ndarray]], tmp_path: Path
) -> None:
    """An index.json listing billions of records in a small shard: refused when opened.

    It was taken as is, and laying out its work items never ended (a run hung before its
    first batch, under either on_error). A compressed chunk is bounded by its first bytes.
    """
    root, _ = corpora
    shutil.copytree(root / folder, tmp_path / folder)
    _count(tmp_path / folder, 3 * 10**9)
    kind = "samples, and a shard" if folder.startswith("mds") else "items, and a chunk"
    message = rf"index\.json lists 3000000000 {kind} of \d+ bytes holds at most \d+"
    if folder == "litz":  # framed zstd: its prefix's count, read when it is opened
        message = r"the chunk holds \d+ items, and its index\.json lists it with 3000000000"
    with pytest.raises(DataError, match=message):
        open_dataset(DatasetSpec("c", paths=(folder,), base_dir=tmp_path), 4)
    skip = DatasetSpec("c", paths=(folder,), base_dir=tmp_path, on_error="skip")
    with pytest.raises(DataError, match=r"no readable corpus in 1 \(skipped: \{'truncated_file'"):
        open_dataset(skip, 4)


@pytest.mark.parametrize("folder", ["mds", "lit"])
def test_a_file_listed_twice(
    folder: str, corpora: tuple[Path, list[np.ndarray]], tmp_path: Path
) -> None:
    """An index.json naming a shard or chunk twice (merged twice): refused, not read twice."""
    root, _ = corpora
    shutil.copytree(root / folder, tmp_path / folder)
    key = "shards" if folder == "mds" else "chunks"
    _edit(tmp_path / folder, lambda j: j[key].append(dict(j[key][0])))
    last = len(json.loads((root / folder / "index.json").read_text())[key])
    kind = key[:-1]
    with pytest.raises(
        DataError, match=rf"index\.json: {kind}s 0 and {last} are both '\S+' \(its records"
    ):
        open_dataset(DatasetSpec("c", paths=(folder,), base_dir=tmp_path), 4)
