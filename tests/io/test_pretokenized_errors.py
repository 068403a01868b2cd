"""Bad pre-tokenized corpora are refused in one line naming the dataset and the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.io import pretokenized_corpora as pc
from zephon_nodes import DatasetSpec
from zephon_nodes.core.errors import DataError, RecipeError
from zephon_nodes.io.sources import OpenedDataset, open_dataset


def _open(tmp_path: Path, *paths: str, **kw: Any) -> OpenedDataset:
    return open_dataset(DatasetSpec("c", paths=paths, base_dir=tmp_path, **kw), 4)


def test_megatron_damage(tmp_path: Path) -> None:
    """A truncated or missing .bin, a foreign .idx: refused, or skipped and counted."""
    pc.write_megatron(tmp_path / "a", pc.documents(6))
    pc.write_megatron(tmp_path / "b", pc.documents(9))
    blob = (tmp_path / "b.bin").read_bytes()
    (tmp_path / "b.bin").write_bytes(blob[:-6])
    with pytest.raises(DataError, match=r"dataset 'c': .*b\.bin: \d+ bytes, its \.idx says"):
        _open(tmp_path, "*.idx")
    opened = _open(tmp_path, "*.idx", on_error="skip")
    assert [s.num_records for s in opened.dataset.shards] == [6]
    assert sum(opened.skipped_files.values()) == 1
    (tmp_path / "b.bin").unlink()
    with pytest.raises(DataError, match=r"b\.bin: data file not found"):
        _open(tmp_path, "b.idx", format="megatron")
    (tmp_path / "c.idx").write_bytes(b"NOTMEGATRON" + bytes(40))
    (tmp_path / "c.bin").write_bytes(b"")
    with pytest.raises(DataError, match=r"c\.idx: not a Megatron \.idx file \(magic"):
        _open(tmp_path, "c", format="megatron")


def test_mds_token_column(tmp_path: Path) -> None:
    """The token column is found by name or as the only ndarray; a bytes column is refused."""
    docs = pc.documents(5)
    pc.write_mds(tmp_path / "m", docs)
    ds = _open(tmp_path, "m").dataset
    got = [ids for s in ds.shards for _, ids in s.read(0, s.num_records)]
    assert all(np.array_equal(a, d) for a, d in zip(got, docs, strict=True))
    with pc.side():
        from streaming import MDSWriter

        with MDSWriter(out=str(tmp_path / "b"), columns={"tokens": "bytes"}) as w:
            for d in docs:
                w.write({"tokens": d.astype(np.int64).tobytes()})
    with pytest.raises(DataError, match=r"no token column 'text' \(columns \['tokens'\]\)"):
        _open(tmp_path, "b", format="mds")
    with pytest.raises(
        DataError,
        match=r"column 'tokens' is 'bytes'; a token column is an "
        r"ndarray of integers",
    ):
        _open(tmp_path, "b", format="mds", text_field="tokens")


def test_litdata_token_stream_refused(tmp_path: Path) -> None:
    """TokensLoader chunks have no documents: refused naming the index."""
    folder = tmp_path / "t"
    folder.mkdir()
    index = {"chunks": [], "config": {"item_loader": "TokensLoader", "data_format": ["int"]}}
    (folder / "index.json").write_text(json.dumps(index))
    with pytest.raises(DataError, match=r"t/index\.json: chunks of LitData's TokensLoader"):
        _open(tmp_path, "t")


def test_unknown_format_refused(tmp_path: Path) -> None:
    """`format` must be one of the pre-tokenized formats."""
    with pytest.raises(RecipeError, match=r"format='arrowz' must be one of \('megatron'"):
        DatasetSpec("c", paths=("x",), format="arrowz")
