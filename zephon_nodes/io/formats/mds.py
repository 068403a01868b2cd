"""MDS corpora (``mosaicml-streaming``): a token-ids column of ``.mds`` shards, read with numpy.

A folder holds ``index.json`` (``{"version": 2, "shards": [...]}``, each shard's
``column_names``, ``column_encodings``, ``column_sizes``, ``samples``, ``compression`` and
the file names ``raw_data.basename`` / ``zip_data.basename``) and the shards. A shard file
is: the sample count ``n`` (uint32), ``n + 1`` byte offsets (uint32), then each sample: a
uint32 size for every column of variable size, then the columns' bytes in column order.

The token column is the dataset's ``text_field`` if the shard has it, else its one
``ndarray`` column. Encodings read: ``ndarray`` (static or per-sample dtype and shape, one
dimension of integers) and ``ndarray:<dtype>``. Shards compressed whole (``zstd``, ``gz``)
are fetched whole and decompressed once per process; uncompressed ones are range read.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from zephon_nodes.core.errors import TRUNCATED_FILE, DataError
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

__all__ = ["MDSShard", "open_mds_shards"]

# streaming's NDArray value dtype codes (``_int2value_dtype``), integers only.
VALUE_DTYPES = {8: "u1", 9: "i1", 16: "<u2", 17: "<i2", 32: "<u4", 33: "<i4", 64: "<u8", 65: "<i8"}
_SHAPE_WIDTHS = (1, 2, 4, 8)  # bytes of each shape value, by streaming's shape dtype code
_NAMED = {
    "uint8": "u1",
    "int8": "i1",
    "uint16": "<u2",
    "int16": "<i2",
    "uint32": "<u4",
    "int32": "<i4",
    "uint64": "<u8",
    "int64": "<i8",
}
_DTYPES = {name: np.dtype(name) for name in VALUE_DTYPES.values()}
_NAMES = ("shard", "sample")  # a file's kind and a record's, for messages
_SCALAR_SIZES = {
    "int": 8,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "float16": 2,
    "float32": 4,
    "float64": 8,
}


@dataclass(frozen=True)
class MDSShard:
    """One ``.mds`` shard's token column; small and picklable.

    Attributes:
        path: The shard file, for messages.
        file: The file read (the compressed one when ``compression`` is set).
        num_records: Samples in the shard.
        column: Index of the token column among the shard's columns.
        variable: For each column, whether its size is per sample (a uint32 in each sample).
        sizes: Each column's fixed size in bytes (0: variable).
        dtype: The token column's fixed dtype (numpy string), or ``""``: in each sample.
        shape: Whether the token column's shape is in each sample.
        compression: ``""``, ``"zstd"`` or ``"gz"``.
    """

    token_ids: ClassVar[bool] = True

    path: str
    file: FileRef
    num_records: int
    column: int
    sizes: tuple[int, ...]
    dtype: str
    shape: bool
    compression: str = ""

    def read(self, start: int, stop: int) -> list[tuple[int, np.ndarray]]:
        """Return samples ``[start, stop)`` as ``(sample number, ids)`` pairs.

        Raises:
            DataError: A range outside the shard, or a sample that is not what
                ``index.json`` says.
        """
        if not 0 <= start <= stop <= self.num_records:
            raise DataError(f"{self.path}: samples [{start}, {stop}) out of range")
        if start == stop:
            return []
        codec = self.compression.split(":")[0]
        blob = decompressed(self.file, codec) if codec else None
        samples = offset_table(self.file, blob, (start, stop, self.num_records), self.path, _NAMES)
        nvar = sum(1 for size in self.sizes if not size)
        heads = struct.Struct(f"<{nvar}I")
        return [(k, self._decode(sample, k, heads)) for k, sample in samples]

    def _decode(self, sample: bytes, record: int, heads: struct.Struct) -> np.ndarray:
        if len(sample) < heads.size:
            raise DataError(f"{self.where(record)}: a truncated sample", kind=TRUNCATED_FILE)
        var = iter(heads.unpack_from(sample))
        sizes = [fixed or next(var) for fixed in self.sizes]
        if heads.size + sum(sizes) != len(sample):
            said = heads.size + sum(sizes)
            raise bad_parts(self.where(record), len(sample), said, _NAMES, "columns")
        pos = heads.size + sum(sizes[: self.column])
        value = sample[pos : pos + sizes[self.column]]
        return _ndarray(value, self.dtype, self.shape, self.where, record)

    def where(self, record: int) -> str:
        """Describe a sample's place for error messages."""
        return f"{self.path} sample {record}"


def _ndarray(
    value: bytes, dtype: str, shaped: bool, where: Callable[[int], str], record: int
) -> np.ndarray:
    """Decode one ``ndarray`` value (streaming's ``NDArray`` layout) of sample ``record``.

    Raises:
        DataError: Not 1-D integers, or a value whose bytes are not its shape's ids
            (``where(record)`` names the sample).
    """
    pos = 0
    if not dtype:
        code = value[0] if value else -1
        if code not in VALUE_DTYPES:
            raise DataError(f"{where(record)}: token column of dtype code {code}, not integers")
        dtype, pos = VALUE_DTYPES[code], 1
    ids = _DTYPES[dtype]
    count = None
    if shaped:
        if len(value) <= pos:
            raise DataError(f"{where(record)}: a truncated token column", kind=TRUNCATED_FILE)
        byte = value[pos]
        ndim, width = byte >> 2, _SHAPE_WIDTHS[byte & 3]
        if ndim != 1:
            raise DataError(f"{where(record)}: a token column of {ndim} dimensions (1 is read)")
        if len(value) < pos + 1 + width:
            raise DataError(f"{where(record)}: a truncated token column", kind=TRUNCATED_FILE)
        count = int.from_bytes(value[pos + 1 : pos + 1 + width], "little")
        pos += 1 + width
    body = len(value) - pos
    if body % ids.itemsize or (count is not None and body != count * ids.itemsize):
        raise bad_ids(where(record), body, ids, count, _NAMES, "column")
    return np.frombuffer(value, dtype=ids, offset=pos)


