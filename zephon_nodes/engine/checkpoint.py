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
    "COMMIT_FILE",
    "checkpoint_path",
    "commit_checkpoint",
    "contents_diff",
    "latest_checkpoint",
    "load_checkpoint",
    "save_rank_state",
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
            if key == "contents" and isinstance(a, Mapping) and isinstance(b, Mapping):
                out.extend(contents_diff(a, b))
            elif isinstance(a, str) and a.startswith("sha256:"):
                out.append(f"{key} differs")
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
        if not isinstance(s, Mapping) or not isinstance(s.get("lanes"), Mapping):
            raise CheckpointError("each rank state must be a dict with a 'lanes' dict")
        bad = [k for k in s["lanes"] if not (isinstance(k, str) and k.isascii() and k.isdigit())]
        if bad:
            raise CheckpointError(f"checkpoint lane key(s) {bad[:4]} are not lane numbers")
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


def _write_json_atomic(target: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to a temporary name in ``target``'s directory, then rename."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_state(directory: str | os.PathLike[str], state: Mapping[str, Any]) -> Path:
    """Write ``state`` as JSON to ``directory/zephon_state.json`` (temp file, then rename)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    target = d / STATE_FILE
    _write_json_atomic(target, state)
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
    state = _read_json(p, "state")
    if not isinstance(state, dict):
        raise CheckpointError(f"{p}: a state must be a JSON object, got {type(state).__name__}")
    return state


def _read_json(p: Path, what: str) -> Any:
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{p}: cannot read the checkpoint {what}: {e}") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CheckpointError(
            f"{p}: not a zephon-nodes {what} (not UTF-8 text at byte {e.start}; a pickle or "
            f"other binary file?)"
        ) from None
    except (ValueError, RecursionError) as e:
        # ValueError covers JSONDecodeError and integers beyond Python's digit limit.
        raise CheckpointError(f"{p}: not a zephon-nodes {what} (invalid JSON: {e})") from None


# Multi-rank checkpoints -------------------------------------------------------------------
#
#   root/step_0000000012/rank_00000.json   one file per rank (its lanes), temp name + rename
#   root/step_0000000012/rank_00001.json
#   root/step_0000000012/COMMITTED.json    written last (after every rank's file exists)
#
# A step directory without COMMITTED.json is incomplete and is never picked as the latest.

COMMIT_FILE = "COMMITTED.json"
_STEP_PREFIX = "step_"
_COMMIT_FORMAT = "zephon-nodes-checkpoint/1"


def checkpoint_path(root: str | os.PathLike[str], step: int) -> Path:
    """Return the directory of step ``step``'s checkpoint under ``root``."""
    if not _is_int(step) or step < 0:
        raise CheckpointError(f"{step=} must be an integer >= 0")
    return Path(root) / f"{_STEP_PREFIX}{step:010d}"


def _rank_file(rank: int) -> str:
    return f"rank_{rank:05d}.json"


def save_rank_state(
    root: str | os.PathLike[str], step: int, rank: int, state: Mapping[str, Any]
) -> Path:
    """Write one rank's state (its lanes) into step ``step``'s checkpoint under ``root``.

    The file is written to a temporary name and renamed, so a killed writer leaves either no
    file or a complete one. Call :func:`commit_checkpoint` once every rank has saved.

    Args:
        root: The run's checkpoint directory.
        step: The step the state was taken after (must equal ``state["step"]``).
        rank: This data-parallel rank.
        state: The rank's :class:`~zephon_nodes.engine.multiplexer.Multiplexer` state.

    Raises:
        CheckpointError: If the state is not a step-boundary state of step ``step``.
    """
    if not isinstance(state, Mapping) or state.get("step") != step:
        got = state.get("step") if isinstance(state, Mapping) else type(state).__name__
        raise CheckpointError(f"save_rank_state({step=}): the state is for step {got!r}")
    if state.get("micro", 0) != 0:
        raise CheckpointError(
            f"save_rank_state({step=}): the state was taken in the middle of a step "
            f"(micro={state.get('micro')!r}); multi-rank checkpoints are taken between steps"
        )
    if not _is_int(rank) or rank < 0:
        raise CheckpointError(f"{rank=} must be an integer >= 0")
    d = checkpoint_path(root, step)
    d.mkdir(parents=True, exist_ok=True)
    target = d / _rank_file(rank)
    _write_json_atomic(target, dict(state))
    return target


def commit_checkpoint(root: str | os.PathLike[str], step: int, world_size: int) -> Path:
    """Mark step ``step``'s checkpoint complete (call once, after every rank has saved).

    Checks that the files of ranks ``0 .. world_size-1`` exist, then writes
    ``COMMITTED.json`` (temp name + rename) listing them with their SHA-256, so later damage
    to a rank file is detected on load.

    Raises:
        CheckpointError: If a rank's file is missing.
    """
    d = checkpoint_path(root, step)
    files: dict[str, str] = {}
    for rank in range(world_size):
        f = d / _rank_file(rank)
        if not f.is_file():
            raise CheckpointError(
                f"cannot commit the checkpoint of step {step}: rank {rank} of {world_size} "
                f"has not saved {f}"
            )
        files[f.name] = hashlib.sha256(f.read_bytes()).hexdigest()
    marker = {"format": _COMMIT_FORMAT, "step": step, "world_size": world_size, "files": files}
    target = d / COMMIT_FILE
    _write_json_atomic(target, marker)
    return d


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """Return the newest committed step directory under ``root``, or None if there is none.

    Directories without ``COMMITTED.json`` (a job killed while writing) are ignored.
    """
    r = Path(root)
    if not r.is_dir():
        return None
    best: tuple[int, Path] | None = None
    for d in r.iterdir():
        name = d.name
        if not name.startswith(_STEP_PREFIX) or not (
            name[len(_STEP_PREFIX) :].isascii() and name[len(_STEP_PREFIX) :].isdigit()
        ):
            continue
        if not (d / COMMIT_FILE).is_file():
            continue
        step = int(name[len(_STEP_PREFIX) :])
        if best is None or step > best[0]:
            best = (step, d)
    return best[1] if best is not None else None


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a committed multi-rank checkpoint and merge the ranks into one global state.

    Args:
        path: A step directory, or a root holding step directories (the latest committed
            one is loaded).

    Returns:
        The merged state; pass it to every rank's ``Multiplexer.reset`` (any dp size).

    Raises:
        CheckpointError: If nothing is committed, the marker or a rank file is missing,
            damaged or changed since the commit, or the ranks disagree.
    """
    d = Path(path)
    if not (d / COMMIT_FILE).is_file():
        latest = latest_checkpoint(d)
        if latest is None:
            raise CheckpointError(f"{d}: no committed checkpoint (no {COMMIT_FILE} found)")
        d = latest
    marker_path = d / COMMIT_FILE
    if marker_path.stat().st_size > _MAX_STATE_BYTES:
        raise CheckpointError(f"{marker_path}: too large for a commit marker")
    marker = _read_json(marker_path, "commit marker")
    if not isinstance(marker, dict) or marker.get("format") != _COMMIT_FORMAT:
        got = marker.get("format") if isinstance(marker, dict) else type(marker).__name__
        raise CheckpointError(
            f"{marker_path}: unsupported commit marker format {got!r}, expected {_COMMIT_FORMAT!r}"
        )
    files, step = marker.get("files"), marker.get("step")
    if not isinstance(files, dict) or not files or not _is_int(step):
        raise CheckpointError(f"{marker_path}: the marker misses its 'files' or 'step'")
    states = []
    for name, digest in sorted(files.items()):
        f = d / str(name)
        if "/" in str(name) or "\\" in str(name) or not f.is_file():
            raise CheckpointError(f"{d}: rank file {name!r} listed in {COMMIT_FILE} is missing")
        if hashlib.sha256(f.read_bytes()).hexdigest() != digest:
            raise CheckpointError(
                f"{f}: the file changed after the checkpoint was committed (SHA-256 mismatch; "
                f"truncated or overwritten?)"
            )
        states.append(load_state(f))
    merged = merge_states(states)
    if merged.get("step") != step:
        raise CheckpointError(
            f"{d}: the rank states are for step {merged.get('step')!r}, the marker says {step}"
        )
    return merged
