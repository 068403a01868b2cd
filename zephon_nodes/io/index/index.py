"""The dataset index: one JSON manifest that lets a pipeline start without reading any shard.

``zephon index PATTERN...`` reads each shard once (in parallel) and writes
``zephon-index.json`` next to the shards (or where ``--output`` says). Its format
(``"format": "zephon-index", "version": 1``) holds, per shard, keyed by its path relative to
the manifest's directory:

- ``bytes``, ``version`` (the backend's version tag: ETag/generation; a local file's
  modification time in ns), ``checksum`` (``xxh3_128:`` of the bytes), ``records``;
- ``kind`` and what reaches a record cheaply: ``jsonl``/``jsonl.zst``: ``every`` and
  ``offsets`` (byte offset of every ``every``-th record in the uncompressed text) and ``end``
  (end of the last record), plus ``frames`` for ``.zst`` (``[compressed offset, compressed
  size, uncompressed size]`` of each zstd frame); ``parquet``: ``row_group_ends`` and
  ``columns``; ``tar``: ``samples`` (each sample's key and members' extension, offset, size).

A pipeline finds the manifest in each shard's directory or up to three folders above it (or
at the dataset's ``index``). A shard
whose size differs from its entry, or a remote shard whose version tag differs, is refused
naming the shard and the command that rebuilds the index; a local shard whose modification
time differs (a copy) is re-hashed once and accepted only if its checksum still matches.
"""

from __future__ import annotations

import json
import os
import posixpath
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from zephon_nodes.core.errors import DataError
from zephon_nodes.core.settings import current
from zephon_nodes.io.formats import tar
from zephon_nodes.io.formats.lines import LineCounter, decompress_to, index_file
from zephon_nodes.io.formats.parquet import _pq
from zephon_nodes.io.index.compact import CompactShards
from zephon_nodes.io.index.indexcheck import SEAL_KEY, check_entry, kind_of, parse_manifest, seal
from zephon_nodes.io.storage import storage
from zephon_nodes.io.storage.cache import atomic_write
from zephon_nodes.io.storage.checksum import build_memo, file_checksum
from zephon_nodes.io.storage.remote import content_checksum, fetched, finish_progress

__all__ = [
    "EVERY",
    "FORMAT",
    "INDEX_NAME",
    "VERSION",
    "build_entry",
    "build_index",
    "find_entry",
    "indexed_identity",
    "is_index_file",
    "load_index",
    "read_manifest",
    "write_index",
]

INDEX_NAME = "zephon-index.json"


def is_index_file(path: object) -> bool:
    """Whether ``path`` (a local path or URI) is a dataset index, never a shard of its data.

    ``zephon index 'data/*'`` writes its index into ``data/``: the next ``data/*`` matches it.
    """
    return posixpath.basename(str(path).rstrip("/")) == INDEX_NAME


FORMAT = "zephon-index"
VERSION = 1
EVERY = 64
# How many parent folders of a shard are searched for an index (after its own folder).
SEARCH_UP = 3

_LOCK = threading.Lock()
# Manifest location -> (its directory, {relative name: entry}); None: no manifest there.
# Kept compact (the entries' JSON text, parsed on lookup): a parsed manifest is 0.4-0.65 KB
# of Python objects per shard, for the life of the process.
_MANIFESTS: dict[str, tuple[str, Mapping[str, Any]] | None] = {}
# Explicit manifest for files: file URI -> manifest location (a dataset's ``index``).
_NAMED: dict[str, str] = {}


def _dirname(uri: str) -> str:
    return posixpath.dirname(uri) if storage.is_remote(uri) else os.path.dirname(uri)


def rebuild_hint(directory: str) -> str:
    """The command that rebuilds the index of a directory (one that can work there)."""
    if storage.scheme(directory) in ("http", "https"):
        # A web server can be neither listed nor written to.
        return (
            "rebuild it: zephon index URL... --output FILE, naming each shard's URL, and "
            'set the dataset\'s index = "FILE"'
        )
    return f"rebuild it: zephon index '{storage.redact(storage.join(directory, '*'))}'"


