"""The rank state's schema: its version, its key names (defined here once) and a typed view.

A rank's state is plain JSON-safe data (``Multiplexer.state_dict()``)::

    {"format": "zephon-nodes/1", "fingerprint": "<sha256 of the recipe>",
     "recipe": {<per-field summary of the recipe>}, "num_lanes": L, "step": s, "micro": 0,
     "lanes": {"0": [window, consumed], "1": [...], ...},
     "layout": {...}, "pass": p, "mixture": {...}, "lineage": {...},
     "stage": {...}, "last_sample": {"0": check, ...}}   # each optional

:class:`RankState` is the typed form: :meth:`RankState.from_dict` checks the structure
(keys, types, ranges) of an untrusted dict, :meth:`RankState.to_dict` gives the dict back.
What the values must be for a given recipe is checked by :mod:`zephon_nodes.state.validate`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.state.last_sample import LAST_SAMPLE_KEY, parse_last_samples
from zephon_nodes.state.lineage import LINEAGE_KEY

__all__ = [
    "FINGERPRINT_KEY",
    "FORMAT",
    "FORMAT_KEY",
    "FORMAT_PREFIX",
    "LANES_KEY",
    "LAST_SAMPLE_KEY",
    "LAYOUT_KEY",
    "LAYOUT_LANES_KEY",
    "LINEAGE_KEY",
    "LOCAL_BATCH_SIZE_KEY",
    "MAX_VALUE",
    "MICRO_KEY",
    "MIXTURE_KEY",
    "NUM_LANES_KEY",
    "PASS_KEY",
    "RECIPE_KEY",
    "REQUIRED_KEYS",
    "RankState",
    "SCHEMA_VERSION",
    "STAGE_KEY",
    "STATE_KEYS",
    "STEP_KEY",
    "is_int",
    "lane_key",
]

SCHEMA_VERSION = 1
"""The version of the rank state's schema; part of :data:`FORMAT`."""
FORMAT_PREFIX = "zephon-nodes/"
FORMAT = f"{FORMAT_PREFIX}{SCHEMA_VERSION}"

FORMAT_KEY = "format"
FINGERPRINT_KEY = "fingerprint"
RECIPE_KEY = "recipe"
NUM_LANES_KEY = "num_lanes"
STEP_KEY = "step"
MICRO_KEY = "micro"
LANES_KEY = "lanes"
LAYOUT_KEY = "layout"  # only when micro > 0
MIXTURE_KEY = "mixture"  # the decision log of a dynamic mixture (state.mixture)
PASS_KEY = "pass"  # the pass of the recipe's stream, after the first (docs/torchdata.md)
# LINEAGE_KEY: where a re-laned stream came from (state.lineage)
STAGE_KEY = "stage"  # the stage of a recipe that changes during the run (state.stage)
# LAST_SAMPLE_KEY: per lane, a check of the last sample it handed out (state.last_sample)
LAYOUT_LANES_KEY = "lanes"
LOCAL_BATCH_SIZE_KEY = "local_batch_size"

REQUIRED_KEYS = (FINGERPRINT_KEY, NUM_LANES_KEY, STEP_KEY, MICRO_KEY, LANES_KEY)
STATE_KEYS = frozenset(
    (
        FORMAT_KEY,
        RECIPE_KEY,
        *REQUIRED_KEYS,
        LAYOUT_KEY,
        MIXTURE_KEY,
        PASS_KEY,
        LINEAGE_KEY,
        STAGE_KEY,
        LAST_SAMPLE_KEY,
    )
)
MAX_VALUE = 2**62
"""Every step, micro-batch, pass, window and count is an integer below this."""


def is_int(x: Any) -> bool:
    """True for an ``int`` that is not a ``bool``."""
    return isinstance(x, int) and not isinstance(x, bool)


def lane_key(lane: int) -> str:
    """The key of lane ``lane`` in a state's ``lanes`` (and ``effects``): its decimal."""
    return str(lane)


