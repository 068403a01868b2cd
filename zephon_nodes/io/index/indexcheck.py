"""The dataset index as a checked artifact: its seal, its keys and the range of every value.

``zephon index`` seals the manifest it writes: the file is the manifest's compact JSON with
``"seal": "xxh3_128:<32 hex>"`` as its last key, the checksum of the same text without that
key. :func:`parse_manifest` refuses a manifest without a seal (written by hand, or by an older
zephon-nodes), one whose bytes do not match its seal (a flipped bit, an edited value), one with
a key twice in an object, and :func:`check_entry` refuses any entry whose values cannot
describe its shard (negative or impossible record counts, offsets that do not cover the
records, frames that do not add up to the file, a ``kind`` that is not the file's), naming
the shard and the command that rebuilds the index. Checking costs one xxh3 pass over the
manifest's bytes and a few comparisons per shard, once per machine and manifest.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from typing import Any

import xxhash

from zephon_nodes.core.errors import DataError

__all__ = ["SEAL_KEY", "check_entry", "kind_of", "parse_manifest", "seal"]

SEAL_KEY = "seal"
_PREFIX = "xxh3_128:"
_TAIL = re.compile(rb',"seal":"xxh3_128:([0-9a-f]{32})"\}\s*\Z')
_CHECKSUM = re.compile(r"xxh3_128:[0-9a-f]{32}")
KINDS = ("jsonl", "jsonl.zst", "parquet", "tar")
# More records, offsets or frames than this in one shard is not a real shard.
_HUGE = 1 << 48


def kind_of(name: str) -> str:
    """The index ``kind`` of a shard file, from its name."""
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith(".tar"):
        return "tar"
    return "jsonl.zst" if name.endswith(".zst") else "jsonl"


def seal(blob: bytes) -> bytes:
    """Append the seal to a manifest's compact JSON text (``{...}``, no spaces)."""
    if not blob.endswith(b"}") or blob == b"{}":
        raise ValueError("a manifest is a non-empty JSON object")
    digest = xxhash.xxh3_128_hexdigest(blob)
    return blob[:-1] + f',"{SEAL_KEY}":"{_PREFIX}{digest}"}}'.encode()


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _Duplicate(twice)
    return out


class _Duplicate(ValueError):
    pass


def parse_manifest(raw: bytes, where: str, hint: str) -> Any:
    """Check a manifest's seal and parse it, refusing duplicated keys.

    Args:
        raw: The manifest file's bytes.
        where: The manifest's location (for messages; already redacted).
        hint: The command that rebuilds it (``rebuild it: zephon index '...'``).

    Raises:
        DataError: Not JSON, not sealed, not matching its seal, or a key twice.
    """
    m = _TAIL.search(raw)
    if m is None:
        if b'"format":"zephon-index"' not in raw.replace(b" ", b""):
            try:
                json.loads(raw)
            except ValueError as e:
                raise DataError(f"{where}: not a JSON dataset index: {e}") from None
            raise DataError(f"{where}: not a zephon dataset index")
        raise DataError(
            f"{where}: the dataset index has no seal (written by an older zephon-nodes or "
            f"edited by hand), so it cannot be trusted; {hint}"
        )
    body = raw[: m.start()] + b"}"
    if xxhash.xxh3_128_hexdigest(body) != m.group(1).decode():
        raise DataError(
            f"{where}: the dataset index does not match its seal (its bytes changed after "
            f"`zephon index` wrote it); {hint}"
        )
    try:
        return json.loads(body, object_pairs_hook=_no_duplicates)
    except _Duplicate as e:
        raise DataError(
            f"{where}: the dataset index has the key {e.args[0]!r} twice; {hint}"
        ) from None
    except (ValueError, RecursionError) as e:
        raise DataError(f"{where}: not a JSON dataset index: {e}") from None


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _HUGE


def _ints(value: Any, n: int | None = None) -> bool:
    return (
        isinstance(value, list) and (n is None or len(value) == n) and all(_int(x) for x in value)
    )


def _increasing(values: Any) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


def check_entry(name: str, entry: Any, fail: Callable[[str, str], DataError]) -> None:
    """Refuse an index entry whose values cannot describe the shard ``name``.

    Args:
        name: The shard's name in the index.
        entry: Its entry.
        fail: Makes the error from the shard's name and the problem (adds the rebuild hint).

    Raises:
        DataError: The first value out of range, named.
    """
    if not isinstance(entry, dict):
        raise fail(name, "the entry is not an object")
    for key in ("records", "bytes"):
        if not _int(entry.get(key)):
            raise fail(name, f"{key}={entry.get(key)!r} is not a count >= 0")
    if not isinstance(entry.get("checksum"), str) or not _CHECKSUM.fullmatch(entry["checksum"]):
        raise fail(name, f"checksum={entry.get('checksum')!r} is not xxh3_128:<32 hex digits>")
    kind = entry.get("kind")
    if kind not in KINDS:
        raise fail(name, f"kind={kind!r} is not one of {', '.join(KINDS)}")
    if kind != kind_of(name):
        raise fail(name, f"kind={kind!r} but the file is a {kind_of(name)} shard")
    _CHECKS.get(kind, _check_samples)(name, entry, fail)


