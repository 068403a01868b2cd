"""A dataset's identity: the content checksum and size of each of its files, in order.

This is what joins the recipe fingerprint in place of file paths, so the same bytes copied
to another disk, folder or bucket resume, and a file whose content changed is refused at
resume, named. With a dataset index (``zephon index``) the identities come from the index
and no shard is read; otherwise a local file is hashed (see :mod:`zephon_nodes.io.storage.checksum`)
and a remote one is fetched and indexed once (see :mod:`zephon_nodes.io.storage.remote`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

import xxhash

from zephon_nodes.core.errors import DataError
from zephon_nodes.io.discovery import RecipeDataset, dataset_files
from zephon_nodes.io.formats.pretokenized import corpus_files, pretokenized_format
from zephon_nodes.io.formats.shards import open_shard
from zephon_nodes.io.formats.tar import open_tar_shard
from zephon_nodes.io.index.index import indexed_identity
from zephon_nodes.io.index.table import resolve_indexed
from zephon_nodes.io.nodecache.wholeshard import open_whole_shard
from zephon_nodes.io.storage import storage
from zephon_nodes.io.storage.checksum import file_checksum
from zephon_nodes.io.storage.remote import fetched, known_checksum

__all__ = [
    "MAX_NAMED_FILES",
    "FileIdentities",
    "content_summary",
    "dataset_identities",
    "file_identity",
    "file_names",
]

# A checkpoint names changed files for datasets up to this many files (one short entry each).
MAX_NAMED_FILES = 4096


def file_identity(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Return ``{"checksum": ..., "bytes": ...}`` of one shard file.

    Raises:
        DataError: If the file cannot be read.
    """
    text = str(path)
    found = indexed_identity(text)
    if found is not None:
        return found
    if not storage.is_remote(text):
        p = Path(storage.local_path(text))
        return {"checksum": file_checksum(p), "bytes": p.stat().st_size}

    st = storage.stat(text)
    checksum = known_checksum(text, st)
    if checksum is None:
        checksum = _open_remote(text)
    return {"checksum": checksum, "bytes": st.size}


def _open_remote(uri: str) -> str:
    """Fetch and index a remote shard by its format (once); return its checksum."""
    if uri.endswith((".parquet", ".pq")):
        with fetched(uri, storage.stat(uri)) as (_, checksum):
            return checksum

    if uri.endswith((".idx", ".bin", ".mds", ".zstd", ".gz", "index.json")):
        with fetched(uri, storage.stat(uri)) as (_, checksum):  # pre-tokenized corpora
            return checksum
    try:
        if uri.endswith(".tar"):
            return open_tar_shard(uri).checksum
        if uri.endswith(".zst"):  # decompressed into the bounded node cache only
            return open_whole_shard(uri).checksum

        return open_shard(uri).checksum
    except DataError as e:
        if "not found" in str(e) or "cannot" in str(e):
            raise
        # A corrupt shard still has an identity (``on_error = "skip"`` leaves it out later).
        with fetched(uri, storage.stat(uri)) as (_, checksum):
            return checksum


class FileIdentities(Sequence[dict[str, Any]]):
    """The ``{"checksum", "bytes"}`` of a dataset's files, read from its index's columns.

    A sequence of dicts like the list :func:`dataset_identities` gives without an index;
    :meth:`canonical_json_chunks` is its canonical JSON without building them (see
    :func:`zephon_nodes.recipe.canonical.canonical_json`).

    Args:
        files: The dataset's rows of its index (:class:`~zephon_nodes.io.index.table.IndexedFiles`).
    """

    def __init__(self, files: Any) -> None:
        self.files = files
        self._list: list[dict[str, Any]] | None = None

    def canonical_json_chunks(self) -> list[bytes | memoryview]:
        """The list's JSON (sorted keys, no spaces) as ``json.dumps`` writes it, in pieces."""
        chunks: list[bytes | memoryview] = self.files.table.identities_json(self.files.rows)
        return chunks

    def content_token(self) -> str:
        """A string naming this list's exact text: the index's cache key and the rows."""
        rows = self.files.rows
        digest = xxhash.xxh3_128_hexdigest(rows.astype("<i8").tobytes())
        return f"{self.files.table.folder}|{len(rows)}|{digest}"

    def _text(self) -> bytes:
        return b"".join(bytes(c) for c in self.canonical_json_chunks())

    def _items(self) -> list[dict[str, Any]]:
        if self._list is None:
            self._list = json.loads(self._text())
        return self._list

    def __len__(self) -> int:
        return len(self.files)

    @overload
    def __getitem__(self, k: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, k: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, k: int | slice) -> Any:
        return self._items()[k]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FileIdentities):
            return self._text() == other._text()
        return isinstance(other, list) and self._items() == other

    __hash__ = None  # type: ignore[assignment]

    def __deepcopy__(self, memo: dict[int, Any]) -> FileIdentities:
        return self  # immutable: a copied canonical form shares the index's columns


def dataset_identities(spec: RecipeDataset, lazy: bool = False) -> Sequence[dict[str, Any]]:
    """The identities of a dataset spec's files, in order (what joins the fingerprint).

    Through the dataset's index when one covers its patterns (no file is listed or read;
    ``lazy`` keeps them as :class:`FileIdentities`), else one :func:`file_identity` each.
    """
    fmt = pretokenized_format(spec)
    if fmt is not None:  # every file of its corpora: .idx and .bin, index.json and shards
        return [file_identity(p) for p in corpus_files(spec, fmt)]
    files = resolve_indexed(spec)
    if files is None:
        return [file_identity(p) for p in dataset_files(spec)]
    identities = FileIdentities(files)
    return identities if lazy else list(identities)


def file_names(files: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Short names of a dataset's files for messages: paths below their common directory."""
    texts = [storage.redact(str(f)) for f in files]
    if len(texts) < 2:
        return [t.rsplit("/", 1)[-1] for t in texts]
    parts = [t.split("/") for t in texts]
    # The common leading folders of all are those of the first and last in sorted order;
    # a file's own name is never dropped.
    lo, hi = min(parts), max(parts)
    limit = min(len(p) for p in parts) - 1
    n = 0
    while n < limit and lo[n] == hi[n]:
        n += 1
    return ["/".join(p[n:]) for p in parts]


def _listed(spec: Any) -> list[Any]:
    """The files a dataset's identity covers, in its order (a corpus's files, pre-tokenized)."""
    fmt = pretokenized_format(spec)
    return list(corpus_files(spec, fmt)) if fmt is not None else dataset_files(spec)


def content_summary(datasets: Sequence[Any], canonical: dict[str, Any]) -> dict[str, Any]:
    """Per dataset, ``{short file name: checksum prefix}`` (for naming a changed file).

    Args:
        datasets: The recipe's :class:`~zephon_nodes.recipe.datasets.DatasetSpec` objects.
        canonical: The recipe's canonical form (holding each file's checksum in order).
    """
    out: dict[str, Any] = {}
    for spec, canon in zip(datasets, canonical["datasets"], strict=True):
        files = canon.get("files")
        if not files or len(files) > MAX_NAMED_FILES:
            continue
        # An indexed dataset's files come from its index (its folders are not listed).
        # Names below the common folder: the same from the index's names as from the paths.
        indexed = isinstance(files, FileIdentities)
        names = file_names(files.files.names() if indexed else _listed(spec))
        out[spec.name] = {
            n: f["checksum"].partition(":")[2][:16] for n, f in zip(names, files, strict=True)
        }
    return out
