"""The lineage of a re-laned checkpoint: which checkpoint its streams were re-laned from.

Stored under ``"lineage"`` in the state of a re-laned stream (plain JSON)::

    {"fingerprint": "<the old checkpoint's fingerprint>", "num_lanes": L, "step": s,
     "lanes": [[w_0, c_0], [w_1, c_1], ...],
     "pass": p,           # only when the old lanes were past the first pass
     "mixture": {...},    # only when the old checkpoint had dynamic-mixture decisions
     "stage": {...},      # only when the old checkpoint's recipe had changed (state.stage)
     "parent": {...}}     # only when the old checkpoint was itself re-laned

A second re-lane nests the first lineage under ``parent``. What the re-laned streams are is
the engine's (:mod:`zephon_nodes.engine.relane`); this module owns the schema and its checks.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from zephon_nodes.core.errors import CheckpointError

__all__ = [
    "LINEAGE_KEY",
    "Lineage",
    "check_lineage",
    "kept_stage",
    "describe_lineage",
]

LINEAGE_KEY = "lineage"

# The lineage's own keys.
FINGERPRINT = "fingerprint"
NUM_LANES = "num_lanes"
STEP = "step"
LANES = "lanes"
PASS = "pass"
MIXTURE = "mixture"
PARENT = "parent"
STAGE = "stage"
_REQUIRED = (FINGERPRINT, NUM_LANES, STEP, LANES)
_ALLOWED = frozenset((*_REQUIRED, PASS, MIXTURE, PARENT, STAGE))
_MAX = 2**62
_MAX_DEPTH = 64


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class Lineage:
    """Where a re-laned stream came from: the checkpoint it was re-laned at.

    Attributes:
        fingerprint: The old checkpoint's recipe fingerprint (the recipe with ``num_lanes``).
        num_lanes: The old lane count ``L``.
        step: The step the old checkpoint was taken after.
        lanes: Per old lane, ``(window, consumed)``.
        pass_index: The pass the old lanes were reading.
        mixture: The old checkpoint's dynamic-mixture section, or None.
        parent: The old checkpoint's own lineage (it was re-laned too), or None.
        stage: The old checkpoint's stage section (its recipe had changed), or None.
    """

    fingerprint: str
    num_lanes: int
    step: int
    lanes: tuple[tuple[int, int], ...]
    pass_index: int = 0
    mixture: dict[str, Any] | None = None
    parent: Lineage | None = None
    stage: dict[str, Any] | None = None

    @property
    def depth(self) -> int:
        """Re-lanes in this chain (1 for a single re-lane)."""
        return 1 + (self.parent.depth if self.parent is not None else 0)

    def to_state(self) -> dict[str, Any]:
        """Return the JSON-safe form stored under ``"lineage"`` in a checkpoint."""
        out: dict[str, Any] = {
            FINGERPRINT: self.fingerprint,
            NUM_LANES: self.num_lanes,
            STEP: self.step,
            LANES: [[w, c] for w, c in self.lanes],
        }
        if self.pass_index:
            out[PASS] = self.pass_index
        if self.mixture is not None:
            out[MIXTURE] = copy.deepcopy(self.mixture)
        if self.parent is not None:
            out[PARENT] = self.parent.to_state()
        if self.stage is not None:
            out[STAGE] = copy.deepcopy(self.stage)
        return out

    @classmethod
    def from_state(cls, raw: Any, where: str = "checkpoint lineage") -> Lineage:
        """Validate an (untrusted) ``"lineage"`` section and return it.

        Raises:
            CheckpointError: Naming the field that is wrong.
        """
        return cls._parse(raw, where, 0)

    @classmethod
    def _parse(cls, raw: Any, where: str, depth: int) -> Lineage:
        if depth > _MAX_DEPTH:
            raise CheckpointError(f"{where}: more than {_MAX_DEPTH} nested re-lanes")
        if not isinstance(raw, Mapping):
            raise CheckpointError(f"{where} must be a dict, got {type(raw).__name__}")
        extra = sorted(set(map(str, raw)) - _ALLOWED)
        if extra:
            raise CheckpointError(f"{where}: unexpected key(s) {extra}")
        missing = sorted(set(_REQUIRED) - set(raw))
        if missing:
            raise CheckpointError(f"{where}: missing key(s) {missing}")
        fp = raw[FINGERPRINT]
        if not isinstance(fp, str) or len(fp) != 64:
            raise CheckpointError(f"{where}: fingerprint must be 64 hex digits, got {fp!r:.80}")
        for key in (NUM_LANES, STEP, PASS):
            v = raw.get(key, 0)
            if not _is_int(v) or not 0 <= v < _MAX or (key == NUM_LANES and v < 1):
                raise CheckpointError(f"{where}: {key}={v!r} must be an integer >= 0 (lanes >= 1)")
        lanes = raw[LANES]
        if not isinstance(lanes, list) or len(lanes) != raw[NUM_LANES]:
            raise CheckpointError(
                f"{where}: 'lanes' must be a list of {raw[NUM_LANES]} [window, consumed] pairs"
            )
        pairs = []
        for k, v in enumerate(lanes):
            if (
                not isinstance(v, list)
                or len(v) != 2
                or not all(_is_int(x) and 0 <= x < _MAX for x in v)
            ):
                raise CheckpointError(f"{where}: lane {k} must be [window, consumed], got {v!r}")
            pairs.append((int(v[0]), int(v[1])))
        mixture = raw.get(MIXTURE)
        if mixture is not None and not isinstance(mixture, Mapping):
            raise CheckpointError(f"{where}: 'mixture' must be a dict")
        parent = raw.get(PARENT)
        stage = raw.get(STAGE)
        if stage is not None and not isinstance(stage, Mapping):
            raise CheckpointError(f"{where}: 'stage' must be a dict")
        return cls(
            fingerprint=fp,
            num_lanes=int(raw[NUM_LANES]),
            step=int(raw[STEP]),
            lanes=tuple(pairs),
            pass_index=int(raw.get(PASS, 0)),
            mixture=copy.deepcopy(dict(mixture)) if mixture is not None else None,
            parent=cls._parse(parent, where + " parent", depth + 1) if parent is not None else None,
            stage=copy.deepcopy(dict(stage)) if stage is not None else None,
        )


def describe_lineage(raw: Any) -> list[str]:
    """One line per re-lane of a checkpoint's lineage (newest first), for ``inspect``/``lanes``."""
    out: list[str] = []
    node = raw
    while isinstance(node, Mapping) and len(out) <= _MAX_DEPTH:
        lanes = node.get(LANES)
        out.append(
            f"re-laned after step {node.get(STEP)} from {node.get(NUM_LANES)} lanes "
            f"(fingerprint {str(node.get(FINGERPRINT))[:16]}...; "
            f"{len(lanes) if isinstance(lanes, list) else '?'} old lane positions kept)"
        )
        node = node.get(PARENT)
    return out


