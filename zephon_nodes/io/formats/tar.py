"""WebDataset-style tar shards: samples ``KEY.jpg|jpeg|png|webp`` + ``KEY.txt|json``.

A sample is every member sharing a key (the member path up to the first dot of its file
name). Opening a shard builds a member index once (one pass over the headers; the JSON index
is cached in :func:`~zephon_nodes.io.storage.cache.cache_dir`, keyed by the shard's content
checksum), so reading any range of samples costs one read (one range request for a remote shard).
The cached index carries its samples' checksum and the cache key it was written for: one that
does not match, is read under another key (files swapped or copied over each other) or is of
an older cache (no key) is dropped, made again and counted (``bad_cache_entries``), once, under
the entry's file lock: a process's threads and a node's processes share the cache directory.
"""

from __future__ import annotations

import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from zephon_nodes.core.errors import (
    EMPTY_FILE,
    MISSING_FILE,
    TRUNCATED_FILE,
    UNREADABLE_FILE,
    DataError,
    FileErrorKind,
    os_error_kind,
)
from zephon_nodes.io.formats.entrysums import BadEntry, count_bad, drop
from zephon_nodes.io.nodecache.locks import entry_lock
from zephon_nodes.io.storage import storage
from zephon_nodes.io.storage.cache import atomic_write, cache_dir
from zephon_nodes.io.storage.checksum import file_checksum
from zephon_nodes.io.storage.remote import fetched, known_checksum

__all__ = ["IMAGE_EXTENSIONS", "TEXT_EXTENSIONS", "TarSample", "TarShard", "open_tar_shard"]

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
TEXT_EXTENSIONS = ("txt", "json")
_INDEX_FORMAT = 2  # 2: the samples' checksum is written with them (and now their key)

# One indexed sample: key, then (extension, offset, size) of each member in archive order.
_Entry = tuple[str, tuple[tuple[str, int, int], ...]]


@dataclass(frozen=True, slots=True)
class TarSample:
    """The raw members of one sample.

    Attributes:
        key: The sample key.
        images: Image members' bytes, in archive order, with their extensions.
        text: The ``.txt`` member's bytes, if any.
        json: The ``.json`` member's bytes, if any.
    """

    key: str
    images: tuple[tuple[str, bytes], ...]
    text: bytes | None
    json: bytes | None


_INDEXES: dict[str, list[_Entry]] = {}


def _samples_sum(samples: Any) -> str:
    """The xxh3-128 of a member index's samples, as its JSON is written."""
    return xxhash.xxh3_128_hexdigest(json.dumps(samples, separators=(",", ":")).encode("utf-8"))


def _entry_key(index_path: str | os.PathLike[str]) -> str:
    """The cache key a member index is kept under: its file name up to ``.tar-index-v``."""
    return os.path.basename(os.fspath(index_path)).partition(".tar-index-v")[0]


def _index_blob(samples: Any, index_path: str | os.PathLike[str]) -> bytes:
    """A member index as it is kept, with its checksum and the key it is written for."""
    body = {
        "format": _INDEX_FORMAT,
        "entry": _entry_key(index_path),
        "samples": samples,
        "sum": _samples_sum(samples),
    }
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def _load(index_path: str) -> list[_Entry]:
    """A cached member index, checked against the checksum written with it.

    Raises:
        BadEntry: It is unreadable or not what was written (the caller makes it again).
    """
    entries = _INDEXES.get(index_path)
    if entries is None:
        try:
            with open(index_path, encoding="utf-8") as f:
                data = json.load(f)
            samples = data["samples"]
            if data.get("format") != _INDEX_FORMAT or data.get("sum") != _samples_sum(samples):
                raise ValueError("its checksum does not match")
            if data.get("entry") != _entry_key(index_path):  # none: an older cache's
                raise ValueError(f"it is the index of another entry ({data.get('entry')})")
            entries = [
                (str(key), tuple((str(e), int(o), int(s)) for e, o, s in members))
                for key, members in samples
            ]
        except FileNotFoundError:
            raise
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise BadEntry(f"{index_path}: bad cached tar member index ({e})") from None
        _INDEXES[index_path] = entries
    return entries


