"""Pre-tokenized corpora as datasets: which format, their files, their shards, their tokenizer.

A dataset whose ``format`` is ``"megatron"``, ``"mds"`` or ``"litdata"`` (or whose patterns
say so: ``.idx`` / ``.bin`` files of a Megatron corpus, a folder or ``index.json`` of an MDS
or LitData corpus) is read by :mod:`~zephon_nodes.io.formats.megatron`,
:mod:`~zephon_nodes.io.formats.mds` or :mod:`~zephon_nodes.io.formats.litdata`: its records
are documents of token ids, which skip the recipe's tokenizer (see
:class:`~zephon_nodes.operators.parse.ParseJsonl`). Every other part of a recipe (work items,
dealing, mixing by tokens, packing, shuffling, stages, re-lanes) applies unchanged.

The content identity of such a dataset is that of every file of its corpora in order: a
Megatron corpus's ``.idx`` and ``.bin``, an MDS or LitData corpus's ``index.json`` and the
shards it names (see :func:`corpus_files`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zephon_nodes.core.errors import DataError, RecipeError
from zephon_nodes.io.discovery import RecipeDataset, dataset_files
from zephon_nodes.io.formats.litdata import chunk_files, open_litdata_shards
from zephon_nodes.io.formats.mds import open_mds_shards, shard_files
from zephon_nodes.io.formats.megatron import open_megatron_shard
from zephon_nodes.io.formats.tokenfiles import pin, read_json, sibling
from zephon_nodes.io.storage import storage

__all__ = [
    "FORMATS",
    "check_recipe",
    "check_tokenizer",
    "corpus_entries",
    "corpus_files",
    "is_token_shard",
    "open_corpus",
    "pretokenized_format",
]

FORMATS = ("megatron", "mds", "litdata")
# Tokenizer files looked for beside a corpus (the folder of its .idx or index.json).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


def is_token_shard(shard: Any) -> bool:
    """Whether a shard's records are documents of token ids."""
    return bool(getattr(shard, "token_ids", False))


def _detect(spec: RecipeDataset, pattern: str) -> str | None:
    if storage.is_remote(pattern):
        local = pattern
    else:
        local = storage.local_path(pattern)
        if not os.path.isabs(local):
            local = str(Path(spec.base_dir) / local)
    if local.endswith((".idx", ".bin")):
        # A .bin is Megatron's too (never a text format): one without its .idx is refused
        # naming the .idx, not read as JSON lines.
        return "megatron"
    if storage.is_remote(local) and not local.endswith(("index.json", "/")):
        return None  # a remote folder is named by its format (no request per pattern)
    index = local if local.endswith("index.json") else local.rstrip("/") + "/index.json"
    if any(c in index for c in "*?["):
        return None
    if not storage.is_remote(index) and not os.path.isfile(index):
        return None
    try:
        data = read_json(index)
    except DataError as e:
        if local.endswith("index.json") or storage.is_remote(index):
            return None  # a file named so may be text (JSON lines); a remote one may be absent
        # A local folder's index.json cut short or unreadable: a damaged corpus, not text.
        raise RecipeError(
            f"dataset {spec.name!r}: pattern {pattern!r}: {e}; name the dataset's `format` "
            f'("mds" or "litdata") to have the corpus refused or skipped by its on_error'
        ) from None
    if isinstance(data, dict) and isinstance(data.get("shards"), list):
        return "mds"
    if isinstance(data, dict) and isinstance(data.get("chunks"), list):
        return "litdata"
    return None


def pretokenized_format(spec: RecipeDataset) -> str | None:
    """The dataset's pre-tokenized format (its ``format``, or detected), or None.

    Detected when every pattern names a Megatron ``.idx`` (or a ``.bin`` with its ``.idx``),
    or an MDS or LitData folder (or its ``index.json``), all of one format.

    Raises:
        RecipeError: Some patterns name a pre-tokenized corpus and others another format
            (a Megatron ``.idx`` beside jsonl files would be read as text).
    """
    fmt = getattr(spec, "format", None)
    if fmt is not None:
        return str(fmt)
    if spec.records is not None or not spec.paths:
        return None
    found = {p: _detect(spec, p) for p in spec.paths}
    formats = set(found.values())
    if len(formats) > 1 and formats != {None}:
        named = ", ".join(f"{p!r}: {f or 'not a pre-tokenized corpus'}" for p, f in found.items())
        raise RecipeError(
            f"dataset {spec.name!r} mixes formats ({named}): a dataset reads one format; "
            f"give each its own [[datasets]] entry (or name the corpora's `format`)"
        )
    return formats.pop()


def _entry_pattern(fmt: str, pattern: str) -> str:
    if fmt == "megatron":
        if pattern.endswith((".idx", ".bin")):
            return pattern  # a .bin is listed itself: one without its .idx is not left out
        return pattern + ".idx"
    if pattern.endswith("index.json"):
        return pattern
    return pattern.rstrip("/") + "/index.json"


def corpus_entries(spec: RecipeDataset, fmt: str) -> list[str]:
    """The corpora of a dataset, one entry file each: Megatron ``.idx``, else ``index.json``.

    Raises:
        RecipeError: A pattern that matches no corpus.
    """
    patterns = tuple(dict.fromkeys(_entry_pattern(fmt, p) for p in spec.paths))
    entries = [str(e) for e in dataset_files(_with_paths(spec, patterns))]
    if fmt == "megatron":  # each .bin stands for its corpus's .idx (refused if it is missing)
        entries = [e[: -len(".bin")] + ".idx" if e.endswith(".bin") else e for e in entries]
    return list(dict.fromkeys(entries))