def _column(shard: dict[str, Any], field: str, where: str) -> int:
    names = [str(n) for n in shard["column_names"]]
    encodings = [str(e) for e in shard["column_encodings"]]
    if not len(names) == len(encodings) == len(shard["column_sizes"]):
        raise DataError(
            f"{where}: {len(names)} column names, {len(encodings)} encodings and "
            f"{len(shard['column_sizes'])} sizes (a corrupt index.json)"
        )
    if field in names:
        k = names.index(field)
    else:
        arrays = [i for i, e in enumerate(encodings) if e.split(":")[0] == "ndarray"]
        if len(arrays) != 1:
            raise DataError(
                f"{where}: no token column {field!r} (columns {names}); name it with the "
                f"dataset's text_field"
            )
        k = arrays[0]
    kind, _, rest = encodings[k].partition(":")
    dtype_name, _, shape = rest.partition(":")
    if kind != "ndarray" or (dtype_name and dtype_name not in _NAMED):
        columns = [n for n, e in zip(names, encodings, strict=True) if e.startswith("ndarray")]
        hint = f"; name one of {columns} with the dataset's text_field" if columns else ""
        raise DataError(
            f"{where}: column {names[k]!r} is {encodings[k]!r}; a token column is an ndarray "
            f"of integers ('ndarray', 'ndarray:int32', 'ndarray:uint16', ...){hint}"
        )
    if "," in shape:
        raise DataError(f"{where}: column {names[k]!r} is {encodings[k]!r}; 1-D ids are read")
    return k


def _shard(index_uri: str, i: int, shard: Any, field: str) -> MDSShard:
    """Shard ``i`` of an ``index.json`` (its entry ``shard``), its file pinned."""
    where = f"{storage.redact(index_uri)} shard {i}"
    if not isinstance(shard, dict) or shard.get("format") != "mds":
        got = shard.get("format") if isinstance(shard, dict) else shard
        raise DataError(f"{where} is {got!r}, not 'mds'")
    try:
        k = _column(shard, field, where)
        compression = str(shard.get("compression") or "")
        name = _basename(shard)
        encoding = str(shard["column_encodings"][k]).split(":")
        sizes = tuple(int(s or 0) for s in shard["column_sizes"])
        samples = int(shard["samples"])
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise DataError(f"{where}: not an MDS shard entry ({type(e).__name__}: {e})") from None
    if compression and compression.split(":")[0] not in ("zstd", "gz"):
        raise DataError(
            f"{storage.redact(index_uri)}: shard {name} is compressed with {compression!r} "
            f"(zstd or gz are read)"
        )
    uri = sibling(index_uri, name)
    file = pin(uri)
    # The shard's bytes (uncompressed: index.json's raw size) bound its samples: a count and
    # n + 1 offsets of 4 bytes. A count beyond it would lay out work items of nothing.
    raw = shard.get("raw_data") if compression else None
    size = raw.get("bytes") if isinstance(raw, dict) else (None if compression else file.size)
    check_count(storage.redact(uri), samples, size, _NAMES)
    return MDSShard(
        path=storage.redact(uri),
        file=file,
        num_records=samples,
        column=k,
        sizes=sizes,
        dtype=_NAMED[encoding[1]] if len(encoding) > 1 and encoding[1] else "",
        shape=len(encoding) < 3,
        compression=compression,
    )


def _basename(shard: dict[str, Any]) -> str:
    """The file of a shard entry: its compressed one when it names a compression."""
    data = shard["zip_data"] if shard.get("compression") else shard["raw_data"]
    name = data["basename"]
    if not isinstance(name, str) or not name:
        raise ValueError(f"basename {name!r}")
    return name


def open_mds_shards(index_uri: str, field: str) -> list[MDSShard]:
    """The shards listed by an MDS ``index.json``, in its order (each file pinned).

    Raises:
        DataError: An ``index.json`` that is not MDS's, a missing shard, no token column.
    """
    index = read_listing(index_uri, "shards", "an MDS")
    shards = [_shard(index_uri, i, shard, field) for i, shard in enumerate(index["shards"])]
    check_distinct(storage.redact(index_uri), [s.path for s in shards], "shard")
    return shards


def shard_files(index_uri: str) -> list[str]:
    """The shard files an MDS ``index.json`` names, in order (for the content identity).

    An entry without its file names none (the ``index.json`` itself is in the identity, and
    opening the corpus refuses the entry).
    """
    index = read_json(index_uri)
    shards = index.get("shards") if isinstance(index, dict) else None
    out = []
    for shard in shards if isinstance(shards, list) else []:
        try:
            out.append(sibling(index_uri, _basename(shard)))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return out
