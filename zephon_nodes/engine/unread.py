"""A dataset's unread items after a re-lane, and the streams that re-deal them to lanes.

A recipe change needs, for every dataset, where each lane stands in that dataset's stream
(:mod:`zephon_nodes.engine.stage_source`). A re-laned run has no such per-lane streams: its
lanes read the old lanes' leftovers, then their untouched items in old global order. What it
does have is the dataset's *global* items: the stream of a dataset with stream key ``k`` is
one sequence ``g = 0, 1, 2, ...`` of its seeded epoch permutations, whatever the lane count
(lane ``l`` of ``L`` reads ``g = t * L + l``). So what a change after a re-lane continues is,
per dataset, the set of its global items not read yet:

* what the lanes the re-lane started from had not read (each old lane's stream of the
  dataset from the start of its current flush window on: ``g = t * L + l`` for ``t`` at or
  past its count there), less
* every item the re-laned lanes read before the change's cut (enumerated: the items read
  since the re-lane, cheap offline).

Such a set is held as :class:`Unread`: every ``g`` at or past ``start``, plus an explicit
sorted list of the items below it (the ragged edge between lanes: a few items per lane). The
stage after the change deals each dataset's unread items to its ``L'`` lanes anew: numbered
``j = 0, 1, 2, ...`` in increasing ``g``, lane ``l'`` reads ``j = t * L' + l'``
(:class:`UnreadStream`). A later change continues these streams like any other (per-lane
counts); a later re-lane and change computes the set again, through them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.engine.work import DatasetWorkSource, WorkItem, WorkSource
from zephon_nodes.state.lineage import Lineage
from zephon_nodes.state.stage import MAX_UNREAD_ITEMS, StageState, Unread, lane_suffixes

__all__ = [
    "MAX_UNREAD_ITEMS",
    "Unread",
    "UnreadStream",
    "enter_after_relane",
    "previous_stage",
]


class UnreadStream(WorkSource):
    """A dataset's unread items (an :class:`Unread` of ``base``), dealt round-robin to lanes.

    Lane ``l`` of ``L`` reads the set's items ``j = t * L + l`` (in increasing global order).

    Args:
        base: The dataset's own stream (its stream key, at any lane count).
        unread: The set of its global items to deal.
        num_lanes: Lanes ``L`` dealt to.
    """

    def __init__(self, base: DatasetWorkSource, unread: Unread, num_lanes: int) -> None:
        super().__init__(num_lanes)
        self.base, self.unread = base, unread
        self.dataset = base.dataset
        self._count = unread.count(base.total_items)

    def global_of(self, lane: int, t: int) -> int:
        """The global item lane ``lane``'s ``t``-th item is."""
        return self.unread.nth(t * self.num_lanes + lane)

    def lane_length(self, lane: int) -> int | None:
        """Items of ``lane`` (None: endless)."""
        if self._count is None:
            return None
        return max(0, -(-(self._count - lane) // self.num_lanes))

    def work(self, lane: int, i: int) -> WorkItem | None:
        """Item ``i`` of ``lane`` (None past the set's end)."""
        j = i * self.num_lanes + lane
        if self._count is not None and j >= self._count:
            return None
        item = item_at(self.base, self.unread.nth(j))
        return None if item is None else dataclasses.replace(item, lane=lane, position=i)


def item_at(source: DatasetWorkSource, g: int) -> WorkItem | None:
    """Global item ``g`` of a dataset's stream."""
    L = source.num_lanes
    return source.work(g % L, g // L)


def stream_global(stream: WorkSource, lane: int, t: int) -> int:
    """The global item of a stage stream's ``t``-th item in ``lane``."""
    if isinstance(stream, UnreadStream):
        return stream.global_of(lane, t)
    return t * stream.num_lanes + lane


def previous_stage(pipeline: Any) -> tuple[StageState | None, Callable[[int], int] | None]:
    """The stage section a re-laned pipeline's streams were in, and its lanes' new lanes.

    A re-lane keeps the stage section of the checkpoint it re-laned (``lineage.stage``; a
    re-lane of a re-lane, its parent's). Old lane ``l`` of ``L`` re-laned to ``L'`` lanes is
    replayed by new lane ``l mod L'``: the map composes over the lineage's re-lanes.
    """
    if pipeline.lineage is None:
        return pipeline.stage, None
    lineage: Lineage | None = Lineage.from_state(pipeline.lineage)
    targets = [pipeline.num_lanes]
    while lineage is not None:
        if lineage.stage is not None:
            stage = StageState.from_state(lineage.stage, lineage.num_lanes)
            chain = tuple(reversed(targets))

            def lane_of(lane: int, chain: tuple[int, ...] = chain) -> int:
                for n in chain:
                    lane %= n
                return lane

            return stage, lane_of
        targets.append(lineage.num_lanes)
        lineage = lineage.parent
    return None, None


def enter_after_relane(
    node: Any,
    cuts: Mapping[int, Any],
    index: int,
    amended: tuple[Mapping[str, Any], ...],
    known: tuple[list[str], list[tuple[int, str]], int],
    prev: StageState | None,
    lane_of: Callable[[int], int] | None,
) -> StageState:
    """:func:`~zephon_nodes.engine.stages.enter_stage` on a re-laned node (module docstring).

    Every dataset's unread items are dealt anew; needs every lane (offline, ``zephon amend``).

    Args:
        node: The re-laned rank node holding every lane, at a step boundary.
        cuts: Per lane, the change's cut (``resume``, ``head``, ``samples``, ``tokens``).
        index: The stage index of the new section.
        amended: The amendments so far (the new one included).
        known: The run's dataset names, their ``(key, content)`` streams, and how many of
            them the run had read before this change (the rest are added by it).
        prev: The stage section the re-lane kept (None: the recipe never changed before).
        lane_of: Maps ``prev``'s lanes to the node's (the re-lanes in between).

    Raises:
        RecipeError: If the change cannot be made there (named).
    """
    p: Any = node.pipeline
    source: Any = node.work_source
    names, streams, before = known
    L = p.num_lanes
    if sorted(cuts) != list(range(L)):
        raise RecipeError(
            "a recipe change after a re-lane needs every lane at once (zephon amend); a "
            "planned stage cannot start after a re-lane"
        )
    if source.lineage.pass_index or source.base_pass:
        raise RecipeError(
            "a recipe change after a re-lane made past the first pass is not supported; "
            "amend before the re-lane"
        )
    got = source.unread_sets({lane: cut.resume for lane, cut in cuts.items()})
    if got.pending:
        raise RecipeError(
            f"at step {node.step} a re-laned lane has not yet read the rest of a work item an "
            f"earlier change or the re-lane cut in two; amend at a later step (once each lane "
            f"is past the flush windows it took over from the old lanes)"
        )
    name_of = {key: names[i] for i, (key, _) in enumerate(streams)}
    unread = {}
    for key, u in got.sets.items():
        if key not in name_of:  # pragma: no cover - the stage section names every stream
            raise CheckpointError(f"a re-laned stream reads stream key {key} no name has")
        if len(u.items) > MAX_UNREAD_ITEMS:
            raise RecipeError(
                f"dataset {name_of[key]!r}: its unread items at step {node.step} are too "
                f"scattered over the re-laned lanes ({len(u.items)} below the first item "
                f"after which all are unread, at most {MAX_UNREAD_ITEMS}); amend at a "
                f"later step or before the re-lane"
            )
        unread[name_of[key]] = u
    for name in names[:before]:
        if name in unread or prev is None or name in prev.retired:
            continue
        # Not read since the stage the re-lane kept: its stream is where that stage left it.
        u = lane_suffixes({ol: prev.offsets(ol)[name] for ol in prev.lanes}, prev.num_lanes)
        unread[name] = u.mapped(prev.unread[name]) if name in prev.unread else u
    retired = tuple(n for n in names[:before] if n not in unread)
    width = len(names)
    rows: dict[int, tuple[int, ...]] = {}
    was = dict.fromkeys(range(L), (0, 0))
    if prev is not None and lane_of is not None:
        for old_lane in prev.lanes:
            a, b = was[lane_of(old_lane)]
            x, y = prev.dropped(old_lane)
            was[lane_of(old_lane)] = (a + x, b + y)
    for lane, cut in cuts.items():
        head = (0, 0, 0)
        if cut.head is not None:
            at, record = cut.head
            key, g = source.global_index(lane, at)
            head = (width + 1 + names.index(name_of[key]), g, record)
        rows[lane] = (
            *([0] * width),
            *head,
            was[lane][0] + cut.samples,
            was[lane][1] + cut.tokens,
        )
    return StageState(
        index=index,
        step=node.step,
        names=tuple(names),
        streams=tuple(streams),
        lanes=rows,
        amended=amended,
        unread=unread,
        retired=retired,
        num_lanes=L,
    )