@dataclass(frozen=True)
class TarShard:
    """A tar shard with a member index; small and picklable, so it travels with tasks.

    Attributes:
        path: The shard as named by the recipe (used in messages).
        index_path: The cached JSON member index.
        num_records: Number of samples (keys).
        checksum: Content checksum of the shard file (``xxh3_128:...``).
        size: Bytes of the shard file.
        uri: Where the bytes are read from (``path`` unless the shard is remote).
        version: A remote shard's version tag when it was opened: every range read is
            conditional on it.
    """

    path: str
    index_path: str
    num_records: int
    checksum: str = ""
    size: int = 0
    uri: str = ""
    version: str = ""

    def read(self, start: int, stop: int) -> list[tuple[int, TarSample]]:
        """Return samples ``[start, stop)`` as ``(sample number, TarSample)`` pairs."""
        if not 0 <= start <= stop <= self.num_records:
            raise DataError(f"{self.path}: samples [{start}, {stop}) out of range")
        entries = self._entries()[start:stop]
        if not entries:
            return []
        lo = min(o for _, members in entries for _, o, _ in members)
        hi = max(o + n for _, members in entries for _, o, n in members)
        try:
            source = self.uri or self.path
            pin = self.version if storage.is_remote(source) else ""
            blob = storage.read_range(source, lo, hi, tag=self.checksum, version=pin)
        except DataError as e:
            raise DataError(
                f"{self.path}: {str(e).partition(': ')[2]}",
                kind=e.kind,
                refused_under_skip=e.refused_under_skip,
            ) from None
        out = []
        for k, (key, members) in enumerate(entries):
            images: list[tuple[str, bytes]] = []
            text = js = None
            for ext, offset, size in members:
                member = blob[offset - lo : offset - lo + size]
                if ext in IMAGE_EXTENSIONS:
                    images.append((ext, member))
                elif ext == "txt":
                    text = member
                else:
                    js = member
            out.append((start + k, TarSample(key, tuple(images), text, js)))
        return out

    def key(self, record: int) -> str:
        """Return the key of sample ``record``."""
        return self._entries()[record][0]

    def _entries(self) -> list[_Entry]:
        """The member index; a bad cached one is dropped, made again and counted."""
        try:
            return _load(self.index_path)
        except (BadEntry, FileNotFoundError):
            entries = _reindexed(self)
        if len(entries) != self.num_records:
            raise DataError(
                f"{self.path}: {len(entries)} samples now, {self.num_records} when opened"
            )
        return entries

    def where(self, record: int) -> str:
        """Describe a sample's place for error messages: ``path key 'KEY'``."""
        return f"{self.path} key {self.key(record)!r}"


def _split_name(name: str) -> tuple[str, str]:
    head, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    key = f"{head}/{stem}" if head else stem
    return key, ext.lower() if dot else ""


def _index_tar(path: Path) -> list[_Entry]:
    size = path.stat().st_size
    order: list[str] = []
    members: dict[str, list[tuple[str, int, int]]] = {}
    try:
        with tarfile.open(path, "r:") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                if info.offset_data + info.size > size:
                    raise DataError(
                        f"{path}: truncated tar: member {info.name!r} needs bytes up to "
                        f"{info.offset_data + info.size}, the file has {size}",
                        kind=TRUNCATED_FILE,
                    )
                key, ext = _split_name(info.name)
                if ext not in IMAGE_EXTENSIONS and ext not in TEXT_EXTENSIONS:
                    continue
                if key not in members:
                    order.append(key)
                    members[key] = []
                if ext in TEXT_EXTENSIONS and any(e == ext for e, _, _ in members[key]):
                    raise DataError(
                        f"{path}: key {key!r}: two {ext!r} members", kind=UNREADABLE_FILE
                    )
                members[key].append((ext, info.offset_data, info.size))
    except tarfile.ReadError as e:
        text = str(e)
        if "unexpected end" in text or "truncated" in text:
            raise DataError(f"{path}: truncated tar: {text}", kind=TRUNCATED_FILE) from None
        kind: FileErrorKind = EMPTY_FILE if text == "empty file" else UNREADABLE_FILE
        raise DataError(f"{path}: not a readable tar file: {text}", kind=kind) from None
    except (tarfile.TarError, EOFError) as e:
        raise DataError(f"{path}: truncated tar: {e}", kind=TRUNCATED_FILE) from None
    return [(k, tuple(members[k])) for k in order]


