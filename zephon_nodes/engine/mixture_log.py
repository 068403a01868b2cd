"""Dynamic mixtures: the decision log ``(step, weights)`` and its per-lane effect points.

A decision made after step ``s`` (``set_mixture(weights)`` between steps ``s`` and ``s + 1``)
takes effect, in every lane, from the first flush window that begins after the lane's
position at step ``s``: if the lane's next sample lies in window ``w``, the decision starts
at window ``w + 1`` (lane item ``(w + 1) * flush_every``). A lane's position at a step is a
function of the recipe and of the earlier decisions, never of dp size, workers, runner,
look-ahead, prefetch or micro-batch size, so the effect point is too. Its latency is at
most two flush windows of work items per lane (the rest of window ``w`` plus, at most, the
whole window if nothing of it was consumed yet); work computed ahead under the old weights
is thrown away and recomputed (the rank node replays window ``w``).

The log lives in the checkpoint state under ``"mixture"``::

    {"log": [{"step": 5, "weights": {"web": 0.2, "code": 0.8}}, ...],
     "effects": {"0": [w1, ...], "1": [...], ...}}

``log`` is the same on every rank (weights normalized, in recipe order, by name);
``effects`` holds, per lane, the flush window where each decision starts. An entry costs
about ``20 + 24 * D`` bytes of JSON for ``D`` datasets plus ~8 bytes per lane.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from zephon_nodes.core.plain import is_int
from zephon_nodes.errors import CheckpointError, RecipeError

__all__ = [
    "MIXTURE_KEY",
    "MixtureLog",
    "normalize_weights",
    "parse_mixture_state",
    "parse_updates",
    "read_updates",
    "updates_after",
    "with_decision",
]

MIXTURE_KEY = "mixture"


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
            "log": [{"step": s, "weights": dict(w)} for s, w in self.entries],
            "effects": {str(i): list(self.effects[i]) for i in lanes},
        }


def with_decision(state: Mapping[str, Any], weights: Mapping[str, float]) -> dict[str, Any]:
    """Return a copy of a step-boundary state with one more decision made after its step.

    The decision's effect window in each lane of the state is the lane's window + 1.

    Raises:
        RecipeError: If the state was taken in the middle of a step.
    """
    if state.get("micro", 0):
        raise RecipeError(
            f"set_mixture is called between steps; this rank is after micro-batch "
            f"{state['micro']} of step {int(state['step']) + 1}"
        )
    out = dict(state)
    old = state.get(MIXTURE_KEY) or {"log": [], "effects": {}}
    lanes = state["lanes"]
    log = [dict(e) for e in old["log"]] + [{"step": int(state["step"]), "weights": dict(weights)}]
    effects = {str(k): [*old["effects"].get(str(k), []), int(v[0]) + 1] for k, v in lanes.items()}
    out[MIXTURE_KEY] = {"log": log, "effects": effects}
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
    if not isinstance(raw, Mapping) or set(raw) != {"log", "effects"}:
        raise CheckpointError("checkpoint 'mixture' must be a dict with 'log' and 'effects'")
    log, effects = raw["log"], raw["effects"]
    if not isinstance(log, list) or not isinstance(effects, Mapping):
        raise CheckpointError("checkpoint mixture: 'log' must be a list, 'effects' a dict")
    entries: list[tuple[int, dict[str, float]]] = []
    last = 0
    for k, e in enumerate(log):
        if not isinstance(e, Mapping) or set(e) != {"step", "weights"} or not is_int(e["step"]):
            raise CheckpointError(
                f"checkpoint mixture log entry {k}: expected {{'step': int, 'weights': {{...}}}}, "
                f"got {e!r:.120}"
            )
        s = e["step"]
        if not last <= s <= step:
            raise CheckpointError(
                f"checkpoint mixture log entry {k}: step {s} must be in [{last}, {step}] "
                f"(entries in order, none after the checkpoint's step)"
            )
        w = e["weights"]
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
        v = effects.get(str(lane))
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


def parse_updates(raw: Any, names: Sequence[str], where: str) -> list[tuple[int, dict]]:
    """Parse a ``--mixture-updates`` list ``[{"step": 5, "weights": {...}}, ...]``.

    Raises:
        RecipeError: Naming the entry and what is wrong.
    """
    if not isinstance(raw, list):
        raise RecipeError(f"{where}: expected a JSON list of {{'step', 'weights'}} entries")
    out: list[tuple[int, dict]] = []
    for k, e in enumerate(raw):
        if not isinstance(e, dict) or set(e) != {"step", "weights"}:
            raise RecipeError(
                f"{where}: entry {k} must be {{'step': int, 'weights': {{dataset: weight}}}}, "
                f"got {e!r:.120}"
            )
        s = e["step"]
        if not is_int(s) or s < 0 or (out and s < out[-1][0]):
            raise RecipeError(
                f"{where}: entry {k} has step {s!r}; steps are integers >= 0 in order"
            )
        out.append((s, normalize_weights(names, e["weights"], where=f"{where}: entry {k}")))
    return out


def read_updates(path: str, names: Sequence[str]) -> list[tuple[int, dict]]:
    """Read a ``--mixture-updates`` JSON file (see :func:`parse_updates`).

    Raises:
        RecipeError: If the file cannot be read or is not a valid list of decisions.
    """

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) != len(pairs):
            seen: set[str] = set()
            for k, _ in pairs:
                if k in seen:
                    raise RecipeError(f"--mixture-updates {path}: the key {k!r} appears twice")
                seen.add(k)
        return out

    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f, object_pairs_hook=unique)
    except OSError as e:
        raise RecipeError(f"--mixture-updates {path}: cannot read the file: {e}") from None
    except RecursionError:
        raise RecipeError(f"--mixture-updates {path}: JSON nested too deeply") from None
    except ValueError as e:
        raise RecipeError(f"--mixture-updates {path}: not valid JSON: {str(e)[:200]}") from None
    return parse_updates(raw, names, f"--mixture-updates {path}")


def updates_after(
    updates: Sequence[tuple[int, dict]],
    state: Mapping[str, Any] | None,
    names: Sequence[str],
    where: str,
) -> list[tuple[int, dict]]:
    """Return the decisions still to make after resuming from ``state``.

    Entries at or before the checkpoint's step come from the checkpoint; those in
    ``updates`` must be exactly the checkpoint's (same steps, same weights).

    Raises:
        RecipeError: Naming the first entry that conflicts with the checkpoint's log.
    """
    if state is None:
        return list(updates)
    step = int(state["step"])
    try:
        saved = parse_mixture_state(state.get(MIXTURE_KEY), names, [], step).entries
    except CheckpointError as e:
        raise RecipeError(str(e)) from None
    mine = [(s, w) for s, w in updates if s <= step]
    for k in range(max(len(mine), len(saved))):
        a = mine[k] if k < len(mine) else None
        b = saved[k] if k < len(saved) else None
        same = (
            a is not None
            and b is not None
            and a[0] == b[0]
            and all(abs(a[1][n] - b[1][n]) <= 1e-12 for n in names)
        )
        if not same:

            def show(e: tuple[int, dict] | None) -> str:
                if e is None:
                    return "no entry"
                return f"step {e[0]} {json.dumps({n: round(e[1][n], 6) for n in names})}"

            raise RecipeError(
                f"{where}: decision {k} (at or before the checkpoint's step {step}) differs "
                f"from the checkpoint's log: the file has {show(a)}, the checkpoint has "
                f"{show(b)}; entries up to step {step} are replayed from the checkpoint"
            )
    return [(s, w) for s, w in updates if s > step]
