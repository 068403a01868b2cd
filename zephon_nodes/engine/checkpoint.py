"""Checkpoint state: a few integers per lane, plain JSON-safe data, validated on load.

Layout (see ``docs/checkpoint.md``)::

    {"format": "zephon-nodes/1", "fingerprint": "<sha256 of the recipe>",
     "recipe": {<per-field summary of the recipe>}, "num_lanes": L, "step": s, "micro": 0,
     "lanes": {"0": [window, consumed], "1": [...], ...}}

Nothing is ever unpickled or evaluated: files are JSON, and every field is type-checked
before a single batch is produced. Every file this module writes starts with a checksum of its
own exact bytes (``{"checksum":"sha256:<hex>", ...}``, see :func:`encode_checked`), so a
flipped bit or a hand edit is refused naming the file; duplicated JSON keys are refused too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from zephon_nodes.core.plain import is_int
from zephon_nodes.engine.state_paths import locate_state
from zephon_nodes.errors import CheckpointError

__all__ = [
    "FORMAT",
    "unwrap_state",
    "STATE_FILE",
    "load_state",
    "merge_states",
    "recipe_summary",
    "save_state",
    "validate_state",
    "COMMIT_FILE",
    "checkpoint_path",
    "commit_checkpoint",
    "check_writable",
    "contents_diff",
    "decode_checked",
    "encode_checked",
    "latest_checkpoint",
    "load_checkpoint",
    "save_rank_state",
]

FORMAT = "zephon-nodes/1"
STATE_FILE = "zephon_state.json"
_KEYS = {
    "format",
    "fingerprint",
    "recipe",
    "num_lanes",
    "step",
    "micro",
    "lanes",
    "layout",
    "mixture",  # the decision log of a dynamic mixture (zephon_nodes.engine.mixture_log)
    "pass",  # the pass of the recipe's stream, after the first (docs/torchdata.md)
    "lineage",  # where a re-laned stream came from (zephon_nodes.engine.relane)
}
_MAX_STATE_BYTES = 16 << 20
CHECKSUM_KEY = "checksum"
_HEADER = b'{"checksum":"sha256:'
_HEADER_RE = re.compile(rb'\{"checksum":"sha256:([0-9a-f]{64})",')
logger = logging.getLogger(__name__)


def recipe_summary(canonical: Mapping[str, Any]) -> dict[str, Any]:
    """Summarize a canonical recipe per top-level field: scalars verbatim, the rest hashed.

    Stored in every checkpoint (a few hundred bytes) so a refused resume can name the field
    that changed (``seq_len: checkpoint has 128, recipe has 256``).
    """
    from zephon_nodes.recipe.canonical import canonical_sha256

    out: dict[str, Any] = {}
    for key, value in sorted(canonical.items()):
        if isinstance(value, (dict, list)):
            out[key] = "sha256:" + canonical_sha256(value)[:16]
        else:
            out[key] = value
    return out


def validate_state(
    state: Any,
    *,
    fingerprint: str,
    summary: Mapping[str, Any],
    num_lanes: int,
    lanes: Iterable[int],
    samples_per_lane: int | None = None,
) -> dict[int, tuple[int, int]]:
    """Check a state against the running recipe and return ``{lane: (window, consumed)}``.

    Besides types and ranges, the positions are checked against the step where that is
    cheap: a lane hands out ``samples_per_lane`` samples per step and its position counts
    the samples taken from its current flush window, so at step 0 every lane is at
    ``[0, 0]``; after it, every lane has taken at least one sample of its window
    (``consumed >= 1``) and at most ``step * samples_per_lane``, exactly that many while
    the lane is still in window 0.

    Args:
        state: The loaded state (untrusted).
        fingerprint: Fingerprint of the running recipe.
        summary: :func:`recipe_summary` of the running recipe.
        num_lanes: Lane count of the running recipe.
        lanes: Lanes this rank owns; each must be present.
        samples_per_lane: The recipe's ``G / L``; enables the step/position checks.

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
        saved = state.get("recipe")
        diffs = _summary_diff(saved, summary)
        if diffs:
            detail = "; ".join(diffs)
        elif isinstance(saved, Mapping):
            detail = (
                "every recipe field recorded in the checkpoint matches, so the fingerprint "
                "itself was altered (a damaged or edited state)"
            )
        else:
            detail = "the checkpoint records no readable recipe summary to compare"
        raise CheckpointError(
            f"the checkpoint was written with a different recipe (fingerprint "
            f"{fingerprint_pair(str(state['fingerprint']), fingerprint)}): {detail}"
        )
    if not is_int(state["num_lanes"]) or state["num_lanes"] != num_lanes:
        raise CheckpointError(
            f"checkpoint has num_lanes={state['num_lanes']!r}, recipe has {num_lanes=}"
        )
    for key in ("step", "micro", "pass"):
        if key not in state:
            continue
        if not is_int(state[key]) or not 0 <= state[key] < 2**62:
            raise CheckpointError(
                f"checkpoint {key}={state[key]!r} must be an integer in [0, 2**62)"
            )
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
            or not all(is_int(v) and 0 <= v < 2**62 for v in value)
        ):
            raise CheckpointError(
                f"checkpoint lane {lane}: expected [window, consumed] (two integers >= 0), "
                f"got {value!r}"
            )
        parsed[lane] = (int(value[0]), int(value[1]))
    absent = sorted(set(lanes) - set(parsed))
    if absent:
        raise CheckpointError(f"checkpoint has no state for lane(s) {absent} owned by this rank")
    if samples_per_lane is not None and state.get("lineage") is None:
        # (A re-laned lane's position also counts the samples its leftovers drop.)
        _check_positions(parsed, state["step"], samples_per_lane)
    return parsed


