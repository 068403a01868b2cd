r"""Megatron indexed datasets (``.bin`` + ``.idx``): documents of token ids, read with numpy.

The layout of ``megatron.core.datasets.indexed_dataset`` (what Megatron-LM's and NeMo's
``preprocess_data.py`` write), all little-endian:

``.idx``: the magic ``MMIDIDX\\x00\\x00`` (9 bytes), the version (uint64, 1), the dtype code
(uint8: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16), the
sequence count ``S`` (uint64), the document count ``D`` (uint64, one more than the
documents), then ``sequence_lengths`` (int32[S], tokens), ``sequence_pointers`` (int64[S],
byte offsets in ``.bin``) and ``document_indices`` (int64[D]: document ``i`` is sequences
``[document_indices[i], document_indices[i + 1])``). ``.bin``: the ids, one sequence after
another.

A record is a document: the ids of its sequences, in order (one sequence each, as
``preprocess_data.py`` writes without sentence splitting). Opening reads the header only;
each work item reads its slice of the three arrays and one byte range of ``.bin``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, ClassVar

import numpy as np

from zephon_nodes.core.errors import TRUNCATED_FILE, DataError
from zephon_nodes.io.formats.tokenfiles import FileRef, pin
from zephon_nodes.io.storage import storage

__all__ = ["DTYPES", "MAGIC", "MegatronShard", "open_megatron_shard"]

MAGIC = b"MMIDIDX\x00\x00"
DTYPES: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, documents


@dataclass(frozen=True)
class MegatronShard:
    """One Megatron corpus (a ``.bin``/``.idx`` pair); small and picklable.

    Attributes:
        path: The corpus prefix (the ``.idx`` path without ``.idx``), for messages.
        idx: The ``.idx`` file as opened.
        bin: The ``.bin`` file as opened.
        num_records: Documents in the corpus.
        dtype_code: Megatron's dtype code of the ids.
        sequences: Sequences in the corpus.
    """

    token_ids: ClassVar[bool] = True

    path: str
    idx: FileRef
    bin: FileRef
    num_records: int
    dtype_code: int
    sequences: int

    @property
    def dtype(self) -> np.dtype[Any]:
        """The ids' dtype."""
        return DTYPES[self.dtype_code]

    def _array(self, offset: int, dtype: str, lo: int, hi: int) -> np.ndarray:
        size = np.dtype(dtype).itemsize
        return np.frombuffer(self.idx.read(offset + lo * size, offset + hi * size), dtype=dtype)

    def read(self, start: int, stop: int) -> list[tuple[int, np.ndarray]]:
        """Return documents ``[start, stop)`` as ``(document number, ids)`` pairs.

        Raises:
            DataError: A range outside the corpus, or an ``.idx`` that does not fit ``.bin``.
        """
        if not 0 <= start <= stop <= self.num_records:
            raise DataError(f"{self.path}: documents [{start}, {stop}) out of range")
        if start == stop:
            return []
        s = self.sequences
        lengths_at = _HEADER.size
        pointers_at = lengths_at + 4 * s
        docs_at = pointers_at + 8 * s
        bounds = self._array(docs_at, "<i8", start, stop + 1).astype(np.int64)
        first, last = int(bounds[0]), int(bounds[-1])
        if not 0 <= first <= last <= s or np.any(np.diff(bounds) < 0):
            raise self._corrupt(f"document indices of documents [{start}, {stop})")
        # Documents tile the sequences: the first starts at 0, the last ends at the last one.
        if (start == 0 and first != 0) or (stop == self.num_records and last != s):
            raise self._corrupt(
                f"document indices of documents [{start}, {stop}) (from {first} to {last} "
                f"of {s} sequences)"
            )
        if first == last:
            return [(start + k, np.empty(0, self.dtype)) for k in range(stop - start)]
        # One sequence before the slice too: its end is where the slice starts (the first
        # sequence starts at byte 0), so every pointer is checked by the read that covers it.
        lo = max(first - 1, 0)
        lengths = self._array(lengths_at, "<i4", lo, last).astype(np.int64)
        pointers = self._array(pointers_at, "<i8", lo, last)
        item = self.dtype.itemsize
        # Sequences are contiguous in .bin (each pointer is the previous one plus its bytes).
        expected = int(pointers[0]) + np.concatenate([[0], np.cumsum(lengths[:-1] * item)])
        if (
            np.any(lengths < 0)
            or not np.array_equal(pointers, expected)
            or (first == 0 and int(pointers[0]) != 0)
        ):
            raise self._corrupt(f"sequence pointers of documents [{start}, {stop})")
        lengths, pointer = lengths[first - lo :], int(pointers[first - lo])
        total = int(lengths.sum())
        blob = self.bin.read(pointer, pointer + total * item)
        ids = np.frombuffer(blob, dtype=self.dtype.newbyteorder("<"))
        # Document k ends where its last sequence does (an empty document where it starts).
        ends = np.concatenate([[0], np.cumsum(lengths)])
        cuts = ends[bounds - first].tolist()
        return [(start + k, ids[a:b]) for k, (a, b) in enumerate(pairwise(cuts))]

    def _corrupt(self, what: str) -> DataError:
        return DataError(
            f"{self.path}.idx: {what} do not fit the corpus (a corrupt .idx, or one of "
            f"another .bin)",
            kind=TRUNCATED_FILE,
        )

    def where(self, record: int) -> str:
        """Describe a document's place for error messages."""
        return f"{self.path} (.bin/.idx) document {record}"


