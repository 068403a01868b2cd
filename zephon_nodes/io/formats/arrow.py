"""Hugging Face ``datasets`` Arrow files: random access through memory maps (needs ``pyarrow``).

``datasets`` stores a dataset as Arrow IPC *stream* files: ``Dataset.save_to_disk(folder)``
writes ``data-00000-of-0000N.arrow`` files listed in the folder's ``state.json``, and
``load_dataset`` caches each split as ``NAME-SPLIT[-0000K-of-0000N].arrow`` next to a
``dataset_info.json``. A recipe names either a ``save_to_disk`` folder (one split) or the
``.arrow`` files themselves (a glob); :func:`expand_dataset_dirs` turns a folder into its
files, in the order ``datasets`` reads them.

A file is opened once per worker thread through a memory map: reading the stream's record
batches parses only their headers (the column buffers stay in the page cache), so any range
of rows is a zero-copy slice. Only the columns the recipe reads are converted to Python.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon_nodes.core.errors import MISSING_FILE, UNREADABLE_ARROW, DataError, RecipeError
from zephon_nodes.io.storage.checksum import file_checksum

__all__ = ["ArrowShard", "expand_dataset_dirs", "open_arrow_shard"]

ARROW_SUFFIX = ".arrow"

# One memory-mapped table per file and thread (a table is immutable, but the reader that
# builds it is not shared).
_LOCAL = threading.local()


def _pa() -> Any:
    try:
        import pyarrow as pa
    except ImportError:
        raise DataError(
            "reading .arrow files (Hugging Face datasets) needs pyarrow: "
            "pip install 'zephon-nodes[parquet]'"
        ) from None
    return pa


def _read_table(path: str) -> Any:
    """Return the whole file as a memory-mapped table (stream format, or the file format)."""
    pa = _pa()
    try:
        source = pa.memory_map(path, "r")
    except Exception as e:
        raise DataError(f"{path}: cannot read: {e}") from None
    try:
        try:
            return pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_file(source).read_all()
    except Exception as e:
        raise DataError(f"{path}: unreadable Arrow file: {e}", kind=UNREADABLE_ARROW) from None


def _table(path: str, checksum: str) -> Any:
    # Keyed by content checksum (as Parquet and jsonl): a same-size edit with its mtime
    # restored is a new key on a warm cache.
    key = f"{path}|{checksum}"
    tables: dict[str, Any] | None = getattr(_LOCAL, "tables", None)
    if tables is None:
        tables = _LOCAL.tables = {}
    table = tables.get(key)
    if table is None:
        table = tables[key] = _read_table(path)
    return table


@dataclass(frozen=True)
class ArrowShard:
    """An Arrow file's columns; small and picklable, so it travels with tasks.

    Records are dicts of the requested columns the file has; a missing column is a missing
    field of every record (``on_error`` decides), as in jsonl and Parquet.

    Attributes:
        path: The file.
        columns: The columns read (the dataset's ``text_field``, and an image column in
            multimodal recipes), those the file has.
        num_records: Rows in the file.
        checksum: Content checksum of the file (``xxh3_128:...``): the key of its table.
    """

    path: str
    columns: tuple[str, ...]
    num_records: int
    checksum: str = ""

    def read(self, start: int, stop: int) -> list[tuple[int, Any]]:
        """Return rows ``[start, stop)`` as ``(row number, {column: value})`` pairs.

        Raises:
            DataError: If the file cannot be read or changed since it was opened.
        """
        if not 0 <= start <= stop <= self.num_records:
            raise DataError(f"{self.path}: rows [{start}, {stop}) out of range")
        if start == stop:
            return []
        table = _table(self.path, self.checksum)
        if table.num_rows != self.num_records:
            raise DataError(
                f"{self.path}: file changed since it was opened ({self.num_records} rows "
                f"expected, {table.num_rows} found)"
            )
        if not self.columns:
            return [(r, {}) for r in range(start, stop)]
        try:
            rows = table.slice(start, stop - start).select(list(self.columns)).to_pylist()
        except Exception as e:
            raise DataError(
                f"{self.path}: unreadable Arrow file: {e}", kind=UNREADABLE_ARROW
            ) from None
        return [(start + k, row) for k, row in enumerate(rows)]

    def where(self, record: int) -> str:
        """Describe a row's place for error messages."""
        return f"{self.path} row {record}"


