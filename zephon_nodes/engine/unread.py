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
from typing import TYPE_CHECKING, Any

from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.engine.work import DatasetWorkSource, WorkItem, WorkSource
from zephon_nodes.state.stage import MAX_UNREAD_ITEMS, StageState, Unread

if TYPE_CHECKING:
    from zephon_nodes.engine.multiplexer import Multiplexer

__all__ = [
    "MAX_UNREAD_ITEMS",
    "Unread",
    "UnreadStream",
    "enter_after_relane",
    "global_index",
    "previous_stage",
    "unread_sets",
]


def lane_suffixes(counts: Mapping[int, int], num_lanes: int) -> Unread:
    """Items ``t * L + l`` with ``t >= counts[l]``, over every lane ``l`` of ``L``."""
    top = max(counts.values(), default=0)
    items = sorted(t * num_lanes + lane for lane, c in counts.items() for t in range(c, top))
    return Unread(top * num_lanes, tuple(items))


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


def global_index(source: WorkSource, lane: int, i: int) -> tuple[int, int]:
    """``(stream key, global item)`` of item ``i`` of ``lane`` of ``source``.

    Raises:
        RecipeError: If the source's items are not per-dataset streams at bottom.
    """
    from zephon_nodes.engine.mixing import MixingWorkSource
    from zephon_nodes.engine.relane.sources import RelanedWorkSource
    from zephon_nodes.engine.stage_source import StageWorkSource

    if isinstance(source, StageWorkSource):
        return source.global_index(lane, i)
    if isinstance(source, RelanedWorkSource):
        old = source.old_position(lane, i)
        if old is None:
            raise RecipeError(f"re-laned lane {lane} has no work item {i}")
        return global_index(source.old, *old)
    if isinstance(source, MixingWorkSource):
        d, t = source.locate(i, lane)
        return d, t * source.num_lanes + lane
    if type(source) is DatasetWorkSource:
        return source.dataset_index, i * source.num_lanes + lane
    raise RecipeError(_REFUSE.format(kind=type(source).__name__))


_REFUSE = (
    "a recipe change needs lanes that read each dataset's own stream (dealt round-robin); "
    "this run's streams are {kind} (dealt by size or wrapped at the end of data), which a "
    "change cannot continue"
)


@dataclasses.dataclass
class UnreadState:
    """What a source had not read at some lane positions: per stream key, its set.

    ``pending`` holds the ``(key, g)`` of items a change cut in two whose rest was still to
    be read (a later reader must have read them before the next change).
    """

    sets: dict[int, Unread]
    pending: set[tuple[int, int]]


def unread_sets(source: WorkSource, resume: Mapping[int, int]) -> UnreadState:
    """Per stream key, the global items ``source`` has not read at lane positions ``resume``.

    ``resume`` holds every lane of the source: lane ``l`` has read its first ``resume[l]``.

    Raises:
        RecipeError: If the source's items cannot be traced to per-dataset streams.
    """
    from zephon_nodes.engine.mixing import MixingWorkSource
    from zephon_nodes.engine.relane.sources import RelanedWorkSource
    from zephon_nodes.engine.stage_source import StageWorkSource

    if isinstance(source, RelanedWorkSource):
        inner = unread_sets(source.old, dict(enumerate(source.old_starts)))
        read: dict[int, set[int]] = {}
        for lane, stop in resume.items():
            for i in range(stop):
                key, g = global_index(source, lane, i)
                read.setdefault(key, set()).add(g)
                inner.pending.discard((key, g))
        sets = {k: u.without(read.get(k, ())) for k, u in inner.sets.items()}
        for lane, stop in resume.items():  # windows the re-lane cut, not replayed yet
            inner.pending.update(
                global_index(source, lane, i) for i in source.partly_delivered(lane, stop)
            )
        return UnreadState(sets, inner.pending)
    if isinstance(source, StageWorkSource):
        return source.unread(resume)
    if isinstance(source, MixingWorkSource):
        L = source.num_lanes
        per_lane = {lane: source.counts(lane, n) for lane, n in resume.items()}
        return UnreadState(
            {
                d: lane_suffixes({lane: c[d] for lane, c in per_lane.items()}, L)
                for d in range(len(source.datasets))
            },
            set(),
        )
    if type(source) is DatasetWorkSource:
        return UnreadState(
            {source.dataset_index: lane_suffixes(dict(resume), source.num_lanes)}, set()
        )
    raise RecipeError(_REFUSE.format(kind=type(source).__name__))


def previous_stage(pipeline: Any) -> tuple[StageState | None, Callable[[int], int] | None]:
    """The stage section a re-laned pipeline's streams were in, and its lanes' new lanes.

    A re-lane keeps the stage section of the checkpoint it re-laned (``lineage.stage``; a
    re-lane of a re-lane, its parent's). Old lane ``l`` of ``L`` re-laned to ``L'`` lanes is
    replayed by new lane ``l mod L'``: the map composes over the lineage's re-lanes.
    """
    from zephon_nodes.state.lineage import Lineage

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
    node: Multiplexer,
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
    got = unread_sets(source, {lane: cut.resume for lane, cut in cuts.items()})
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
            key, g = global_index(source, lane, at)
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
