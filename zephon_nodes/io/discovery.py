"""File discovery: a recipe dataset's glob patterns resolved to its files, its index registered.

The recipe says *which* data (:class:`~zephon_nodes.recipe.datasets.DatasetSpec`: patterns
relative to the recipe's folder, an optional index location); this module finds it. Local
patterns are globbed (``**`` recursive), a Hugging Face ``save_to_disk`` folder stands for its
``.arrow`` files (:func:`~zephon_nodes.io.formats.arrow.expand_dataset_dirs`), remote ones
(``s3://``, ...) are listed through :mod:`zephon_nodes.io.storage.storage`. A dataset that
names its index registers it (:func:`~zephon_nodes.io.index.index.use_index`) before any file
is opened. io reads a recipe dataset only through the :class:`RecipeDataset` protocol, so it
imports nothing of the recipe.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.io.formats.arrow import expand_dataset_dirs
from zephon_nodes.io.index.index import is_index_file, use_index
from zephon_nodes.io.storage import storage
from zephon_nodes.io.storage.checksum import build_memo

__all__ = ["RecipeDataset", "dataset_files"]


class RecipeDataset(Protocol):
    """The fields of a recipe's ``[[datasets]]`` entry that io reads.

    :class:`~zephon_nodes.recipe.datasets.DatasetSpec` is the one implementation; see it for
    what each field means.
    """

    @property
    def name(self) -> str:
        """Name used in errors, stats and the fingerprint."""

    @property
    def paths(self) -> tuple[str, ...]:
        """Glob patterns or URIs of the shards, relative to ``base_dir``."""

    @property
    def base_dir(self) -> Path:
        """Directory the patterns are relative to."""

    @property
    def index(self) -> str | None:
        """Where the dataset index is, if not next to the shards."""

    @property
    def text_field(self) -> str:
        """Record field holding the text."""

    @property
    def records(self) -> Sequence[Mapping[str, Any]] | None:
        """In-memory records instead of files."""

    @property
    def on_error(self) -> str:
        """``"raise"`` or ``"skip"`` bad input."""

    @property
    def chunk_size(self) -> int | None:
        """Records per work item of this dataset (None: the recipe's)."""


def _is_shard(dataset: RecipeDataset, match: str) -> bool:
    """Whether a local match is a file to read; a folder is not (as ``glob`` returns them).

    Raises:
        RecipeError: A match that is neither a file nor a folder: a symbolic link whose
            target is missing or that loops, a FIFO, a device. Left out, it would be data
            silently lost (a shard of a half-copied folder, a cache link to a deleted blob).
    """
    if os.path.isfile(match):
        return True
    if os.path.isdir(match):
        return False
    if os.path.islink(match):
        why = (
            f"a symbolic link to {os.readlink(match)!r}, which cannot be opened (missing or a loop)"
        )
    else:
        why = "not a regular file (a FIFO, a socket or a device)"
    raise RecipeError(f"dataset {dataset.name!r}: {match} is {why}; remove it or fix the link")


def dataset_files(dataset: RecipeDataset) -> list[Any]:
    """Resolve a dataset's glob patterns into a sorted list of files.

    Local files come back as :class:`~pathlib.Path`, remote ones (``s3://``, ...) as URI
    strings (see :mod:`zephon_nodes.io.storage.storage`); each pattern's matches are sorted,
    and a file matched by two patterns is listed once, where it is first matched. Listed once
    per pipeline build (:func:`~zephon_nodes.io.storage.checksum.build_memo`).

    Raises:
        RecipeError: If a pattern matches no file, or a match is neither a file nor a
            folder (a dangling or looping symbolic link, a FIFO).
    """
    memo = build_memo()  # one listing per pipeline build
    if memo is not None and ("files", id(dataset)) in memo:
        return list(memo[("files", id(dataset))])
    out: list[Any] = []
    for pattern in dataset.paths:
        if storage.is_remote(pattern):
            matches = [m for m in storage.expand(pattern) if not is_index_file(m)]
        else:
            local = storage.local_path(pattern)
            full = local if os.path.isabs(local) else str(Path(dataset.base_dir) / local)
            matches = sorted(glob.glob(full, recursive=True))
            # A Hugging Face `datasets` folder stands for its .arrow files (formats/arrow.py).
            named = not glob.has_magic(local)
            matches = [
                m
                for m in expand_dataset_dirs(matches, named)
                if not is_index_file(m) and _is_shard(dataset, m)
            ]
        if not matches:
            if storage.is_remote(pattern):
                where = storage.redact(pattern)
                gone = storage.missing_container(pattern)
                if gone is not None:
                    where += f"; {gone} does not exist or these credentials cannot see it"
            else:
                where = str((Path(dataset.base_dir) / storage.local_path(pattern)).parent)
            named_dir = not storage.is_remote(pattern) and os.path.isdir(
                Path(dataset.base_dir) / storage.local_path(pattern)
            )
            folder = pattern.rstrip("/")
            hint = f"; it is a folder: name its files ('{folder}/*.jsonl')" if named_dir else ""
            raise RecipeError(
                f"dataset {dataset.name!r}: pattern {storage.redact(pattern)!r} matches no "
                f"file (looked in {where}){hint}"
            )
        out.extend(m if storage.is_remote(m) else Path(m) for m in matches)
    seen: set[Any] = set()
    unique = []
    for p in out:
        if p not in seen:
            seen.add(p)
            unique.append(p)
    if dataset.index is not None:
        location = dataset.index
        if not storage.is_remote(location) and not os.path.isabs(location):
            location = str(Path(dataset.base_dir) / location)
        use_index([str(p) for p in unique], location)
    if memo is not None:
        memo[("files", id(dataset))] = list(unique)
    return unique
