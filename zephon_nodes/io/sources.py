"""Open a dataset's files under its ``on_error`` policy.

jsonl, jsonl.zst, Parquet, Arrow, tar, and pre-tokenized corpora (Megatron, MDS, LitData: see
:mod:`zephon_nodes.io.formats.pretokenized`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from zephon_nodes.core.errors import EMPTY_FILE, DataError, RecipeError, skip_reason
from zephon_nodes.io.dataset import Dataset
from zephon_nodes.io.discovery import RecipeDataset, dataset_files
from zephon_nodes.io.formats.arrow import open_arrow_shard
from zephon_nodes.io.formats.parquet import indexed_parquet_shard, open_parquet_shard
from zephon_nodes.io.formats.pretokenized import corpus_entries, open_corpus, pretokenized_format
from zephon_nodes.io.formats.shards import Shard, indexed_shard, memory_shard, open_shard
from zephon_nodes.io.formats.tar import indexed_tar_shard, open_tar_shard
from zephon_nodes.io.index.index import find_entry
from zephon_nodes.io.index.lazyshards import LazyShards
from zephon_nodes.io.index.table import resolve_indexed
from zephon_nodes.io.nodecache.wholeshard import open_whole_shard
from zephon_nodes.io.storage import storage

__all__ = ["OpenedDataset", "open_dataset"]

PARQUET_SUFFIXES = (".parquet", ".pq")


@dataclass(frozen=True)
class OpenedDataset:
    """A dataset ready to cut into work items, and the files it skipped.

    Attributes:
        dataset: The dataset (readable shards only).
        skipped_files: ``{reason: files}`` skipped under ``on_error = "skip"``, and empty
            files (``"empty_file"``, under either policy).
    """

    dataset: Dataset
    skipped_files: dict[str, int] = field(default_factory=dict)


def _open_file(spec: RecipeDataset, path: str, image_column: str | None = None) -> Shard:

    found = find_entry(path)
    if found is not None:
        entry = found[0]
        if entry["kind"] == "parquet":
            return indexed_parquet_shard(path, entry, spec.text_field, image_column)
        if entry["kind"] == "tar":
            return indexed_tar_shard(path, entry)

        return indexed_shard(path, entry)
    if path.endswith(PARQUET_SUFFIXES):
        return open_parquet_shard(path, spec.text_field, image_column)
    if path.endswith(".arrow"):
        return open_arrow_shard(path, (spec.text_field, image_column))
    if path.endswith(".tar"):
        return open_tar_shard(path)
    if path.endswith(".zst"):
        # Its decompressed copy lives in the bounded node cache.

        return open_whole_shard(path)  # type: ignore[return-value]
    return open_shard(path)


HINT_FILES = 100
_HINTED: set[str] = set()


def _hint(spec: RecipeDataset, files: list[Any]) -> None:
    """One line, once per dataset and process: many local shards and no dataset index."""
    if len(files) < HINT_FILES or spec.name in _HINTED or storage.is_remote(files[0]):
        return
    _HINTED.add(spec.name)
    if find_entry(str(files[0])) is None:
        print(
            f"zephon: dataset {spec.name!r}: {len(files)} shards and no dataset index, so "
            f"every shard is read at start-up; `zephon index` builds one (see docs/storage.md)",
            file=sys.stderr,
        )


def _open_indexed(
    spec: RecipeDataset, chunk_size: int, image_column: str | None
) -> OpenedDataset | None:
    """The dataset from its index's columns, opening no shard (None: no index covers it)."""
    files = resolve_indexed(spec)
    if files is None:
        return None
    shards = LazyShards(files, spec.name, spec.text_field, image_column)
    empty = int((shards.records == 0).sum())
    skipped = {EMPTY_FILE: empty} if empty else {}
    return OpenedDataset(Dataset(spec.name, spec.text_field, shards, chunk_size), skipped)


