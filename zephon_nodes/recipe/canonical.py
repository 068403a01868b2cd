"""The canonical JSON of a recipe's canonical form, whose file lists may be lazy.

A dataset read through a dataset index puts its files' identities into the canonical form as
a :class:`~zephon_nodes.io.identity.FileIdentities` (the index's columns), not as one dict
per file. :func:`canonical_json` and :func:`canonical_sha256` splice in their JSON text as it
stands in the index's columns, so the fingerprint of a 100,000-shard dataset costs one hash
of that text, and it is byte for byte the text ``json.dumps`` writes for the same list of
dicts: a recipe's fingerprint does not depend on whether its data is indexed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import uuid
from typing import Any

from zephon_nodes.io.storage.cache import atomic_write, cache_dir

__all__ = ["canonical_json", "canonical_sha256"]


def _split(value: Any) -> tuple[str, list[tuple[int, int, Any]]]:
    """``json.dumps`` of ``value`` with each lazy part as a marker, and the markers' spans."""
    token = uuid.uuid4().hex
    lazies: list[Any] = []

    def swap(v: Any) -> Any:
        if hasattr(v, "canonical_json_chunks"):
            lazies.append(v)
            return f"\x00{token}-{len(lazies) - 1}\x00"
        if isinstance(v, dict):
            return {k: swap(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)) and v and isinstance(v[0], (dict, list, tuple)):
            return [swap(x) for x in v]
        return v

    blob = json.dumps(swap(value), sort_keys=True, separators=(",", ":"))
    if not lazies:
        return blob, []
    marker = re.compile(r'"\\u0000' + token + r'-(\d+)\\u0000"')
    return blob, [(m.start(), m.end(), lazies[int(m.group(1))]) for m in marker.finditer(blob)]


def canonical_json(value: Any) -> str:
    """``json.dumps(value, sort_keys=True, separators=(",", ":"))``, lazy parts spliced in.

    A lazy part is any object with a ``canonical_json_chunks()`` method returning the bytes
    of its JSON text in that form, in pieces.
    """
    blob, spans = _split(value)
    out, pos = [], 0
    for start, end, lazy in spans:
        out.append(blob[pos:start])
        out.append(b"".join(bytes(c) for c in lazy.canonical_json_chunks()).decode("utf-8"))
        pos = end
    out.append(blob[pos:])
    return "".join(out)


_MEMO: dict[str, str] = {}


def _memo_key(blob: str, spans: list[tuple[int, int, Any]]) -> str | None:
    """A key naming the whole text, when every lazy part names its content (else None)."""
    pieces, pos = [], 0
    for start, end, lazy in spans:
        token = getattr(lazy, "content_token", None)
        if token is None:
            return None
        pieces += [blob[pos:start], "\x00", str(token()), "\x00"]
        pos = end
    text = "".join([*pieces, blob[pos:]])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]


def canonical_sha256(value: Any) -> str:
    """The SHA-256 (hex) of :func:`canonical_json` of ``value``, hashed piece by piece.

    When every lazy part has a ``content_token()`` (a string naming its exact text, such as
    a dataset index's cache key and the rows selected), the result is remembered under the
    rest of the text and those tokens, in this process and in ``$ZEPHON_CACHE_DIR``, so the
    next build does not hash a 100,000-shard list again.
    """
    blob, spans = _split(value)
    key = _memo_key(blob, spans) if spans else None
    if key is not None:
        hit = _MEMO.get(key) or _read_memo(key)
        if hit is not None:
            _MEMO[key] = hit
            return hit
    digest = _hash(blob, spans)
    if key is not None:
        _MEMO[key] = digest
        _write_memo(key, digest)
    return digest


def _memo_path(key: str) -> Any:
    return cache_dir() / f"canonical-{key}.sha256"


def _read_memo(key: str) -> str | None:
    try:
        text = _memo_path(key).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if re.fullmatch(r"[0-9a-f]{64}", text) else None


def _write_memo(key: str, digest: str) -> None:
    with contextlib.suppress(OSError):  # a read-only cache only costs the hash next time
        atomic_write(_memo_path(key), lambda f: f.write(digest.encode("ascii")))


def _hash(blob: str, spans: list[tuple[int, int, Any]]) -> str:
    h = hashlib.sha256()
    pos = 0
    for start, end, lazy in spans:
        h.update(blob[pos:start].encode("utf-8"))
        for chunk in lazy.canonical_json_chunks():
            h.update(chunk)
        pos = end
    h.update(blob[pos:].encode("utf-8"))
    return h.hexdigest()
