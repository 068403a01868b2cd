"""Checkpoint state: a few integers per lane, plain JSON-safe data, validated on load.

Layout (see ``docs/checkpoint.md``)::

    {"format": "zephon-nodes/1", "fingerprint": "<sha256 of the recipe>",
     "recipe": {<per-field summary of the recipe>}, "num_lanes": L, "step": s, "micro": 0,
     "lanes": {"0": [window, consumed], "1": [...], ...}}

Nothing is ever unpickled or evaluated: files are JSON, and every field is type-checked
before a single batch is produced.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from zephon_nodes.errors import CheckpointError

__all__ = [
    "FORMAT",
    "STATE_FILE",
    "load_state",
    "merge_states",
    "recipe_summary",
    "save_state",
    "validate_state",
]

FORMAT = "zephon-nodes/1"
STATE_FILE = "zephon_state.json"
_KEYS = {"format", "fingerprint", "recipe", "num_lanes", "step", "micro", "lanes", "layout"}
_MAX_STATE_BYTES = 16 << 20


def recipe_summary(canonical: Mapping[str, Any]) -> dict[str, Any]:
    """Summarize a canonical recipe per top-level field: scalars verbatim, the rest hashed.

    Stored in every checkpoint (a few hundred bytes) so a refused resume can name the field
    that changed (``seq_len: checkpoint has 128, recipe has 256``).
    """
    out: dict[str, Any] = {}
    for key, value in sorted(canonical.items()):
        if isinstance(value, (dict, list)):
            blob = json.dumps(value, sort_keys=True, separators=(",", ":"))
            out[key] = "sha256:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]
        else:
            out[key] = value
    return out


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate_state(
    state: Any,
    *,
    fingerprint: str,
    summary: Mapping[str, Any],
    num_lanes: int,
    lanes: Iterable[int],
) -> dict[int, tuple[int, int]]:
    """Check a state against the running recipe and return ``{lane: (window, consumed)}``.

    Args:
        state: The loaded state (untrusted).
        fingerprint: Fingerprint of the running recipe.
        summary: :func:`recipe_summary` of the running recipe.
        num_lanes: Lane count of the running recipe.
        lanes: Lanes this rank owns; each must be present.

    Raises:
        CheckpointError: Naming what is wrong (format, recipe fields, lanes, values).
    """
    if not isinstance(state, Mapping):
        raise CheckpointError(f"a zephon-nodes state must be a dict, got {type(state).__name__}")
    if state.get("format") != FORMAT:
        raise CheckpointError(
            f"unsupported checkpoint format {state.get('format')!r}, expected {FORMAT!r} "
            f"(was it written by zephon-nodes?)"
        )
    extra = sorted(set(map(str, state)) - _KEYS)
    if extra:
        raise CheckpointError(f"unexpected key(s) in checkpoint state: {extra}")
    missing = sorted({"fingerprint", "num_lanes", "step", "micro", "lanes"} - set(state))
    if missing:
        raise CheckpointError(f"checkpoint state misses key(s): {missing}")
    if state["fingerprint"] != fingerprint:
        diffs = _summary_diff(state.get("recipe"), summary)
        detail = "; ".join(diffs) if diffs else "the recipe summary is missing or unreadable"
        raise CheckpointError(
            f"the checkpoint was written with a different recipe (fingerprint "
            f"{str(state['fingerprint'])[:12]}..., this recipe {fingerprint[:12]}...): {detail}"
        )
    if state["num_lanes"] != num_lanes:
        raise CheckpointError(
            f"checkpoint has num_lanes={state['num_lanes']!r}, recipe has {num_lanes=}"
        )
    for key in ("step", "micro"):
        if not _is_int(state[key]) or state[key] < 0:
            raise CheckpointError(f"checkpoint {key}={state[key]!r} must be an integer >= 0")
    raw_lanes = state["lanes"]
    if not isinstance(raw_lanes, Mapping):
        raise CheckpointError(f"checkpoint 'lanes' must be a dict, got {type(raw_lanes).__name__}")
    parsed: dict[int, tuple[int, int]] = {}
    for key, value in raw_lanes.items():
        try:
            lane = int(key)
        except (TypeError, ValueError):
            raise CheckpointError(f"checkpoint lane key {key!r} is not a lane number") from None
        if not 0 <= lane < num_lanes or str(lane) != str(key):
            raise CheckpointError(f"checkpoint lane {key!r} is out of range [0, {num_lanes})")
        if (
            not isinstance(value, Sequence)
            or isinstance(value, (str, bytes))
            or len(value) != 2
            or not all(_is_int(v) and 0 <= v < 2**62 for v in value)
        ):
            raise CheckpointError(
                f"checkpoint lane {lane}: expected [window, consumed] (two integers >= 0), "
                f"got {value!r}"
            )
        parsed[lane] = (int(value[0]), int(value[1]))
    absent = sorted(set(lanes) - set(parsed))
    if absent:
        raise CheckpointError(f"checkpoint has no state for lane(s) {absent} owned by this rank")
    return parsed


def _summary_diff(saved: Any, current: Mapping[str, Any]) -> list[str]:
    if not isinstance(saved, Mapping):
        return []
    out = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if a != b:
            if isinstance(a, str) and a.startswith("sha256:"):
                out.append(f"{key} differs")
            else:
                out.append(f"{key}: checkpoint has {a!r}, recipe has {b!r}")
    return out


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge the states of all ranks (each holding its own lanes) into one global state.

    Raises:
        CheckpointError: If the ranks disagree on recipe or step, are mid-step, or overlap.
    """
    if not states:
        raise CheckpointError("no states to merge")
    first = states[0]
    lanes: dict[str, Any] = {}
    for s in states:
        for key in ("format", "fingerprint", "num_lanes", "step"):
            if s.get(key) != first.get(key):
                raise CheckpointError(
                    f"ranks disagree on {key}: {first.get(key)!r} vs {s.get(key)!r}"
                )
        if s.get("micro", 0) != 0:
            raise CheckpointError("cannot merge states taken in the middle of a step")
        overlap = set(lanes) & set(s["lanes"])
        if overlap:
            raise CheckpointError(f"lanes {sorted(overlap)} appear in more than one rank state")
        lanes.update(s["lanes"])
    merged = {k: v for k, v in first.items() if k not in ("lanes", "layout")}
    merged["lanes"] = dict(sorted(lanes.items(), key=lambda kv: int(kv[0])))
    return merged


def save_state(directory: str | os.PathLike[str], state: Mapping[str, Any]) -> Path:
    """Write ``state`` as JSON to ``directory/zephon_state.json`` (temp file, then rename)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    target = d / STATE_FILE
    fd, tmp = tempfile.mkstemp(dir=d, prefix=STATE_FILE + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(state, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


def load_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a state saved by :func:`save_state` (a directory or the JSON file itself).

    Raises:
        CheckpointError: If the file is missing, too large, or not a JSON object.
    """
    p = Path(path)
    if p.is_dir():
        p = p / STATE_FILE
    if not p.is_file():
        raise CheckpointError(f"no checkpoint state at {p}")
    if p.stat().st_size > _MAX_STATE_BYTES:
        raise CheckpointError(f"{p}: {p.stat().st_size} bytes is too large for a state file")
    raw = p.read_bytes()
    try:
        state = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{p}: not a zephon-nodes state (invalid JSON: {e})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{p}: a state must be a JSON object, got {type(state).__name__}")
    return state