def _read_text(uri: str) -> bytes | None:
    if not storage.is_remote(uri):
        path = storage.local_path(uri)
        if not os.path.isfile(path):
            return None
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise DataError(f"{path}: cannot read the dataset index: {e}") from None
    try:
        st = storage.stat(uri)
    except DataError as e:
        if "not found" in str(e):
            return None
        raise
    return storage.read_range(uri, 0, st.size, cache=False)


def load_index(location: str) -> dict[str, Any] | None:
    """Load the manifest at ``location`` (a file URI/path); ``None`` if there is none.

    Its seal is checked and every entry range-checked (:mod:`zephon_nodes.io.index.indexcheck`).

    Raises:
        DataError: If the manifest is unreadable, of another format or version, does not
            match its seal, or holds a value that cannot describe its shard.
    """
    raw = _read_text(location)
    if raw is None:
        return None
    where = storage.redact(location)
    hint = rebuild_hint(_dirname(location))
    data = parse_manifest(raw, where, hint)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DataError(f"{storage.redact(location)}: not a zephon dataset index")
    if data.get("version") != VERSION:
        raise DataError(
            f"{storage.redact(location)}: dataset index version {data.get('version')!r}, this "
            f"zephon-nodes reads version {VERSION}; "
            f"{rebuild_hint(_dirname(location))}"
        )
    if not isinstance(data.get("shards"), dict):
        raise DataError(f"{storage.redact(location)}: dataset index has no 'shards' table")
    every = data.get("every", EVERY)
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise DataError(f"{where}: dataset index: every={every!r} is not an integer >= 1; {hint}")

    def fail(name: str, problem: str) -> DataError:
        return DataError(
            f"{storage.redact(storage.join(_dirname(location), name))}: its dataset index entry "
            f"({where}) is impossible: {problem}; {hint}"
        )

    for name, entry in data["shards"].items():
        if not isinstance(name, str) or not name or "\n" in name:
            raise DataError(f"{where}: dataset index: a malformed shard name {name!r}; {hint}")
        check_entry(name, entry, fail)
    data.pop(SEAL_KEY, None)
    return data


def _manifest(location: str) -> tuple[str, Mapping[str, Any]] | None:
    """The manifest at ``location`` as ``(directory, shards)``, kept for the process (compact)."""
    with _LOCK:
        if location in _MANIFESTS:
            return _MANIFESTS[location]
    read = read_manifest(location)
    found = None if read is None else (read[0], CompactShards(read[1]))
    with _LOCK:
        _MANIFESTS[location] = found
    return found


def read_manifest(location: str) -> tuple[str, dict[str, Any]] | None:
    """The manifest at ``location`` as ``(directory, {name: entry})``, parsed now, not kept.

    Raises:
        DataError: As :func:`load_index`.
    """
    data = load_index(location)
    found = None
    if data is not None:
        base = str(data.get("base", "."))
        if storage.is_remote(base):
            directory = base.rstrip("/")
        elif storage.is_remote(location):
            directory = (
                _dirname(location)
                if base == "."
                else posixpath.normpath(posixpath.join(_dirname(location), base))
            )
        else:
            directory = os.path.normpath(os.path.join(_dirname(location), base))
        found = (directory, data["shards"])
    return found


def use_index(files: Sequence[str], location: str) -> None:
    """Make ``files`` look up their entries in the manifest at ``location``."""
    with _LOCK:
        for f in files:
            _NAMED[str(f)] = location


def forget() -> None:
    """Forget loaded manifests (they are re-read on next use)."""
    with _LOCK:
        _MANIFESTS.clear()
        _DIRS.clear()
        _ANNOUNCED.clear()


_ANNOUNCED: set[str] = set()


def announce(location: str, shard: str) -> None:
    """Say once per process and index that remote shards are read through it (stderr).

    Without an index, the first fetch says so instead
    (:func:`zephon_nodes.io.storage.remote.fetched`): which path a run took is on stderr.
    """
    if not storage.is_remote(shard):
        return
    with _LOCK:
        if location in _ANNOUNCED:
            return
        _ANNOUNCED.add(location)
    print(
        f"zephon: reading remote shards through the dataset index {storage.redact(location)} "
        "(no shard fetched to list or count its records)",
        file=sys.stderr,
    )