def _check_positions(
    positions: Mapping[int, tuple[int, int]], step: int, samples_per_lane: int
) -> None:
    taken = step * samples_per_lane
    for lane, (window, consumed) in sorted(positions.items()):
        if step == 0 and (window, consumed) != (0, 0):
            raise CheckpointError(
                f"checkpoint lane {lane}: position [{window}, {consumed}] at step 0 (before "
                f"any step every lane is at [0, 0])"
            )
        if step == 0:
            continue
        if consumed < 1 or consumed > taken or (window == 0 and consumed != taken):
            expected = f"exactly {taken}" if window == 0 else f"between 1 and {taken}"
            raise CheckpointError(
                f"checkpoint lane {lane}: position [{window}, {consumed}] is inconsistent with "
                f"step={step} (the lane handed out {step} x {samples_per_lane} = {taken} "
                f"samples, so the samples consumed in window {window} must be {expected})"
            )


def fingerprint_pair(saved: str, current: str) -> str:
    """Show two fingerprints by prefixes long enough to tell them apart."""
    n = 12
    while n < max(len(saved), len(current)) and saved[:n] == current[:n]:
        n += 8
    return f"{saved[:n]!r}..., this recipe {current[:n]!r}..."


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


def unwrap_state(state: Any) -> dict[str, Any]:
    """Return the library's state: ``state`` itself, or the one inside a ``Loader`` state.

    A ``torchdata.nodes.Loader`` over a rank node holds its state under the wrappers' keys
    (``root``, ``root.snapshot``, ``root.it_state.snapshot``, ``root.source``, ...); it is
    found by its ``format`` key whatever the stack.

    Raises:
        CheckpointError: If there is no library state, more than one, or the wrappers yielded
            items after it was taken (``steps_since_snapshot`` > 0): then the state lags the
            consumer and :func:`zephon_nodes.engine.loader_state.rank_state` must replay it to
            the step the consumer reached.
    """
    if isinstance(state, Mapping) and "format" in state:
        return dict(state)
    found = locate_state(state, FORMAT)
    if not found:
        kind = type(state).__name__
        raise CheckpointError(
            f"no zephon-nodes state (a dict with format {FORMAT!r}) found in this {kind}"
        )
    if len(found) > 1:
        where = ", ".join(f.where for f in found)
        raise CheckpointError(f"more than one zephon-nodes state in this Loader state: {where}")
    f = found[0]
    if not f.exact:
        lag = ", ".join(f"{k}={v}" for k, v in f.lag)
        raise CheckpointError(
            f"the zephon-nodes state at {f.where} in this Loader state was taken before the "
            f"last items the wrappers yielded ({lag}); replay it to the step the training loop "
            f"reached: zephon_nodes.loader_state.rank_state(state, pipeline, step=STEP)"
        )
    return dict(f.state)


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge the states of all ranks (each holding its own lanes) into one global state.

    Each state may also be a whole ``torchdata.nodes.Loader`` state (see
    :func:`unwrap_state`).

    Raises:
        CheckpointError: If the ranks disagree on recipe or step, are mid-step, or overlap.
    """
    if not states:
        raise CheckpointError("no states to merge")
    states = [unwrap_state(s) for s in states]
    first = states[0]
    lanes: dict[str, Any] = {}
    for s in states:
        if not isinstance(s, Mapping) or not isinstance(s.get("lanes"), Mapping):
            raise CheckpointError("each rank state must be a dict with a 'lanes' dict")
        bad = [k for k in s["lanes"] if not (isinstance(k, str) and k.isascii() and k.isdigit())]
        if bad:
            raise CheckpointError(f"checkpoint lane key(s) {bad[:4]} are not lane numbers")
        for key in ("format", "fingerprint", "num_lanes", "step", "pass", "lineage"):
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
    mixtures = [s.get("mixture") for s in states]
    if any(m is not None for m in mixtures):
        merged["mixture"] = _merge_mixtures(mixtures)
    return merged


def _merge_mixtures(mixtures: Sequence[Any]) -> dict[str, Any]:
    """Merge the ranks' decision logs (identical) and per-lane effect windows (disjoint)."""
    logs = [m.get("log") if isinstance(m, Mapping) else None for m in mixtures]
    for k, log in enumerate(logs):
        if log != logs[0]:
            raise CheckpointError(
                f"ranks disagree on the mixture decision log: rank 0 has {logs[0]!r:.200}, "
                f"rank {k} has {log!r:.200}"
            )
    effects: dict[str, Any] = {}
    for m in mixtures:
        if isinstance(m, Mapping) and isinstance(m.get("effects"), Mapping):
            effects.update(m["effects"])
    ordered = sorted(effects.items(), key=lambda kv: (len(str(kv[0])), str(kv[0])))
    return {"log": logs[0], "effects": dict(ordered)}


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
        obj = _parse_json(raw, where)
        if not isinstance(obj, dict):  # pragma: no cover - the header makes it an object
            raise CheckpointError(f"{where}: not a JSON object")
        del obj[CHECKSUM_KEY]
        return obj
    obj = _parse_json(raw, where)
    if isinstance(obj, dict) and CHECKSUM_KEY in obj:
        raise CheckpointError(
            f"{where}: the {CHECKSUM_KEY!r} key must come first, as zephon-nodes writes it "
            f"(was the file re-serialized or edited?)"
        )
    if not allow_unchecked:
        raise CheckpointError(
            f"{where}: the file carries no checksum (a state written before zephon-nodes "
            f"checksummed its checkpoints, or a hand-made one); load it with "
            f"load_state(path, allow_unchecked=True) if you trust it"
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


def _parse_json(raw: bytes, where: str | os.PathLike[str], what: str = "state") -> Any:
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


def _write_atomic(target: Path, data: bytes) -> None:
    """Write ``data`` to a temporary name in ``target``'s directory, fsync, then rename.

    A failure (disk full, permissions) removes the temporary file and leaves any previous
    ``target`` untouched.

    Raises:
        CheckpointError: Naming the file and the OS error.
    """
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".", suffix=".tmp")
        from zephon_nodes.io.storage.cache import umask_mode

        umask_mode(fd)  # the usual mode (umask), not mkstemp's 0600
    except OSError as e:
        raise CheckpointError(f"cannot write the checkpoint file {target}: {e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise CheckpointError(
                f"cannot write the checkpoint file {target}: {e} (any previous version of "
                f"the file is intact)"
            ) from None
        raise


