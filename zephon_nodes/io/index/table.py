"""A dataset index as columns: what a pipeline reads at start-up instead of the shards.

A dataset index (:mod:`zephon_nodes.io.index.index`) is one JSON manifest; parsing it costs a few
microseconds per shard, as would listing the shards' folders, building one object per shard
or serializing each shard's identity into the fingerprint. At 100,000 shards that is
seconds before the first batch. A :class:`ShardTable` is the same manifest converted once per
machine into flat arrays (record counts, sizes, kinds, names, each shard's entry as JSON,
each shard's identity as the exact JSON text the fingerprint holds), kept in the cache
directory under a key made of the manifest's location, size, modification time and inode
(a remote manifest: its version tag), and memory-mapped on later builds.

:func:`resolve_indexed` matches a dataset's glob patterns against the names the index lists
(the folders are not listed; the selection is cached next to the table), so building a
pipeline touches no shard: each shard is checked against its entry (size and version tag,
see :func:`zephon_nodes.io.index.index.find_entry`) when a work item of it is first read
(:class:`~zephon_nodes.io.index.lazyshards.LazyShards`). With an index, the index is the list of
shards: a file added to the folders later joins the dataset when the index is rebuilt.
``ZEPHON_VERIFY_DATA=1`` also lists the folders and refuses a matched file the index lacks.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import posixpath
import re
import shutil
import tempfile
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zephon_nodes.core.errors import DataError
from zephon_nodes.core.settings import current
from zephon_nodes.io.formats.entrysums import count_bad
from zephon_nodes.io.index.index import _candidates as shard_candidates
from zephon_nodes.io.index.index import announce, literal_dir, read_manifest, rebuild_hint
from zephon_nodes.io.index.tablesums import (
    drop_table,
    sums_hold,
    tag_rows,
    untag_rows,
    write_table_sums,
)
from zephon_nodes.io.storage import storage
from zephon_nodes.io.storage.cache import atomic_write, cache_dir
from zephon_nodes.io.storage.checksum import build_memo

__all__ = ["IndexedFiles", "ShardTable", "load_table", "resolve_indexed", "verify_data"]

# Kind codes of the ``kinds`` column.
KINDS = ("jsonl", "jsonl.zst", "parquet", "tar")
# Bump when the table's on-disk layout changes (old tables are then rebuilt).
LAYOUT = 3  # 2: the manifest's seal and values are checked when converted; 3: sums.json
_COLUMNS = (
    "records",
    "sizes",
    "kinds",
    "frames",
    "names",
    "name_starts",
    "entries",
    "entry_starts",
    "identities",
    "identity_starts",
)
_LOCK = threading.Lock()
_PLAIN = re.compile(r"[A-Za-z0-9_:]*")
# Table key -> loaded table (a key names one manifest content, so it never goes stale).
_TABLES: dict[str, ShardTable] = {}
# id of a mapped column -> a descriptor of its file (reads that map no page into the process).
_FDS: dict[int, int] = {}


def _column_fd(column: np.ndarray, path: str) -> int:
    """A descriptor of a mapped column's file, opened once per column and process.

    Kept while the column lives (the file may be removed meanwhile: the descriptor, like the
    mapping, still reads it); closed with it.
    """
    with _LOCK:
        fd = _FDS.get(id(column))
        if fd is None:
            fd = _FDS[id(column)] = os.open(path, os.O_RDONLY)
            weakref.finalize(column, _close_fd, id(column), fd)
        return fd


def _close_fd(key: int, fd: int) -> None:
    with _LOCK:
        _FDS.pop(key, None)
    os.close(fd)


def verify_data() -> bool:
    """Whether ``ZEPHON_VERIFY_DATA`` asks for the full checks with an index.

    Then building a pipeline also lists the folders (a matched file the index lacks is
    refused) and each local shard's checksum is compared with the index's when it is first
    opened (one read of each shard), instead of its size and modification time only.
    """
    return current().verify_data


def _offsets(blob: np.ndarray, last: int) -> np.ndarray:
    """Start offsets of the items of ``blob``, and its end (n + 1 offsets).

    Each item ends with byte ``last``, followed by a separator byte for identities (a name
    or an entry ends with its separator, a newline).
    """
    step = 2 if last == ord("}") else 1
    ends = np.flatnonzero(blob == last).astype(np.int64) + step
    return np.concatenate([np.zeros(1, dtype=np.int64), ends])


@dataclass(frozen=True)
class ShardTable:
    r"""The per-shard columns of one dataset index (row ``k``: the ``k``-th name, sorted).

    Attributes:
        location: The manifest's URI or path.
        directory: The directory the shard names are relative to.
        folder: Where the columns are cached (selections are cached there too).
        records: Records of each shard (int64).
        sizes: Bytes of each shard file (int64).
        kinds: Index into :data:`KINDS` (int8).
        frames: Number of zstd frames of a ``.zst`` shard, else 0 (int32).
        names: Shard names, each followed by ``\\n`` (uint8, memory-mapped).
        name_starts: Offset of each name in ``names`` (n + 1).
        entries: Each shard's entry as compact JSON, each followed by ``\\n``.
        entry_starts: Offset of each entry (n + 1).
        identities: Each shard's ``{"bytes":...,"checksum":...}`` JSON, each followed by
            ``,`` (the fingerprint's text for the shard).
        identity_starts: Offset of each identity (n + 1).
    """

    location: str
    directory: str
    folder: str
    records: np.ndarray
    sizes: np.ndarray
    kinds: np.ndarray
    frames: np.ndarray
    names: np.ndarray
    name_starts: np.ndarray
    entries: np.ndarray
    entry_starts: np.ndarray
    identities: np.ndarray
    identity_starts: np.ndarray

    def __len__(self) -> int:
        return int(self.records.shape[0])

    def name(self, k: int) -> str:
        """The ``k``-th shard's name (relative to :attr:`directory`)."""
        a, b = int(self.name_starts[k]), int(self.name_starts[k + 1]) - 1
        return bytes(self.names[a:b]).decode("utf-8")

    def uri(self, k: int) -> str:
        """The ``k``-th shard's full path or URI."""
        return storage.join(self.directory, self.name(k))

    def entry(self, k: int) -> dict[str, Any]:
        """The ``k``-th shard's index entry (parsed on each call).

        Read from the column's file, not through its mapping: touching a mapped page maps
        its neighbours too (64-128 KB per touch), so a few hundred shards opened at random
        would map most of the column into every rank's RSS.
        """
        a, b = int(self.entry_starts[k]), int(self.entry_starts[k + 1]) - 1
        path = getattr(self.entries, "filename", None)
        try:
            if not path:
                raise FileNotFoundError
            fd = _column_fd(self.entries, path)
            raw = os.pread(fd, b - a, int(getattr(self.entries, "offset", 0)) + a)
        except OSError:  # no file, or gone since (the mapping still holds it)
            raw = bytes(self.entries[a:b])
        entry: dict[str, Any] = json.loads(raw)
        return entry

    def identities_json(self, rows: np.ndarray) -> list[bytes | memoryview]:
        """The JSON list of ``{"bytes","checksum"}`` of ``rows``, as the fingerprint has it.

        In pieces: a contiguous run of rows is one view of the table, copied nowhere.
        """
        if len(rows) == 0:
            return [b"[]"]
        lo, hi = int(rows[0]), int(rows[-1])
        starts = self.identity_starts
        if hi - lo + 1 == len(rows) and bool(np.all(np.diff(rows) == 1)):
            body: bytes | memoryview = self.identities[
                int(starts[lo]) : int(starts[hi + 1]) - 1
            ].data
        else:
            body = b",".join(
                bytes(self.identities[int(starts[k]) : int(starts[k + 1]) - 1])
                for k in rows.tolist()
            )
        return [b"[", body, b"]"]

    def match(self, pattern: str) -> np.ndarray:
        """Rows whose name matches the glob ``pattern`` (relative to :attr:`directory`).

        As :func:`glob.glob` with ``recursive=True``: ``*`` and ``?`` stay inside one
        folder, ``**`` spans folders, and wildcards do not match a leading ``.``. The
        result is cached next to the table.
        """
        key = hashlib.sha256(pattern.encode("utf-8")).hexdigest()[:24]
        path = Path(self.folder) / f"match-{key}.npy"
        try:
            rows = untag_rows(np.load(path, allow_pickle=False))
            if rows is not None:
                return rows  # else not what was written: made again (counted)
        except FileNotFoundError:
            pass
        except (OSError, ValueError):
            count_bad()  # unreadable: made again
        rx = re.compile(_glob_regex(pattern).encode("utf-8"), re.M)
        text = bytes(self.names)
        hits = np.fromiter((m.start() for m in rx.finditer(text) if m.end() > m.start()), np.int64)
        rows = np.searchsorted(self.name_starts, hits).astype(np.int64)
        with contextlib.suppress(OSError):  # a read-only cache only costs the match next time
            _save(path, tag_rows(rows))
        return rows


def _glob_regex(pattern: str) -> str:
    r"""A regex matching a name per line (``\n``-terminated) as ``glob(recursive=True)``."""
    parts = pattern.split("/")
    out = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            # Zero or more folders (and, last, any file below), none hidden.
            out.append(r"(?!\.)[^/\n]+(?:/(?!\.)[^/\n]+)*" if last else r"(?:(?!\.)[^/\n]+/)*")
            continue
        text = r"(?!\.)" if part[:1] in ("*", "?", "[") else ""
        j = 0
        while j < len(part):
            c = part[j]
            if c == "*":
                text += r"[^/\n]*"
            elif c == "?":
                text += r"[^/\n]"
            elif c == "[":
                k = part.find("]", j + 2 if part[j + 1 : j + 2] in ("!", "]") else j + 1)
                if k < 0:
                    text += re.escape(c)
                else:
                    body = part[j + 1 : k]
                    neg = body.startswith("!")
                    body = body[1:] if neg else body
                    body = body.replace("\\", "\\\\")
                    text += "[" + ("^/\n" if neg else "") + body + "]"
                    j = k
            else:
                text += re.escape(c)
            j += 1
        out.append(text + ("" if last else "/"))
    return "^" + "".join(out) + "$"


def _save(path: Path, array: np.ndarray) -> None:
    atomic_write(path, lambda f: np.save(f, array, allow_pickle=False))


def _table_key(location: str) -> tuple[str, storage.FileStat] | None:
    """A key naming the manifest's content at ``location``; None if there is none."""
    if storage.is_remote(location):
        try:
            st = storage.stat(location)
        except DataError as e:
            if "not found" in str(e):
                return None
            raise
        text = f"{location}|{st.size}|{st.version}"
    else:
        path = storage.local_path(location)
        try:
            raw = os.stat(path)
        except OSError:
            return None
        st = storage.FileStat(raw.st_size, str(raw.st_mtime_ns))
        text = f"{os.path.abspath(path)}|{raw.st_size}|{raw.st_mtime_ns}|{raw.st_ino}"
    text += f"|{LAYOUT}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32], st


def _build(location: str, folder: Path) -> None:
    """Parse the manifest at ``location`` once and write its columns into ``folder``."""
    found = read_manifest(location)  # parsed for the conversion only (not kept)
    if found is None:
        raise DataError(f"{storage.redact(location)}: dataset index vanished while read")
    directory, shards = found
    names = sorted(shards)
    n = len(names)
    records = np.zeros(n, dtype=np.int64)
    sizes = np.zeros(n, dtype=np.int64)
    kinds = np.zeros(n, dtype=np.int8)
    frames = np.zeros(n, dtype=np.int32)
    entries = []
    identities = []
    encode = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
    for k, name in enumerate(names):
        e = shards[name]
        if not isinstance(e, dict) or "\n" in name:
            raise DataError(f"{storage.redact(location)}: malformed entry for {name!r}")
        try:
            records[k] = int(e["records"])
            sizes[k] = int(e["bytes"])
            kinds[k] = KINDS.index(str(e["kind"]))
            frames[k] = len(e.get("frames", ()))
            size, checksum = int(e["bytes"]), str(e["checksum"])
        except (KeyError, TypeError, ValueError):
            raise DataError(
                f"{storage.redact(location)}: malformed entry for {name!r} (needs records, "
                f"bytes, kind and checksum); {_hint(location)}"
            ) from None
        entries.append(encode(e))
        if _PLAIN.fullmatch(checksum):  # as json.dumps writes it, without its per-call cost
            identities.append(f'{{"bytes":{size},"checksum":"{checksum}"}}')
        else:
            identities.append(encode({"bytes": size, "checksum": checksum}))
    blobs = {
        "names": np.frombuffer("".join(x + "\n" for x in names).encode("utf-8"), np.uint8),
        "entries": np.frombuffer("".join(x + "\n" for x in entries).encode("utf-8"), np.uint8),
        "identities": np.frombuffer("".join(x + "," for x in identities).encode(), np.uint8),
    }
    columns: dict[str, np.ndarray] = {
        "records": records,
        "sizes": sizes,
        "kinds": kinds,
        "frames": frames,
        **blobs,
    }
    # Each identity ends with its only "}" and a ",": names and entries with "\n".
    plurals = {"name": "names", "entry": "entries", "identity": "identities"}
    for key, last in (("name", 10), ("entry", 10), ("identity", ord("}"))):
        plural = plurals[key]
        columns[key + "_starts"] = _offsets(blobs[plural], last)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".", suffix=".tmp"))
    try:
        for key, array in columns.items():
            np.save(tmp / f"{key}.npy", array, allow_pickle=False)
        (tmp / "directory.txt").write_text(directory, encoding="utf-8")
        write_table_sums(tmp, _files())
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / "directory.txt").exists():  # not another rank's identical table
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _hint(location: str) -> str:
    directory = posixpath.dirname(location) if storage.is_remote(location) else None
    return rebuild_hint(directory or os.path.dirname(storage.local_path(location)))


