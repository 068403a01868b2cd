"""The multi-rank checkpoint layout: one file per rank, a commit marker, newest-complete fallback.

::

    root/step_0000000012/rank_00000.json   one file per rank (its lanes), temp name + rename
    root/step_0000000012/rank_00001.json
    root/step_0000000012/COMMITTED.json    written last (after every rank's file exists)

A step directory without ``COMMITTED.json`` is incomplete and is never picked as the latest;
:func:`load_checkpoint` on the root falls back to the newest step that is complete and
consistent.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.state.codec import MAX_FILE_BYTES, decode_checked, encode_checked
from zephon_nodes.state.files import read_bytes, write_atomic
from zephon_nodes.state.merge import merge_states
from zephon_nodes.state.schema import (
    FORMAT_KEY,
    LANES_KEY,
    MICRO_KEY,
    NUM_LANES_KEY,
    STEP_KEY,
    is_int,
)

__all__ = [
    "COMMIT_FILE",
    "MAX_WORLD_SIZE",
    "checkpoint_path",
    "commit_checkpoint",
    "latest_checkpoint",
    "load_checkpoint",
    "save_rank_state",
]

logger = logging.getLogger("zephon_nodes.state")  # the name the docs give (docs/checkpoint.md)
COMMIT_FILE = "COMMITTED.json"
_STEP_PREFIX = "step_"
_COMMIT_FORMAT = "zephon-nodes-checkpoint/1"
# The commit marker's keys (its format and step use the state's key names).
WORLD_SIZE_KEY = "world_size"
FILES_KEY = "files"
_MARKER_KEYS = frozenset((FORMAT_KEY, STEP_KEY, WORLD_SIZE_KEY, FILES_KEY))


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
    if not isinstance(state, Mapping) or state.get(STEP_KEY) != step:
        got = state.get(STEP_KEY) if isinstance(state, Mapping) else type(state).__name__
        raise CheckpointError(f"save_rank_state({step=}): the state is for step {got!r}")
    if state.get(MICRO_KEY, 0) != 0:
        raise CheckpointError(
            f"save_rank_state({step=}): the state was taken in the middle of a step "
            f"(micro={state.get(MICRO_KEY)!r}); multi-rank checkpoints are taken between steps"
        )
    if not is_int(rank) or rank < 0:
        raise CheckpointError(f"{rank=} must be an integer >= 0")
    d = checkpoint_path(root, step)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"cannot create the checkpoint directory {d}: {e}") from None
    target = d / _rank_file(rank)
    write_atomic(target, encode_checked(dict(state)))
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
        raw = read_bytes(f, "rank state")
        files[f.name] = hashlib.sha256(raw).hexdigest()
        states.append(decode_checked(raw, f, allow_unchecked=False))
    merged = merge_states(states)
    if merged.get(STEP_KEY) != step:
        raise CheckpointError(
            f"cannot commit the checkpoint of step {step}: the rank files hold step "
            f"{merged.get(STEP_KEY)!r}"
        )
    marker = {
        FORMAT_KEY: _COMMIT_FORMAT,
        STEP_KEY: step,
        WORLD_SIZE_KEY: world_size,
        FILES_KEY: files,
    }
    target = d / COMMIT_FILE
    write_atomic(target, encode_checked(marker))
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
            ``zephon_nodes.state``) naming the step and why.

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
            state = _load_step_settled(step_dir)
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


def _load_step_settled(d: Path) -> dict[str, Any]:
    """:func:`_load_step`, once more if its marker changed meanwhile.

    Another attempt of the job may commit the same step again while it is read (the
    marker read, then the other attempt's rank files): the files then disagree with the
    marker read, but the step is complete again under its new marker.
    """
    marker = d / COMMIT_FILE
    before = _marker_bytes(marker)
    try:
        return _load_step(d)
    except CheckpointError:
        if before is None or _marker_bytes(marker) in (None, before):
            raise
    return _load_step(d)


def _marker_bytes(marker: Path) -> bytes | None:
    try:
        return marker.read_bytes()
    except OSError:
        return None


def _load_step(d: Path) -> dict[str, Any]:
    marker_path = d / COMMIT_FILE
    try:
        size = marker_path.stat().st_size
    except OSError as e:  # removed since it was listed (a retention policy pruning it)
        raise CheckpointError(f"{marker_path}: cannot read the commit marker: {e}") from None
    if size > MAX_FILE_BYTES:
        raise CheckpointError(f"{marker_path}: too large for a commit marker")
    # Markers written before checksums existed are accepted when they hold exactly the
    # marker keys (a damaged checksum header leaves an extra key and is refused).
    marker = decode_checked(
        read_bytes(marker_path, "commit marker"), marker_path, allow_unchecked=True
    )
    if not isinstance(marker, dict) or marker.get(FORMAT_KEY) != _COMMIT_FORMAT:
        got = marker.get(FORMAT_KEY) if isinstance(marker, dict) else type(marker).__name__
        raise CheckpointError(
            f"{marker_path}: unsupported commit marker format {got!r}, expected {_COMMIT_FORMAT!r}"
        )
    extra = sorted(set(marker) - _MARKER_KEYS)
    if extra:
        raise CheckpointError(f"{marker_path}: unexpected key(s) in the commit marker: {extra}")
    files, step = marker.get(FILES_KEY), marker.get(STEP_KEY)
    world = marker.get(WORLD_SIZE_KEY)
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
        raw = read_bytes(f, "rank state")
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
    if merged.get(STEP_KEY) != step:
        raise CheckpointError(
            f"{d}: the rank states are for step {merged.get(STEP_KEY)!r}, the marker says {step}"
        )
    num_lanes: Any = merged.get(NUM_LANES_KEY)
    if is_int(num_lanes) and sorted(map(int, merged[LANES_KEY])) != list(range(num_lanes)):
        raise CheckpointError(
            f"{d}: the rank files hold lanes {sorted(map(int, merged[LANES_KEY]))[:8]}..., not "
            f"every lane of num_lanes={num_lanes}"
        )
    return merged
