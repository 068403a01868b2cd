"""Re-laning: change the lane count of a running job, every document still used exactly once.

A checkpoint at step ``s`` with ``L`` lanes splits the pass's work into what was consumed
(every work item before each lane's current flush window ``w_l``, and the first ``c_l``
samples of that window), the *leftover* of each lane's current window, and the *untouched*
work items (old lane ``l``'s positions past window ``w_l``). Re-laning to ``L'`` lanes keeps
the first, then gives new lane ``l'``:

1. the leftovers of the old lanes ``l = l', l' + L', l' + 2L', ...`` (in that order), one
   flush window each: old lane ``l``'s window ``w_l`` replayed exactly as the old lane ran
   it (same work items, same operator seeds ``(old lane, old window)``), its first ``c_l``
   samples dropped; a window may be short or, once dropped, empty. When the old lanes were
   themselves re-laned, an old lane's leftover windows past ``w_l`` follow it, each replayed
   the same way with the drop of the earlier re-lane (their first samples were delivered
   before it: they are never untouched);
2. then the untouched items in their old global order ``g = i * L + l``, renumbered
   ``g' = 0, 1, 2, ...``: first a *catch-up* block per new lane, so that every new lane
   holds as many items (lane ``l'`` with ``A_l'`` leftover items takes the next
   ``M - A_l'`` ranks, ``M = max A``, lanes in order; ``C`` ranks in all), then round-robin:
   rank ``C + k * L' + l'`` is lane ``l'``'s ``k``-th item after its block. If the old
   stream was dealt by size (``work.deal = "balanced"``: its items' sizes are known), the
   untouched items are dealt by those sizes instead, each new lane starting with the
   estimated size of its leftovers (their items' sizes less ``c_l * seq_len`` each),
   largest first to the lane holding the least, then swaps; each lane still reads its items
   in rank order. They form flush windows of ``K`` items seeded by ``(salt, l', window)``
   with a salt derived from the lineage (never one of the old seeds).

Everything after the change is a function of the recipe, the checkpoint and ``L'``: the
same global batches at every dp size dividing ``L'``, any worker count, runner or restart.

The new checkpoint keeps two integers per lane and records a *lineage* (plain JSON)::

    {"fingerprint": "<the checkpoint's fingerprint>", "num_lanes": L, "step": s,
     "lanes": [[w_0, c_0], [w_1, c_1], ...],
     "pass": p,           # only when the old lanes were past the first pass
     "mixture": {...},    # only when the old checkpoint had dynamic-mixture decisions
     "parent": {...}}     # only when the old checkpoint was itself re-laned

A second re-lane nests the first lineage under ``parent``. Positions of a re-laned lane count
the dropped samples of a leftover window as consumed (so ``[w, c]`` keeps its meaning: replay
window ``w`` and drop ``c``). Mixture decisions (``set_mixture``) are refused after a re-lane.

Re-lanes and recipe changes chain (:mod:`zephon_nodes.engine.stages`): a checkpoint of a
changed recipe keeps its stage section in the lineage (``stage``), and its old streams are
rebuilt through it; a recipe with ``[[stages]]`` is re-laned only once every stage has started
(the re-laned run continues the stage in force: :func:`for_state`); a change after a re-lane
(``zephon amend``) continues each dataset from the set of its work items no lane has read
(:mod:`zephon_nodes.engine.unread`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.core.plain import is_int
from zephon_nodes.engine.assembly import work_source
from zephon_nodes.engine.relane.nodes import RelanedLane, RelanedWorkItemNode
from zephon_nodes.engine.relane.sources import RelanedWorkSource
from zephon_nodes.engine.stages import check_resumes, segment_for_state
from zephon_nodes.engine.work import WorkSource
from zephon_nodes.recipe.canonical import canonical_sha256
from zephon_nodes.state.identity import fingerprint_pair, recipe_summary
from zephon_nodes.state.lineage import LINEAGE_KEY, Lineage, describe_lineage
from zephon_nodes.state.lineage import check_lineage as _check_lineage
from zephon_nodes.state.mixture import parse_mixture_state
from zephon_nodes.state.schema import FINGERPRINT_KEY, STAGE_KEY, STEP_KEY
from zephon_nodes.state.validate import validate_state

__all__ = [
    "LINEAGE_KEY",
    "Lineage",
    "RelanedLane",
    "RelanedWorkItemNode",
    "RelanedWorkSource",
    "check_lineage",
    "describe_lineage",
    "for_state",
    "pipeline_at",
    "relane_state",
]


# -- building re-laned pipelines ------------------------------------------------------------------


def _canonical_at(pipeline: Any, num_lanes: int) -> dict[str, Any]:
    canonical = copy.deepcopy(pipeline.canonical)
    canonical["num_lanes"] = num_lanes
    for stage in canonical.get("stages", ()):  # each stage's recipe holds the lane count too
        stage["recipe"]["num_lanes"] = num_lanes
    return canonical


def _fingerprint_of(canonical: Mapping[str, Any]) -> str:
    # An indexed dataset's file list is lazy (recipe/canonical.py): same hash, no dict per file.
    return canonical_sha256(canonical)


def fingerprint_at(pipeline: Any, num_lanes: int) -> str:
    """The fingerprint of the pipeline's recipe with ``num_lanes`` lanes."""
    return _fingerprint_of(_canonical_at(pipeline, num_lanes))