def _index_path(checksum: str) -> Path:
    key = checksum.partition(":")[2][:32]
    return cache_dir() / f"{key}.tar-index-v{_INDEX_FORMAT}.json"


def _write_index(src: Path, index_path: Path) -> None:
    entries = _index_tar(src)
    blob = _index_blob([[k, [list(x) for x in m]] for k, m in entries], index_path)
    atomic_write(index_path, lambda f: f.write(blob))


def _count(shard: TarShard) -> int:
    """Samples in ``shard``'s member index; a bad cached one is dropped, remade and counted."""
    try:
        return len(_load(shard.index_path))
    except BadEntry:
        return len(_reindexed(shard))


def _reindexed(shard: TarShard) -> list[_Entry]:
    """``shard``'s member index, dropped, made again and counted if it is still bad.

    Under the entry's file lock, checked afresh first: readers that find the same bad index
    at once (a process's threads, a node's processes) make it once, and none drops the index
    another has just made.

    Raises:
        DataError: If the shard's content is no longer the one it was opened with.
    """
    with entry_lock(Path(shard.index_path).with_suffix(".lock")):
        try:
            return _load(shard.index_path)  # made again meanwhile by another reader
        except (BadEntry, FileNotFoundError):
            pass
        drop(shard.index_path)
        count_bad()
        _remake(shard)
        return _load(shard.index_path)


def _remake(shard: TarShard) -> None:
    """Index ``shard`` again from its bytes (its cached member index was bad).

    Raises:
        DataError: If the shard's content is no longer the one it was opened with.
    """
    text = shard.uri or shard.path
    if storage.is_remote(text):
        with fetched(text, storage.stat(text)) as (tmp, checksum):
            if checksum != shard.checksum:
                raise DataError(f"{shard.path}: content changed during the run")
            _write_index(tmp, Path(shard.index_path))
        return
    src = Path(storage.local_path(text))
    if file_checksum(src) != shard.checksum:
        raise DataError(f"{shard.path}: content changed during the run")
    _write_index(src, Path(shard.index_path))


def indexed_tar_shard(uri: str, entry: dict[str, Any]) -> TarShard:
    """A tar shard from its dataset-index entry, without reading the file."""
    checksum = str(entry["checksum"])
    index_path = _index_path(checksum)
    if not index_path.exists():
        blob = _index_blob(entry["samples"], index_path)
        atomic_write(index_path, lambda f: f.write(blob))
    return TarShard(
        path=storage.redact(uri),
        index_path=str(index_path),
        num_records=int(entry["records"]),
        checksum=checksum,
        size=int(entry["bytes"]),
        uri=uri,
        version=str(entry.get("version", "")),
    )


def open_tar_shard(path: str | os.PathLike[str]) -> TarShard:
    """Index a tar shard (once per content) and return a handle; ``path`` may be a URI.

    Raises:
        DataError: If the file is missing, unreadable, not a tar file, or truncated.
    """
    text = str(path)
    if storage.is_remote(text):
        st = storage.stat(text)
        checksum = known_checksum(text, st)
        if checksum is None or not _index_path(checksum).exists():
            with fetched(text, st) as (tmp, checksum):
                try:
                    _write_index(tmp, _index_path(checksum))
                except DataError as e:
                    raise DataError(
                        f"{storage.redact(text)}: {str(e).partition(': ')[2]}", kind=e.kind
                    ) from None
        index_path = _index_path(checksum)
        n = _count(TarShard(storage.redact(text), str(index_path), 0, checksum, st.size, text))
        return TarShard(
            path=storage.redact(text),
            index_path=str(index_path),
            num_records=n,
            checksum=checksum,
            size=st.size,
            uri=text,
            version=st.version,
        )
    p = Path(storage.local_path(text))
    if not p.is_file():
        raise DataError(f"{p}: data file not found", kind=MISSING_FILE)
    try:
        checksum = file_checksum(p)
        index_path = _index_path(checksum)
        if not index_path.exists():
            _write_index(p, index_path)
        size = p.stat().st_size
        n = _count(TarShard(str(p), str(index_path), 0, checksum, size))
    except OSError as e:
        raise DataError(f"{p}: cannot read: {e}", kind=os_error_kind(e)) from None
    return TarShard(
        path=str(p), index_path=str(index_path), num_records=n, checksum=checksum, size=size
    )
