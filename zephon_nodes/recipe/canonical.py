"""The canonical JSON of a recipe's canonical form, whose file lists may be lazy.

A dataset read through a dataset index puts its files' identities into the canonical form as
a :class:`~zephon_nodes.io.identity.FileIdentities` (the index's columns), not as one dict
per file. :func:`canonical_json` and :func:`canonical_sha256` splice in their JSON text as it
stands in the index's columns, so the fingerprint of a 100,000-shard dataset costs one hash
of that text, and it is byte for byte the text ``json.dumps`` writes for the same list of
dicts: a recipe's fingerprint does not depend on whether its data is indexed.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from typing import Any

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


def canonical_sha256(value: Any) -> str:
    """The SHA-256 (hex) of :func:`canonical_json` of ``value``, hashed piece by piece."""
    blob, spans = _split(value)
    h = hashlib.sha256()
    pos = 0
    for start, end, lazy in spans:
        h.update(blob[pos:start].encode("utf-8"))
        for chunk in lazy.canonical_json_chunks():
            h.update(chunk)
        pos = end
    h.update(blob[pos:].encode("utf-8"))
    return h.hexdigest()
