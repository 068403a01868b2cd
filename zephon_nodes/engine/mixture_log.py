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

The log lives in the checkpoint state under ``"mixture"``; its schema, parsing and checks
are :mod:`zephon_nodes.state.mixture`. An entry costs about
``20 + 24 * D`` bytes of JSON for ``D`` datasets plus ~8 bytes per lane. This module keeps
the ``--mixture-updates`` file: its parsing and its agreement with a checkpoint's log.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.state.mixture import (
    ENTRY_STEP_KEY,
    MIXTURE_KEY,
    WEIGHTS_KEY,
    normalize_weights,
    parse_mixture_state,
)
from zephon_nodes.state.schema import LINEAGE_KEY, STEP_KEY, is_int

__all__ = [
    "parse_updates",
    "read_updates",
    "refuse_updates_after_stages",
    "updates_after",
]


def parse_updates(raw: Any, names: Sequence[str], where: str) -> list[tuple[int, dict]]:
    """Parse a ``--mixture-updates`` list ``[{"step": 5, "weights": {...}}, ...]``.

    Raises:
        RecipeError: Naming the entry and what is wrong.
    """
    if not isinstance(raw, list):
        raise RecipeError(f"{where}: expected a JSON list of {{'step', 'weights'}} entries")
    out: list[tuple[int, dict]] = []
    for k, e in enumerate(raw):
        if not isinstance(e, dict) or set(e) != {ENTRY_STEP_KEY, WEIGHTS_KEY}:
            raise RecipeError(
                f"{where}: entry {k} must be {{'step': int, 'weights': {{dataset: weight}}}}, "
                f"got {e!r:.120}"
            )
        s = e[ENTRY_STEP_KEY]
        if not is_int(s) or s < 0 or (out and s < out[-1][0]):
            raise RecipeError(
                f"{where}: entry {k} has step {s!r}; steps are integers >= 0 in order"
            )
        out.append((s, normalize_weights(names, e[WEIGHTS_KEY], where=f"{where}: entry {k}")))
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

    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO, /dev/zero: never ends
        raise RecipeError(f"--mixture-updates {path}: not a regular file")
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
    step = int(state[STEP_KEY])
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
    later = [(s, w) for s, w in updates if s > step]
    if later and state.get(LINEAGE_KEY) is not None:
        raise RecipeError(
            f"{where}: decision after step {later[0][0]}: set_mixture is not supported after a "
            f"re-lane (the checkpoint was re-laned); change the mixture before re-laning"
        )
    return later


def refuse_updates_after_stages(
    updates: Sequence[tuple[int, dict]], stage_steps: Sequence[int], where: str
) -> None:
    """Refuse, at start-up, a decision made after a recipe's first stage has started.

    Raises:
        RecipeError: Naming the decision and the stage.
    """
    if stage_steps:
        late = [s for s, _ in updates if s >= stage_steps[0]]
        if late:
            raise RecipeError(
                f"{where}: decision after step {late[0]}: set_mixture is not supported after a "
                f"recipe change (the recipe's first stage starts after step {stage_steps[0]}); "
                f"give the weights as a stage's `weights`"
            )
