"""Tar shards: member index (built once, cached), keys, reading, truncation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.multimodal.helpers import encode, noise, write_tar
from zephon_nodes.errors import DataError
from zephon_nodes.io.formats import tar as tarmod
from zephon_nodes.io.formats.tar import TarSample, open_tar_shard


def members() -> list[tuple[str, bytes]]:
    return [
        ("a/000.jpg", b"J0"),
        ("a/000.txt", b"first"),
        ("a/000.cls", b"7"),  # not an image or text: ignored
        ("a/001.json", json.dumps({"text": "second"}).encode()),
        ("a/001.webp", b"W1"),
        ("a/001.png", b"P1"),
        ("b.v1/000.png", b"P2"),  # key "b.v1/000": the file name up to its first dot
        ("b.v1/000.txt", b"third"),
        ("c/000.seg.png", b"S"),  # extension "seg.png": not an image field, ignored
    ]


def test_index_keys_and_read(tmp_path: Path) -> None:
    shard = open_tar_shard(write_tar(tmp_path / "s.tar", members()))
    assert shard.num_records == 3
    rows = shard.read(0, 3)
    assert [r for r, _ in rows] == [0, 1, 2]
    assert rows[0][1] == TarSample("a/000", (("jpg", b"J0"),), b"first", None)
    assert rows[1][1] == TarSample(
        "a/001", (("webp", b"W1"), ("png", b"P1")), None, b'{"text": "second"}'
    )
    assert rows[2][1] == TarSample("b.v1/000", (("png", b"P2"),), b"third", None)
    assert shard.read(1, 2) == rows[1:2]
    assert shard.where(2) == f"{tmp_path / 's.tar'} key 'b.v1/000'"


def test_index_is_built_once_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_tar(tmp_path / "s.tar", members())
    first = open_tar_shard(path)
    assert Path(first.index_path).is_file()
    tarmod._INDEXES.clear()

    def boom(_: Path) -> None:
        raise AssertionError("the index was rebuilt")

    monkeypatch.setattr(tarmod, "_index_tar", boom)
    again = open_tar_shard(path)
    assert again == first and again.read(0, 3) == first.read(0, 3)


def test_truncated_and_non_tar(tmp_path: Path) -> None:
    full = write_tar(tmp_path / "full.tar", [("k.png", encode(noise(40, 40, 0))), ("k.txt", b"x")])
    blob = full.read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(blob[:700])
    with pytest.raises(DataError, match=r"cut\.tar: truncated tar"):
        open_tar_shard(cut)
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"this is not a tar file at all" * 30)
    with pytest.raises(DataError, match=r"junk\.tar"):
        open_tar_shard(junk)
