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

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from zephon_nodes.core.errors import TRUNCATED_FILE, DataError
from zephon_nodes.io.formats.tokenfiles import (
    FileRef,
    decompressed,
    offset_table,
    pin,
    read_json,
    read_listing,
    sibling,
    uint32s,
)
from zephon_nodes.io.storage import storage

__all__ = ["MDSShard", "open_mds_shards"]

# streaming's NDArray value dtype codes (``_int2value_dtype``), integers only.
VALUE_DTYPES = {8: "u1", 9: "i1", 16: "<u2", 17: "<i2", 32: "<u4", 33: "<i4", 64: "<u8", 65: "<i8"}
_SHAPE_DTYPES = {0: "u1", 1: "<u2", 2: "<u4", 3: "<u8"}
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
        samples = offset_table(self.file, blob, (start, stop), self.path, ("shard", "sample"))
        return [(k, self._decode(sample, k)) for k, sample in samples]

    def _decode(self, sample: bytes, record: int) -> np.ndarray:
        nvar = sum(1 for s in self.sizes if not s)
        heads = uint32s(sample[: 4 * nvar], self.where(record)).tolist()
        pos = 4 * nvar
        var = iter(heads)
        size = 0
        for i, fixed in enumerate(self.sizes):
            size = fixed or int(next(var))
            if i == self.column:
                break
            pos += size
        value = sample[pos : pos + size]
        if len(value) != size:
            raise DataError(f"{self.where(record)}: a truncated sample", kind=TRUNCATED_FILE)
        return _ndarray(value, self.dtype, self.shape, self.where(record))

    def where(self, record: int) -> str:
        """Describe a sample's place for error messages."""
        return f"{self.path} sample {record}"


def _ndarray(value: bytes, dtype: str, shaped: bool, where: str) -> np.ndarray:
    """Decode one ``ndarray`` value (streaming's ``NDArray`` layout)."""
    pos = 0
    if not dtype:
        code = value[0] if value else -1
        if code not in VALUE_DTYPES:
            raise DataError(f"{where}: token column of dtype code {code}, not integers")
        dtype, pos = VALUE_DTYPES[code], 1
    if shaped:
        byte = value[pos]
        ndim, shape_dtype = byte >> 2, _SHAPE_DTYPES[byte & 3]
        if ndim != 1:
            raise DataError(f"{where}: a token column of {ndim} dimensions (1 is read)")
        pos += 1 + np.dtype(shape_dtype).itemsize
    ids = np.frombuffer(value, dtype=dtype, offset=pos)
    return ids


def _column(shard: dict[str, Any], field: str, where: str) -> int:
    names = list(shard["column_names"])
    encodings = list(shard["column_encodings"])
    if field in names:
        k = names.index(field)
    else:
        arrays = [i for i, e in enumerate(encodings) if str(e).split(":")[0] == "ndarray"]
        if len(arrays) != 1:
            raise DataError(
                f"{where}: no token column {field!r} (columns {names}); name it with the "
                f"dataset's text_field"
            )
        k = arrays[0]
    encoding = str(encodings[k])
    kind, _, rest = encoding.partition(":")
    dtype_name = rest.split(":")[0]
    if kind != "ndarray" or (dtype_name and dtype_name not in _NAMED):
        raise DataError(
            f"{where}: column {names[k]!r} is {encoding!r}; a token column is an ndarray of "
            f"integers ('ndarray', 'ndarray:int32', 'ndarray:uint16', ...)"
        )
    return k


def open_mds_shards(index_uri: str, field: str) -> list[MDSShard]:
    """The shards listed by an MDS ``index.json``, in its order (each file pinned).

    Raises:
        DataError: An ``index.json`` that is not MDS's, a missing shard, no token column.
    """
    where = storage.redact(index_uri)
    index = read_listing(index_uri, "shards", "an MDS")
    out = []
    for i, shard in enumerate(index["shards"]):
        if shard.get("format") != "mds":
            raise DataError(f"{where}: shard {i} is {shard.get('format')!r}, not 'mds'")
        k = _column(shard, field, f"{where} shard {i}")
        compression = str(shard.get("compression") or "")
        name = shard["zip_data"]["basename"] if compression else shard["raw_data"]["basename"]
        if compression and compression.split(":")[0] not in ("zstd", "gz"):
            raise DataError(
                f"{where}: shard {name} is compressed with {compression!r} (zstd or gz are read)"
            )
        encoding = str(shard["column_encodings"][k]).split(":")
        sizes = tuple(int(s or 0) for s in shard["column_sizes"])
        uri = sibling(index_uri, name)
        out.append(
            MDSShard(
                path=storage.redact(uri),
                file=pin(uri),
                num_records=int(shard["samples"]),
                column=k,
                sizes=sizes,
                dtype=_NAMED[encoding[1]] if len(encoding) > 1 and encoding[1] else "",
                shape=len(encoding) < 3,
                compression=compression,
            )
        )
    return out


def shard_files(index_uri: str) -> list[str]:
    """The shard files an MDS ``index.json`` names, in order (for the content identity)."""
    index = read_json(index_uri)
    shards = index.get("shards", []) if isinstance(index, dict) else []
    return [
        sibling(
            index_uri,
            s["zip_data"]["basename"] if s.get("compression") else s["raw_data"]["basename"],
        )
        for s in shards
    ]
