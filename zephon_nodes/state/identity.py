"""The recipe's identity in a state: fingerprint, per-field summary, and what differs.

Every state carries the recipe's fingerprint (the SHA-256 of its canonical form) and a
summary per top-level recipe field (scalars verbatim, tables hashed, plus ``contents``: the
content checksum of each data file), so a refused resume names the fields and files that
changed. The engine builds both once per pipeline (:func:`recipe_identity`); ``inspect`` and
``relane`` compare through :func:`summary_diff`, never by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zephon_nodes.recipe.canonical import canonical_sha256

__all__ = [
    "CONTENTS_KEY",
    "contents_diff",
    "fingerprint_pair",
    "recipe_identity",
    "recipe_summary",
    "summary_diff",
]

CONTENTS_KEY = "contents"
"""Summary key of the data files' content checksums (``{dataset: {file: hex16}}``)."""
_HASHED = "sha256:"


def recipe_summary(canonical: Mapping[str, Any]) -> dict[str, Any]:
    """Summarize a canonical recipe per top-level field: scalars verbatim, the rest hashed.

    Stored in every checkpoint (a few hundred bytes) so a refused resume can name the field
    that changed (``seq_len: checkpoint has 128, recipe has 256``).
    """
    out: dict[str, Any] = {}
    for key, value in sorted(canonical.items()):
        if isinstance(value, (dict, list)):
            out[key] = _HASHED + canonical_sha256(value)[:16]
        else:
            out[key] = value
    return out


def recipe_identity(
    canonical: Mapping[str, Any], contents: Mapping[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """Return ``(fingerprint, summary)`` of a canonical recipe (with its files' contents).

    Args:
        canonical: The recipe's canonical form, as the pipeline built it (the mixture's
            token estimate included).
        contents: ``{dataset: {file: checksum}}`` of its data files, if known.
    """
    summary = recipe_summary(canonical)
    if contents:
        summary[CONTENTS_KEY] = dict(contents)
    return canonical_sha256(canonical), summary


def fingerprint_pair(saved: str, current: str) -> str:
    """Show two fingerprints by prefixes long enough to tell them apart."""
    n = 12
    while n < max(len(saved), len(current)) and saved[:n] == current[:n]:
        n += 8
    return f"{saved[:n]!r}..., this recipe {current[:n]!r}..."


def summary_diff(saved: Any, current: Mapping[str, Any], *, hashes: bool = False) -> list[str]:
    """Name the recipe fields (and data files) in which two summaries differ.

    Args:
        saved: The checkpoint's summary (untrusted; anything but a mapping gives no lines).
        current: The running recipe's summary.
        hashes: Show both hashes of a table that differs (``datasets: differs (checkpoint
            sha256:..., recipe sha256:...)``) instead of ``datasets differs``.

    Returns:
        Lines such as ``seq_len: checkpoint has 128, recipe has 256``; empty if nothing
        differs.
    """
    if not isinstance(saved, Mapping):
        return []
    out = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if a != b:
            if key == CONTENTS_KEY and isinstance(a, Mapping) and isinstance(b, Mapping):
                out.extend(contents_diff(a, b))
            elif isinstance(a, str) and a.startswith(_HASHED):
                out.append(
                    f"{key}: differs (checkpoint {a}, recipe {b})" if hashes else f"{key} differs"
                )
            else:
                out.append(f"{key}: checkpoint has {a!r}, recipe has {b!r}")
    return out


def contents_diff(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Name the data files whose content changed (summary key ``contents``)."""
    out = []
    for name in sorted(set(saved) & set(current)):
        a, b = saved[name], current[name]
        if not isinstance(a, Mapping) or not isinstance(b, Mapping):
            continue
        changed = sorted(f for f in set(a) & set(b) if a[f] != b[f])
        if changed:
            out.append(
                f"dataset {name!r}: content changed in {', '.join(changed[:5])}"
                + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
            )
        for what, files in (("removed", set(a) - set(b)), ("added", set(b) - set(a))):
            if files:
                out.append(f"dataset {name!r}: file(s) {what}: {', '.join(sorted(files)[:5])}")
    return out
