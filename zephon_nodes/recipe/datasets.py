"""The recipe's ``[[datasets]]`` tables: shard files (glob patterns) or in-memory records."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.io.discovery import dataset_files
from zephon_nodes.io.identity import dataset_identities
from zephon_nodes.recipe.bounds import SETTINGS, check_setting

__all__ = ["FORMATS", "ON_ERROR", "ON_EXHAUSTED", "DatasetSpec"]

ON_ERROR = ("raise", "skip")
ON_EXHAUSTED = ("end", "repeat")
# Values of a dataset's ``format``: the pre-tokenized corpora (jsonl, Parquet, Arrow and tar
# go by suffix).
FORMATS = ("megatron", "mds", "litdata")
_WEIGHT = SETTINGS["datasets.weight"]


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset: shard files (glob patterns) or, for tests, in-memory records.

    Args:
        name: Name used in errors, stats and the fingerprint.
        paths: Glob patterns of ``.jsonl`` / ``.jsonl.zst`` / ``.txt`` / ``.parquet`` /
            ``.arrow`` shards or Hugging Face ``save_to_disk`` folders, relative to
            ``base_dir`` (one pattern may be given as a string or a path).
        text_field: JSON field holding the document text.
        weight: Mixture weight (a token share when several datasets are mixed).
        records: In-memory records (dicts) instead of files; for tests and notebooks.
        base_dir: Directory the patterns are relative to (the recipe file's directory).
        on_exhausted: When the dataset has run ``work.epochs`` passes: ``"end"`` ends the
            whole stream (default), ``"repeat"`` starts another pass in a new seeded order,
            forever.
        on_error: Bad input (corrupt or truncated file, invalid JSON or UTF-8, missing or
            non-string field, empty file): ``"raise"`` (default) or ``"skip"`` (skip and count).
        image_field: Field holding base64 image bytes (one string or a list) in jsonl records
            of a recipe with an ``[image]`` table; ``None``: ``"image"``.
        chunk_size: Records per work item for this dataset (default ``work.chunk_size``);
            smaller for long documents keeps a mixture's shares smooth over short horizons.
        index: Where the dataset index (``zephon index``) is, if not next to the shards
            (a path relative to ``base_dir`` or a URI); not fingerprinted.
        format: A pre-tokenized corpus: ``"megatron"`` (``.bin``/``.idx`` pairs: patterns
            of their ``.idx``, ``.bin`` or prefix), ``"mds"`` or ``"litdata"`` (patterns of
            their folders or ``index.json``); None: by the files (detected from the patterns,
            else jsonl, Parquet, Arrow or tar by suffix). See docs/pretokenized.md.
        vocab_size: A pre-tokenized corpus's vocabulary size, checked against the recipe's
            tokenizer (None: not stated).
    """

    name: str
    paths: tuple[str, ...] = ()
    text_field: str = "text"
    weight: float = 1.0
    records: tuple[Mapping[str, Any], ...] | None = None
    base_dir: Path = field(default_factory=Path.cwd)
    on_exhausted: str = "end"
    on_error: str = "raise"
    image_field: str | None = None
    chunk_size: int | None = None
    index: str | None = None
    format: str | None = None
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise RecipeError("dataset name must be a non-empty string")
        if isinstance(self.paths, (str, os.PathLike)):  # one pattern, not its characters
            object.__setattr__(self, "paths", (os.fspath(self.paths),))
        elif not isinstance(self.paths, tuple):  # a list from Python code: hashable as a tuple
            object.__setattr__(self, "paths", tuple(self.paths))
        if not all(isinstance(p, str) for p in self.paths):
            raise RecipeError(
                f"dataset {self.name!r}: paths={self.paths!r} must be patterns (strings)"
            )
        if self.records is None and not self.paths:
            raise RecipeError(f"dataset {self.name!r}: give `paths` (glob patterns) or `records`")
        check_setting("weight", self.weight, where=f"dataset {self.name!r}: ", bound=_WEIGHT)
        if self.on_exhausted not in ON_EXHAUSTED:
            raise RecipeError(
                f"dataset {self.name!r}: on_exhausted={self.on_exhausted!r} must be one of "
                f"{ON_EXHAUSTED}"
            )
        if self.on_error not in ON_ERROR:
            raise RecipeError(
                f"dataset {self.name!r}: on_error={self.on_error!r} must be one of {ON_ERROR}"
            )
        if self.format is not None and self.format not in FORMATS:
            raise RecipeError(
                f"dataset {self.name!r}: format={self.format!r} must be one of {FORMATS}"
            )
        if self.vocab_size is not None and self.vocab_size < 1:
            raise RecipeError(
                f"dataset {self.name!r}: vocab_size={self.vocab_size} must be an integer >= 1"
            )
        if self.chunk_size is not None:
            check_setting(
                "chunk_size",
                self.chunk_size,
                where=f"dataset {self.name!r}: ",
                bound=SETTINGS["datasets.chunk_size"],
            )

    def files(self) -> list[Any]:
        """Resolve the glob patterns into a sorted list of files.

        Local files come back as :class:`~pathlib.Path`, remote ones (``s3://``, ...) as URI
        strings; see :func:`zephon_nodes.io.discovery.dataset_files`, which finds them.

        Raises:
            RecipeError: If a pattern matches no file.
        """
        return dataset_files(self)

    def canonical(self, *, lazy: bool = False) -> dict[str, Any]:
        """Data-defining fields, with each file's content checksum and size, in order.

        Paths are not part of it: the same bytes elsewhere are the same data. A local file
        is read once to hash it unless a dataset index covers it (see
        :mod:`zephon_nodes.io.identity`). ``lazy``: an indexed dataset's files stay a
        :class:`~zephon_nodes.io.identity.FileIdentities` (serialize the result with
        :func:`~zephon_nodes.recipe.canonical.canonical_json`).
        """
        out: dict[str, Any] = {
            "name": self.name,
            "text_field": self.text_field,
            "weight": float(self.weight),
        }
        if self.records is not None:
            blob = json.dumps(list(self.records), sort_keys=True, ensure_ascii=False)
            out["records_sha256"] = hashlib.sha256(blob.encode("utf-8")).hexdigest()
            out["num_records"] = len(self.records)
        else:
            out["files"] = dataset_identities(self, lazy)
        # New fields join the canonical form only when set, so older recipes keep their
        # fingerprint.
        if self.on_exhausted != "end":
            out["on_exhausted"] = self.on_exhausted
        if self.on_error != "raise":
            out["on_error"] = self.on_error
        if self.chunk_size is not None:
            out["chunk_size"] = self.chunk_size
        if self.image_field is not None:
            out["image_field"] = self.image_field
        if self.format is not None:
            out["format"] = self.format
        if self.vocab_size is not None:
            out["vocab_size"] = self.vocab_size
        return out
