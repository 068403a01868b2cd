"""The stage section of a state: which stage of a changing recipe the streams are in.

A run whose recipe changes (planned ``[[stages]]`` or an unplanned ``zephon amend``) reads,
after each change, streams that continue every dataset where each lane left it. The state of
such a run carries (plain JSON, under ``"stage"``)::

    {"index": k,              # the stage of the resuming recipe in force (0: its base)
     "step": S,               # the step the stage started after
     "names": ["web", ...],   # every dataset the run has read, in order of first use
     "streams": [[key, "<content>"], ...],   # per name: its stream's seed key, its content
     "lanes": {"0": [t_0, t_1, ..., head, head_t, head_r, samples, tokens], ...},
     "amended": [{"fingerprint": "<old recipe>", "step": S}, ...],   # only when amended
     "unread": {"version": 1, "num_lanes": L,          # only after a change that followed
                "datasets": {"web": {"from": K, "items": [g, ...]}, ...}},   # a re-lane
     "retired": ["old", ...]}  # names a change after a re-lane could not continue (refused)

Per lane: how many work items of each named dataset the lane had read before the stage
(``t``; the stage continues there); the *head*, a work item the change cut, whose records
from ``head_r`` on the lane reads first (``head``: 1 + the index of its dataset's name, 0:
none; ``head_t``: the item's count in that dataset's lane stream); then the samples and
tokens the changes so far dropped in that lane. Lanes merge across ranks like positions; the
rest is the same on every rank. Every lane's positions in ``"lanes"`` of the state count from
the stage's start.

After a change that followed a re-lane (:mod:`zephon_nodes.engine.unread`), a dataset listed
under ``"unread"`` is read from the set of its global items that were not read by then (every
``g >= from`` and the sorted ``items``, each below ``from``: at most
:data:`MAX_UNREAD_ITEMS` of them), dealt anew to the ``num_lanes``
lanes (lane ``l`` reads the set's ``l``-th, ``(l + L)``-th, ... items); its counts ``t`` count
into that stream. A head whose dataset field is ``n + 1 + index`` (``n``: the number of names)
instead of ``1 + index`` names the cut item by its global index ``head_t`` in the dataset's
stream (a change after a re-lane cut it). ``"retired"`` names datasets the run read before a
re-lane but not after it: their streams cannot be continued, so a recipe reading one again is
refused.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from zephon_nodes.core.errors import CheckpointError

__all__ = [
    "MAX_UNREAD_ITEMS",
    "StageState",
    "Unread",
    "UnreadState",
    "lane_suffixes",
    "merge_stage_sections",
    "summarize_changes",
]

_KEYS = ("index", "step", "names", "streams", "lanes")
_ALLOWED = frozenset((*_KEYS, "amended", "unread", "retired"))
_UNREAD_VERSION = 1
_MAX = 2**62
_MAX_NAMES = 4096
_MAX_AMENDED = 256


#: The most explicit items one dataset's unread set may hold in a checkpoint (ints of JSON).
MAX_UNREAD_ITEMS = 1 << 20


@dataclasses.dataclass(frozen=True)
class Unread:
    """A set of global items: ``items`` (sorted, each below ``start``) and every ``g >= start``.

    A finite stream's set ends at the stream's total (applied by the reader, not stored).
    """

    start: int
    items: tuple[int, ...] = ()

    def nth(self, j: int) -> int:
        """The ``j``-th item of the set in increasing order."""
        n = len(self.items)
        return self.items[j] if j < n else self.start + (j - n)

    def count(self, total: int | None) -> int | None:
        """Items of the set below ``total`` (None: endless)."""
        if total is None:
            return None
        return bisect.bisect_left(self.items, total) + max(0, total - self.start)

    def __contains__(self, g: object) -> bool:
        if not isinstance(g, int):
            return False
        if g >= self.start:
            return True
        k = bisect.bisect_left(self.items, g)
        return k < len(self.items) and self.items[k] == g

    def without(self, removed: Iterable[int]) -> Unread:
        """This set less ``removed`` (the tail moves up past the largest removed item)."""
        gone = set(removed)
        if not gone:
            return self
        top = max(self.start, max(gone) + 1)
        kept = [g for g in self.items if g not in gone]
        kept += [g for g in range(self.start, top) if g not in gone]
        return Unread(top, tuple(kept))

    def mapped(self, outer: Unread) -> Unread:
        """This set of indices ``j`` into ``outer`` (its ``j``-th items), as a set of items."""
        n = len(outer.items)
        items = [outer.nth(j) for j in self.items]
        if self.start < n:
            items += list(outer.items[self.start :])
            start = outer.start
        else:
            start = outer.start + (self.start - n)
        return Unread(start, tuple(items))


@dataclasses.dataclass
class UnreadState:
    """What a work source had not read at some lane positions: per stream key, its set.

    ``pending`` holds the ``(key, g)`` of items a change (or a re-lane) cut in two whose
    rest was still to be read (a later reader must have read them before the next change).
    """

    sets: dict[int, Unread]
    pending: set[tuple[int, int]]


def lane_suffixes(counts: Mapping[int, int], num_lanes: int) -> Unread:
    """Items ``t * L + l`` with ``t >= counts[l]``, over every lane ``l`` of ``L``."""
    top = max(counts.values(), default=0)
    items = sorted(t * num_lanes + lane for lane, c in counts.items() for t in range(c, top))
    return Unread(top * num_lanes, tuple(items))


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _count(x: Any) -> bool:
    return _is_int(x) and 0 <= x < _MAX


@dataclasses.dataclass(frozen=True)
class StageState:
    """The stage section of a state, typed.

    Attributes:
        index: The stage of the resuming recipe in force (0: its base recipe).
        step: The step the stage started after.
        names: Every dataset the run has read, in order of first use.
        streams: Per name, ``(key, content)``: the seed key of its stream and a digest of
            its data (a dataset of the same name must be the same data).
        lanes: Per lane, per name the work items read before the stage, the head
            (``1 + name index`` or 0, its item's count, its first record), then the samples
            and tokens dropped by the changes so far.
        amended: Unplanned changes, oldest first: ``{"fingerprint", "step"}`` each.
        unread: Per dataset name read from its unread items after a re-lane, the set.
        retired: Datasets read before a re-lane that a later change could not continue.
    """

    index: int
    step: int
    names: tuple[str, ...]
    streams: tuple[tuple[int, str], ...]
    lanes: Mapping[int, tuple[int, ...]]
    amended: tuple[Mapping[str, Any], ...] = ()
    unread: Mapping[str, Unread] = dataclasses.field(default_factory=dict)
    retired: tuple[str, ...] = ()
    num_lanes: int = 0

    def offsets(self, lane: int) -> dict[str, int]:
        """Work items of each dataset lane ``lane`` read before the stage."""
        row = self.lanes[lane]
        return dict(zip(self.names, row[: len(self.names)], strict=True))

    def head(self, lane: int) -> tuple[str, int, int, bool] | None:
        """``(dataset, count, first record, global)`` of the cut item lane ``lane`` reads first.

        ``global``: ``count`` is the item's global index in the dataset's stream.
        """
        row = self.lanes[lane]
        n = len(self.names)
        if not row[n]:
            return None
        whole = row[n] > n
        return self.names[row[n] - 1 - (n if whole else 0)], row[n + 1], row[n + 2], whole

    def dropped(self, lane: int) -> tuple[int, int]:
        """Samples and tokens the changes so far dropped in lane ``lane``."""
        row = self.lanes[lane]
        return row[-2], row[-1]

    def key_of(self, name: str) -> tuple[int, str] | None:
        """The stream key and content digest of dataset ``name`` (None: never read)."""
        return self.streams[self.names.index(name)] if name in self.names else None

    def to_state(self, lanes: Iterable[int] | None = None) -> dict[str, Any]:
        """The JSON-safe section (a fresh dict), with the rows of ``lanes`` (default all)."""
        keep = set(self.lanes) if lanes is None else set(lanes)
        out: dict[str, Any] = {
            "index": self.index,
            "step": self.step,
            "names": list(self.names),
            "streams": [[k, c] for k, c in self.streams],
            "lanes": {str(i): list(row) for i, row in sorted(self.lanes.items()) if i in keep},
        }
        if self.amended:
            out["amended"] = [dict(a) for a in self.amended]
        if self.unread:
            out["unread"] = {
                "version": _UNREAD_VERSION,
                "num_lanes": self.num_lanes,
                "datasets": {
                    name: {"from": u.start, "items": list(u.items)}
                    for name, u in self.unread.items()
                },
            }
        if self.retired:
            out["retired"] = list(self.retired)
        return out

    @classmethod
    def from_state(cls, raw: Any, num_lanes: int) -> StageState:
        """Check an untrusted ``"stage"`` section and return it typed.

        Raises:
            CheckpointError: Naming the key or value that is wrong.
        """
        where = "checkpoint 'stage'"
        _check_keys(raw, where)
        names = _parse_names(raw["names"], where)
        parsed_streams = _parse_streams(raw["streams"], names, where)
        parsed = _parse_lanes(raw["lanes"], names, num_lanes, where)
        amended = _parse_amended(raw.get("amended", []), where)
        unread = _parse_unread(raw.get("unread"), names, num_lanes, where)
        _check_heads(parsed, names, unread, where)
        retired = raw.get("retired", [])
        if not isinstance(retired, list) or not all(r in names for r in retired):
            raise CheckpointError(f"{where}: 'retired' must be a list of the section's names")
        return cls(
            index=int(raw["index"]),
            step=int(raw["step"]),
            names=tuple(names),
            streams=tuple(parsed_streams),
            lanes=dict(sorted(parsed.items())),
            amended=tuple(copy.deepcopy(dict(a)) for a in amended),
            unread=unread,
            retired=tuple(retired),
            num_lanes=num_lanes,
        )

    def require_lanes(self, lanes: Iterable[int]) -> None:
        """Refuse a section without a row for one of ``lanes``.

        Raises:
            CheckpointError: Naming the lanes.
        """
        absent = sorted(set(lanes) - set(self.lanes))
        if absent:
            raise CheckpointError(f"checkpoint 'stage' has no row for lane(s) {absent}")


def _parse_unread(raw: Any, names: list[str], num_lanes: int, where: str) -> dict[str, Unread]:
    """Check an untrusted ``"unread"`` entry (see the module docstring).

    Raises:
        CheckpointError: Naming the field that is wrong.
    """
    if raw is None:
        return {}
    where = f"{where} 'unread'"
    if not isinstance(raw, Mapping) or set(raw) != {"version", "num_lanes", "datasets"}:
        raise CheckpointError(f"{where} must be {{'version', 'num_lanes', 'datasets'}}")
    if raw["version"] != _UNREAD_VERSION:
        raise CheckpointError(
            f"{where}: version {raw['version']!r} is not {_UNREAD_VERSION} (written by another "
            f"zephon-nodes?)"
        )
    if raw["num_lanes"] != num_lanes:
        raise CheckpointError(
            f"{where}: its items are dealt to num_lanes={raw['num_lanes']!r}, the checkpoint "
            f"has {num_lanes}"
        )
    datasets = raw["datasets"]
    if not isinstance(datasets, Mapping):
        raise CheckpointError(f"{where}: 'datasets' must be a dict")
    out: dict[str, Unread] = {}
    for name, entry in datasets.items():
        if name not in names:
            raise CheckpointError(f"{where}: dataset {name!r} is not one of the names")
        if not isinstance(entry, Mapping) or set(entry) != {"from", "items"}:
            raise CheckpointError(f"{where}: dataset {name!r} must be {{'from', 'items'}}")
        start, items = entry["from"], entry["items"]
        if not _count(start):
            raise CheckpointError(f"{where}: {name!r} 'from'={start!r} must be an integer >= 0")
        if not isinstance(items, list) or len(items) > MAX_UNREAD_ITEMS:
            raise CheckpointError(
                f"{where}: {name!r} 'items' must be a list of at most {MAX_UNREAD_ITEMS}"
            )
        if not all(_count(g) for g in items) or any(
            a >= b for a, b in itertools.pairwise([*items, start])
        ):
            raise CheckpointError(
                f"{where}: {name!r} 'items' must be increasing integers >= 0, each below "
                f"'from'={start}"
            )
        out[name] = Unread(int(start), tuple(int(g) for g in items))
    return out


def merge_stage_sections(sections: list[Any]) -> dict[str, Any] | None:
    """Merge the stage sections of rank states (disjoint lanes) into one.

    Raises:
        CheckpointError: If some ranks have a section and others none, or they disagree on
            anything but their lanes.
    """
    if all(s is None for s in sections):
        return None
    if any(not isinstance(s, Mapping) for s in sections):
        raise CheckpointError("ranks disagree on 'stage': some states have one, some not")
    first = sections[0]
    lanes: dict[str, Any] = {}
    for s in sections:
        for key in _ALLOWED - {"lanes"}:
            if s.get(key) != first.get(key):
                raise CheckpointError(f"ranks disagree on stage {key}")
        rows = s.get("lanes")
        if not isinstance(rows, Mapping):
            raise CheckpointError("checkpoint 'stage': 'lanes' must be a dict")
        overlap = set(lanes) & set(rows)
        if overlap:
            raise CheckpointError(f"stage lanes {sorted(overlap)} appear in more than one state")
        lanes.update(rows)
    merged = {k: copy.deepcopy(v) for k, v in first.items() if k != "lanes"}
    merged["lanes"] = dict(sorted(lanes.items(), key=lambda kv: int(kv[0])))
    return merged


def summarize_changes(sections: Iterable[Any]) -> dict[str, Any] | None:
    """What the recipe changes of a run did, over the stage sections of some ranks.

    Returns:
        ``{"stage", "after_step", "amendments", "dropped_samples", "dropped_tokens"}`` (the
        stage in force, the step it started after, the amendments, and what the changes so
        far dropped in these ranks' lanes), or None if the recipe never changed.
    """
    present = [s for s in sections if isinstance(s, Mapping)]
    if not present:
        return None
    rows = [row for sec in present for row in sec["lanes"].values()]
    first = present[0]
    return {
        "stage": first["index"],
        "after_step": first["step"],
        "amendments": len(first.get("amended", [])),
        "dropped_samples": sum(r[-2] for r in rows),
        "dropped_tokens": sum(r[-1] for r in rows),
    }


def _check_keys(raw: Any, where: str) -> None:
    """The section is a dict of the known keys, every required one, counts where counts are."""
    if not isinstance(raw, Mapping):
        raise CheckpointError(f"{where} must be a dict, got {type(raw).__name__}")
    extra = sorted(set(map(str, raw)) - _ALLOWED)
    if extra:
        raise CheckpointError(f"{where}: unexpected key(s) {extra}")
    missing = [k for k in _KEYS if k not in raw]
    if missing:
        raise CheckpointError(f"{where}: missing key(s) {missing}")
    for key in ("index", "step"):
        if not _count(raw[key]):
            raise CheckpointError(f"{where}: {key}={raw[key]!r} must be an integer >= 0")


def _parse_names(names: Any, where: str) -> list[str]:
    """The section's dataset names: a non-empty list of distinct strings."""
    if (
        not isinstance(names, list)
        or not 0 < len(names) <= _MAX_NAMES
        or not all(isinstance(n, str) for n in names)
        or len(set(names)) != len(names)
    ):
        raise CheckpointError(f"{where}: 'names' must be a list of distinct dataset names")
    return names


def _parse_streams(streams: Any, names: list[str], where: str) -> list[tuple[int, str]]:
    """One ``[key, content]`` per name."""
    if not isinstance(streams, list) or len(streams) != len(names):
        raise CheckpointError(f"{where}: 'streams' must hold one [key, content] per name")
    parsed = []
    for i, s in enumerate(streams):
        if not (isinstance(s, list) and len(s) == 2 and _count(s[0]) and isinstance(s[1], str)):
            raise CheckpointError(f"{where}: streams[{i}] must be [key, content], got {s!r}")
        parsed.append((int(s[0]), str(s[1])))
    return parsed


def _parse_lanes(
    lanes: Any, names: list[str], num_lanes: int, where: str
) -> dict[int, tuple[int, ...]]:
    """Each lane's row: a count per name, the head's dataset, count and record, the drops."""
    if not isinstance(lanes, Mapping):
        raise CheckpointError(f"{where}: 'lanes' must be a dict")
    width = len(names) + 5
    parsed: dict[int, tuple[int, ...]] = {}
    for key, row in lanes.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise CheckpointError(f"{where}: lane key {key!r} is not a lane number")
        lane = int(key)
        if not 0 <= lane < num_lanes or str(lane) != key:
            raise CheckpointError(f"{where}: lane {key!r} is out of range [0, {num_lanes})")
        if (
            not isinstance(row, list)
            or len(row) != width
            or not all(map(_count, row))
            or row[len(names)] > 2 * len(names)
        ):
            raise CheckpointError(
                f"{where}: lane {lane} must hold {width} integers >= 0 (one per dataset "
                f"name, the head's dataset (at most {len(names)}), count and record, "
                f"then dropped samples and tokens), got {row!r:.120}"
            )
        parsed[lane] = tuple(int(v) for v in row)
    return parsed


def _parse_amended(amended: Any, where: str) -> list[Mapping[str, Any]]:
    """The amendments: ``{'fingerprint': 64 hex digits, 'step': a count}`` each."""
    if not isinstance(amended, list) or len(amended) > _MAX_AMENDED:
        raise CheckpointError(f"{where}: 'amended' must be a list")
    for i, a in enumerate(amended):
        if (
            not isinstance(a, Mapping)
            or set(a) != {"fingerprint", "step"}
            or not isinstance(a["fingerprint"], str)
            or len(a["fingerprint"]) != 64
            or not _count(a["step"])
        ):
            raise CheckpointError(
                f"{where}: amended[{i}] must be {{'fingerprint': 64 hex digits, 'step': "
                f"an integer}}, got {a!r:.120}"
            )
    return amended


def _check_heads(
    parsed: Mapping[int, tuple[int, ...]], names: list[str], unread: Mapping[str, Any], where: str
) -> None:
    """A head named by global index needs its dataset's ``unread`` entry."""
    for lane, row in parsed.items():
        h = row[len(names)]
        if h > len(names) and names[h - 1 - len(names)] not in unread:
            raise CheckpointError(
                f"{where}: lane {lane}'s head names dataset "
                f"{names[h - 1 - len(names)]!r} by global index, but it has no 'unread' entry"
            )