def _files() -> list[str]:
    return [f"{c}.npy" for c in _COLUMNS] + ["directory.txt"]


def load_table(location: str) -> ShardTable | None:
    """The columns of the manifest at ``location`` (built once per machine); None if absent.

    Raises:
        DataError: If the manifest is unreadable, of another format, or malformed.
    """
    keyed = _table_key(location)
    if keyed is None:
        return None
    key = keyed[0]
    with _LOCK:
        table = _TABLES.get(key)
    if table is not None:
        return table
    folder = cache_dir() / f"index-{key}"
    if not (folder / "directory.txt").exists() or not sums_hold(folder, _files()):
        # One process of the node converts the index; the node's other ranks wait for it.
        with open(folder.with_suffix(".lock"), "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (folder / "directory.txt").exists() and not sums_hold(folder, _files()):
                drop_table(folder)  # not what was written: made again from the index, counted
            if not (folder / "directory.txt").exists():
                _build(location, folder)
                if not sums_hold(folder, _files()):
                    raise DataError(
                        f"cache directory {cache_dir()}: the columns of the dataset index "
                        f"{storage.redact(location)} do not read back as written (a failing "
                        f"disk?); set ZEPHON_CACHE_DIR to another disk"
                    )
    arrays = {c: np.load(folder / f"{c}.npy", mmap_mode="r", allow_pickle=False) for c in _COLUMNS}
    directory = (folder / "directory.txt").read_text(encoding="utf-8")
    table = ShardTable(
        location=location,
        directory=directory,
        folder=str(folder),
        records=np.asarray(arrays["records"]),
        sizes=np.asarray(arrays["sizes"]),
        kinds=np.asarray(arrays["kinds"]),
        frames=np.asarray(arrays["frames"]),
        names=arrays["names"],
        name_starts=np.asarray(arrays["name_starts"]),
        entries=arrays["entries"],
        entry_starts=np.asarray(arrays["entry_starts"]),
        identities=arrays["identities"],
        identity_starts=np.asarray(arrays["identity_starts"]),
    )
    with _LOCK:
        _TABLES[key] = table
    return table


@dataclass(frozen=True)
class IndexedFiles:
    """A dataset's files as rows of one :class:`ShardTable`, in the recipe's order.

    Attributes:
        table: The index's columns.
        rows: The rows, in the order :meth:`DatasetSpec.files` would list the files.
    """

    table: ShardTable
    rows: np.ndarray

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def names(self) -> list[str]:
        """Every file's name relative to the index's directory (for small datasets)."""
        rows = self.rows
        span = int(rows[-1]) - int(rows[0]) + 1 if len(rows) else -1
        if span == len(rows) and bool(np.all(np.diff(rows) == 1)):
            starts = self.table.name_starts
            a, b = int(starts[int(rows[0])]), int(starts[int(rows[-1]) + 1]) - 1
            return bytes(self.table.names[a:b]).decode("utf-8").split("\n")
        return [self.table.name(k) for k in rows.tolist()]

    def uris(self) -> list[str]:
        """Every file's full path or URI (one string per file: for small datasets)."""
        return [self.table.uri(k) for k in self.rows.tolist()]


def _candidates(directory: str, named: str | None) -> list[str]:
    """Where the index of files under ``directory`` may be (as for a shard there)."""
    return shard_candidates(storage.join(directory, "*"), named)


def _absolute(spec: Any, pattern: str) -> str:
    if storage.is_remote(pattern):
        return pattern
    local = storage.local_path(pattern)
    full = local if os.path.isabs(local) else os.path.join(str(spec.base_dir), local)
    return os.path.normpath(full)


def resolve_indexed(spec: Any) -> IndexedFiles | None:
    """The files of a dataset spec through its dataset index, without listing or opening any.

    Applies when every pattern has a wildcard and one index (the dataset's ``index``, or
    ``zephon-index.json`` in the pattern's folder before its first wildcard or up to three
    folders above) covers them all; otherwise None (the files are listed and opened one by
    one, as without an index). Under ``ZEPHON_VERIFY_DATA=1`` the folders are listed too
    and a matched file missing from the index is refused.

    Raises:
        DataError: An unreadable index, or (verify mode) a file the index lacks.
    """
    if spec.records is not None or not current().use_index or not spec.paths:
        return None
    memo = build_memo()
    if memo is not None and ("indexed", id(spec)) in memo:
        hit: IndexedFiles | None = memo[("indexed", id(spec))]
        return hit
    named = None
    if spec.index is not None:
        named = spec.index
        if not storage.is_remote(named) and not os.path.isabs(named):
            named = os.path.normpath(os.path.join(str(spec.base_dir), named))
    table: ShardTable | None = None
    parts: list[np.ndarray] = []
    result: IndexedFiles | None = None
    for pattern in spec.paths:
        full = _absolute(spec, pattern)
        literal = literal_dir(full)
        if literal is None:
            break
        found = None
        for location in _candidates(literal, named):
            candidate = load_table(location)
            if candidate is not None and (full + "/").startswith(candidate.directory + "/"):
                found = candidate
                break
        if found is None or (table is not None and found is not table):
            break
        table = found
        rows = table.match(full[len(table.directory.rstrip("/")) + 1 :])
        if len(rows) == 0:
            break
        parts.append(rows)
    else:
        if table is not None:
            rows = parts[0]
            if len(parts) > 1:
                joined = np.concatenate(parts)
                _, first = np.unique(joined, return_index=True)
                rows = joined[np.sort(first)]
            result = IndexedFiles(table, rows)
            announce(table.location, table.directory)
            if verify_data():
                _verify_listing(spec, result)
    if memo is not None:
        memo[("indexed", id(spec))] = result
    return result


def _verify_listing(spec: Any, files: IndexedFiles) -> None:
    """Refuse a file the patterns match on disk that the index does not list."""
    listed = {str(p) for p in _list(spec)}
    known = set(files.uris())
    extra = sorted(listed - known)
    if extra:
        raise DataError(
            f"dataset {spec.name!r}: {storage.redact(extra[0])} matches the dataset's patterns "
            f"but is not in its dataset index {storage.redact(files.table.location)} "
            f"({len(extra)} such file(s)); {_hint(files.table.location)}"
        )


def _list(spec: Any) -> Sequence[Any]:
    """The files the patterns match on disk or in the bucket (as without an index)."""
    out: list[str] = []
    for pattern in spec.paths:
        full = _absolute(spec, pattern)
        if storage.is_remote(full):
            out.extend(storage.expand(full))
        else:
            out.extend(m for m in glob.glob(full, recursive=True) if os.path.isfile(m))
    return out