def summary_at(pipeline: Any, num_lanes: int) -> dict[str, Any]:
    """The checkpoint recipe summary of the pipeline's recipe with ``num_lanes`` lanes."""
    summary = recipe_summary(_canonical_at(pipeline, num_lanes))
    if "contents" in pipeline.summary:
        summary["contents"] = pipeline.summary["contents"]
    return summary


def recipe_at(recipe: Any, num_lanes: int) -> Any:
    """``recipe`` with ``num_lanes`` lanes, its stages' recipes too.

    Raises:
        RecipeError: If ``num_lanes`` does not divide a global batch.
    """
    stages = tuple(
        dataclasses.replace(s, recipe=s.recipe.replace(num_lanes=num_lanes)) for s in recipe.stages
    )
    return recipe.replace(num_lanes=num_lanes, stages=stages)


def _base_source(pipeline: Any, num_lanes: int) -> WorkSource:
    """The recipe's own work source at ``num_lanes`` lanes (same data, same estimate)."""
    if num_lanes == pipeline.num_lanes and not pipeline.lineage:
        return pipeline.work_source  # type: ignore[no-any-return,unused-ignore]
    recipe = pipeline.recipe
    try:
        changed = recipe_at(recipe, num_lanes)
    except RecipeError as e:
        raise CheckpointError(f"cannot rebuild the recipe with num_lanes={num_lanes}: {e}") from e
    estimate = pipeline.canonical.get("mixture", {}).get("estimate")
    if estimate is not None and recipe.mixture.tokens_per_record is None:
        changed = changed.replace(
            mixture=dataclasses.replace(recipe.mixture, tokens_per_record=dict(estimate))
        )
    source, _ = work_source(changed, pipeline.datasets, pipeline.stateless)
    return source


def pipeline_at(pipeline: Any, num_lanes: int) -> Any:
    """The pipeline of the same recipe at ``num_lanes`` lanes, never re-laned (cheap copy).

    Raises:
        RecipeError: If ``num_lanes`` does not divide the global batch.
    """
    if pipeline.num_lanes == num_lanes and pipeline.lineage is None:
        return pipeline
    canonical = _canonical_at(pipeline, num_lanes)
    out = pipeline.derive(
        recipe=recipe_at(pipeline.recipe, num_lanes),
        canonical=canonical,
        fingerprint=_fingerprint_of(canonical),
        summary=summary_at(pipeline, num_lanes),
        lineage=None,
        work_source=_base_source(pipeline, num_lanes),
        segments={},
        stage=None,
        base_step=0,
    )
    # The copy is a run of its own (a recipe change of it is rebuilt from it, at its lanes).
    out.run = out
    return out


def _install_mixture(source: WorkSource, lineage: Lineage, pipeline: Any) -> None:
    """Install the old checkpoint's decision log into the old work source (all lanes)."""
    if lineage.mixture is None:
        return
    names = [d.name for d in pipeline.recipe.datasets]
    log = parse_mixture_state(lineage.mixture, names, range(lineage.num_lanes), lineage.step)
    if not source.takes_decisions:
        if log:
            raise CheckpointError("the lineage holds mixture decisions but the recipe has none")
        return
    K = pipeline.recipe.flush_every
    source.set_decisions(
        [tuple(w[n] for n in names) for _, w in log.entries],
        {i: [e * K for e in log.effects.get(i, [])] for i in range(lineage.num_lanes)},
    )