@dataclasses.dataclass(frozen=True)
class RankState:
    """One rank's checkpoint state, typed.

    Attributes:
        fingerprint: SHA-256 (hex) of the canonical recipe.
        recipe: The per-field recipe summary (names the fields that differ on a refusal).
        num_lanes: The recipe's lane count ``L``.
        step: Steps whose micro-batches were all handed out.
        micro: Micro-batches of step ``step + 1`` already handed out.
        lanes: ``{lane: (window, consumed)}`` for the lanes this rank owns.
        layout: ``{"lanes": [...], "local_batch_size": b}`` when ``micro > 0``.
        pass_index: The pass of the recipe's stream (0: the first).
        mixture: The dynamic-mixture section (:mod:`zephon_nodes.state.mixture`), or None.
        lineage: The re-lane lineage (:mod:`zephon_nodes.state.lineage`), or None.
        stage: The stage section (:mod:`zephon_nodes.state.stage`), or None.
        last_sample: ``{lane: check}`` of the last sample each lane handed out
            (:mod:`zephon_nodes.state.last_sample`), or None (a state written before it).
    """

    fingerprint: str
    recipe: Mapping[str, Any]
    num_lanes: int
    step: int
    micro: int
    lanes: Mapping[int, tuple[int, int]]
    layout: Mapping[str, Any] | None = None
    pass_index: int = 0
    mixture: Mapping[str, Any] | None = None
    lineage: Mapping[str, Any] | None = None
    stage: Mapping[str, Any] | None = None
    last_sample: Mapping[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the plain, JSON-safe state (a fresh dict)."""
        out: dict[str, Any] = {
            FORMAT_KEY: FORMAT,
            FINGERPRINT_KEY: self.fingerprint,
            RECIPE_KEY: dict(self.recipe),
            NUM_LANES_KEY: self.num_lanes,
            STEP_KEY: self.step,
            MICRO_KEY: self.micro,
            LANES_KEY: {lane_key(i): [w, c] for i, (w, c) in self.lanes.items()},
        }
        if self.layout is not None:
            out[LAYOUT_KEY] = dict(self.layout)
        if self.mixture is not None:
            out[MIXTURE_KEY] = dict(self.mixture)
        if self.pass_index:
            out[PASS_KEY] = self.pass_index
        if self.lineage is not None:
            out[LINEAGE_KEY] = self.lineage
        if self.stage is not None:
            out[STAGE_KEY] = self.stage
        if self.last_sample is not None:
            out[LAST_SAMPLE_KEY] = {lane_key(i): v for i, v in sorted(self.last_sample.items())}
        return out

    @classmethod
    def from_dict(cls, state: Any) -> RankState:
        """Check the structure of an untrusted state and return it typed.

        Raises:
            CheckpointError: Naming the key or value that is wrong (format, unknown or
                missing keys, types, ranges, lane keys).
        """
        if not isinstance(state, Mapping):
            raise CheckpointError(
                f"a zephon-nodes state must be a dict, got {type(state).__name__}"
            )
        if state.get(FORMAT_KEY) != FORMAT:
            raise CheckpointError(
                f"unsupported checkpoint format {state.get(FORMAT_KEY)!r}, expected {FORMAT!r} "
                f"(was it written by zephon-nodes?)"
            )
        extra = sorted(set(map(str, state)) - STATE_KEYS)
        if extra:
            raise CheckpointError(f"unexpected key(s) in checkpoint state: {extra}")
        missing = sorted(set(REQUIRED_KEYS) - set(state))
        if missing:
            raise CheckpointError(f"checkpoint state misses key(s): {missing}")
        num_lanes = state[NUM_LANES_KEY]
        if not is_int(num_lanes) or not 1 <= num_lanes < MAX_VALUE:
            raise CheckpointError(f"checkpoint num_lanes={num_lanes!r} must be an integer >= 1")
        for key in (STEP_KEY, MICRO_KEY, PASS_KEY):
            if key in state and (not is_int(state[key]) or not 0 <= state[key] < MAX_VALUE):
                raise CheckpointError(
                    f"checkpoint {key}={state[key]!r} must be an integer in [0, 2**62)"
                )
        recipe = state.get(RECIPE_KEY)
        layout = state.get(LAYOUT_KEY)
        mixture = state.get(MIXTURE_KEY)
        for key, value in ((RECIPE_KEY, recipe), (LAYOUT_KEY, layout), (MIXTURE_KEY, mixture)):
            if value is not None and not isinstance(value, Mapping):
                raise CheckpointError(
                    f"checkpoint {key!r} must be a dict, got {type(value).__name__}"
                )
        return cls(
            fingerprint=str(state[FINGERPRINT_KEY]),
            recipe=dict(recipe) if isinstance(recipe, Mapping) else {},
            num_lanes=int(num_lanes),
            step=int(state[STEP_KEY]),
            micro=int(state[MICRO_KEY]),
            lanes=parse_lanes(state[LANES_KEY], int(num_lanes)),
            layout=layout,
            pass_index=int(state.get(PASS_KEY, 0)),
            mixture=mixture,
            lineage=state.get(LINEAGE_KEY),
            stage=state.get(STAGE_KEY),
            last_sample=parse_last_samples(state.get(LAST_SAMPLE_KEY), int(num_lanes)),
        )


def parse_lanes(raw: Any, num_lanes: int) -> dict[int, tuple[int, int]]:
    """Parse a state's ``lanes`` (``{"lane": [window, consumed]}``), lanes in ascending order.

    Raises:
        CheckpointError: Naming the lane key or position that is wrong.
    """
    if not isinstance(raw, Mapping):
        raise CheckpointError(f"checkpoint 'lanes' must be a dict, got {type(raw).__name__}")
    parsed: dict[int, tuple[int, int]] = {}
    for key, value in raw.items():
        try:
            lane = int(key)
        except (TypeError, ValueError):
            raise CheckpointError(f"checkpoint lane key {key!r} is not a lane number") from None
        if not 0 <= lane < num_lanes or lane_key(lane) != str(key):
            raise CheckpointError(f"checkpoint lane {key!r} is out of range [0, {num_lanes})")
        if not _is_pair(value):
            raise CheckpointError(
                f"checkpoint lane {lane}: expected [window, consumed] (two integers >= 0), "
                f"got {value!r}"
            )
        parsed[lane] = (int(value[0]), int(value[1]))
    return dict(sorted(parsed.items()))


def _is_pair(value: Any) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes))
        and len(value) == 2
        and all(is_int(v) and 0 <= v < MAX_VALUE for v in value)
    )