def _normal(uri: str) -> str:
    if storage.is_remote(uri):
        return uri
    path = storage.local_path(uri)
    plain = path.startswith("/") and "/." not in path and "//" not in path
    return path if plain else os.path.abspath(path)


def find_entry(uri: str) -> tuple[dict[str, Any], str] | None:
    """Return ``(entry, manifest location)`` of a shard, if an index covers it.

    The entry is checked against the shard's size and version tag first.

    Raises:
        DataError: If the index does not match the shard (naming it and the rebuild command).
    """
    memo = build_memo()
    if memo is not None and ("index", str(uri)) in memo:
        hit: tuple[dict[str, Any], str] | None = memo[("index", str(uri))]
        return hit
    if not current().use_index:  # ZEPHON_NO_INDEX=1
        return None
    text = _normal(str(uri))
    found = _lookup(str(uri), text)
    if found is not None:
        entry, location, directory = found
        _check(text, entry, directory)
        announce(location, text)
        result: tuple[dict[str, Any], str] | None = (entry, location)
    else:
        result = None
    if memo is not None:
        memo[("index", str(uri))] = result
    return result


_DIRS: dict[str, tuple[str, str, Mapping[str, Any]] | None] = {}


def _candidates(text: str, named: str | None) -> list[str]:
    """Where the index of ``text`` may be: the dataset's, or its folder and SEARCH_UP above."""
    if named is not None:
        return [_normal(named)]
    out = []
    directory = _dirname(text)
    for _ in range(SEARCH_UP + 1):
        out.append(storage.join(directory, INDEX_NAME))
        parent = _dirname(directory)
        remote_root = storage.is_remote(text) and "://" not in parent
        if parent == directory or remote_root or not parent:
            break
        directory = parent
    return out


def _lookup(uri: str, text: str) -> tuple[dict[str, Any], str, str] | None:
    named = _NAMED.get(uri)
    key = "@" + _normal(named) if named is not None else _dirname(text)
    with _LOCK:
        known = key in _DIRS
        cached = _DIRS.get(key)
    if not known:
        cached = None
        for location in _candidates(text, named):
            found = _manifest(location)
            if found is None:
                continue
            directory, shards = found
            if text.startswith(directory + "/") and text[len(directory) + 1 :] in shards:
                cached = (location, directory, shards)
                break
        with _LOCK:
            _DIRS[key] = cached
    if cached is None:
        return None
    location, directory, shards = cached
    entry = shards.get(text[len(directory) + 1 :]) if text.startswith(directory + "/") else None
    return (entry, location, directory) if isinstance(entry, dict) else None


def _check(uri: str, entry: dict[str, Any], directory: str) -> None:
    st = storage.stat(uri)
    if st.size != entry.get("bytes"):
        raise DataError(
            f"{storage.redact(uri)}: the dataset index says {entry.get('bytes')} bytes, the "
            f"file has {st.size}; {rebuild_hint(directory)}"
        )
    if st.version and st.version == entry.get("version"):
        return
    if storage.is_remote(uri):
        # Another version tag (an index built on another copy: local files, another
        # bucket) or none at all: the entry holds for this copy only if its content is the
        # same. It is fetched and hashed once (remembered under its version tag).

        if content_checksum(uri, st) != entry.get("checksum"):
            raise DataError(
                f"{storage.redact(uri)}: content differs from the dataset index at "
                f"{storage.redact(directory)} (same size, other checksum; version tag "
                f"{st.version!r}, the index's {entry.get('version')!r}); "
                f"{rebuild_hint(directory)}"
            )
        entry["version"] = st.version
        return
    # A local copy has a new modification time: accept it only with the same content.
    if file_checksum(uri) != entry.get("checksum"):
        raise DataError(
            f"{uri}: content differs from the dataset index (same size, other checksum); "
            f"{rebuild_hint(directory)}"
        )
    entry["version"] = st.version


def indexed_identity(uri: str) -> dict[str, Any] | None:
    """``{"checksum", "bytes"}`` of a shard from its index, or ``None`` without an index."""
    found = find_entry(uri)
    if found is None:
        return None
    entry = found[0]
    return {"checksum": str(entry["checksum"]), "bytes": int(entry["bytes"])}