def _source_for(pipeline: Any, lineage: Lineage | None, num_lanes: int) -> WorkSource:
    """The work source a checkpoint with ``lineage`` and ``num_lanes`` lanes reads."""
    base = _base_source(pipeline, num_lanes)
    if lineage is None:
        return base
    got = fingerprint_at(pipeline, lineage.num_lanes)
    if got != lineage.fingerprint:
        raise CheckpointError(
            f"the checkpoint's lineage does not match this recipe: it was re-laned after step "
            f"{lineage.step} from a recipe with num_lanes={lineage.num_lanes} and fingerprint "
            f"{fingerprint_pair(lineage.fingerprint, got)} (with num_lanes="
            f"{lineage.num_lanes}); only num_lanes may differ across a re-lane"
        )
    if lineage.stage is not None:  # the old checkpoint's recipe had changed (engine/stages.py)
        old_full = _stage_source(pipeline, lineage)
    else:
        old_full = _source_for(pipeline, lineage.parent, lineage.num_lanes)
    if lineage.mixture is not None:
        old_full = old_full.fork()
        _install_mixture(old_full, lineage, pipeline)
    old = old_full.for_pass(lineage.pass_index)
    if old is None:
        raise CheckpointError(
            f"the checkpoint's lineage reads pass {lineage.pass_index}, which has no data"
        )
    base_pass = old_full.base_pass + lineage.pass_index
    return RelanedWorkSource(
        old,
        base,
        lineage,
        pipeline.recipe.flush_every,
        pipeline.recipe.seed,
        base_pass,
        sample_tokens=int(pipeline.recipe.seq_len or 0),
    )


def _stage_source(pipeline: Any, lineage: Lineage) -> WorkSource:
    """The work source of the stage the old checkpoint was in, at its lanes (all of them)."""
    old = pipeline_at(pipeline, lineage.num_lanes)
    state = {FINGERPRINT_KEY: lineage.fingerprint, STAGE_KEY: lineage.stage, STEP_KEY: lineage.step}
    return segment_for_state(old, state).work_source


def _stage_in_force(lineage: Lineage) -> int:
    """The planned stage a re-laned run is in: the one its last stage section names (0: none)."""
    at: Lineage | None = lineage
    while at is not None:
        if at.stage is not None:
            index: Any = at.stage.get("index")
            return int(index) if is_int(index) else 0
        at = at.parent
    return 0


def for_state(pipeline: Any, state: Mapping[str, Any] | None) -> Any:
    """Return the pipeline that resumes ``state``.

    ``pipeline`` itself for a checkpoint that was never re-laned; for a re-laned one, a copy
    whose work source and lanes read the re-laned streams (the recipe must be the
    checkpoint's, its ``num_lanes`` the new lane count). Cheap: no shard is opened again.

    Raises:
        CheckpointError: If the lineage is malformed or does not match the recipe.
    """
    if state is None or state.get(LINEAGE_KEY) is None:
        return pipeline
    if state.get("fingerprint") != pipeline.fingerprint:
        return pipeline  # another recipe: the resume refuses it, naming the fields that differ
    lineage = Lineage.from_state(state[LINEAGE_KEY])
    if pipeline.lineage == lineage.to_state():
        return pipeline
    source = _source_for(pipeline, lineage, pipeline.num_lanes)
    k = _stage_in_force(lineage)
    if k:  # the run is in stage k of its recipe (every stage started before the re-lane)
        return pipeline.stage_segment(k).derive(
            fingerprint=pipeline.fingerprint,
            summary=pipeline.summary,
            run=pipeline,
            stage=None,
            base_step=0,
            next_change=None,
            work_source=source,
            lineage=lineage.to_state(),
        )
    return pipeline.derive(work_source=source, lineage=lineage.to_state())


def check_lineage(state: Mapping[str, Any], pipeline: Any) -> None:
    """Refuse a state whose lineage is not the one ``pipeline`` reads.

    See :func:`zephon_nodes.state.lineage.check_lineage`.

    Raises:
        CheckpointError: Naming what to do.
    """
    _check_lineage(state.get(LINEAGE_KEY), pipeline.lineage)


