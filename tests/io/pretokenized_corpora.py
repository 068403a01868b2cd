"""Pre-tokenized corpora written, and read back, by their own libraries (the side folder).

``megatron-core``, ``mosaicml-streaming`` and ``litdata`` live in a side folder
(``make install-test`` fills ``.side-formats``; ``ZEPHON_SIDE_FORMATS`` names another one),
installed without their dependencies so that they never change the venv's torch or numpy.
They are put on ``sys.path`` only here, to write the test corpora and read them back with
each library's own reader; zephon's readers never import them.

The documents are the byte tokenizer's ids of texts that name their record (``doc 7 ...``),
so a check can compare what comes out with the corpus.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SIDE = Path(os.environ.get("ZEPHON_SIDE_FORMATS", ROOT / ".side-formats"))


def texts(n: int, tag: str = "doc") -> list[str]:
    """Texts naming their record, of varied lengths."""
    return [f"{tag} {i} " + "word " * (i % 7 + 1) for i in range(n)]


def byte_ids(text: str) -> np.ndarray:
    """The byte tokenizer's ids of ``text`` (UTF-8 bytes + 3), with its eos (2) appended."""
    return np.concatenate([np.frombuffer(text.encode(), np.uint8).astype(np.int32) + 3, [2]])


def documents(n: int, tag: str = "doc") -> list[np.ndarray]:
    """``n`` documents of byte-tokenizer ids (int32), each ending with eos."""
    return [byte_ids(t).astype(np.int32) for t in texts(n, tag)]


@contextmanager
def side() -> Iterator[None]:
    """The side folder on ``sys.path`` (skips, or fails under CI, when it is not installed)."""
    if not (SIDE / "megatron").is_dir():
        message = f"the writers' side folder {SIDE} is not installed: run `make install-test`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    # streaming imports its vision/multimodal/text datasets (torchvision) on import: not used.
    for name in ("streaming.vision", "streaming.multimodal", "streaming.text"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.path.insert(0, str(SIDE))
    try:
        yield
    finally:
        sys.path.remove(str(SIDE))


def write_megatron(prefix: Path, docs: list[np.ndarray], dtype: Any = np.uint16) -> None:
    """A ``.bin``/``.idx`` pair written by ``megatron.core``'s ``IndexedDatasetBuilder``."""
    import torch

    with side():
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

        builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
        for d in docs:
            builder.add_document(torch.from_numpy(d.astype(np.int64)), [len(d)])
        builder.finalize(f"{prefix}.idx")


def read_megatron(prefix: Path) -> list[np.ndarray]:
    """Each document's ids by ``megatron.core``'s ``IndexedDataset``."""
    with side():
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        ds = IndexedDataset(str(prefix))
        bounds = ds.document_indices
        return [
            np.concatenate([ds[j] for j in range(bounds[i], bounds[i + 1])])
            for i in range(len(bounds) - 1)
        ]


def write_mds(
    folder: Path,
    docs: list[np.ndarray],
    compression: str | None = None,
    size_limit: int = 400,
    dtype: str = "int32",
) -> None:
    """An MDS folder by ``streaming.MDSWriter`` (a token column and an int column)."""
    with side():
        from streaming import MDSWriter

        columns = {"id": "int", "tokens": f"ndarray:{dtype}"}
        with MDSWriter(
            out=str(folder), columns=columns, compression=compression, size_limit=size_limit
        ) as w:
            for i, d in enumerate(docs):
                w.write({"id": i, "tokens": d.astype(dtype)})


def read_mds(folder: Path) -> list[np.ndarray]:
    """Each sample's token column by ``streaming.StreamingDataset``."""
    with side():
        from streaming import StreamingDataset

        ds = StreamingDataset(local=str(folder), shuffle=False, batch_size=1)
        return [np.asarray(ds[i]["tokens"]) for i in range(ds.num_samples)]


def write_litdata(
    folder: Path, docs: list[np.ndarray], chunk_bytes: int = 400, compression: str | None = None
) -> None:
    """LitData chunks by ``litdata``'s ``BinaryWriter`` (what ``optimize`` writes with)."""
    import torch

    with side():
        from litdata.streaming.writer import BinaryWriter

        w = BinaryWriter(str(folder), chunk_bytes=chunk_bytes, compression=compression)
        for i, d in enumerate(docs):
            w[i] = {"input_ids": torch.from_numpy(d.astype(np.int32)), "n": len(d)}
        w.done()
        w.merge()


def read_litdata(folder: Path) -> list[np.ndarray]:
    """Each item's ``input_ids`` by ``litdata.StreamingDataset``."""
    with side():
        from litdata import StreamingDataset

        ds = StreamingDataset(str(folder))
        return [ds[i]["input_ids"].numpy() for i in range(len(ds))]