_kind = kind_of


def _frames(path: Path) -> list[list[int]]:
    """``[offset, compressed size, uncompressed size]`` of each zstd frame of a file."""
    data = path.read_bytes()
    dctx = zstandard.ZstdDecompressor()
    out = []
    offset = 0
    while offset < len(data):
        obj = dctx.decompressobj()
        plain = obj.decompress(data[offset:])
        used = len(data) - offset - len(obj.unused_data)
        out.append([offset, used, len(plain)])
        offset += used
    return out


def _common_dir(dirs: Sequence[str]) -> str:
    parts = [d.rstrip("/").split("/") for d in dirs]
    common = []
    for column in zip(*parts, strict=False):
        if any(c != column[0] for c in column):
            break
        common.append(column[0])
    return "/".join(common) or "/"


# Names a JSON-lines shard goes by; any other name read as JSON lines (the default kind) has
# its first record checked, so that `zephon index recipe.toml` is refused, not indexed.
_JSON_LINES = (".jsonl", ".json", ".ndjson", ".jsonl.zst", ".json.zst", ".ndjson.zst")
_FIRST_RECORD_CAP = 1 << 20


def _check_json_lines(path: Path, kind: str, first: np.ndarray, name: str) -> None:
    """Refuse a file whose first record is not a JSON object (a recipe, a README, a script).

    Raises:
        DataError: Naming the file, its first record and what a shard is.
    """
    start, end = int(first[0]), int(first[1])
    size = min(end - start, _FIRST_RECORD_CAP)
    with open(path, "rb") as f:
        if kind == "jsonl.zst":
            with zstandard.ZstdDecompressor().stream_reader(f) as plain:
                head = plain.read(start + size)
                while len(head) < start + size and (more := plain.read(start + size - len(head))):
                    head += more
            text = head[start:]
        else:
            f.seek(start)
            text = f.read(size)
    if size == end - start:
        try:
            ok = isinstance(json.loads(text), dict)
        except ValueError:
            ok = False
    else:  # a first record over 1 MiB: its first byte says whether it opens an object
        ok = text.lstrip()[:1] == b"{"
    if not ok:
        recipe = " (zephon index takes a dataset's shard files, not a recipe)"
        raise DataError(
            f"{name}: record 1 is not a JSON object ({text[:40]!r}): a shard named neither "
            "*.jsonl, *.parquet nor *.tar is read as JSON lines"
            + (recipe if name.endswith((".toml", ".yaml", ".yml")) else ""),
            kind="unreadable_file",
        )


def _local_entry(path: Path, kind: str, every: int, name: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"kind": kind}
    if kind in ("jsonl", "jsonl.zst"):
        if kind == "jsonl.zst":
            # Counted as a stream: no temporary file (the data folder may be read-only, and
            # concurrent runs must not share one).
            counter = LineCounter()
            decompress_to(path, counter)
            index = counter.index()
            entry["frames"] = _frames(path)
        else:
            index = index_file(path)
        if len(index) and not name.endswith(_JSON_LINES):
            _check_json_lines(path, kind, index[0], name)
        entry["records"] = int(index.shape[0])
        entry["every"] = every
        entry["offsets"] = [int(x) for x in index[::every, 0].tolist()]
        entry["end"] = int(index[-1, 1]) if len(index) else 0
    elif kind == "parquet":
        f = _pq().ParquetFile(str(path))
        meta = f.metadata
        counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        ends = [int(x) for x in np.cumsum(counts)] if counts else []
        entry["records"] = ends[-1] if ends else 0
        entry["row_group_ends"] = ends
        entry["columns"] = list(f.schema_arrow.names)
    else:
        samples = tar._index_tar(path)
        entry["records"] = len(samples)
        entry["samples"] = [[k, [list(m) for m in members]] for k, members in samples]
    return entry


