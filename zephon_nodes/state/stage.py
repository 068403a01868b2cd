"""The stage section of a state: which stage of a changing recipe the streams are in.

A run whose recipe changes (planned ``[[stages]]`` or an unplanned ``zephon amend``) reads,
after each change, streams that continue every dataset where each lane left it. The state of
such a run carries (plain JSON, under ``"stage"``)::

    {"index": k,              # the stage of the resuming recipe in force (0: its base)
     "step": S,               # the step the stage started after
     "names": ["web", ...],   # every dataset the run has read, in order of first use
     "streams": [[key, "<content>"], ...],   # per name: its stream's seed key, its content
     "lanes": {"0": [t_0, t_1, ..., head, head_t, head_r, samples, tokens], ...},
     "amended": [{"fingerprint": "<old recipe>", "step": S}, ...]}   # only when amended

Per lane: how many work items of each named dataset the lane had read before the stage
(``t``; the stage continues there); the *head*, a work item the change cut, whose records
from ``head_r`` on the lane reads first (``head``: 1 + the index of its dataset's name, 0:
none; ``head_t``: the item's count in that dataset's lane stream); then the samples and
tokens the changes so far dropped in that lane. Lanes merge across ranks like positions; the
rest is the same on every rank. Every lane's positions in ``"lanes"`` of the state count from
the stage's start.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from zephon_nodes.core.errors import CheckpointError

__all__ = ["StageState", "merge_stage_sections", "summarize_changes"]

_KEYS = ("index", "step", "names", "streams", "lanes")
_ALLOWED = frozenset((*_KEYS, "amended"))
_MAX = 2**62
_MAX_NAMES = 4096
_MAX_AMENDED = 256


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
    """

    index: int
    step: int
    names: tuple[str, ...]
    streams: tuple[tuple[int, str], ...]
    lanes: Mapping[int, tuple[int, ...]]
    amended: tuple[Mapping[str, Any], ...] = ()

    def offsets(self, lane: int) -> dict[str, int]:
        """Work items of each dataset lane ``lane`` read before the stage."""
        row = self.lanes[lane]
        return dict(zip(self.names, row[: len(self.names)], strict=True))

    def head(self, lane: int) -> tuple[str, int, int] | None:
        """``(dataset, count, first record)`` of the cut work item lane ``lane`` reads first."""
        row = self.lanes[lane]
        n = len(self.names)
        if not row[n]:
            return None
        return self.names[row[n] - 1], row[n + 1], row[n + 2]

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
        return out

    @classmethod
    def from_state(cls, raw: Any, num_lanes: int) -> StageState:
        """Check an untrusted ``"stage"`` section and return it typed.

        Raises:
            CheckpointError: Naming the key or value that is wrong.
        """
        where = "checkpoint 'stage'"
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
        names = raw["names"]
        if (
            not isinstance(names, list)
            or not 0 < len(names) <= _MAX_NAMES
            or not all(isinstance(n, str) for n in names)
            or len(set(names)) != len(names)
        ):
            raise CheckpointError(f"{where}: 'names' must be a list of distinct dataset names")
        streams = raw["streams"]
        if not isinstance(streams, list) or len(streams) != len(names):
            raise CheckpointError(f"{where}: 'streams' must hold one [key, content] per name")
        parsed_streams = []
        for i, s in enumerate(streams):
            if not (isinstance(s, list) and len(s) == 2 and _count(s[0]) and isinstance(s[1], str)):
                raise CheckpointError(f"{where}: streams[{i}] must be [key, content], got {s!r}")
            parsed_streams.append((int(s[0]), str(s[1])))
        lanes = raw["lanes"]
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
                or row[len(names)] > len(names)
            ):
                raise CheckpointError(
                    f"{where}: lane {lane} must hold {width} integers >= 0 (one per dataset "
                    f"name, the head's dataset (at most {len(names)}), count and record, "
                    f"then dropped samples and tokens), got {row!r:.120}"
                )
            parsed[lane] = tuple(int(v) for v in row)
        amended = raw.get("amended", [])
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
        return cls(
            index=int(raw["index"]),
            step=int(raw["step"]),
            names=tuple(names),
            streams=tuple(parsed_streams),
            lanes=dict(sorted(parsed.items())),
            amended=tuple(copy.deepcopy(dict(a)) for a in amended),
        )

    def require_lanes(self, lanes: Iterable[int]) -> None:
        """Refuse a section without a row for one of ``lanes``.

        Raises:
            CheckpointError: Naming the lanes.
        """
        absent = sorted(set(lanes) - set(self.lanes))
        if absent:
            raise CheckpointError(f"checkpoint 'stage' has no row for lane(s) {absent}")


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
