"""The dynamic-mixture section of a state: the decision log and each lane's effect windows.

Stored under ``"mixture"`` (see :mod:`zephon_nodes.engine.mixture_log` for when a decision
takes effect)::

    {"log": [{"step": 5, "weights": {"web": 0.2, "code": 0.8}}, ...],
     "effects": {"0": [w1, ...], "1": [...], ...}}

``log`` is the same on every rank (weights normalized, in recipe order, by name);
``effects`` holds, per lane, the flush window where each decision starts. Besides the
structure, :func:`check_effects` holds the effect windows to what the lane positions allow:
a decision made after step ``s`` starts in a lane at the window after the one the lane was
in at step ``s``, so it is never later than the lane's current window + 1, exactly that for
a decision made after the state's own step, and 1 for a decision made before any step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.state.schema import LANES_KEY, MICRO_KEY, MIXTURE_KEY, STEP_KEY, is_int, lane_key

__all__ = [
    "EFFECTS_KEY",
    "LOG_KEY",
    "MIXTURE_KEY",
    "MixtureLog",
    "WEIGHTS_KEY",
    "check_effects",
    "merge_mixtures",
    "normalize_weights",
    "parse_mixture_state",
    "with_decision",
]

LOG_KEY = "log"
EFFECTS_KEY = "effects"
WEIGHTS_KEY = "weights"
ENTRY_STEP_KEY = STEP_KEY
_ENTRY_KEYS = {ENTRY_STEP_KEY, WEIGHTS_KEY}
_SECTION_KEYS = {LOG_KEY, EFFECTS_KEY}


def normalize_weights(names: Sequence[str], weights: Any, *, where: str = "mixture") -> dict:
    """Check a decision's weights against the recipe's datasets and normalize them.

    Args:
        names: The recipe's dataset names, in order.
        weights: ``{name: weight}``, one weight >= 0 per dataset (0 pauses a dataset).
        where: What the weights are, for messages.

    Returns:
        ``{name: weight / sum}`` in recipe order.

    Raises:
        RecipeError: Naming an unknown or missing dataset, or a bad weight.
    """
    if not isinstance(weights, Mapping):
        raise RecipeError(
            f"{where}: weights must be a mapping {{dataset: weight}}, got {type(weights).__name__}"
        )
    unknown = sorted(str(k) for k in weights if k not in names)
    if unknown:
        raise RecipeError(
            f"{where}: unknown dataset(s) {unknown}; the recipe's datasets are {list(names)}"
        )
    missing = [n for n in names if n not in weights]
    if missing:
        raise RecipeError(
            f"{where}: no weight for dataset(s) {missing}; give every dataset a weight "
            f"(0 pauses it)"
        )
    out: dict[str, float] = {}
    for n in names:
        w = weights[n]
        try:
            ok = not isinstance(w, bool) and isinstance(w, (int, float)) and math.isfinite(w)
        except OverflowError:  # an integer beyond any float
            ok = False
        if not ok or w < 0:
            shown = f"{str(w)[:20]}... ({len(str(w))} digits)" if len(str(w)) > 40 else repr(w)
            raise RecipeError(f"{where}: weight of {n!r} is {shown}, expected a finite number >= 0")
        out[n] = float(w)
    total = sum(out.values())
    if not math.isfinite(total):
        raise RecipeError(
            f"{where}: the weights sum to more than a float holds ({max(out.values()):g} is "
            f"too large); only their ratios matter, use smaller numbers"
        )
    if not total > 0:
        raise RecipeError(f"{where}: the weights sum to 0 (at least one dataset needs weight > 0)")
    if any(w > 0 and w / total == 0 for w in out.values()):
        raise RecipeError(
            f"{where}: a weight > 0 is too small next to the others to be represented "
            f"({min(w for w in out.values() if w > 0):g} of {total:g}); give it 0 or more"
        )
    return {n: w / total for n, w in out.items()}


class MixtureLog:
    """The decisions in force on a rank: weights per decision and each lane's effect window.

    Attributes:
        entries: ``[(step, {name: weight}), ...]`` in order (normalized weights).
        effects: ``{lane: [window, ...]}``, one window per entry, for the lanes known here.
    """

    def __init__(
        self,
        entries: Sequence[tuple[int, dict[str, float]]] = (),
        effects: Mapping[int, Sequence[int]] | None = None,
    ) -> None:
        self.entries = [(int(s), dict(w)) for s, w in entries]
        self.effects = {int(k): [int(x) for x in v] for k, v in (effects or {}).items()}

    def __bool__(self) -> bool:
        return bool(self.entries)

    def to_state(self, lanes: Sequence[int]) -> dict[str, Any]:
        """Return the JSON-safe ``"mixture"`` section for ``lanes``."""
        return {
            LOG_KEY: [{ENTRY_STEP_KEY: s, WEIGHTS_KEY: dict(w)} for s, w in self.entries],
            EFFECTS_KEY: {lane_key(i): list(self.effects[i]) for i in lanes},
        }


def with_decision(state: Mapping[str, Any], weights: Mapping[str, float]) -> dict[str, Any]:
    """Return a copy of a step-boundary state with one more decision made after its step.

    The decision's effect window in each lane of the state is the lane's window + 1.

    Raises:
        RecipeError: If the state was taken in the middle of a step.
    """
    if state.get(MICRO_KEY, 0):
        raise RecipeError(
            f"set_mixture is called between steps; this rank is after micro-batch "
            f"{state[MICRO_KEY]} of step {int(state[STEP_KEY]) + 1}"
        )
    out = dict(state)
    old = state.get(MIXTURE_KEY) or {LOG_KEY: [], EFFECTS_KEY: {}}
    lanes = state[LANES_KEY]
    log = [dict(e) for e in old[LOG_KEY]] + [
        {ENTRY_STEP_KEY: int(state[STEP_KEY]), WEIGHTS_KEY: dict(weights)}
    ]
    effects = {str(k): [*old[EFFECTS_KEY].get(str(k), []), int(v[0]) + 1] for k, v in lanes.items()}
    out[MIXTURE_KEY] = {LOG_KEY: log, EFFECTS_KEY: effects}
    return out


def parse_mixture_state(
    raw: Any, names: Sequence[str], lanes: Sequence[int], step: int
) -> MixtureLog:
    """Validate a checkpoint's ``"mixture"`` section (untrusted) and return its log.

    Args:
        raw: The section (or None: no decision).
        names: The recipe's dataset names.
        lanes: Lanes this rank owns (each needs its effect windows).
        step: The checkpoint's step (no entry may be later).

    Raises:
        CheckpointError: Naming the entry, the dataset or the lane that is wrong.
    """
    if raw is None:
        return MixtureLog()
    if not isinstance(raw, Mapping) or set(raw) != _SECTION_KEYS:
        raise CheckpointError("checkpoint 'mixture' must be a dict with 'log' and 'effects'")
    log, effects = raw[LOG_KEY], raw[EFFECTS_KEY]
    if not isinstance(log, list) or not isinstance(effects, Mapping):
        raise CheckpointError("checkpoint mixture: 'log' must be a list, 'effects' a dict")
    entries: list[tuple[int, dict[str, float]]] = []
    last = 0
    for k, e in enumerate(log):
        if not isinstance(e, Mapping) or set(e) != _ENTRY_KEYS or not is_int(e[ENTRY_STEP_KEY]):
            raise CheckpointError(
                f"checkpoint mixture log entry {k}: expected {{'step': int, 'weights': {{...}}}}, "
                f"got {e!r:.120}"
            )
        s = e[ENTRY_STEP_KEY]
        if not last <= s <= step:
            raise CheckpointError(
                f"checkpoint mixture log entry {k}: step {s} must be in [{last}, {step}] "
                f"(entries in order, none after the checkpoint's step)"
            )
        w = e[WEIGHTS_KEY]
        if isinstance(w, Mapping):
            for n in w:
                if n not in names:
                    raise CheckpointError(
                        f"checkpoint mixture decision at step {s} names dataset {n!r}, which "
                        f"the recipe does not have (its datasets: {list(names)})"
                    )
            for n in names:
                if n not in w:
                    raise CheckpointError(
                        f"checkpoint mixture decision at step {s} has no weight for the "
                        f"recipe's dataset {n!r}"
                    )
        try:
            weights = normalize_weights(names, w, where=f"checkpoint mixture decision at step {s}")
        except RecipeError as err:
            raise CheckpointError(str(err)) from None
        entries.append((s, weights))
        last = s
    out: dict[int, list[int]] = {}
    for lane in lanes:
        v = effects.get(lane_key(lane))
        if (
            not isinstance(v, list)
            or len(v) != len(entries)
            or not all(is_int(x) and 1 <= x < 2**62 for x in v)
            or v != sorted(v)
        ):
            raise CheckpointError(
                f"checkpoint mixture: lane {lane} needs {len(entries)} non-decreasing effect "
                f"windows >= 1 (one per decision), got {v!r:.120}"
            )
        out[lane] = list(v)
    return MixtureLog(entries, out)


def check_effects(
    log: MixtureLog,
    positions: Mapping[int, tuple[int, int]],
    step: int,
    samples_per_lane: int,
) -> None:
    """Hold each lane's effect windows to what its position at ``step`` allows.

    A lane hands out ``samples_per_lane`` samples per step. At ``[window, consumed]`` after
    ``step`` steps it handed out ``B = step * samples_per_lane - consumed`` samples before
    ``window``; at an earlier step ``s`` it had handed out ``s * samples_per_lane``. So a
    decision made after step ``s`` starts (its effect window):

    - at window 1 if ``s == 0`` (every lane is at ``[0, 0]`` before the first step);
    - at ``window + 1`` if ``s * samples_per_lane > B`` (the lane was already in
      ``window``; in particular for ``s == step``);
    - at a window in ``[1, window]`` otherwise (the lane was in an earlier window).

    Raises:
        CheckpointError: Naming the lane, the decision and the window that is impossible.
    """
    for lane, (window, consumed) in sorted(positions.items()):
        effects = log.effects.get(lane)
        if effects is None:
            continue
        before = step * samples_per_lane - consumed
        for k, ((s, _), effect) in enumerate(zip(log.entries, effects, strict=True)):
            if s == 0:
                lo = hi = 1
            elif s * samples_per_lane > before:
                lo = hi = window + 1
            else:
                lo, hi = 1, max(1, window)
            if not lo <= effect <= hi:
                want = f"window {lo}" if lo == hi else f"a window in [{lo}, {hi}]"
                raise CheckpointError(
                    f"checkpoint mixture: effects[{lane_key(lane)!r}][{k}] is window {effect}, "
                    f"but the decision made after step {s} can only start at {want} in lane "
                    f"{lane} (at [{window}, {consumed}] after step {step}, "
                    f"{samples_per_lane} samples per step); a forged or edited decision log"
                )


def merge_mixtures(mixtures: Sequence[Any]) -> dict[str, Any]:
    """Merge the ranks' decision logs (identical) and per-lane effect windows (disjoint).

    Raises:
        CheckpointError: If the ranks' logs differ.
    """
    logs = [m.get(LOG_KEY) if isinstance(m, Mapping) else None for m in mixtures]
    for k, log in enumerate(logs):
        if log != logs[0]:
            raise CheckpointError(
                f"ranks disagree on the mixture decision log: rank 0 has {logs[0]!r:.200}, "
                f"rank {k} has {log!r:.200}"
            )
    effects: dict[str, Any] = {}
    for m in mixtures:
        if isinstance(m, Mapping) and isinstance(m.get(EFFECTS_KEY), Mapping):
            effects.update(m[EFFECTS_KEY])
    ordered = sorted(effects.items(), key=lambda kv: (len(str(kv[0])), str(kv[0])))
    return {LOG_KEY: logs[0], EFFECTS_KEY: dict(ordered)}