def _check_lines(name: str, entry: dict[str, Any], fail: Callable[[str, str], DataError]) -> None:
    """A ``jsonl`` or ``jsonl.zst`` entry: its line offsets (and a ``.zst``'s frames)."""
    kind, records, size = entry["kind"], int(entry["records"]), int(entry["bytes"])
    every: Any = entry.get("every")
    end: Any = entry.get("end", 0)
    offsets: Any = entry.get("offsets")
    if not _int(every) or every < 1:
        raise fail(name, f"every={every!r} is not an integer >= 1")
    if not _int(end) or (kind == "jsonl" and end > size):
        raise fail(name, f"end={end!r} is not an offset within the file's {size} bytes")
    # A record is a non-blank line: at least one byte, and a newline between two.
    if records and 2 * records - 1 > end:
        raise fail(name, f"records={records} cannot fit in {end} bytes of text")
    want = -(-records // every)
    if not _ints(offsets, want):
        got = len(offsets) if isinstance(offsets, list) else offsets
        raise fail(
            name,
            f"offsets: {want} offsets >= 0 expected ({records} records, "
            f"every {every}), got {got!r}",
        )
    if offsets and offsets[-1] >= end:
        raise fail(name, f"offsets end at {offsets[-1]}, past the text's end {end}")
    if not _increasing(offsets):
        raise fail(name, "offsets are not increasing")
    if kind == "jsonl.zst":
        _check_frames(name, entry.get("frames", []), size, end, fail)


def _check_frames(
    name: str, frames: Any, size: int, end: int, fail: Callable[[str, str], DataError]
) -> None:
    """A ``jsonl.zst`` entry's frames: contiguous, covering the file, holding the text."""
    if not isinstance(frames, list) or not all(_ints(f, 3) for f in frames):
        raise fail(name, "frames: a list of [offset, compressed size, size] expected")
    at = 0
    for offset, csize, _ in frames:
        if offset != at or csize < 1:
            raise fail(name, f"frames: a frame at byte {offset}, expected {at}")
        at += csize
    if frames and at != size:
        raise fail(name, f"frames cover {at} bytes, the file has {size}")
    if frames and sum(f[2] for f in frames) < end:
        raise fail(name, f"frames hold less text than end={end}")


def _check_parquet(name: str, entry: dict[str, Any], fail: Callable[[str, str], DataError]) -> None:
    """A ``parquet`` entry: its row groups' ends and its columns."""
    records = int(entry["records"])
    ends: Any = entry.get("row_group_ends")
    columns = entry.get("columns")
    if not _ints(ends) or any(a > b for a, b in itertools.pairwise(ends)):
        raise fail(name, "row_group_ends: non-decreasing row counts expected")
    if (ends[-1] if ends else 0) != records:
        raise fail(name, f"row_group_ends end at {ends[-1] if ends else 0}, records={records}")
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        raise fail(name, "columns: a list of column names expected")


def _member(m: Any, size: int) -> bool:
    """A tar sample's member: ``[name, offset, length]`` within the file."""
    return (
        isinstance(m, list)
        and len(m) == 3
        and isinstance(m[0], str)
        and _int(m[1])
        and _int(m[2])
        and m[1] + m[2] <= size
    )


def _check_samples(name: str, entry: dict[str, Any], fail: Callable[[str, str], DataError]) -> None:
    """A ``tar`` entry: one ``[key, members]`` per sample, each member within the file."""
    records, size = int(entry["records"]), int(entry["bytes"])
    samples = entry.get("samples")
    if not isinstance(samples, list) or len(samples) != records:
        got = len(samples) if isinstance(samples, list) else samples
        raise fail(name, f"samples: {records} samples expected, got {got!r}")
    for sample in samples:
        ok = isinstance(sample, list) and len(sample) == 2 and isinstance(sample[0], str)
        members = sample[1] if ok else None
        if not (ok and isinstance(members, list) and all(_member(m, size) for m in members)):
            raise fail(name, f"samples: a malformed sample {str(sample)[:80]}")


# The check of each kind's own fields (a kind not named here is a tar shard's samples).
_CHECKS: dict[str, Callable[[str, dict[str, Any], Callable[[str, str], DataError]], None]] = {
    "jsonl": _check_lines,
    "jsonl.zst": _check_lines,
    "parquet": _check_parquet,
}