def build_entry(uri: str, every: int = EVERY) -> dict[str, Any]:
    """Read one shard once and return its index entry.

    Raises:
        DataError: If the shard cannot be read or is corrupt.
    """
    kind = _kind(uri)
    st = storage.stat(uri)
    if storage.is_remote(uri):
        with fetched(uri, st) as (tmp, checksum):
            entry = _local_entry(tmp, kind, every, storage.redact(uri))
    else:
        path = Path(storage.local_path(uri))
        checksum = file_checksum(path)
        try:
            entry = _local_entry(path, kind, every, uri)
        except DataError as e:
            raise DataError(f"{uri}: {str(e).partition(': ')[2] or e}", kind=e.kind) from None
    return {"bytes": st.size, "version": st.version, "checksum": checksum, **entry}


def literal_dir(pattern: str) -> str | None:
    """The folders of ``pattern`` before its first wildcard; None without a wildcard."""
    parts = pattern.split("/")
    for i, part in enumerate(parts):
        if any(c in part for c in "*?["):
            return "/".join(parts[:i]) if i else None
    return None


def _pattern_dirs(patterns: Sequence[str]) -> list[str]:
    """Each wildcard pattern's folder before its first wildcard.

    A pipeline looks for the index there (:func:`zephon_nodes.io.index.table.resolve_indexed`).
    """
    out = []
    for pattern in patterns:
        literal = literal_dir(_normal(pattern))
        if literal:
            out.append(literal)
    return out


def build_index(
    patterns: Sequence[str],
    *,
    every: int = EVERY,
    workers: int = 8,
    progress: Callable[[int], Any] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Index every file matched by ``patterns`` (in parallel); return ``(directory, manifest)``.

    The manifest's names are relative to the common directory of the files and of each
    pattern's folder before its first wildcard (so ``data/*/*.jsonl`` gives ``data`` even if
    every file is in ``data/a``: a pipeline finds the index there without listing folders).

    Raises:
        DataError: If no file matches, or a shard cannot be read.
    """
    files: list[str] = []
    for pattern in patterns:
        matches = [m for m in storage.expand(pattern) if not is_index_file(m)]
        if not matches:
            local = not storage.is_remote(pattern) and os.path.isdir(storage.local_path(pattern))
            hint = f": it is a folder; name its shards ('{pattern.rstrip('/')}/*.jsonl')"
            raise DataError(
                f"pattern {storage.redact(pattern)!r} matches no file{hint if local else ''}"
            )
        files.extend(_normal(m) for m in matches)
    files = sorted(set(files))
    directory = _common_dir([_dirname(f) for f in files] + _pattern_dirs(patterns))

    def one(f: str) -> dict[str, Any]:
        entry = build_entry(f, every)
        if progress is not None:
            progress(1)
        return entry

    try:
        with ThreadPoolExecutor(max(1, workers)) as pool:
            entries = list(pool.map(one, files))
    finally:
        finish_progress()  # the "fetching" line of remote shards ends with the index
    shards = {f[len(directory) :].lstrip("/"): e for f, e in zip(files, entries, strict=True)}
    return directory, {"format": FORMAT, "version": VERSION, "every": every, "shards": shards}


def write_index(manifest: dict[str, Any], location: str, directory: str | None = None) -> None:
    """Write a manifest to a local path or remote URI (atomically for local files).

    Args:
        manifest: From :func:`build_index`.
        location: Where to write it.
        directory: The shards' directory, when not the manifest's own (kept as ``base``:
            relative for local paths, so a copied tree keeps working).

    Raises:
        DataError: If it cannot be written.
    """
    if directory is not None:
        here = _dirname(_normal(location))
        if storage.is_remote(directory) or storage.is_remote(location):
            base = "." if directory.rstrip("/") == here.rstrip("/") else directory
        else:
            base = os.path.relpath(directory, here)
        manifest = {**manifest, "base": base}
    blob = seal(json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode("utf-8"))
    if storage.is_remote(location):

        def put() -> None:
            with storage.filesystem(location).open(location, "wb") as f:
                f.write(blob)

        storage.with_retries(put, location, what="write")
    else:
        target = Path(storage.local_path(location))
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(target, lambda f: f.write(blob))
        except OSError as e:
            raise DataError(f"{target}: cannot write the dataset index: {e}") from None
    with _LOCK:
        _MANIFESTS.pop(_normal(location), None)
        _DIRS.clear()