def open_arrow_shard(path: str | Path, columns: Sequence[str | None]) -> ArrowShard:
    """Open an Arrow file (once per thread and content) and return a shard of ``columns``.

    The file's memory-mapped table is cached under its content checksum, not its path, size
    and modification time: a same-size edit with the time restored is a new table.

    Raises:
        DataError: If pyarrow is missing or the file is not a readable Arrow file.
    """
    p = str(path)
    if not Path(p).is_file():
        raise DataError(f"{p}: data file not found", kind=MISSING_FILE)
    checksum = file_checksum(p)  # hashed once per build (the fingerprint hashed it already)
    table = _table(p, checksum)
    names = set(table.schema.names)
    present = tuple(dict.fromkeys(c for c in columns if c is not None and c in names))
    return ArrowShard(p, present, int(table.num_rows), checksum)


def _save_to_disk_files(folder: Path) -> list[str]:
    state_path = folder / "state.json"
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
        names = [str(f["filename"]) for f in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RecipeError(
            f"{state_path}: not a readable Hugging Face `save_to_disk` state "
            f"(expected a JSON object with `_data_files`): {e}"
        ) from None
    if state.get("_indices_data_files"):
        raise RecipeError(
            f"{folder}: the dataset was saved with an indices mapping; save it again after "
            f"`dataset.flatten_indices()`"
        )
    files = [str(folder / n) for n in names]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise RecipeError(f"{folder}: state.json lists {missing[0]}, which does not exist")
    return files


def _cache_folder_files(folder: Path) -> list[str]:
    files = sorted(str(p) for p in folder.glob(f"*{ARROW_SUFFIX}"))
    info_path = folder / "dataset_info.json"
    splits: list[str] = []
    if info_path.is_file():
        try:
            splits = sorted(
                (json.loads(info_path.read_text(encoding="utf-8")) or {}).get("splits") or {}
            )
        except (OSError, ValueError, AttributeError):
            splits = []
    if len(splits) > 1:
        raise RecipeError(
            f"{folder}: a `load_dataset` cache folder holding splits {splits}; name one "
            f"split's files with a glob, e.g. '{folder}/*-{splits[0]}*.arrow'"
        )
    return files


def expand_dataset_dirs(matches: Sequence[str], named: bool = True) -> list[str]:
    """Replace each Hugging Face dataset folder among ``matches`` by its ``.arrow`` files.

    A ``save_to_disk`` folder (it has ``state.json``) gives the files its state lists, in
    order. When the folder was ``named`` (the recipe pattern has no wildcard), a
    ``DatasetDict`` folder (``dataset_dict.json``) is refused with its split names, and
    another folder holding ``.arrow`` files (a ``load_dataset`` cache folder of one split)
    gives them sorted; folders matched by a wildcard are otherwise left out, as before.
    Other paths are returned unchanged.

    Raises:
        RecipeError: A named ``DatasetDict`` folder or cache folder of several splits, or an
            unreadable ``state.json``.
    """
    out: list[str] = []
    for m in matches:
        p = Path(m)
        if not p.is_dir():
            out.append(m)
        elif (p / "state.json").is_file():
            out.extend(_save_to_disk_files(p))
        elif not named:
            continue
        elif (p / "dataset_dict.json").is_file():
            splits = sorted(c.name for c in p.iterdir() if (c / "state.json").is_file())
            raise RecipeError(
                f"{p}: a Hugging Face DatasetDict folder; name one split's folder, one of "
                f"{[str(p / s) for s in splits]}"
            )
        else:
            out.extend(_cache_folder_files(p))
    return out
