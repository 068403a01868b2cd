"""The checksummed codec: canonical JSON whose first key is a SHA-256 of its own bytes.

Every file zephon-nodes writes (a state, a rank file, a commit marker) is::

    {"checksum":"sha256:<64 hex>",<the canonical JSON object's remaining bytes>

and the hash covers every byte after the header up to the end of the file, so a flipped
bit, a truncation or a hand edit is refused before parsing; a key that appears twice in one
JSON object is refused at any depth. Nothing is unpickled or evaluated.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from zephon_nodes.core.errors import CheckpointError

__all__ = ["CHECKSUM_KEY", "MAX_FILE_BYTES", "decode_checked", "encode_checked", "parse_json"]

CHECKSUM_KEY = "checksum"
MAX_FILE_BYTES = 16 << 20
"""Largest checkpoint file (state, rank file, marker) that is read."""
_HEADER = b'{"checksum":"sha256:'
_HEADER_RE = re.compile(rb'\{"checksum":"sha256:([0-9a-f]{64})",')


def encode_checked(obj: Mapping[str, Any]) -> bytes:
    """Serialize a JSON object with a checksum of its exact bytes in front.

    The result is canonical JSON (sorted keys, no spaces, ASCII) whose first key is
    ``"checksum": "sha256:<hex>"``: the SHA-256 of every byte that follows the header
    ``{"checksum":"sha256:<64 hex>",`` up to the end of the file. :func:`decode_checked`
    recomputes it before parsing.

    Raises:
        CheckpointError: If ``obj`` is empty, already holds a ``checksum`` key, or is not
            JSON-safe (NaN and infinities included).
    """
    if not isinstance(obj, Mapping) or not obj or CHECKSUM_KEY in obj:
        keys = sorted(map(str, obj))[:8] if isinstance(obj, Mapping) else None
        raise CheckpointError(
            f"a checksummed checkpoint file holds a non-empty JSON object without a "
            f"{CHECKSUM_KEY!r} key, got {type(obj).__name__} (keys: {keys})"
        )
    try:
        body = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"the checkpoint state is not plain JSON data: {e}") from None
    rest = body.encode("ascii")[1:]
    return _HEADER + hashlib.sha256(rest).hexdigest().encode("ascii") + b'",' + rest


def decode_checked(raw: bytes, where: str | os.PathLike[str], *, allow_unchecked: bool) -> Any:
    """Verify the checksum of bytes written by :func:`encode_checked` and parse them.

    Args:
        raw: The file's bytes.
        where: The file, named in errors.
        allow_unchecked: Accept a JSON object without a checksum (a file written before
            checkpoints carried one); damaged checksums are refused whatever this says.

    Returns:
        The parsed object, without its ``checksum`` key.

    Raises:
        CheckpointError: On a checksum mismatch, a damaged header, a missing checksum (unless
            allowed), duplicated keys or anything that is not JSON.
    """
    if raw.startswith(b'{"checksum":'):
        m = _HEADER_RE.match(raw)
        if m is None:
            raise CheckpointError(
                f"{where}: damaged checksum header (expected "
                f'{{"checksum":"sha256:<64 lowercase hex>", ...)'
            )
        got = hashlib.sha256(raw[m.end() :]).hexdigest()
        said = m.group(1).decode("ascii")
        if got != said:
            # Enough digits to show where they differ (a flip late in the recorded checksum).
            first = next(i for i, (a, b) in enumerate(zip(said, got, strict=True)) if a != b)
            n = max(16, first + 4)
            cut = "..." if n < len(got) else ""
            raise CheckpointError(
                f"{where}: checksum mismatch (the file says sha256:{said[:n]}{cut}, "
                f"its bytes hash to sha256:{got[:n]}{cut}): the file was damaged or edited "
                f"after it was written"
            )
        obj = parse_json(raw, where)
        if not isinstance(obj, dict):  # pragma: no cover - the header makes it an object
            raise CheckpointError(f"{where}: not a JSON object")
        del obj[CHECKSUM_KEY]
        return obj
    obj = parse_json(raw, where)
    if isinstance(obj, dict) and CHECKSUM_KEY in obj:
        raise CheckpointError(
            f"{where}: the {CHECKSUM_KEY!r} key must come first, as zephon-nodes writes it "
            f"(was the file re-serialized or edited?)"
        )
    if not allow_unchecked:
        raise CheckpointError(
            f"{where}: the file carries no checksum (a state written before zephon-nodes "
            f"checksummed its checkpoints, or a hand-made one); if you trust it, load it in "
            f"Python with load_state(path, allow_unchecked=True) and write it again with "
            f"save_state (which adds the checksum): the zephon commands read checksummed "
            f"states only"
        )
    return obj


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(key)
        out[key] = value
    return out


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def parse_json(raw: bytes, where: str | os.PathLike[str], what: str = "state") -> Any:
    """Parse JSON bytes, refusing duplicated keys and anything that is not UTF-8 JSON.

    Raises:
        CheckpointError: Naming ``where`` and the problem.
    """
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError as e:
        raise CheckpointError(
            f"{where}: not a zephon-nodes {what} (not UTF-8 text at byte {e.start}; a pickle "
            f"or other binary file?)"
        ) from None
    except _DuplicateKeyError as e:
        raise CheckpointError(
            f"{where}: the key {e.key!r} appears more than once in one JSON object "
            f"(a hand edit?); refusing to guess which value is meant"
        ) from None
    except (ValueError, RecursionError) as e:
        # ValueError covers JSONDecodeError and integers beyond Python's digit limit.
        raise CheckpointError(f"{where}: not a zephon-nodes {what} (invalid JSON: {e})") from None
