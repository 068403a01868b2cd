"""LitData corpora (``litdata.optimize`` / ``BinaryWriter``): token-id items of ``.bin`` chunks.

A folder holds ``index.json`` (``{"chunks": [...], "config": {...}}``: each chunk's
``filename`` and ``chunk_size`` (items), the items' ``data_format`` (one serializer per
leaf), ``data_spec`` (the tree of an item) and ``compression``) and the chunks. A chunk is:
the item count ``n`` (uint32), ``n + 1`` byte offsets (uint32), then each item: a uint32 size
for every leaf, then the leaves' bytes.

An item is one document: a tensor or 1-D array of integers, or a dict of them (the leaf named
by the dataset's ``text_field``, else its only integer leaf). Leaf formats read:
``no_header_tensor:<k>``, ``no_header_numpy:<k>`` (what 1-D tensors and arrays are written
as) and ``tensor``. ``zstd`` chunks (frames of items, LitData's default, or whole chunks)
are fetched whole and decompressed once per process; ``TokensLoader`` chunks (a flat token
stream without documents) are refused.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import zstandard

from zephon_nodes.core.errors import CORRUPT_ZSTD, TRUNCATED_FILE, DataError
from zephon_nodes.io.formats.tokenfiles import (
    FileRef,
    bad_ids,
    bad_parts,
    check_count,
    check_distinct,
    decompressed,
    offset_table,
    pin,
    read_json,
    read_listing,
    sibling,
)
from zephon_nodes.io.storage import storage

__all__ = ["LitDataShard", "chunk_files", "open_litdata_shards"]

# litdata.constants._TORCH_DTYPES_MAPPING (integers) and _NUMPY_DTYPES_MAPPING (integers).
TORCH_DTYPES = {
    11: "u1",
    12: "i1",
    13: "<i2",
    14: "<i2",
    15: "<i4",
    16: "<i4",
    17: "<i8",
    18: "<i8",
    20: "<u2",
}
NUMPY_DTYPES = {0: "i1", 1: "<i2", 2: "<i4", 3: "<i8", 4: "u1", 5: "<u2", 6: "<u4", 7: "<u8"}
_DTYPES = {name: np.dtype(name) for name in (*TORCH_DTYPES.values(), *NUMPY_DTYPES.values())}
NAMES = ("chunk", "item")  # a file's kind and a record's, for messages


@dataclass(frozen=True)
class LitDataShard:
    """One LitData chunk's token leaf; small and picklable.

    Attributes:
        path: The chunk file, for messages.
        file: The chunk as opened.
        num_records: Items in the chunk.
        leaves: Leaves of an item.
        leaf: Index of the token leaf.
        dtype: The leaf's dtype (numpy string); ``""``: in the leaf (``tensor`` format).
        compression: ``""``, ``"zstd"`` (the whole chunk) or ``"batch"`` (zstd frames of
            items, LitData's default for ``compression="zstd"``).
    """

    token_ids: ClassVar[bool] = True

    path: str
    file: FileRef
    num_records: int
    leaves: int
    leaf: int
    dtype: str
    compression: str = ""

    def read(self, start: int, stop: int) -> list[tuple[int, np.ndarray]]:
        """Return items ``[start, stop)`` as ``(item number, ids)`` pairs.

        Raises:
            DataError: A range outside the chunk, or a corrupt chunk.
        """
        if not 0 <= start <= stop <= self.num_records:
            raise DataError(f"{self.path}: items [{start}, {stop}) out of range")
        if start == stop:
            return []
        if self.compression == "batch":
            blob: bytes | None = decompressed(self.file, "litdata-framed", unframe)
        else:
            blob = decompressed(self.file, "zstd") if self.compression else None
        items = offset_table(self.file, blob, (start, stop, self.num_records), self.path, NAMES)
        heads = struct.Struct(f"<{self.leaves}I")
        return [(k, self._decode(item, k, heads)) for k, item in items]

    def _decode(self, item: bytes, record: int, heads: struct.Struct) -> np.ndarray:
        if len(item) < heads.size:
            raise DataError(f"{self.where(record)}: a truncated item", kind=TRUNCATED_FILE)
        sizes = heads.unpack_from(item)
        if heads.size + sum(sizes) != len(item):
            said = heads.size + sum(sizes)
            raise bad_parts(self.where(record), len(item), said, NAMES, "leaves")
        pos = heads.size + sum(sizes[: self.leaf])
        value = item[pos : pos + sizes[self.leaf]]
        dtype, offset, count = self.dtype, 0, None
        if not dtype:
            if len(value) < 12:
                raise DataError(f"{self.where(record)}: a truncated tensor", kind=TRUNCATED_FILE)
            code, rank, count = struct.unpack_from(">III", value, 0)
            if code not in TORCH_DTYPES or rank != 1:
                raise DataError(
                    f"{self.where(record)}: a tensor of dtype code {code} and rank {rank}, not "
                    f"1-D integers"
                )
            dtype, offset = TORCH_DTYPES[code], 12
        ids = _DTYPES[dtype]
        body = len(value) - offset
        if body % ids.itemsize or (count is not None and body != count * ids.itemsize):
            raise bad_ids(self.where(record), body, ids, count, NAMES, "leaf")
        return np.frombuffer(value, dtype=ids, offset=offset)

    def where(self, record: int) -> str:
        """Describe an item's place for error messages."""
        return f"{self.path} item {record}"


_FRAMED_MAGIC = b"LDFZ01\x00\x00"
_PREFIX = struct.Struct("<8sHHIII")  # magic, version, flags, items, items per frame, frames
_FRAME = struct.Struct("<IIQII")  # first item, items, offset, compressed, uncompressed bytes


def unframe(raw: bytes, where: str) -> bytes:
    """A chunk of zstd frames of items (``compression_level="batch"``) in the plain layout.

    The framed chunk is the prefix, the items' offsets from the first item (uint32[n + 1]),
    a table of frames and the frames; the plain one is ``n``, the items' file offsets and the
    items, which :meth:`LitDataShard.read` reads.

    Raises:
        DataError: A chunk that is not framed, or a corrupt frame.
    """
    if len(raw) < _PREFIX.size or raw[:8] != _FRAMED_MAGIC:
        raise DataError(f"{where}: not a framed zstd LitData chunk", kind=TRUNCATED_FILE)
    _, version, _, n, _, frames = _PREFIX.unpack_from(raw, 0)
    if version != 1:
        raise DataError(f"{where}: framed chunk version {version} is not read (1 is)")
    table = _PREFIX.size + 4 * (n + 1)
    if len(raw) < table + frames * _FRAME.size:
        raise DataError(f"{where}: a truncated framed chunk", kind=TRUNCATED_FILE)
    logical = np.frombuffer(raw, dtype="<u4", count=n + 1, offset=_PREFIX.size).astype(np.int64)
    dctx = zstandard.ZstdDecompressor()
    parts = []
    for i in range(frames):
        _, _, offset, size, plain = _FRAME.unpack_from(raw, table + i * _FRAME.size)
        if offset + size > len(raw):
            raise DataError(f"{where}: a truncated zstd frame {i}", kind=TRUNCATED_FILE)
        try:
            part = dctx.decompress(raw[offset : offset + size], max_output_size=plain)
        except zstandard.ZstdError as e:
            raise DataError(f"{where}: corrupt zstd frame {i}: {e}", kind=CORRUPT_ZSTD) from None
        if len(part) != plain:
            raise DataError(
                f"{where}: zstd frame {i} is {len(part)} bytes, its table says {plain}",
                kind=CORRUPT_ZSTD,
            )
        parts.append(part)
    total = sum(len(p) for p in parts)
    if int(logical[0]) != 0 or int(logical[-1]) != total:
        raise DataError(
            f"{where}: its items end at byte {int(logical[-1])} of {total} decompressed",
            kind=CORRUPT_ZSTD,
        )
    header = 4 + 4 * (n + 1)
    offsets = (logical + header).astype("<u4")
    return struct.pack("<I", n) + offsets.tobytes() + b"".join(parts)


def _leaf_names(spec_text: str) -> list[str | None]:
    """Names of an item's leaves from LitData's ``data_spec`` (None: the item is a leaf)."""
    spec = json.loads(spec_text)
    tree = spec[1] if isinstance(spec, list) and len(spec) > 1 else spec
    if tree.get("type") is None:
        return [None]
    children = tree.get("children_spec", [])
    context = tree.get("context")
    keys = json.loads(context) if isinstance(context, str) and context.startswith("[") else None
    names = [str(k) for k in keys] if keys is not None else [str(i) for i in range(len(children))]
    if any(c.get("type") is not None for c in children):
        return [None] * 0  # nested trees: no leaf is named
    return list(names)


def _leaf_dtype(fmt: str) -> str | None:
    kind, _, code = fmt.partition(":")
    if kind == "tensor":
        return ""
    if kind == "no_header_tensor":
        return TORCH_DTYPES.get(int(code))
    if kind == "no_header_numpy":
        return NUMPY_DTYPES.get(int(code))
    return None


def _token_leaf(config: dict[str, Any], field: str, where: str) -> tuple[int, str]:
    formats = [str(f) for f in config.get("data_format") or []]
    names = _leaf_names(str(config.get("data_spec") or "[1, {}]"))
    dtypes = [_leaf_dtype(f) for f in formats]
    if len(names) != len(formats):
        raise DataError(f"{where}: items of a nested tree ({formats}); one level is read")
    if field in names:
        k = names.index(field)
    elif len(formats) == 1:
        k = 0
    else:
        ints = [i for i, d in enumerate(dtypes) if d is not None]
        if len(ints) != 1:
            raise DataError(
                f"{where}: no token leaf {field!r} (leaves {names}); name it with the "
                f"dataset's text_field"
            )
        k = ints[0]
    dtype = dtypes[k]
    if dtype is None:
        leaves = [names[i] or str(i) for i, d in enumerate(dtypes) if d is not None]
        hint = f"; name one of {leaves} with the dataset's text_field" if leaves else ""
        raise DataError(
            f"{where}: leaf {names[k] or 0!r} is {formats[k]!r}; a token leaf is a 1-D tensor "
            f"or array of integers{hint}"
        )
    return k, dtype


def open_litdata_shards(index_uri: str, field: str) -> list[LitDataShard]:
    """The chunks listed by a LitData ``index.json``, in its order (each file pinned).

    Raises:
        DataError: An ``index.json`` that is not LitData's, a missing chunk, no token leaf.
    """
    where = storage.redact(index_uri)
    index = read_listing(index_uri, "chunks", "a LitData")
    config = index.get("config") or {}
    if not isinstance(config, dict):
        raise DataError(f"{where}: its config is not a JSON object (not a LitData index.json)")
    loader = str(config.get("item_loader") or "PyTreeLoader")
    if loader != "PyTreeLoader":
        raise DataError(
            f"{where}: chunks of LitData's {loader} (a token stream without documents); "
            f"write one item per document (the default PyTreeLoader)"
        )
    compression = str(config.get("compression") or "")
    level = str(config.get("compression_level") or "chunk")
    if compression and (not compression.startswith("zstd") or level not in ("chunk", "batch")):
        raise DataError(
            f"{where}: chunks compressed with {compression!r} at level {level!r} (zstd "
            f"chunks, whole or framed by batches, are read)"
        )
    if not config.get("data_format"):
        raise DataError(f"{where}: no data_format in its config (not a LitData index.json)")
    try:
        leaf, dtype = _token_leaf(config, field, where)
        leaves = len(config["data_format"])
        chunks = [(_filename(c), int(c["chunk_size"])) for c in index["chunks"]]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise DataError(f"{where}: not a LitData index.json ({type(e).__name__}: {e})") from None
    check_distinct(where, [name for name, _ in chunks], "chunk")
    out = []
    for name, items in chunks:
        uri = sibling(index_uri, name)
        file = pin(uri)
        size = _plain_size(file, level, items, storage.redact(uri)) if compression else file.size
        check_count(storage.redact(uri), items, size, NAMES)
        out.append(
            LitDataShard(
                path=storage.redact(uri),
                file=file,
                num_records=items,
                leaves=leaves,
                leaf=leaf,
                dtype=dtype,
                compression=(level if level == "batch" else "zstd") if compression else "",
            )
        )
    return out


def _plain_size(file: FileRef, level: str, items: int, where: str) -> int | None:
    """A compressed chunk's size in the plain layout, from its first bytes (one small read).

    A whole zstd chunk's frame header holds its content size (None if the writer left it
    out); a framed chunk's prefix holds its item count, which must be ``items`` (then None).

    Raises:
        DataError: A corrupt header, or a framed chunk of another item count.
    """
    if level != "batch":
        try:
            size = zstandard.frame_content_size(file.read(0, min(file.size, 18)))
        except zstandard.ZstdError as e:
            raise DataError(f"{where}: corrupt zstd data: {e}", kind=CORRUPT_ZSTD) from None
        return size if size >= 0 else None
    if file.size < _PREFIX.size:
        raise DataError(f"{where}: a truncated framed chunk", kind=TRUNCATED_FILE)
    magic, _, _, n, _, _ = _PREFIX.unpack(file.read(0, _PREFIX.size))
    if magic != _FRAMED_MAGIC:
        raise DataError(f"{where}: not a framed zstd LitData chunk", kind=TRUNCATED_FILE)
    if n != items:
        raise DataError(
            f"{where}: the chunk holds {n} items, and its index.json lists it with {items} "
            f"items (an index.json of other chunks, or a corrupt chunk)",
            kind=TRUNCATED_FILE,
        )
    return None


def _filename(chunk: dict[str, Any]) -> str:
    """A chunk entry's file name."""
    name = chunk["filename"]
    if not isinstance(name, str) or not name:
        raise ValueError(f"chunk filename {name!r}")
    return name


def chunk_files(index_uri: str) -> list[str]:
    """The chunk files a LitData ``index.json`` names, in order (for the content identity).

    An entry without its file names none (the ``index.json`` itself is in the identity, and
    opening the corpus refuses the entry).
    """
    index = read_json(index_uri)
    chunks = index.get("chunks") if isinstance(index, dict) else None
    out = []
    for chunk in chunks if isinstance(chunks, list) else []:
        try:
            out.append(sibling(index_uri, _filename(chunk)))
        except (KeyError, TypeError, ValueError):
            continue
    return out