def _with_paths(spec: RecipeDataset, paths: tuple[str, ...]) -> Any:
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        return dataclasses.replace(spec, paths=paths, index=None)
    raise RecipeError(f"dataset {spec.name!r}: a pre-tokenized dataset needs a dataset table")


def corpus_files(spec: RecipeDataset, fmt: str) -> list[str]:
    """Every file of the dataset's corpora, in order (what its content identity covers).

    A local file that is not there (a ``.bin`` without its ``.idx``, a shard its
    ``index.json`` names) is left out: opening the corpus refuses it, or skips the corpus
    and counts it under ``on_error = "skip"``.
    """
    out: list[str] = []
    for entry in corpus_entries(spec, fmt):
        if fmt == "megatron":
            files = [entry, entry[: -len(".idx")] + ".bin"]
        elif fmt == "mds":
            files = [entry, *shard_files(entry)] if _there(entry) else [entry]
        else:
            files = [entry, *chunk_files(entry)] if _there(entry) else [entry]
        out += [f for f in files if _there(f)]
    return out


def _there(uri: str) -> bool:
    """Whether a file exists (a remote one is taken to: its identity reads it anyway)."""
    return storage.is_remote(uri) or os.path.isfile(storage.local_path(uri))


def open_corpus(spec: RecipeDataset, fmt: str, entry: str) -> list[Any]:
    """The shards of one corpus of a dataset (a Megatron corpus is one shard).

    Raises:
        DataError: A corpus that cannot be read.
    """
    if fmt == "megatron":
        return [open_megatron_shard(entry)]
    if fmt == "mds":
        return list(open_mds_shards(entry, spec.text_field))
    if fmt == "litdata":
        return list(open_litdata_shards(entry, spec.text_field))
    raise RecipeError(f"dataset {spec.name!r}: format {fmt!r} must be one of {FORMATS}")


def _file_checksum(uri: str) -> str:

    return pin(uri).checksum


def _beside(entry: str) -> list[str]:
    """Tokenizer files in the folder of a corpus's entry file."""
    found = []
    for name in TOKENIZER_FILES:
        uri = sibling(entry, name)
        try:
            exists = (
                storage.stat(uri) is not None if storage.is_remote(uri) else os.path.isfile(uri)
            )
        except (DataError, OSError, FileNotFoundError):
            exists = False
        if exists:
            found.append(uri)
    return found


def check_tokenizer(
    spec: RecipeDataset, fmt: str, tokenizer_path: str | None, vocab_size: int
) -> None:
    """Refuse a recipe tokenizer that is not the corpus's.

    The dataset's ``vocab_size`` (the corpus's vocabulary, when the recipe states it) must be
    the tokenizer's; a tokenizer file beside a corpus (``tokenizer.json`` or
    ``tokenizer.model`` in the folder of its ``.idx`` or ``index.json``) must have the same
    content as the recipe's tokenizer file. Ids at or above the vocabulary are refused when
    read (naming the file and document).

    Raises:
        RecipeError: One line naming both tokenizers.
    """
    stated = getattr(spec, "vocab_size", None)
    if stated is not None and vocab_size and int(stated) != vocab_size:
        raise RecipeError(
            f"dataset {spec.name!r}: the corpus's vocabulary is {stated} tokens (its "
            f"vocab_size), the recipe's tokenizer has {vocab_size}: tokenize with the "
            f"corpus's tokenizer"
        )
    ours = _file_checksum(tokenizer_path) if tokenizer_path is not None else None
    for entry in corpus_entries(spec, fmt):
        for uri in _beside(entry):
            if ours is None or _file_checksum(uri) != ours:
                mine = tokenizer_path if tokenizer_path is not None else "the built-in one"
                raise RecipeError(
                    f"dataset {spec.name!r}: the corpus was tokenized with "
                    f"{storage.redact(uri)}, the recipe's tokenizer is {mine} (another "
                    f"content): tokenize with the corpus's tokenizer"
                )


def check_recipe(
    datasets: Sequence[RecipeDataset],
    operators: Sequence[Any],
    tokenizer_path: str | os.PathLike[str] | None,
    vocab_size: int,
) -> None:
    """Refuse what a recipe cannot do with its pre-tokenized datasets.

    Each one's tokenizer must be the recipe's (:func:`check_tokenizer`), and no text
    operator (``[[operators]]`` filter or map) may apply to it: its records have no text.

    Raises:
        RecipeError: Naming the dataset (and the operator or both tokenizers).
    """
    path = str(tokenizer_path) if tokenizer_path is not None else None
    for spec in datasets:
        fmt = pretokenized_format(spec)
        if fmt is None:
            continue
        for op in operators:
            scope = getattr(op, "datasets", None)
            if scope is None or spec.name in scope:
                raise RecipeError(
                    f"{op.kind} {op.name!r} works on text, and dataset {spec.name!r} is "
                    f"pre-tokenized ({fmt}: token ids): give the operator `datasets` without it"
                )
        check_tokenizer(spec, fmt, path, vocab_size)
