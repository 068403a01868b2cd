"""Recipe changes during a run: planned stages and amendments, one mechanism.

A change takes effect after a step ``S``. At that point each lane is in some flush window
``w`` of which it has handed out ``c`` samples. The change:

1. **cuts** that window: the window's samples not yet handed out are dropped, and counted
   (samples and tokens, per lane, in the state and the run metrics). The documents of those
   samples are not delivered (the window's accumulators held them: partial bins, the shuffle
   buffer); nothing handed out before is handed out again;
2. **continues** every dataset of the new recipe: each lane's stream of a dataset that was
   read before resumes after the last work item of the cut window; a dataset read for the
   first time starts at its beginning (its order depends on its name, not on when it came);
   a dataset the new recipe drops is no longer read
   (:class:`~zephon_nodes.engine.stage_source.StageWorkSource`);
3. runs the new recipe's operators, ``seq_len`` and ``global_batch_size`` from step ``S + 1``,
   with new lane positions counted from the change (the state's ``"stage"`` section, see
   :mod:`zephon_nodes.state.stage`, holds where each dataset's stream resumed).

A planned ``[[stages]]`` entry is entered by the rank nodes when they reach its step; ``zephon
amend`` makes the same move on a saved state with another recipe (:func:`amend_state`), so an
amendment after step ``S`` gives the batches of the same change written as a stage starting
at ``S``. Each lane's move uses only that lane's position, so every rank moves its own lanes
and the batches after the change are the same at every dp size.

Changes chain with re-lanes (:mod:`zephon_nodes.engine.relane`): a re-lane keeps the stage
section of the checkpoint it re-laned, and a change after a re-lane, which needs every lane
at once (``zephon amend``), continues each dataset from the set of its work items no lane has
read yet, dealt anew to the lanes (:mod:`zephon_nodes.engine.unread`); a later change or
re-lane continues those streams like any other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.core.flush import is_flush
from zephon_nodes.core.seeding import derive_seed
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.engine.stage_source import StageWorkSource, added_stream_key, dataset_counts
from zephon_nodes.engine.unread import enter_after_relane, previous_stage
from zephon_nodes.recipe import Recipe
from zephon_nodes.recipe.canonical import canonical_sha256
from zephon_nodes.recipe.stages import fixed_differences
from zephon_nodes.state.schema import (
    FINGERPRINT_KEY,
    FORMAT,
    FORMAT_KEY,
    LANES_KEY,
    LINEAGE_KEY,
    MICRO_KEY,
    NUM_LANES_KEY,
    PASS_KEY,
    RECIPE_KEY,
    STAGE_KEY,
    STEP_KEY,
)
from zephon_nodes.state.stage import StageState

# A pipeline (engine/pipeline.py) and a rank node (engine/multiplexer.py) are passed in: both
# build on this module, which never imports them.
Pipeline = Any
Multiplexer = Any

__all__ = [
    "amend_state",
    "check_resumes",
    "check_stage_batches",
    "continue_streams",
    "enter_next_stage",
    "enter_stage",
    "segment_for_state",
    "stage_pipeline",
]

_STAGE_TAG = 0x53544745  # "STGE"
_IGNORE = -100


def _content(dataset_canonical: Mapping[str, Any]) -> str:
    """A digest of what a dataset *is* (its files and records), not of how it is read."""
    keep = {
        k: v
        for k, v in dataset_canonical.items()
        if k not in ("weight", "on_exhausted", "on_error", "name")
    }
    return canonical_sha256(keep)[:16]


def base_streams(pipeline: Any) -> tuple[list[str], list[tuple[int, str]]]:
    """The dataset names and stream keys of a recipe that never changed (its base)."""
    names = [d.name for d in pipeline.recipe.datasets]
    streams = [(i, _content(c)) for i, c in enumerate(pipeline.canonical["datasets"])]
    return names, streams


def stage_pipeline(run: Pipeline, stage: StageState) -> Pipeline:
    """The pipeline of stage ``stage.index`` of ``run`` (its base recipe's pipeline).

    The recipe in force is ``run.recipe.stage_recipe(stage.index)``; its work source continues
    every dataset's stream at ``stage``'s offsets. Identity (fingerprint, summary) stays the
    run's. Cheap after the first call for a stage (its datasets are opened once).

    Raises:
        CheckpointError: If the stage does not exist or its datasets differ from the run's.
    """
    stages = run.recipe.stages
    if stage.index > len(stages):
        raise CheckpointError(
            f"checkpoint 'stage': index {stage.index} but the recipe has {len(stages)} stage(s)"
        )
    expected = stages[stage.index - 1].start_step if stage.index else None
    if stage.index and stage.step != expected:
        raise CheckpointError(
            f"checkpoint 'stage': stage {stage.index} started after step {stage.step}, the "
            f"recipe starts it after step {expected}"
        )
    if not stage.index and not stage.amended:
        raise CheckpointError("checkpoint 'stage': stage 0 of a recipe that was never amended")
    seg = run.stage_segment(stage.index)
    recipe = seg.recipe
    keys: list[int] = []
    for d, canon in zip(recipe.datasets, seg.canonical["datasets"], strict=True):
        got = stage.key_of(d.name)
        if got is None:
            keys.append(added_stream_key(d.name))
            continue
        if got[1] != _content(canon):
            raise CheckpointError(
                f"dataset {d.name!r} is not the data the run read under that name (content "
                f"{_content(canon)} now, {got[1]} before the change): a dataset keeps its "
                f"files for the whole run; give changed data a new name"
            )
        keys.append(got[0])
    offsets = {
        lane: [stage.offsets(lane).get(d.name, 0) for d in recipe.datasets] for lane in stage.lanes
    }
    names = [d.name for d in recipe.datasets]
    retired = sorted(set(names) & set(stage.retired))
    if retired:
        raise CheckpointError(
            f"checkpoint 'stage': the recipe reads {retired}, retired at a change after a "
            f"re-lane (their streams cannot be continued)"
        )
    heads = {}
    for lane in stage.lanes:
        head = stage.head(lane)
        if head is not None and head[0] in names:
            heads[lane] = (names.index(head[0]), head[1], head[2], head[3])
    unread = {d: stage.unread[n] for d, n in enumerate(names) if n in stage.unread}
    plan = seg.work_source
    tokens = [float(c) for c in _planned_tokens(plan, len(recipe.datasets))]
    epochs = [None if d.on_exhausted == "repeat" else recipe.work.epochs for d in recipe.datasets]
    source = StageWorkSource(
        seg.datasets,
        keys,
        epochs,
        [d.weight for d in recipe.datasets],
        tokens,
        offsets,
        recipe.seed,
        derive_seed(recipe.seed, _STAGE_TAG, stage.step),
        recipe.num_lanes,
        recipe.mixture.block,
        heads,
        unread,
    )
    return seg.derive(
        work_source=source,
        fingerprint=run.fingerprint,
        summary=run.summary,
        run=run,
        stage=stage,
        base_step=stage.step,
        next_change=stages[stage.index].start_step if stage.index < len(stages) else None,
    )


def _planned_tokens(plan: Any, count: int) -> list[float]:
    """Tokens per work item of each dataset, as the recipe's own mixture planned them."""
    if plan.tokens_per_item is not None:
        return list(plan.tokens_per_item)
    return [1.0] * count


def segment_for_state(current: Any, state: Mapping[str, Any] | None) -> Any:
    """The pipeline (stage) that resumes ``state``, for a node running ``current``.

    A state of the base recipe (no ``"stage"`` section) resumes on the run's own pipeline
    (``current`` itself unless it runs a stage: a re-laned copy stays as it is).

    Raises:
        CheckpointError: If the state's stage section is malformed or does not fit the recipe.
    """
    run = current.run
    if state is not None and not isinstance(state, Mapping):
        return current  # not a state at all: the resume's validation says so
    raw = state.get(STAGE_KEY) if state is not None else None
    if raw is None:
        if current.stage is None:
            run = current
        if state is not None and run.recipe.stages and state.get(LINEAGE_KEY) is None:
            step = state.get(STEP_KEY)
            first = run.recipe.stages[0].start_step
            if isinstance(step, int) and step > first:
                raise CheckpointError(
                    f"the checkpoint at step {step} has no 'stage' section, but the recipe's "
                    f"first stage starts after step {first}: the state was not written by a "
                    f"run of this recipe"
                )
        return run
    if state is not None and state.get(FINGERPRINT_KEY) != run.fingerprint:
        return current  # another recipe: the resume refuses it, naming the fields that differ
    stage = StageState.from_state(raw, run.num_lanes)
    step = state.get(STEP_KEY) if state is not None else None
    seg = stage_pipeline(run, stage)
    if isinstance(step, int) and (
        step < stage.step or (seg.next_change is not None and step > seg.next_change)
    ):
        raise CheckpointError(
            f"checkpoint step {step} is outside stage {stage.index} (after step {stage.step}"
            + (f", up to {seg.next_change})" if seg.next_change is not None else ")")
        )
    return seg


def _drain_window(node: Multiplexer, lane: int) -> tuple[int, int]:
    """Drop what remains of the lane's current flush window; return ``(samples, tokens)``."""
    source = node.lanes[lane].source
    samples = tokens = 0
    while True:
        try:
            item = next(source)
        except StopIteration:
            break
        if is_flush(item):
            break
        samples += 1
        labels = item.get("labels")
        if labels is not None:
            tokens += int((labels != _IGNORE).sum())
    return samples, tokens


@dataclasses.dataclass(frozen=True)
class _Cut:
    """Where a change cut a lane: the position it resumes at, its head, what it dropped."""

    resume: int
    head: tuple[int, int] | None  # (position of the cut item, its first record not used)
    samples: int
    tokens: int


def _cut(node: Multiplexer, lane: int, window: int, consumed: int) -> _Cut:
    """Cut ``lane`` of ``node`` after the ``consumed`` samples of ``window`` it handed out.

    With concatenated packing the samples handed out and those held by the shuffle buffer
    (``P = consumed + buffer_size``) hold the window's documents up to the one holding input
    token ``P * seq_len``; the stateless chain is run again over the window's work items to
    find it (the replay a resume does).
    """
    p: Any = node.pipeline
    r = p.recipe
    ws = node.work_source
    start, stop = ws.window_bounds(lane, window, r.flush_every)
    if r.pack.mode != "concat" or r.image is not None:
        samples, tokens = _drain_window(node, lane)
        return _Cut(stop, None, samples, tokens)
    held = consumed + r.shuffle.buffer_size
    need = held * r.seq_len  # inputs of the samples used (handed out or in the buffer)
    seen = 0
    for j in range(start, stop):
        item = ws.work(lane, j)
        if item is None:
            break
        batch = p.run_stateless(item)
        inputs = np.maximum(np.asarray(batch.lengths, dtype=np.int64) - 1, 0)
        total = int(inputs.sum())
        if seen + total <= need:
            seen += total
            continue
        ends = np.cumsum(inputs)
        k = int(np.searchsorted(ends, need - seen, side="left"))  # the doc holding the cut
        cut_rest = int(ends[k]) - (need - seen)
        rest = k + 1
        buffered = (held - consumed) * r.seq_len
        exact = len(inputs) == item.stop - item.start and not batch.skipped
        if rest < len(inputs) and exact:
            return _Cut(j + 1, (j, item.start + rest), held - consumed, buffered + cut_rest)
        # The documents after the cut cannot be told apart by record (some were skipped or
        # filtered): they are dropped with the cut one.
        lost = cut_rest + int(inputs[rest:].sum())
        return _Cut(j + 1, None, held - consumed, buffered + lost)
    # The whole window fit in the samples used: what was not handed out is dropped. Which
    # samples the shuffle handed out is known only to the lane (its last, short sample may
    # be among them), so the rest of the window is drained and counted.
    samples, tokens = _drain_window(node, lane)
    return _Cut(stop, None, samples, tokens)


def enter_stage(
    node: Multiplexer, recipe: Recipe, index: int, amended: tuple[Mapping[str, Any], ...]
) -> StageState:
    """Cut each of ``node``'s lanes at its position and continue its datasets under ``recipe``.

    Args:
        node: A rank node at a step boundary (its lanes at their positions).
        recipe: The recipe in force after the change (no stages).
        index: The stage of the resuming recipe it is (0 for an amendment's own base).
        amended: The amendments of the run so far (the new one included).

    Returns:
        The stage section of the node's lanes (rows for its lanes only).

    Raises:
        RecipeError: If the change is not one a run can make (fixed fields, streams).
    """
    p: Any = node.pipeline
    old = p.recipe
    differs = fixed_differences(old, recipe)
    if differs:
        raise RecipeError("; ".join(differs))
    if node.micro:
        raise CheckpointError(
            f"a recipe change needs a step boundary; the node is after micro-batch "
            f"{node.micro} of step {node.step + 1}"
        )
    source = node.work_source
    relaned = source.relaned
    prev, lane_of = previous_stage(p) if relaned else (p.stage, None)
    if prev is not None:
        names, streams = list(prev.names), list(prev.streams)
    else:
        names, streams = base_streams(p)
    retired = prev.retired if prev is not None else ()
    known = len(names)
    renames = continue_streams(names, streams, retired, recipe)
    cuts: dict[int, _Cut] = {}
    for lane, (w, c) in node.positions.items():
        if c:
            cuts[lane] = _cut(node, lane, w, c)
        else:
            cuts[lane] = _Cut(source.window_start(lane, w, old.flush_every), None, 0, 0)
    if relaned:
        out = enter_after_relane(node, cuts, index, amended, (names, streams, known), prev, lane_of)
        gone = sorted(({d.name for d in recipe.datasets} | set(renames)) & set(out.retired))
        if gone:
            raise RecipeError(
                f"dataset(s) {gone} were not read by the re-laned lanes and their streams "
                f"before the re-lane are not known: give them new names to read them again "
                f"from their beginning"
            )
        return _renamed(out, renames)
    own = [d.name for d in old.datasets]
    rows: dict[int, tuple[int, ...]] = {}
    for lane, cut in cuts.items():
        counts = dict(zip(own, dataset_counts(source, lane, cut.resume, own), strict=True))
        before = prev.offsets(lane) if prev is not None else {}
        head = (0, 0, 0)
        if cut.head is not None:
            at, record = cut.head
            item = source.work(lane, at)
            assert item is not None
            # The cut item is its dataset's item (count after it) - 1 in the lane's stream.
            t = counts[own[item.dataset]] - 1
            head = (names.index(own[item.dataset]) + 1, t, record)
        was = prev.dropped(lane) if prev is not None else (0, 0)
        row = [counts[n] if n in counts else before.get(n, 0) for n in names]
        rows[lane] = (*row, *head, was[0] + cut.samples, was[1] + cut.tokens)
    out = StageState(
        index=index,
        step=node.step,
        names=tuple(names),
        streams=tuple(streams),
        lanes=rows,
        amended=amended,
        unread=dict(prev.unread) if prev is not None else {},
        retired=retired,
        num_lanes=p.num_lanes,
    )
    return _renamed(out, renames)


def continue_streams(
    names: list[str], streams: list[tuple[int, str]], retired: Sequence[str], recipe: Recipe
) -> dict[str, str]:
    """Join ``recipe``'s datasets to the run's streams by content, not by name.

    A dataset of a known name must be the data read under that name; a new name whose data
    (content digest: files, their checksums and order, chunking) is a known stream's
    continues that stream (a rename: returned as ``{old name: new name}``); any other new
    name is added to ``names`` and ``streams`` (in place), read from its beginning.

    Raises:
        RecipeError: If a name changed its data, two datasets hold the same data, or the
            stream to continue was retired after a re-lane.
    """
    wanted = _recipe_streams(recipe)
    in_recipe = {name for name, _ in wanted}
    renames: dict[str, str] = {}
    first: dict[str, str] = {}
    for name, content in wanted:
        twin = first.setdefault(content, name)
        if twin != name:
            raise RecipeError(
                f"datasets {twin!r} and {name!r} hold the same data (content {content}): each "
                f"document would be read twice; keep one of them"
            )
        if name in retired:
            raise RecipeError(
                f"dataset {name!r} was removed before a re-lane and is not read since: its "
                f"stream cannot be continued without repeating documents; give it a new name "
                f"to read it again from its beginning"
            )
        if name in names:
            was = streams[names.index(name)][1]
            if was != content:
                raise RecipeError(
                    f"dataset {name!r} is not the data the run read under that name (content "
                    f"{content} now, {was} before the change: other files, a subset, a "
                    f"superset, another order or another chunk_size): a dataset keeps its "
                    f"files for the whole run; give changed data a new name"
                )
            continue
        same = [n for n, (_, c) in zip(names, streams, strict=True) if c == content]
        if not same:
            names.append(name)
            streams.append((added_stream_key(name), content))
            continue
        if same[0] in in_recipe:
            raise RecipeError(
                f"dataset {name!r} holds the data of dataset {same[0]!r} (content {content}), "
                f"which the new recipe also reads: each document would be read twice; remove "
                f"{same[0]!r} to continue its stream under the name {name!r}"
            )
        renames[same[0]] = name
    return renames


def _renamed(stage: StageState, renames: Mapping[str, str]) -> StageState:
    """``stage`` with datasets renamed (each keeps its stream, its rows and its unread set)."""
    if not renames:
        return stage
    return dataclasses.replace(
        stage,
        names=tuple(renames.get(n, n) for n in stage.names),
        unread={renames.get(n, n): u for n, u in stage.unread.items()},
    )


def _recipe_streams(recipe: Recipe) -> list[tuple[str, str]]:
    """``(name, content digest)`` of each dataset of ``recipe``."""
    canonical = recipe.canonical(lazy=True)
    return [
        (d.name, _content(c)) for d, c in zip(recipe.datasets, canonical["datasets"], strict=True)
    ]


def stage_state_dict(run: Pipeline, step: int, stage: StageState) -> dict[str, Any]:
    """The state of a run just after a change: every lane at the start of the new stage."""
    return {
        FORMAT_KEY: FORMAT,
        FINGERPRINT_KEY: run.fingerprint,
        RECIPE_KEY: run.summary,
        NUM_LANES_KEY: run.num_lanes,
        STEP_KEY: step,
        MICRO_KEY: 0,
        LANES_KEY: {str(lane): [0, 0] for lane in stage.lanes},
        STAGE_KEY: stage.to_state(),
    }


def amend_state(old: Pipeline, state: Mapping[str, Any], new: Pipeline) -> dict[str, Any]:
    """Amend a merged step-boundary state of ``old``'s run to continue under ``new``'s recipe.

    The same move as entering a stage (:func:`enter_stage`), on every lane at once.

    Args:
        old: The pipeline of the recipe the state was written with.
        state: A merged state (every lane) at a step boundary.
        new: The pipeline of the recipe to continue with; its own stages, if any, must start
            after the state's step.

    Returns:
        The new state (plain JSON data); resume it with ``new``'s recipe.

    Raises:
        CheckpointError: If the state does not fit ``old``.
        RecipeError: If the change cannot be made (a fixed field differs, ...).
    """
    step = int(state[STEP_KEY])
    if state.get(PASS_KEY, 0) != 0:
        # The amended streams continue each lane's position in the first pass's streams; a
        # later pass reads other data epochs (issue 32: found by the chain property). After a
        # re-lane made in a later pass the state's own pass restarts at 0: enter_stage refuses
        # that change (engine/unread.py).
        raise RecipeError(
            f"the checkpoint is in pass {state.get(PASS_KEY)!r} of a finite recipe (a new "
            f"iter() after the end of its data): an amendment continues the first pass's "
            f"streams only; amend before the data ends, or start a new run with the new recipe"
        )
    early = [s.start_step for s in new.recipe.stages if s.start_step <= step]
    if early:
        raise RecipeError(
            f"the new recipe's stages must start after the amended step {step}; stage(s) "
            f"starting after step(s) {early} are in the past"
        )
    if new.recipe.balanced_dealing or new.recipe.wraps:
        raise RecipeError(
            'the new recipe must deal its work items round-robin (work.deal = "round_robin") '
            "to continue the run's streams"
        )
    old = old.for_state(state)  # a re-laned checkpoint's streams
    with WorkerPool(1, "thread") as pool:
        node = old.rank_node(1, 0, pool=pool)
        try:
            node.reset(dict(state))
            prev, _ = previous_stage(node.pipeline)
            amended = (*(prev.amended if prev is not None else ()),)
            amended += ({"fingerprint": old.fingerprint, "step": step},)
            stage = enter_stage(node, new.recipe.base, 0, amended)
        finally:
            node.close()
    out = stage_state_dict(new, step, stage)
    check_resumes(new, out, f"the amendment after step {step}")
    return out


def check_resumes(pipeline: Pipeline, state: Mapping[str, Any], change: str) -> None:
    """Resume ``state`` on every lane of ``pipeline`` (validation and replay), then drop it.

    A change made offline (``zephon amend``, ``zephon relane``, the TorchTitan adapters) must
    never write a state the next resume refuses: it is refused here, at the change.

    Args:
        pipeline: The pipeline of the recipe the state is to be resumed with.
        state: The state a change produced (plain data, every lane).
        change: What produced it, for the message (``"the amendment after step 4"``).

    Raises:
        RecipeError: In one line, if a resume of the state would be refused.
    """
    try:
        segment = pipeline.for_state(state)
        with WorkerPool(1, "thread") as pool:
            node = segment.rank_node(lanes=list(range(segment.num_lanes)), pool=pool)
            try:
                node.reset(dict(state))
            finally:
                node.close()
    except CheckpointError as e:
        raise RecipeError(f"{change} is refused: the state it writes would not resume: {e}") from e


def enter_next_stage(node: Multiplexer) -> None:
    """Move ``node`` (at the step a planned stage starts after) into that stage."""
    run = node.pipeline.run
    k = run.recipe.stage_at(node.step)
    prev = node.pipeline.stage
    stage = enter_stage(node, run.recipe.stage_recipe(k), k, prev.amended if prev else ())
    node.reset_own(stage_state_dict(run, node.step, stage))


def check_stage_batches(recipe: Recipe, lanes: int, local_batch_size: int | None) -> None:
    """Refuse, at launch, a stage whose step this rank cannot cut into micro-batches.

    Raises:
        RecipeError: Naming the stage.
    """
    if local_batch_size is None:
        return
    for k, stage in enumerate(recipe.stages):
        share = stage.recipe.samples_per_lane * lanes
        if share % local_batch_size:
            raise RecipeError(
                f"stages[{k}] (start_step={stage.start_step}): this rank's share of a step "
                f"({share} samples: {lanes} lanes x {stage.recipe.samples_per_lane}) must be a "
                f"multiple of local_batch_size={local_batch_size}"
            )