def _open_pretokenized(spec: RecipeDataset, fmt: str, chunk_size: int) -> OpenedDataset:
    """A pre-tokenized dataset: the shards of each of its corpora, in order."""
    shards: list[Any] = []
    skipped: dict[str, int] = {}
    entries = corpus_entries(spec, fmt)
    for entry in entries:
        try:
            opened = open_corpus(spec, fmt, entry)
        except DataError as e:
            if spec.on_error != "skip":
                raise DataError(f"dataset {spec.name!r}: {e}", kind=e.kind) from None
            reason = skip_reason(e, entry)
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        for shard in opened:
            if shard.num_records == 0:
                skipped[EMPTY_FILE] = skipped.get(EMPTY_FILE, 0) + 1
            shards.append(shard)
    if not shards and skipped:
        raise DataError(
            f"dataset {spec.name!r}: no readable corpus in {len(entries)} (skipped: {skipped})"
        )
    return OpenedDataset(Dataset(spec.name, spec.text_field, tuple(shards), chunk_size), skipped)


def open_dataset(
    spec: RecipeDataset, chunk_size: int, image_column: str | None = None
) -> OpenedDataset:
    """Open (and index, once per machine) every file of ``spec``.

    An empty file is valid and contributes no work items (it is counted under
    ``"empty_file"`` in the skipped files, under either policy). A corrupt or truncated zstd
    stream or an unreadable Parquet file raises
    :class:`DataError` naming the dataset and file under ``on_error = "raise"``; under
    ``"skip"`` the file is left out and counted by reason. Which files are left out depends
    only on the files, so every rank and restart agrees. ``image_column`` (multimodal
    recipes) names a Parquet binary image column to read with the text.

    When a dataset index covers the dataset's patterns
    (:func:`~zephon_nodes.io.index.table.resolve_indexed`), no file is listed or opened here: the
    shards are :class:`~zephon_nodes.io.index.lazyshards.LazyShards`, each checked against its
    entry when a work item of it is first read, and a shard that no longer matches is
    refused then (``on_error = "skip"`` cannot leave it out: the work items are laid out).

    Raises:
        DataError: A bad file under ``"raise"``, or no readable record at all.
    """
    if spec.chunk_size is not None:
        chunk_size = spec.chunk_size
    if spec.records is not None:
        shards: list[Shard] = [memory_shard(spec.name, spec.records)]
        return OpenedDataset(Dataset(spec.name, spec.text_field, tuple(shards), chunk_size))

    fmt = pretokenized_format(spec)
    if fmt is not None:
        if image_column is not None:
            raise RecipeError(
                f"dataset {spec.name!r}: a pre-tokenized corpus ({fmt}) holds token ids, and "
                f"an [image] recipe reads text and images: use it in a text recipe"
            )
        return _open_pretokenized(spec, fmt, chunk_size)
    lazy = _open_indexed(spec, chunk_size, image_column)
    if lazy is not None:
        return lazy
    shards = []
    skipped: dict[str, int] = {}
    files = dataset_files(spec)
    _hint(spec, files)
    for path in files:
        try:
            # An empty shard (0 records) is valid and contributes no work items (issue 2);
            # it is reported under "empty_file" with the skipped files, whatever the policy.
            shard = _open_file(spec, str(path), image_column)
            if shard.num_records == 0:
                skipped[EMPTY_FILE] = skipped.get(EMPTY_FILE, 0) + 1
        except DataError as e:
            if spec.on_error != "skip":
                raise DataError(f"dataset {spec.name!r}: {e}", kind=e.kind) from None
            reason = skip_reason(e, str(path))
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        shards.append(shard)
    if not shards and skipped:
        raise DataError(
            f"dataset {spec.name!r}: no readable record in {len(files)} file(s) "
            f"(skipped: {skipped})"
        )
    return OpenedDataset(Dataset(spec.name, spec.text_field, tuple(shards), chunk_size), skipped)
