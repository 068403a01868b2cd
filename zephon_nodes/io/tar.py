"""WebDataset-style tar shards: samples ``KEY.jpg|jpeg|png|webp`` + ``KEY.txt|json``.

A sample is every member sharing a key (the member path up to the first dot of its file
name). Opening a shard builds a member index once (one pass over the headers; the JSON index
is cached in :func:`~zephon_nodes.io.cache.cache_dir`, keyed by path, size and modification
time), so reading any range of samples costs one seek and read per member.
"""

from __future__ import annotations

import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon_nodes.errors import DataError
from zephon_nodes.io.cache import atomic_write, cache_dir, cache_key

__all__ = ["IMAGE_EXTENSIONS", "TEXT_EXTENSIONS", "TarSample", "TarShard", "open_tar_shard"]

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
TEXT_EXTENSIONS = ("txt", "json")
_INDEX_FORMAT = 1

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


def _load(index_path: str) -> list[_Entry]:
    entries = _INDEXES.get(index_path)
    if entries is None:
        with open(index_path, encoding="utf-8") as f:
            data = json.load(f)
        entries = [
            (key, tuple((str(e), int(o), int(s)) for e, o, s in members))
            for key, members in data["samples"]
        ]
        _INDEXES[index_path] = entries
    return entries


@dataclass(frozen=True)
class TarShard:
    """A tar shard with a member index; small and picklable, so it travels with tasks.

    Attributes:
        path: The shard as named by the recipe (used in messages).
        index_path: The cached JSON member index.
        num_records: Number of samples (keys).
    """

    path: str
    index_path: str
    num_records: int

    def read(self, start: int, stop: int) -> list[tuple[int, TarSample]]:
        """Return samples ``[start, stop)`` as ``(sample number, TarSample)`` pairs."""
        if not 0 <= start <= stop <= self.num_records:
            raise DataError(f"{self.path}: samples [{start}, {stop}) out of range")
        entries = _load(self.index_path)[start:stop]
        out = []
        try:
            with open(self.path, "rb") as f:
                for k, (key, members) in enumerate(entries):
                    images: list[tuple[str, bytes]] = []
                    text = js = None
                    for ext, offset, size in members:
                        f.seek(offset)
                        blob = f.read(size)
                        if len(blob) != size:
                            raise DataError(
                                f"{self.path}: key {key!r}: file changed since it was "
                                f"indexed (short read)"
                            )
                        if ext in IMAGE_EXTENSIONS:
                            images.append((ext, blob))
                        elif ext == "txt":
                            text = blob
                        else:
                            js = blob
                    out.append((start + k, TarSample(key, tuple(images), text, js)))
        except OSError as e:
            raise DataError(f"{self.path}: cannot read: {e}") from None
        return out

    def key(self, record: int) -> str:
        """Return the key of sample ``record``."""
        return _load(self.index_path)[record][0]

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
                        f"{info.offset_data + info.size}, the file has {size}"
                    )
                key, ext = _split_name(info.name)
                if ext not in IMAGE_EXTENSIONS and ext not in TEXT_EXTENSIONS:
                    continue
                if key not in members:
                    order.append(key)
                    members[key] = []
                if ext in TEXT_EXTENSIONS and any(e == ext for e, _, _ in members[key]):
                    raise DataError(f"{path}: key {key!r}: two {ext!r} members")
                members[key].append((ext, info.offset_data, info.size))
    except tarfile.ReadError as e:
        text = str(e)
        if "unexpected end" in text or "truncated" in text:
            raise DataError(f"{path}: truncated tar: {text}") from None
        raise DataError(f"{path}: not a readable tar file: {text}") from None
    except (tarfile.TarError, EOFError) as e:
        raise DataError(f"{path}: truncated tar: {e}") from None
    return [(k, tuple(members[k])) for k in order]


def open_tar_shard(path: str | os.PathLike[str]) -> TarShard:
    """Index a tar shard (once per machine) and return a handle.

    Raises:
        DataError: If the file is missing, unreadable, not a tar file, or truncated.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: data file not found")
    try:
        index_path = cache_dir() / f"{cache_key(p)}.tar-index.json"
        if not index_path.exists():
            entries = _index_tar(p)
            blob = json.dumps(
                {"format": _INDEX_FORMAT, "samples": [[k, list(m)] for k, m in entries]},
                separators=(",", ":"),
            ).encode("utf-8")

            def write(f: Any) -> None:
                f.write(blob)

            atomic_write(index_path, write)
        n = len(_load(str(index_path)))
    except OSError as e:
        raise DataError(f"{p}: cannot read: {e}") from None
    return TarShard(path=str(p), index_path=str(index_path), num_records=n)