def kept_stage(raw: Any) -> Mapping[str, Any] | None:
    """The stage section a re-laned checkpoint's lineage keeps, or None.

    A re-lane keeps the stage section of the checkpoint it re-laned (its recipe had changed:
    what the changes dropped, per old lane); a re-lane of a re-lane keeps it in its parent.
    Nearest first: the section of the last change before the re-lanes.
    """
    node, depth = raw, 0
    while isinstance(node, Mapping) and depth <= _MAX_DEPTH:
        stage = node.get(STAGE)
        if isinstance(stage, Mapping):
            return stage
        node, depth = node.get(PARENT), depth + 1
    return None


def check_lineage(saved: Any, expected: Any) -> None:
    """Refuse a state whose lineage is not the one the pipeline reads.

    Args:
        saved: The state's ``"lineage"`` section (None: never re-laned).
        expected: The lineage the resuming pipeline was built for (None: plain streams).

    Raises:
        CheckpointError: Naming what to do.
    """
    if saved == expected:
        return
    if expected is None:
        first = Lineage.from_state(saved)
        raise CheckpointError(
            f"the checkpoint was re-laned (after step {first.step}, from {first.num_lanes} "
            f"lanes); build the pipeline with zephon_nodes.engine.relane.for_state(pipeline, "
            f"state) before its rank nodes (the zephon commands and the TorchTitan loader do)"
        )
    if saved is None:
        raise CheckpointError(
            "this pipeline reads re-laned streams but the checkpoint has no lineage; build "
            "the pipeline afresh for a checkpoint that was never re-laned"
        )
    raise CheckpointError(
        "the checkpoint's lineage differs from the one this pipeline was built for; build "
        "it with zephon_nodes.engine.relane.for_state(pipeline, state) for this checkpoint"
    )