def check_writable(directory: str | os.PathLike[str]) -> Path:
    """Check at start-up that checkpoints can be written to ``directory`` (created if absent).

    Creates and removes a small probe file, so a read-only mount, missing permission or a
    path that is a file fails now, not hours later at the first save.

    Raises:
        CheckpointError: Naming the directory and the OS error.
    """
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=d, prefix=".zephon-probe.", suffix=".tmp")
        try:
            os.write(fd, b"0")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise CheckpointError(f"checkpoint directory {d} is not writable: {e}") from None
    return d


def save_state(directory: str | os.PathLike[str], state: Mapping[str, Any]) -> Path:
    """Write ``state`` to ``directory/zephon_state.json`` with its checksum (temp file, rename).

    Raises:
        CheckpointError: If the state is not plain JSON data or the file cannot be written
            (the previous file, if any, stays intact).
    """
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"cannot create the checkpoint directory {d}: {e}") from None
    target = d / STATE_FILE
    _write_atomic(target, encode_checked(state))
    return target


def load_state(path: str | os.PathLike[str], *, allow_unchecked: bool = False) -> dict[str, Any]:
    """Read a state saved by :func:`save_state` (a directory or the JSON file itself).

    The checksum is verified before the JSON is parsed. A file holding a whole
    ``torchdata.nodes.Loader`` state gives the library state inside it (:func:`unwrap_state`).

    Args:
        path: The file, or the directory holding ``zephon_state.json``.
        allow_unchecked: Also accept a file without a checksum (written by an older version).

    Raises:
        CheckpointError: If the file is missing, too large, damaged (checksum mismatch),
            holds duplicated keys, or is not a JSON object.
    """
    p = Path(path)
    if p.is_dir():
        p = p / STATE_FILE
    if not p.is_file():
        raise CheckpointError(f"no checkpoint state at {p}")
    if p.stat().st_size > _MAX_STATE_BYTES:
        raise CheckpointError(f"{p}: {p.stat().st_size} bytes is too large for a state file")
    state = decode_checked(_read_bytes(p, "state"), p, allow_unchecked=allow_unchecked)
    if not isinstance(state, dict):
        raise CheckpointError(f"{p}: a state must be a JSON object, got {type(state).__name__}")
    if "format" not in state:
        try:
            return unwrap_state(state)
        except CheckpointError as e:
            raise CheckpointError(f"{p}: {e}") from None
    return state