def relane_state(pipeline: Any, state: Mapping[str, Any], num_lanes: int) -> dict[str, Any]:
    """Re-lane a merged checkpoint state to ``num_lanes`` lanes.

    Args:
        pipeline: The compiled recipe of the checkpoint (its ``num_lanes`` may be the old or
            the new count: only ``num_lanes`` may differ from the checkpoint's recipe).
        state: A merged, step-boundary state holding every lane.
        num_lanes: The new lane count ``L'`` (must divide the global batch).

    Returns:
        The new state (plain JSON data): resume it with the recipe at ``num_lanes`` lanes.

    Raises:
        CheckpointError: If the state is mid-step, lacks lanes, or belongs to another recipe.
        RecipeError: If ``num_lanes`` does not divide the global batch.
    """
    recipe = pipeline.recipe
    if recipe.stages:
        _refuse_stages_ahead(recipe, state)
    if not is_int(num_lanes) or num_lanes < 1:
        raise RecipeError(f"--num-lanes={num_lanes!r} must be an integer >= 1")
    if recipe.global_batch_size % num_lanes:
        raise RecipeError(
            f"cannot re-lane to num_lanes={num_lanes}: global_batch_size="
            f"{recipe.global_batch_size} must be a multiple of it (every step takes the same "
            f"number of samples from each lane)"
        )
    if not isinstance(state, Mapping):
        raise CheckpointError(f"a zephon-nodes state must be a dict, got {type(state).__name__}")
    raw_lanes: Any = state.get("num_lanes")
    if not is_int(raw_lanes) or raw_lanes < 1:
        raise CheckpointError(f"checkpoint num_lanes={raw_lanes!r} must be an integer >= 1")
    old_lanes = int(raw_lanes)
    if state.get("micro", 0):
        raise CheckpointError(
            "cannot re-lane a state taken in the middle of a step (micro="
            f"{state.get('micro')!r}); re-lane a step-boundary checkpoint"
        )
    # An amended checkpoint (a "stage" section) is read through the stage it is in.
    old_pipeline = for_state(segment_for_state(pipeline_at(pipeline, old_lanes), state), state)
    positions = validate_state(
        state,
        fingerprint=old_pipeline.fingerprint,
        summary=old_pipeline.summary,
        num_lanes=old_lanes,
        lanes=range(old_lanes),
        samples_per_lane=None,
    )
    check_lineage(state, old_pipeline)
    source = old_pipeline.work_source
    mixture = state.get("mixture")
    if mixture is not None and isinstance(source, RelanedWorkSource):  # pragma: no cover
        raise CheckpointError("a re-laned checkpoint cannot hold mixture decisions")
    p = int(state.get("pass", 0))
    lanes = []
    for lane in range(old_lanes):
        w, c = positions[lane]
        if not p:  # a re-laned lane's position counts its dropped samples as consumed
            c = max(c, source.leftover_drop(lane, w))
        lanes.append((w, c))
    parent = state.get(LINEAGE_KEY)
    lineage = Lineage(
        fingerprint=str(state["fingerprint"]),
        num_lanes=old_lanes,
        step=int(state["step"]),
        lanes=tuple(lanes),
        pass_index=p,
        mixture=copy.deepcopy(dict(mixture)) if mixture is not None else None,
        parent=Lineage.from_state(parent) if parent is not None else None,
        stage=copy.deepcopy(dict(state[STAGE_KEY])) if state.get(STAGE_KEY) is not None else None,
    )
    relaned = _source_for(pipeline_at(pipeline, num_lanes), lineage, num_lanes)  # checks all
    assert isinstance(relaned, RelanedWorkSource)
    out = {
        "format": state["format"],
        "fingerprint": fingerprint_at(pipeline, num_lanes),
        "recipe": summary_at(pipeline, num_lanes),
        "num_lanes": num_lanes,
        "step": lineage.step,
        "micro": 0,
        "lanes": {str(i): [0, relaned.leftover_drop(i, 0)] for i in range(num_lanes)},
        LINEAGE_KEY: lineage.to_state(),
    }
    check_resumes(pipeline_at(pipeline, num_lanes), out, f"the re-lane after step {lineage.step}")
    return out


def _refuse_stages_ahead(recipe: Any, state: Any) -> None:
    """Refuse to re-lane a run that has a planned stage still to enter.

    A stage is entered by each rank on its own lanes; after a re-lane a rank's lanes read
    other lanes' work, so the stage could not cut them. Every stage must have started.

    Raises:
        RecipeError: Naming the first stage still ahead.
    """
    section = state.get(STAGE_KEY) if isinstance(state, Mapping) else None
    entered: Any = section.get("index") if isinstance(section, Mapping) else None
    if isinstance(state, Mapping) and state.get(LINEAGE_KEY) is not None and section is None:
        got = Lineage.from_state(state[LINEAGE_KEY])
        entered = _stage_in_force(got)
    k = int(entered) if is_int(entered) else 0
    if k < len(recipe.stages):
        stage, last = recipe.stages[k], recipe.stages[-1]
        raise RecipeError(
            f"cannot re-lane this checkpoint: stages[{k}] (start_step={stage.start_step}) is "
            f"still ahead of it (a stage cuts each rank's own lanes, and a re-laned lane reads "
            f"other lanes' work); re-lane a checkpoint of step {last.start_step + 1} or "
            f"later (every stage started), or write the stages still ahead as amendments "
            f"(zephon amend) after re-laning"
        )