def _header(idx: FileRef, where: str) -> tuple[int, int, int]:
    if idx.size < _HEADER.size:
        raise DataError(f"{where}: not a Megatron .idx file (too short)", kind=TRUNCATED_FILE)
    magic, version, code, sequences, documents = _HEADER.unpack(idx.read(0, _HEADER.size))
    if magic != MAGIC:
        raise DataError(f"{where}: not a Megatron .idx file (magic {magic!r}, expected {MAGIC!r})")
    if version != 1:
        raise DataError(f"{where}: Megatron .idx version {version} is not read (1 is)")
    if code not in DTYPES:
        raise DataError(f"{where}: unknown Megatron dtype code {code} (1 to 8 are known)")
    if np.dtype(DTYPES[code]).kind == "f":
        raise DataError(f"{where}: holds {DTYPES[code]} values, not token ids")
    need = _HEADER.size + 12 * sequences + 8 * documents
    if documents < 1 or idx.size < need:
        raise DataError(
            f"{where}: truncated .idx ({idx.size} bytes, its header needs {need})",
            kind=TRUNCATED_FILE,
        )
    return code, int(sequences), int(documents) - 1


def open_megatron_shard(idx_uri: str) -> MegatronShard:
    """Open the corpus whose ``.idx`` is ``idx_uri`` (its ``.bin`` beside it).

    Raises:
        DataError: A missing ``.bin`` or ``.idx``, or an ``.idx`` that is not Megatron's.
    """
    prefix = str(idx_uri)[: -len(".idx")]
    idx = pin(str(idx_uri))
    where = storage.redact(str(idx_uri))
    code, sequences, documents = _header(idx, where)
    bin_ref = pin(prefix + ".bin")
    last = _HEADER.size + 4 * sequences + 8 * sequences - 8 if sequences else 0
    if sequences:
        # The last sequence must end inside .bin (a .bin of another corpus is refused here).
        length = int(
            np.frombuffer(
                idx.read(_HEADER.size + 4 * (sequences - 1), _HEADER.size + 4 * sequences), "<i4"
            )[0]
        )
        pointer = int(np.frombuffer(idx.read(last, last + 8), "<i8")[0])
        end = pointer + length * DTYPES[code].itemsize
        if end != bin_ref.size:
            raise DataError(
                f"{storage.redact(prefix)}.bin: {bin_ref.size} bytes, its .idx says {end} "
                f"(a truncated .bin, or one of another corpus)",
                kind=TRUNCATED_FILE,
            )
    return MegatronShard(
        path=storage.redact(prefix),
        idx=idx,
        bin=bin_ref,
        num_records=documents,
        dtype_code=code,
        sequences=sequences,
    )