def _read_bytes(p: Path, what: str) -> bytes:
    try:
        return p.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{p}: cannot read the checkpoint {what}: {e}") from None


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
    if not is_int(step) or step < 0:
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
    if not is_int(rank) or rank < 0:
        raise CheckpointError(f"{rank=} must be an integer >= 0")
    d = checkpoint_path(root, step)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"cannot create the checkpoint directory {d}: {e}") from None
    target = d / _rank_file(rank)
    _write_atomic(target, encode_checked(dict(state)))
    return target


MAX_WORLD_SIZE = 1 << 20
"""Largest ``world_size`` a commit accepts (far beyond any data-parallel job)."""


def commit_checkpoint(root: str | os.PathLike[str], step: int, world_size: int) -> Path:
    """Mark step ``step``'s checkpoint complete (call once, after every rank has saved).

    Checks that the files of ranks ``0 .. world_size-1`` exist, verify their checksums, are
    for step ``step`` and hold disjoint lanes, then writes ``COMMITTED.json`` (checksummed,
    temp name + rename) listing them with their SHA-256, so later damage to a rank file is
    detected on load.

    Raises:
        CheckpointError: If ``world_size`` is not an integer in ``[1, 2**20]`` (nothing is
            written), or a rank's file is missing, damaged or for another step.
    """
    if not is_int(world_size) or not 1 <= world_size <= MAX_WORLD_SIZE:
        raise CheckpointError(
            f"commit_checkpoint: world_size={world_size!r} must be an integer in "
            f"[1, {MAX_WORLD_SIZE}]; nothing was committed"
        )
    d = checkpoint_path(root, step)
    files: dict[str, str] = {}
    states = []
    for rank in range(world_size):
        f = d / _rank_file(rank)
        if not f.is_file():
            raise CheckpointError(
                f"cannot commit the checkpoint of step {step}: rank {rank} of {world_size} "
                f"has not saved {f}"
            )
        raw = _read_bytes(f, "rank state")
        files[f.name] = hashlib.sha256(raw).hexdigest()
        states.append(decode_checked(raw, f, allow_unchecked=False))
    merged = merge_states(states)
    if merged.get("step") != step:
        raise CheckpointError(
            f"cannot commit the checkpoint of step {step}: the rank files hold step "
            f"{merged.get('step')!r}"
        )
    marker = {"format": _COMMIT_FORMAT, "step": step, "world_size": world_size, "files": files}
    target = d / COMMIT_FILE
    _write_atomic(target, encode_checked(marker))
    return d


def _committed_steps(root: Path) -> list[tuple[int, Path]]:
    """Committed step directories under ``root``, newest first."""
    if not root.is_dir():
        return []
    out = []
    for d in root.iterdir():
        digits = d.name[len(_STEP_PREFIX) :]
        if not d.name.startswith(_STEP_PREFIX) or not (digits.isascii() and digits.isdigit()):
            continue
        if (d / COMMIT_FILE).is_file():
            out.append((int(digits), d))
    return sorted(out, reverse=True)


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """Return the newest committed step directory under ``root``, or None if there is none.

    Directories without ``COMMITTED.json`` (a job killed while writing) are ignored. The
    newest committed step may still be damaged; :func:`load_checkpoint` on ``root`` falls
    back to the newest one that loads.
    """
    steps = _committed_steps(Path(root))
    return steps[0][1] if steps else None


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a committed multi-rank checkpoint and merge the ranks into one global state.

    Args:
        path: A step directory (loaded or refused, no fallback), or a root holding step
            directories: the newest committed step that is complete and consistent is
            loaded; each newer committed step that is not is skipped with a warning (logger
            ``zephon_nodes.engine.checkpoint``) naming the step and why.

    Returns:
        The merged state; pass it to every rank's ``Multiplexer.reset`` (any dp size).

    Raises:
        CheckpointError: If nothing is committed, or (for a step directory, or for every
            committed step of a root) the marker or a rank file is missing, damaged or
            changed since the commit, or the ranks disagree.
    """
    d = Path(path)
    if (d / COMMIT_FILE).is_file():
        return _load_step(d)
    steps = _committed_steps(d)
    if not steps:
        raise CheckpointError(f"{d}: no committed checkpoint (no {COMMIT_FILE} found)")
    reasons = []
    for step, step_dir in steps:
        try:
            state = _load_step(step_dir)
        except CheckpointError as e:
            reasons.append(f"step {step}: {e}")
            logger.warning("skipping the checkpoint of step %d (%s): %s", step, step_dir, e)
            continue
        if reasons:
            logger.warning(
                "loaded the checkpoint of step %d, the newest complete and consistent one "
                "under %s (skipped: %s)",
                step,
                d,
                ", ".join(r.split(":", 1)[0] for r in reasons),
            )
        return state
    raise CheckpointError(
        f"{d}: none of the {len(steps)} committed checkpoint(s) loads: " + " | ".join(reasons)
    )


def _load_step(d: Path) -> dict[str, Any]:
    marker_path = d / COMMIT_FILE
    if marker_path.stat().st_size > _MAX_STATE_BYTES:
        raise CheckpointError(f"{marker_path}: too large for a commit marker")
    # Markers written before checksums existed are accepted when they hold exactly the
    # marker keys (a damaged checksum header leaves an extra key and is refused).
    marker = decode_checked(
        _read_bytes(marker_path, "commit marker"), marker_path, allow_unchecked=True
    )
    if not isinstance(marker, dict) or marker.get("format") != _COMMIT_FORMAT:
        got = marker.get("format") if isinstance(marker, dict) else type(marker).__name__
        raise CheckpointError(
            f"{marker_path}: unsupported commit marker format {got!r}, expected {_COMMIT_FORMAT!r}"
        )
    extra = sorted(set(marker) - {"format", "step", "world_size", "files"})
    if extra:
        raise CheckpointError(f"{marker_path}: unexpected key(s) in the commit marker: {extra}")
    files, step, world = marker.get("files"), marker.get("step"), marker.get("world_size")
    if not isinstance(files, dict) or not files or not is_int(step):
        raise CheckpointError(f"{marker_path}: the marker misses its 'files' or 'step'")
    if not is_int(world) or world != len(files):
        raise CheckpointError(
            f"{marker_path}: world_size={world!r} but the marker lists {len(files)} rank file(s)"
        )
    states = []
    for name, digest in sorted(files.items()):
        f = d / str(name)
        if "/" in str(name) or "\\" in str(name) or not f.is_file():
            raise CheckpointError(f"{d}: rank file {name!r} listed in {COMMIT_FILE} is missing")
        raw = _read_bytes(f, "rank state")
        if hashlib.sha256(raw).hexdigest() != digest:
            raise CheckpointError(
                f"{f}: the file changed after the checkpoint was committed (SHA-256 mismatch; "
                f"truncated or overwritten?)"
            )
        # Rank files written before checksums existed are vouched for by the marker's SHA-256.
        state = decode_checked(raw, f, allow_unchecked=True)
        if not isinstance(state, dict):
            raise CheckpointError(f"{f}: a state must be a JSON object")
        states.append(state)
    merged = merge_states(states)
    if merged.get("step") != step:
        raise CheckpointError(
            f"{d}: the rank states are for step {merged.get('step')!r}, the marker says {step}"
        )
    num_lanes: Any = merged.get("num_lanes")
    if is_int(num_lanes) and sorted(map(int, merged["lanes"])) != list(range(num_lanes)):
        raise CheckpointError(
            f"{d}: the rank files hold lanes {sorted(map(int, merged['lanes']))[:8]}..., not "
            f"every lane of num_lanes={num_lanes}"
        )
    return merged
