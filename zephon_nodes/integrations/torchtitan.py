"""TorchTitan 0.3.0 integration: a ``BaseDataLoader`` whose checkpoint resumes at any dp size.

TorchTitan's trainer builds the loader with ``config.dataloader.build(dp_world_size=,
dp_rank=, tokenizer=, seq_len=, local_batch_size=, snapshot_every_n_steps=)``; it yields
TorchTitan's batch format ``({"input": ..., "positions": ...}, labels)``, one micro-batch of
``local_batch_size`` rows per call, ``G / (R * local_batch_size)`` calls per recipe step.

Checkpoint state goes through TorchTitan's own ``CheckpointManager`` (DCP) as small int64 /
uint8 tensors, never pickled objects (keys below live under ``dataloader.``):

* one key per lane, unique to that lane: ``lane_00003 -> int64[window, consumed, step,
  check]`` (DCP keeps one value per key, so lanes must never share a key); ``check`` is 62
  bits of a SHA-256 over the lane, its position and the replicated fingerprint, lane count,
  step, micro, dp size and micro-batch size, so a flipped bit in any of them is refused;
* replicated keys, identical on every rank: ``zephon_format``, ``num_lanes``, ``step``,
  ``micro``, ``dp_world_size``, ``local_batch_size`` (int64[1]), ``fingerprint``
  (uint8[32]) and one ``recipe_<field>`` per top-level recipe field (int64[kind, value]),
  so a refused resume names the field that changed.

* the decision log of a dynamic mixture (:meth:`ZephonDataLoader.set_mixture`), with room
  for ``max_decisions`` entries: ``mixture_count`` (int64[1]) and ``mixture_log``
  (float64[max_decisions, 1 + D]: the step, then the weights in recipe order; replicated) and
  one ``mixture_lane_00003 -> int64[max_decisions]`` per lane (its effect windows, -1 unused);
  once a decision is made, each lane's check value also covers the decisions it reads (the
  used log rows and its effect windows, :func:`mixture_digest`).

On load, DCP first calls :meth:`ZephonDataLoader.state_dict` on the *new* loader to learn
which keys to read: it lists exactly the lanes this rank owns in the new layout, so a
checkpoint written at dp 2 loads at dp 1, 4, 8, ... (any divisor of ``num_lanes``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torchdata.nodes import BaseNode, Prefetcher
from torchtitan.components.dataloader import BaseDataLoader

from zephon_nodes.engine.checkpoint import FORMAT, fingerprint_pair, validate_state
from zephon_nodes.engine.decisions import (
    MIXTURE_KEY,
    normalize_weights,
    parse_mixture_state,
    with_decision,
)
from zephon_nodes.engine.end_of_data import all_ranks_continue
from zephon_nodes.engine.metrics import StepMetrics, flatten_metrics
from zephon_nodes.engine.multiplexer import Multiplexer
from zephon_nodes.engine.pipeline import Pipeline, lanes_for_rank
from zephon_nodes.engine.pool import RUNNERS, WorkerPool
from zephon_nodes.engine.stages import parse_operator_workers
from zephon_nodes.errors import CheckpointError, RecipeError
from zephon_nodes.io.nodecache.nodecache import parse_size, set_cache_limit
from zephon_nodes.operators.tokenize import load_tokenizer
from zephon_nodes.recipe import Recipe
from zephon_nodes.recipe.bounds import SETTINGS, check_setting
from zephon_nodes.verification.dump import StepDumper

__all__ = [
    "DCP_FORMAT",
    "ZephonDataLoader",
    "check_agreement",
    "check_launch",
    "check_tokenizer",
    "from_dcp_state",
    "lane_check",
    "lane_key",
    "loader_metrics",
    "mixture_digest",
    "mixture_lane_key",
    "to_dcp_state",
]

logger = logging.getLogger(__name__)

DCP_FORMAT = 2
"""Version of the DCP key layout (``zephon_format``); the JSON state inside is ``FORMAT``.

2: lane tensors carry a check value (``[window, consumed, step, check]``).
"""

DCP_FORMAT_RELANED = 3
"""``zephon_format`` of a checkpoint written after a re-lane: layout 2 plus the lineage keys
``lineage_len`` (int64[2]: bytes, check) and ``lineage`` (uint8[max_lineage_bytes], JSON)."""

FORMAT_KEY = "zephon_format"
NUM_LANES_KEY = "num_lanes"
STEP_KEY = "step"
MICRO_KEY = "micro"
DP_KEY = "dp_world_size"
LBS_KEY = "local_batch_size"
FINGERPRINT_KEY = "fingerprint"
RECIPE_PREFIX = "recipe_"
LANE_PREFIX = "lane_"
MIXTURE_COUNT_KEY = "mixture_count"
MIXTURE_LOG_KEY = "mixture_log"
MIXTURE_LANE_PREFIX = "mixture_lane_"
LINEAGE_LEN_KEY = "lineage_len"
LINEAGE_DCP_KEY = "lineage"

_KIND_INT, _KIND_HASH, _KIND_OTHER = 0, 1, 2


# Loaders alive in this process, whose metrics TorchTitan's metrics processor logs.
_LIVE_LOADERS: weakref.WeakSet[ZephonDataLoader] = weakref.WeakSet()
_SERIAL = itertools.count()


def loader_metrics(prefix: str = "zephon") -> dict[str, float]:
    """Metrics of the live :class:`ZephonDataLoader` (training, not validation), flattened.

    Keys are ``zephon/data_wait_s``, ``zephon/operators/tokenize/busy_s``, ...; empty when
    no loader is alive. With several loaders (a validator's too) the first one built (the
    trainer's) is reported.
    """
    loaders = sorted(_LIVE_LOADERS, key=lambda x: x.serial)
    return flatten_metrics(loaders[0].metrics(), prefix) if loaders else {}


def lane_key(lane: int) -> str:
    """Return the DCP key of lane ``lane`` (``lane_00003``)."""
    return f"{LANE_PREFIX}{lane:05d}"


def _scalar(value: int) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.int64)


def _encode_field(value: Any) -> tuple[int, int]:
    """Encode one recipe-summary value as ``(kind, int64)``.

    Integers are stored verbatim (so errors can show both values); the ``sha256:`` digests
    of nested fields keep their 8 bytes; anything else is reduced to 8 bytes of a SHA-256.
    """
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return _KIND_INT, value
    if isinstance(value, str) and value.startswith("sha256:") and len(value) == 23:
        try:
            raw = bytes.fromhex(value[7:])
        except ValueError:
            raw = b""
        if len(raw) == 8:
            return _KIND_HASH, int.from_bytes(raw, "little", signed=True)
    if isinstance(value, str) and value.startswith("sha256(json):") and len(value) == 29:
        # A value decoded by _decode_field from a checkpoint: encode it back unchanged.
        try:
            raw = bytes.fromhex(value[13:])
        except ValueError:
            raw = b""
        if len(raw) == 8:
            return _KIND_OTHER, int.from_bytes(raw, "little", signed=True)
    blob = json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return _KIND_OTHER, int.from_bytes(hashlib.sha256(blob).digest()[:8], "little", signed=True)


def lane_check(
    fingerprint: str,
    lane: int,
    position: tuple[int, int],
    replicated: tuple[int, ...],
    *,
    mixture: str = "",
) -> int:
    """The check value stored with a lane: 62 bits of a SHA-256 (a non-negative int64).

    Args:
        fingerprint: The recipe fingerprint (hex).
        lane: The lane.
        position: The lane's ``(window, consumed)``.
        replicated: ``(num_lanes, step, micro, dp_world_size, local_batch_size)``.
        mixture: :func:`mixture_digest` of the decision log and the lane's effect windows
            ("" when the checkpoint holds no decision).
    """
    text = f"{fingerprint}:{lane}:{position[0]}:{position[1]}:" + ":".join(map(str, replicated))
    if mixture:
        text += f":mixture:{mixture}"
    return int.from_bytes(hashlib.sha256(text.encode("ascii")).digest()[:8], "little") >> 2


def mixture_digest(count: int, table: torch.Tensor, windows: torch.Tensor) -> str:
    """SHA-256 (hex) of the ``count`` decisions a lane reads: log rows and effect windows.

    Covers ``mixture_count``, the first ``count`` rows of ``mixture_log`` (their float64
    bytes) and the first ``count`` entries of the lane's ``mixture_lane_NNNNN``; the unused
    rows are never read. Empty (``""``) when ``count`` is 0, so a checkpoint without
    decisions keeps the check value it had before decisions existed.
    """
    if count <= 0:
        return ""
    h = hashlib.sha256(count.to_bytes(8, "little", signed=True))
    h.update(table[:count].to(torch.float64).contiguous().numpy().tobytes())
    h.update(windows[:count].to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()


def _decode_field(kind: int, value: int) -> Any:
    if kind == _KIND_INT:
        return value
    raw = value.to_bytes(8, "little", signed=True).hex()
    return f"sha256:{raw}" if kind == _KIND_HASH else f"sha256(json):{raw}"


def to_dcp_state(
    state: Mapping[str, Any],
    *,
    dp_world_size: int,
    local_batch_size: int,
    dataset_names: list[str] | None = None,
    max_decisions: int = 0,
    lineage_bytes: int = 0,
) -> dict[str, torch.Tensor]:
    """Convert a :class:`~zephon_nodes.engine.multiplexer.Multiplexer` state to DCP tensors.

    Args:
        state: The rank's JSON-safe multiplexer state.
        dp_world_size: The job's data-parallel size (stored for mid-step states).
        local_batch_size: The rank's micro-batch size (stored for mid-step states).
        dataset_names: The recipe's datasets (order of the stored weights).
        max_decisions: Room for decisions (0: no mixture keys).
        lineage_bytes: Room for a re-lane's lineage (0: no lineage keys; a state with a
            lineage needs room, and is written as ``DCP_FORMAT_RELANED``).

    Returns:
        ``{key: tensor}``: one ``lane_NNNNN`` per lane in ``state`` plus the replicated keys.

    Raises:
        CheckpointError: If the decision log holds more than ``max_decisions`` entries, or
            for a state of a later pass (``ZephonDataLoader`` never starts one; the DCP
            layout has no place for it, and dropping it would resume in pass 0).
    """
    if state.get("pass", 0):
        raise CheckpointError(
            f"the state is in pass {state['pass']} of the recipe's stream; the TorchTitan "
            f"checkpoint layout stores pass 0 only"
        )
    step = int(state["step"])
    lineage = state.get("lineage")
    out: dict[str, torch.Tensor] = {
        FORMAT_KEY: _scalar(DCP_FORMAT if lineage is None else DCP_FORMAT_RELANED),
        NUM_LANES_KEY: _scalar(int(state["num_lanes"])),
        STEP_KEY: _scalar(step),
        MICRO_KEY: _scalar(int(state["micro"])),
        DP_KEY: _scalar(dp_world_size),
        LBS_KEY: _scalar(local_batch_size),
        FINGERPRINT_KEY: torch.frombuffer(
            bytearray(bytes.fromhex(str(state["fingerprint"]))), dtype=torch.uint8
        ).clone(),
    }
    for name, value in sorted(dict(state.get("recipe") or {}).items()):
        out[RECIPE_PREFIX + name] = torch.tensor(_encode_field(value), dtype=torch.int64)
    fp = str(state["fingerprint"])
    replicated = (
        int(state["num_lanes"]),
        step,
        int(state["micro"]),
        dp_world_size,
        local_batch_size,
    )
    digests: dict[int, str] = {}
    if max_decisions > 0:
        names = list(dataset_names or [])
        mixture = state.get(MIXTURE_KEY) or {"log": [], "effects": {}}
        log = mixture["log"]
        if len(log) > max_decisions:
            raise CheckpointError(
                f"the mixture log holds {len(log)} decisions, more than "
                f"dataloader.max_decisions={max_decisions}"
            )
        table = torch.full((max_decisions, 1 + len(names)), -1.0, dtype=torch.float64)
        for k, entry in enumerate(log):
            table[k, 0] = float(entry["step"])
            weights = [float(entry["weights"][n]) for n in names]
            table[k, 1:] = torch.tensor(weights, dtype=torch.float64)
        out[MIXTURE_COUNT_KEY] = _scalar(len(log))
        out[MIXTURE_LOG_KEY] = table
        for key in state["lanes"]:
            windows = torch.full((max_decisions,), -1, dtype=torch.int64)
            eff = mixture["effects"].get(str(key), [])
            windows[: len(eff)] = torch.tensor(eff, dtype=torch.int64)
            out[mixture_lane_key(int(key))] = windows
            digests[int(key)] = mixture_digest(len(log), table, windows)
    for key, (window, consumed) in sorted(state["lanes"].items(), key=lambda kv: int(kv[0])):
        mix = digests.get(int(key), "")
        check = lane_check(fp, int(key), (window, consumed), replicated, mixture=mix)
        out[lane_key(int(key))] = torch.tensor([window, consumed, step, check], dtype=torch.int64)
    if lineage is not None or lineage_bytes > 0:
        out.update(_lineage_to_dcp(lineage, lineage_bytes))
    return out


def _lineage_check(blob: bytes) -> int:
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") >> 2


def _lineage_to_dcp(lineage: Any, room: int) -> dict[str, torch.Tensor]:
    """The lineage keys: its JSON bytes (zero-padded to ``room``) and [length, check]."""
    blob = b""
    if lineage is not None:
        blob = json.dumps(lineage, sort_keys=True, separators=(",", ":")).encode("ascii")
    if len(blob) > room:
        raise CheckpointError(
            f"the re-lane lineage takes {len(blob)} bytes, more than dataloader."
            f"max_lineage_bytes={room}; raise it (and keep it for every later resume)"
        )
    data = torch.zeros(room, dtype=torch.uint8)
    if blob:
        data[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    meta = torch.tensor([len(blob), _lineage_check(blob)], dtype=torch.int64)
    return {LINEAGE_LEN_KEY: meta, LINEAGE_DCP_KEY: data}


def _lineage_from_dcp(sd: Mapping[str, Any], room: int) -> Any:
    """Read (and check) the lineage keys; None when they hold no lineage."""
    n, check = _as_ints(sd, LINEAGE_LEN_KEY, 2)
    data = sd.get(LINEAGE_DCP_KEY)
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.numel() != room:
        raise CheckpointError(
            f"dataloader.{LINEAGE_DCP_KEY}: expected uint8[{room}] (dataloader."
            f"max_lineage_bytes), got {data!r:.80}"
        )
    if not 0 <= n <= room:
        raise CheckpointError(f"dataloader.{LINEAGE_LEN_KEY}: length {n} is out of range")
    blob = bytes(data[:n].tolist())
    if check != _lineage_check(blob) or bool(data[n:].any()):
        raise CheckpointError(
            f"dataloader.{LINEAGE_DCP_KEY}: check value mismatch or non-zero padding (the "
            f"re-lane lineage or {LINEAGE_LEN_KEY} was damaged or edited after saving)"
        )
    if not n:
        return None
    try:
        return json.loads(blob.decode("ascii"))
    except ValueError as e:
        raise CheckpointError(f"dataloader.{LINEAGE_DCP_KEY}: not a lineage ({e})") from None


def mixture_lane_key(lane: int) -> str:
    """Return the DCP key of lane ``lane``'s decision effect windows."""
    return f"{MIXTURE_LANE_PREFIX}{lane:05d}"


def _mixture_from_dcp(
    sd: Mapping[str, Any], names: list[str], lanes: list[int], max_decisions: int
) -> dict[str, Any] | None:
    """Read the decision log back from DCP tensors (None when there is none)."""
    if MIXTURE_COUNT_KEY not in sd:
        return None
    (count,) = _as_ints(sd, MIXTURE_COUNT_KEY, 1)
    table = sd.get(MIXTURE_LOG_KEY)
    shape = (max_decisions, 1 + len(names))
    if not isinstance(table, torch.Tensor) or tuple(table.shape) != shape:
        raise CheckpointError(
            f"dataloader.{MIXTURE_LOG_KEY}: expected a float64 tensor of shape {shape}, got "
            f"{table!r:.80}"
        )
    if not 0 <= count <= max_decisions:
        raise CheckpointError(f"dataloader.{MIXTURE_COUNT_KEY}={count} is out of range")
    if count == 0:
        return None
    rows = table.to(torch.float64).tolist()
    log = [
        {"step": int(row[0]), "weights": dict(zip(names, row[1:], strict=True))}
        for row in rows[:count]
    ]
    effects = {}
    for lane in lanes:
        effects[str(lane)] = _as_ints(sd, mixture_lane_key(lane), max_decisions)[:count]
    return {"log": log, "effects": effects}


def _stored_mixture_digest(sd: Mapping[str, Any], lane: int, max_decisions: int) -> str:
    """:func:`mixture_digest` of the loaded ``mixture_*`` tensors, for ``lane``'s check."""
    (count,) = _as_ints(sd, MIXTURE_COUNT_KEY, 1)
    if not 0 <= count <= max_decisions:
        raise CheckpointError(f"dataloader.{MIXTURE_COUNT_KEY}={count} is out of range")
    table = sd.get(MIXTURE_LOG_KEY)
    if not isinstance(table, torch.Tensor) or table.dtype != torch.float64:
        raise CheckpointError(
            f"dataloader.{MIXTURE_LOG_KEY}: expected a float64 tensor, got {table!r:.80}"
        )
    windows = torch.tensor(_as_ints(sd, mixture_lane_key(lane), max_decisions), dtype=torch.int64)
    return mixture_digest(count, table, windows)


def _as_ints(sd: Mapping[str, Any], key: str, n: int) -> list[int]:
    value = sd.get(key)
    if not isinstance(value, torch.Tensor) or value.dtype != torch.int64 or value.numel() != n:
        raise CheckpointError(
            f"dataloader.{key}: expected an int64 tensor of {n} value(s), got {value!r:.80}"
        )
    return [int(v) for v in value.reshape(-1).tolist()]


def _recipe_diff(sd: Mapping[str, Any], summary: Mapping[str, Any]) -> list[str]:
    """Name the recipe fields whose stored encoding differs from the running recipe's."""
    saved = {k[len(RECIPE_PREFIX) :] for k in sd if k.startswith(RECIPE_PREFIX)}
    out = []
    for name in sorted(saved | set(summary)):
        if name not in saved:
            out.append(f"{name}: absent from the checkpoint")
            continue
        kind, value = _as_ints(sd, RECIPE_PREFIX + name, 2)
        if name not in summary:
            out.append(f"{name}: in the checkpoint, absent from this recipe")
            continue
        now_kind, now_value = _encode_field(summary[name])
        if (kind, value) != (now_kind, now_value):
            if kind == now_kind == _KIND_INT:
                out.append(f"{name}: checkpoint has {value}, recipe has {now_value}")
            else:
                out.append(f"{name} differs")
    return out


def from_dcp_state(
    sd: Mapping[str, Any],
    pipeline: Pipeline,
    lanes: list[int],
    *,
    dp_world_size: int,
    local_batch_size: int,
    max_decisions: int = 0,
    lineage_bytes: int = 0,
) -> dict[str, Any]:
    """Convert loaded DCP tensors back to a JSON-safe multiplexer state for ``lanes``.

    Args:
        sd: The dataloader's part of the checkpoint (as filled in by DCP).
        pipeline: The running recipe.
        lanes: Lanes this rank owns now.
        dp_world_size: This job's data-parallel size.
        local_batch_size: This job's micro-batch size.
        max_decisions: Room for decisions in the mixture keys (0: none stored).
        lineage_bytes: Room of the lineage keys (0: the checkpoint must have none).

    Raises:
        CheckpointError: If the checkpoint is not a zephon-nodes one, was written with
            another recipe (naming the fields that differ), holds inconsistent steps, or was
            taken in the middle of a step on another layout.
    """
    if FORMAT_KEY not in sd:
        raise CheckpointError(
            "the checkpoint's dataloader state has no 'zephon_format' key: it was not "
            "written by ZephonDataLoader (was it TorchTitan's default loader?)"
        )
    (fmt,) = _as_ints(sd, FORMAT_KEY, 1)
    if fmt == DCP_FORMAT_RELANED and not lineage_bytes:
        raise CheckpointError(
            f"the checkpoint was written after a re-lane (zephon_format={fmt}: it carries the "
            f"lineage of its data stream); resume it with dataloader.relaned = true and the "
            f"job's dataloader.max_lineage_bytes"
        )
    if fmt not in (DCP_FORMAT, DCP_FORMAT_RELANED):
        raise CheckpointError(f"dataloader state has zephon_format={fmt}, expected {DCP_FORMAT}")
    fp = sd.get(FINGERPRINT_KEY)
    if not isinstance(fp, torch.Tensor) or fp.dtype != torch.uint8 or fp.numel() != 32:
        raise CheckpointError(f"dataloader.fingerprint: expected uint8[32], got {fp!r:.80}")
    fingerprint = bytes(fp.tolist()).hex()
    if fingerprint != pipeline.fingerprint:
        diffs = _recipe_diff(sd, pipeline.summary)
        detail = (
            "; ".join(diffs)
            if diffs
            else (
                "every recipe field recorded in the checkpoint matches, so the fingerprint itself "
                "was altered (a damaged or edited checkpoint)"
            )
        )
        (saved_lanes,) = _as_ints(sd, NUM_LANES_KEY, 1)
        if saved_lanes != pipeline.recipe.num_lanes:
            detail += (
                f" (to re-lane this checkpoint to num_lanes={pipeline.recipe.num_lanes}, "
                f"every document still used once: dataloader.relane_from = {saved_lanes})"
            )
        raise CheckpointError(
            f"the checkpoint was written with a different recipe (fingerprint "
            f"{fingerprint_pair(fingerprint, pipeline.fingerprint)}): {detail}"
        )
    (num_lanes,) = _as_ints(sd, NUM_LANES_KEY, 1)
    (step,) = _as_ints(sd, STEP_KEY, 1)
    (micro,) = _as_ints(sd, MICRO_KEY, 1)
    (saved_dp,) = _as_ints(sd, DP_KEY, 1)
    (saved_lbs,) = _as_ints(sd, LBS_KEY, 1)
    stored_mixture = max_decisions > 0 and MIXTURE_COUNT_KEY in sd
    positions: dict[str, list[int]] = {}
    for lane in lanes:
        key = lane_key(lane)
        if key not in sd:
            raise CheckpointError(f"the checkpoint has no state for lane {lane} ({key})")
        window, consumed, lane_step, check = _as_ints(sd, key, 4)
        if lane_step != step:
            raise CheckpointError(
                f"lane {lane} was saved at step {lane_step}, the checkpoint is at step {step}"
            )
        replicated = (num_lanes, step, micro, saved_dp, saved_lbs)
        mix = _stored_mixture_digest(sd, lane, max_decisions) if stored_mixture else ""
        if check != lane_check(fingerprint, lane, (window, consumed), replicated, mixture=mix):
            if mix:
                what = (
                    f", or the decision log ({MIXTURE_COUNT_KEY}, {MIXTURE_LOG_KEY}, "
                    f"{mixture_lane_key(lane)})"
                )
            elif stored_mixture:
                what = f" (or {MIXTURE_COUNT_KEY}, now 0)"
            else:
                what = (
                    " (if the checkpoint holds set_mixture decisions: this loader has "
                    "dataloader.max_decisions=0 and does not read them)"
                )
            raise CheckpointError(
                f"dataloader.{key}: check value mismatch: the lane's position [{window}, "
                f"{consumed}] or the replicated num_lanes/step/micro/dp_world_size/"
                f"local_batch_size {list(replicated)}{what} were damaged or edited after saving"
            )
        positions[str(lane)] = [window, consumed]
    state: dict[str, Any] = {
        "format": FORMAT,
        "fingerprint": fingerprint,
        "recipe": {
            k[len(RECIPE_PREFIX) :]: _decode_field(*_as_ints(sd, k, 2))
            for k in sorted(sd)
            if k.startswith(RECIPE_PREFIX)
        },
        "num_lanes": num_lanes,
        "step": step,
        "micro": micro,
        "lanes": positions,
    }
    if lineage_bytes > 0:
        lineage = _lineage_from_dcp(sd, lineage_bytes)
        if lineage is not None:
            state["lineage"] = lineage
    if max_decisions > 0:
        names = [d.name for d in pipeline.recipe.datasets]
        mixture = _mixture_from_dcp(sd, names, lanes, max_decisions)
        if mixture is not None:
            state[MIXTURE_KEY] = mixture
    if micro:
        if (saved_dp, saved_lbs) != (dp_world_size, local_batch_size):
            raise CheckpointError(
                f"the checkpoint was taken after micro-batch {micro} of step {step + 1} (the "
                f"trainer's global batch is not a multiple of the recipe's global_batch_size="
                f"{pipeline.recipe.global_batch_size}); it resumes only at dp_world_size="
                f"{saved_dp} and local_batch_size={saved_lbs}, this job has "
                f"{dp_world_size=} and {local_batch_size=}"
            )
        state["layout"] = {"lanes": list(lanes), "local_batch_size": saved_lbs}
    return state


def check_agreement(step: int, index: int, weights: Mapping[str, float], group: Any = None) -> None:
    """Check that every rank of ``group`` makes decision ``index`` after ``step`` alike.

    One ``all_gather`` of ``2 + D`` float64 values; nothing happens when
    ``torch.distributed`` is not initialized.

    Raises:
        RecipeError: Naming a rank that disagrees and both weight sets (and steps).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    names = list(weights)
    mine = torch.tensor([float(step), float(index), *weights.values()], dtype=torch.float64)
    if dist.get_backend(group) == "nccl":
        mine = mine.to(torch.device("cuda", torch.cuda.current_device()))
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    me = dist.get_rank(group)
    for rank, theirs in enumerate(gathered):
        if not torch.equal(theirs.cpu(), mine.cpu()):
            t = theirs.cpu().tolist()
            raise RecipeError(
                f"ranks disagree on mixture decision {index}: rank {me} decided "
                f"{dict(weights)} after step {step}, rank {rank} decided "
                f"{dict(zip(names, t[2:], strict=True))} after step {int(t[0])} (decision "
                f"{int(t[1])}); every rank must call set_mixture with the same weights "
                f"after the same step"
            )


def check_launch(
    recipe: Recipe, *, dp_world_size: int, dp_rank: int, seq_len: int, local_batch_size: int
) -> None:
    """Check that a TorchTitan job's geometry fits the recipe; say what to change if not.

    Raises:
        RecipeError: Naming the TorchTitan option or recipe field to change.
    """
    L, G = recipe.num_lanes, recipe.global_batch_size
    check_setting("dp_world_size", dp_world_size)
    check_setting("training.local_batch_size", local_batch_size, bound=SETTINGS["local_batch_size"])
    check_setting("training.seq_len", seq_len, bound=SETTINGS["seq_len"])
    if dp_world_size < 1 or not 0 <= dp_rank < dp_world_size:
        raise RecipeError(f"{dp_rank=} must be in [0, {dp_world_size=})")
    if L % dp_world_size:
        divisors = [d for d in range(1, L + 1) if L % d == 0]
        raise RecipeError(
            f"the recipe's num_lanes={L} must be a multiple of the data-parallel size "
            f"{dp_world_size=} (dp_replicate x dp_shard): run at a dp size in {divisors}, or "
            f"write a new recipe whose num_lanes is a common multiple of every dp size you "
            f"plan to use (a new num_lanes is a new data stream)"
        )
    if G % L:
        raise RecipeError(f"the recipe's global_batch_size={G} must be a multiple of num_lanes={L}")
    share = G // dp_world_size
    if local_batch_size < 1 or share % local_batch_size:
        ok = [b for b in range(1, share + 1) if share % b == 0]
        raise RecipeError(
            f"each rank takes global_batch_size / dp_world_size = {G} / {dp_world_size} = "
            f"{share} samples per step, which must be a multiple of training.local_batch_size="
            f"{local_batch_size}: set --training.local-batch-size to one of {ok} and "
            f"--training.global-batch-size {G}"
        )
    if seq_len != recipe.seq_len:
        raise RecipeError(
            f"training.seq_len={seq_len} but the recipe's seq_len={recipe.seq_len}: set "
            f"--training.seq-len {recipe.seq_len} (seq_len is part of the recipe)"
        )


def check_tokenizer(recipe: Recipe, tokenizer: Any) -> None:
    """Refuse a TorchTitan tokenizer that does not describe the recipe's vocabulary.

    The recipe's tokenizer produces every token id the loader yields; TorchTitan's
    tokenizer (built from ``--hf-assets-path``) is not used by the loader. They must be
    the same vocabulary: equal vocabulary size, and equal bos/eos ids where TorchTitan's
    tokenizer defines them.

    Raises:
        RecipeError: Naming the first property that differs.
    """
    if tokenizer is None:
        return
    ours = load_tokenizer(recipe.tokenizer)
    where = f"recipe tokenizer ({recipe.tokenizer.kind}"
    where += f" {recipe.tokenizer.path})" if recipe.tokenizer.path else ")"
    theirs_vocab = None
    if hasattr(tokenizer, "get_vocab_size"):
        theirs_vocab = int(tokenizer.get_vocab_size())
    if theirs_vocab is not None and theirs_vocab != ours.vocab_size:
        raise RecipeError(
            f"TorchTitan's tokenizer (--hf-assets-path) has vocab_size={theirs_vocab}, the "
            f"{where} has {ours.vocab_size}: both must be the same vocabulary (the recipe's "
            f"tokenizer produces the ids; TorchTitan's describes them to the model)"
        )
    for name in ("bos_id", "eos_id"):
        theirs = getattr(tokenizer, name, None)
        if theirs is not None and int(theirs) != int(getattr(ours, name)):
            raise RecipeError(
                f"TorchTitan's tokenizer has {name}={theirs}, the {where} has "
                f"{name}={getattr(ours, name)}: both must be the same vocabulary"
            )


class ZephonDataLoader(BaseDataLoader):
    """TorchTitan dataloader over a zephon-nodes recipe: same global batches at any dp size.

    Built by TorchTitan's trainer through ``config.dataloader.build(...)``. Each call of the
    iterator returns one micro-batch ``({"input", "positions"}, labels)`` of
    ``local_batch_size`` rows; the ``G / dp_world_size`` rows of a rank per recipe step come
    from the lanes it owns (a contiguous block of ``num_lanes / dp_world_size``).

    Args:
        config: The loader's settings (recipe path and physical settings).
        dp_world_size: Data-parallel size (TorchTitan's batch mesh).
        dp_rank: This rank's data-parallel index.
        tokenizer: TorchTitan's tokenizer; checked against the recipe's (see
            :func:`check_tokenizer`), never used to tokenize.
        seq_len: ``training.seq_len``; must equal the recipe's.
        local_batch_size: Rows per micro-batch (``training.local_batch_size``).
        snapshot_every_n_steps: Accepted for TorchTitan; unused (the state is always exact).

    Raises:
        RecipeError: If the recipe cannot be loaded or does not fit the job (messages say
            what to change).
    """

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        """Settings of :class:`ZephonDataLoader`: the recipe, then physical settings only."""

        recipe: str = ""
        """Path of the zephon-nodes recipe TOML that defines the data (required)."""

        num_workers: int = 2
        """Worker threads or processes shared by this rank's lanes (0 runs inline)."""

        runner: Literal["thread", "process", "ray"] = "thread"
        """Where operators run: threads (GIL-releasing tokenizers), spawned processes, or Ray
        tasks on a Ray cluster (``RAY_ADDRESS``; needs the ``ray`` extra)."""

        lookahead: int = 4
        """Work items each lane submits to the workers ahead of the one it reads."""

        operator_workers: str = ""
        """Per-operator pools, e.g. ``"decode=process:6,tokenize=thread:2"`` (default: none,
        every operator on the shared pool); created and closed by this loader."""

        prefetch: int = 2
        """Micro-batches prepared ahead in a background thread (0 disables prefetching)."""

        worker_timeout_s: float = 300.0
        """Longest wait for one work item before the loader raises WorkerError."""

        check_tokenizer: bool = True
        """Refuse a TorchTitan tokenizer whose vocab size or bos/eos ids differ."""

        infinite: bool = True
        """Set by TorchTitan's validator; False refuses an endless recipe (work.epochs='inf')."""

        cache_limit: str = ""
        """Node cache size shared by the node's ranks, e.g. "50G" (sets ZEPHON_CACHE_LIMIT;
        empty: that variable, or no cache). Physical: never changes a batch."""

        max_decisions: int = 256
        """Room for set_mixture decisions in the checkpoint (fixed-shape DCP tensors)."""

        dump_batches: str = ""
        """Folder for this rank's rows of every step (step-S.rank-R.npz; zephon digest-dump)."""

        relane_from: int = 0
        """Lane count of the checkpoint to re-lane at load (0: never; docs/lanes.md)."""

        relaned: bool = False
        """The checkpoint to load was written after a re-lane (it carries a lineage)."""

        max_lineage_bytes: int = 65536
        """Room for a re-lane's lineage in the checkpoint (about 12 bytes per old lane)."""

        def __post_init__(self) -> None:
            for name in ("num_workers", "lookahead", "prefetch", "worker_timeout_s"):
                check_setting(f"dataloader.{name}", getattr(self, name), bound=SETTINGS[name])
            if self.runner not in RUNNERS:
                raise RecipeError(f"dataloader.runner={self.runner!r} must be one of {RUNNERS}")
            if self.lookahead < 1:
                raise RecipeError(f"dataloader.lookahead={self.lookahead} must be >= 1")
            try:
                parse_operator_workers(self.operator_workers)
            except RecipeError as e:
                raise RecipeError(f"dataloader.operator_workers: {e}") from None
            if self.prefetch < 0:
                raise RecipeError(f"dataloader.prefetch={self.prefetch} must be >= 0")
            if self.cache_limit:
                try:
                    parse_size(self.cache_limit)
                except ValueError as e:
                    raise RecipeError(f"dataloader.cache_limit: {e}") from None
            if self.max_decisions < 0:
                raise RecipeError(f"dataloader.max_decisions={self.max_decisions} must be >= 0")
            if self.relane_from < 0 or self.max_lineage_bytes < 0:
                raise RecipeError(
                    f"dataloader.relane_from={self.relane_from} and dataloader."
                    f"max_lineage_bytes={self.max_lineage_bytes} must be >= 0"
                )
            if not self.worker_timeout_s > 0:
                raise RecipeError(
                    f"dataloader.worker_timeout_s={self.worker_timeout_s} must be > 0"
                )

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: Any = None,
        seq_len: int,
        local_batch_size: int,
        snapshot_every_n_steps: int | None = None,
    ) -> None:
        if not config.recipe:
            raise RecipeError("ZephonDataLoader needs a recipe: set --dataloader.recipe PATH.toml")
        if config.dataset or config.dataset_path:
            raise RecipeError(
                f"ZephonDataLoader reads the data named by its recipe; dataloader.dataset="
                f"{config.dataset!r} and dataloader.dataset_path={config.dataset_path!r} "
                f"are not used: leave them empty and put the data in {config.recipe}"
            )
        self.config = config
        recipe = Recipe.from_toml(config.recipe)
        check_launch(
            recipe,
            dp_world_size=dp_world_size,
            dp_rank=dp_rank,
            seq_len=seq_len,
            local_batch_size=local_batch_size,
        )
        if config.check_tokenizer:
            check_tokenizer(recipe, tokenizer)
        if not config.infinite and recipe.work.epochs is None:
            raise RecipeError(
                f"dataloader.infinite=False (TorchTitan's validator with validator.steps=-1 "
                f"reads until the data ends) but recipe {config.recipe} never ends "
                f"(work.epochs = 'inf'): set --validator.steps, or give the validator a recipe "
                f"with a finite work.epochs"
            )
        if config.infinite and recipe.work.epochs is not None:
            logger.info(
                "recipe %s ends after %d epoch(s) (work.epochs); set work.epochs = 'inf' "
                "for an endless stream",
                config.recipe,
                recipe.work.epochs,
            )
        self.dp_world_size = dp_world_size
        self.dp_rank = dp_rank
        self.local_batch_size = local_batch_size
        if config.cache_limit:
            set_cache_limit(config.cache_limit)
        self.pipeline = Pipeline(recipe)
        self.lanes = lanes_for_rank(recipe.num_lanes, dp_world_size, dp_rank)
        self.pool = WorkerPool(config.num_workers, config.runner, config.worker_timeout_s)
        self._build_node()
        self._dumper = (
            StepDumper(config.dump_batches, dp_rank, self.multiplexer.micro_per_step)
            if config.dump_batches
            else None
        )
        self._state: dict[str, Any] = self._fresh_state()
        self._restore: dict[str, Any] | None = None
        self._started = False
        self._loaded = False
        self._dataset_ids: list[torch.Tensor] = []
        # What the trainer got and how long it waited, per step (after the prefetcher).
        self._steps = StepMetrics()
        self._step_batches: list[dict[str, torch.Tensor]] = []
        self._step_wait = 0.0
        # A finite stream ends where some rank's lane runs dry: ranks agree on that step.
        self._finite = (
            recipe.work.epochs is not None
            and any(d.on_exhausted == "end" for d in recipe.datasets)
            and not recipe.wraps
        )
        self.serial = next(_SERIAL)
        _LIVE_LOADERS.add(self)

    def _build_node(self) -> None:
        """Build this rank's multiplexer (and prefetcher) over ``self.pipeline``."""
        config = self.config
        self.multiplexer: Multiplexer = self.pipeline.rank_node(
            self.dp_world_size,
            self.dp_rank,
            local_batch_size=self.local_batch_size,
            pool=self.pool,
            lanes=self.lanes,
            lookahead=config.lookahead,
            operator_pools=parse_operator_workers(config.operator_workers),
        )
        self.multiplexer.own([self.pool])  # a loader dropped without close() stops it too
        self._node: BaseNode[dict[str, torch.Tensor]] = (
            Prefetcher(self.multiplexer, config.prefetch)
            if config.prefetch > 0
            else self.multiplexer
        )

    def _read_relaned(self, state: dict[str, Any]) -> None:
        """Switch to the re-laned streams of ``state`` (rebuilding this rank's nodes)."""
        from zephon_nodes.engine.relane import for_state

        pipeline = for_state(self.pipeline, state)
        if pipeline is self.pipeline:
            return
        old = self.multiplexer
        self.pipeline = pipeline
        self._build_node()
        old._owned[:] = [r for r in old._owned if r is not self.pool]
        old.close()  # its per-operator pools; the shared pool serves the new node

    def _lineage_room(self, state: Mapping[str, Any]) -> int:
        relaned = state.get("lineage") is not None or self.config.relaned
        return self.config.max_lineage_bytes if relaned else 0

    def _relane_template(self) -> dict[str, Any]:
        """The keys of the checkpoint ``dataloader.relane_from`` names: all its old lanes."""
        from zephon_nodes.engine.relane import pipeline_at

        old = pipeline_at(self.pipeline, self.config.relane_from)
        return {
            "format": FORMAT,
            "fingerprint": old.fingerprint,
            "recipe": dict(old.summary),
            "num_lanes": old.num_lanes,
            "step": 0,
            "micro": 0,
            "lanes": {str(i): [0, 0] for i in range(old.num_lanes)},
        }

    def cache_stats(self) -> dict[str, int] | None:
        """Return the node cache's counters in this process, or None without a cache limit.

        Keys: hits, misses, bytes_fetched, evictions, peak_bytes, limit_bytes and more (see
        :meth:`~zephon_nodes.io.nodecache.nodecache.NodeCache.stats`); log them with your metrics.
        """
        return self.pipeline.cache_stats()

    def _fresh_state(self) -> dict[str, Any]:
        p = self.pipeline
        return {
            "format": FORMAT,
            "fingerprint": p.fingerprint,
            "recipe": dict(p.summary),
            "num_lanes": p.num_lanes,
            "step": 0,
            "micro": 0,
            "lanes": {str(i): [0, 0] for i in self.lanes},
        }

    def _start(self) -> None:
        if self.config.relane_from and not self._loaded:
            raise CheckpointError(
                f"dataloader.relane_from={self.config.relane_from} but no checkpoint was "
                f"loaded: there is nothing to re-lane (unset it to start afresh)"
            )
        state = self._restore
        if isinstance(self._node, Prefetcher):
            snap = None if state is None else {"snapshot": state, "steps_since_snapshot": 0}
            self._node.reset(snap)
        else:
            self._node.reset(state)
        self._restore = None
        self._started = True

    def _current_state(self) -> dict[str, Any]:
        if isinstance(self._node, Prefetcher):
            st = self._node.get_state()
            if st.get("steps_since_snapshot", 0) != 0:  # never with snapshot_frequency=1
                raise CheckpointError("prefetcher state is not at a snapshot")
            return dict(st["snapshot"])
        return self.multiplexer.get_state()

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        """Yield micro-batches, continuing where the last iteration (or checkpoint) stopped."""
        while True:
            if not self._started or self._restore is not None:
                self._start()  # at the start, after a load, or after set_mixture
            t0 = time.perf_counter()
            step_start = self._state["micro"] == 0
            try:
                batch: dict[str, torch.Tensor] | None = next(self._node)
            except StopIteration:
                batch = None
            if step_start and self._finite and not all_ranks_continue(batch is not None):
                # Another rank's lanes ran dry: every rank stops after the same step.
                logger.info("the data ended after step %d (on every rank)", self._state["step"])
                return
            if batch is None:
                return
            self._state = self._current_state()
            if "dataset_ids" in batch:
                self._dataset_ids.append(batch["dataset_ids"])
                del self._dataset_ids[:-1024]
            self._count(batch, time.perf_counter() - t0)
            if self._dumper is not None:
                step, micro = self._state["step"], self._state["micro"]
                index = (micro - 1) % self.multiplexer.micro_per_step
                self._dumper.add(step if micro == 0 else step + 1, index, batch)
            yield {"input": batch["input"], "positions": batch["positions"]}, batch["labels"]

    def _count(self, batch: dict[str, torch.Tensor], wait_s: float) -> None:
        self._step_batches.append(batch)
        self._step_wait += wait_s
        if self._state["micro"] == 0:  # the step's last micro-batch
            self._steps.step(self._step_batches, self._step_wait)
            self._step_batches, self._step_wait = [], 0.0

    def metrics(self) -> dict[str, Any]:
        """Return the rank's run metrics (a plain dict; see ``docs/torchtitan.md``).

        As :meth:`~zephon_nodes.Multiplexer.metrics` (operators, queues, skipped records,
        replay time), but the per-step numbers are those of the steps the trainer took:
        ``step`` is the last step fully handed out, ``data_wait_s`` the time the trainer
        waited for its micro-batches (after the prefetcher), ``samples``, ``tokens`` and
        ``padding_fraction`` its rows.
        """
        out = self.multiplexer.metrics()
        st = self._steps
        out.update(
            step=int(self._state["step"]),
            data_wait_s=st.wait_s,
            samples=st.samples,
            tokens=st.tokens,
            padding_fraction=st.padding_fraction,
            data_wait_s_total=st.total_wait_s,
            samples_total=st.total_samples,
            tokens_total=st.total_tokens,
        )
        return out

    def pop_dataset_ids(self) -> list[torch.Tensor]:
        """Return the ``dataset_ids`` of the micro-batches yielded since the last call.

        Each is int64 ``[local_batch_size, seq_len]``: the recipe dataset index of every
        label token, -1 on padding. TorchTitan passes every ``input_dict`` key to the
        model, so the loader keeps this field aside for controllers (per-domain loss).
        """
        out, self._dataset_ids = self._dataset_ids, []
        return out

    @property
    def mixture_log(self) -> list[tuple[int, dict[str, float]]]:
        """The decisions made so far: ``[(step, {dataset: weight}), ...]`` (normalized)."""
        state = self._restore if self._restore is not None else self._state
        log = (state.get(MIXTURE_KEY) or {}).get("log", [])
        return [(int(e["step"]), dict(e["weights"])) for e in log]

    def set_mixture(self, weights: Mapping[str, float], *, group: Any = None) -> None:
        """Change the mixture after the step just consumed (call between steps).

        The decision ``(step, weights)`` joins the log kept in the checkpoint and takes
        effect in each lane from the first flush window after the lane's position at this
        step (see :mod:`zephon_nodes.engine.decisions`); micro-batches prefetched under the
        old weights are thrown away and recomputed. With ``torch.distributed`` initialized,
        one all-gather on ``group`` (default: the whole job; pass the data-parallel group)
        checks that every rank makes the same decision at the same step.

        Args:
            weights: ``{dataset: weight}`` for every recipe dataset (0 pauses one);
                renormalized.
            group: Process group to check agreement on.

        Raises:
            RecipeError: On an unknown or missing dataset, a bad weight, a call in the
                middle of a step, a full log (``dataloader.max_decisions``), or when ranks
                disagree (naming both weight sets).
        """
        refuse = getattr(self.pipeline.work_source, "refuse_decisions", None)  # re-laned
        if refuse is not None:
            refuse()
        names = [d.name for d in self.pipeline.recipe.datasets]
        normalized = normalize_weights(names, weights, where="ZephonDataLoader.set_mixture")
        state = self._restore if self._restore is not None else self._state
        log = (state.get(MIXTURE_KEY) or {}).get("log", [])
        if len(log) >= self.config.max_decisions:
            raise RecipeError(
                f"set_mixture: the decision log is full ({len(log)} decisions, "
                f"dataloader.max_decisions={self.config.max_decisions}); raise it"
            )
        check_agreement(int(state["step"]), len(log), normalized, group)
        new = with_decision(state, normalized)
        self._restore = new
        self._state = new

    def state_dict(self) -> dict[str, Any]:
        """Return the checkpoint: one ``lane_NNNNN`` tensor per owned lane + replicated keys.

        On a freshly built loader this is a placeholder of the right keys and shapes for the
        lanes this rank owns, which is what DCP needs to load a checkpoint written at
        another dp size.
        """
        state = self._restore if self._restore is not None else self._state
        if self.config.relane_from and not self._started and self._restore is None:
            state = self._relane_template()  # what DCP reads: the old checkpoint's keys
        if state["micro"]:
            logger.warning(
                "checkpoint taken after micro-batch %d of a recipe step: TorchTitan's "
                "training.global_batch_size is not a multiple of the recipe's "
                "global_batch_size=%d, so this checkpoint resumes only on the same dp size "
                "and local batch size",
                state["micro"],
                self.pipeline.recipe.global_batch_size,
            )
        return to_dcp_state(
            state,
            dp_world_size=self.dp_world_size,
            local_batch_size=self.local_batch_size,
            dataset_names=[d.name for d in self.pipeline.recipe.datasets],
            max_decisions=self.config.max_decisions,
            lineage_bytes=self._lineage_room(state),
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from a checkpoint written at any dp size with the same recipe.

        The state is validated here (so a mismatch fails at load time); the lanes replay
        their flush windows when iteration starts.

        Raises:
            CheckpointError: Naming what differs (recipe fields, lanes, step, layout).
        """
        if not state_dict:
            return
        self._loaded = True
        room = self.config.max_lineage_bytes if self.config.relaned else 0
        if self.config.relane_from:
            state = self._relane(state_dict, room)
        else:
            state = from_dcp_state(
                state_dict,
                self.pipeline,
                self.lanes,
                dp_world_size=self.dp_world_size,
                local_batch_size=self.local_batch_size,
                max_decisions=self.config.max_decisions,
                lineage_bytes=room,
            )
            self._read_relaned(state)
        p = self.pipeline
        validate_state(
            state,
            fingerprint=p.fingerprint,
            summary=p.summary,
            num_lanes=p.num_lanes,
            lanes=self.lanes,
            samples_per_lane=p.recipe.samples_per_lane,
        )
        parse_mixture_state(
            state.get(MIXTURE_KEY),
            [d.name for d in p.recipe.datasets],
            self.lanes,
            int(state["step"]),
        )
        self._restore = state
        self._state = state

    def _relane(self, state_dict: dict[str, Any], room: int) -> dict[str, Any]:
        """Re-lane the loaded checkpoint of ``dataloader.relane_from`` lanes (every rank alike)."""
        from zephon_nodes.engine.relane import pipeline_at, relane_state

        old_lanes = self.config.relane_from
        old = pipeline_at(self.pipeline, old_lanes)
        saved = from_dcp_state(
            state_dict,
            old,
            list(range(old_lanes)),
            dp_world_size=self.dp_world_size,
            local_batch_size=self.local_batch_size,
            max_decisions=self.config.max_decisions,
            lineage_bytes=room,
        )
        new = relane_state(self.pipeline, saved, self.pipeline.num_lanes)
        logger.warning(
            "dataloader.relane_from=%d: re-laned the checkpoint of step %d from %d to %d lanes "
            "(each new lane first replays the rest of its old lanes' flush windows, then takes "
            "the untouched work items; no document lost or repeated). Checkpoints from now on "
            "carry the lineage: resume them with dataloader.relane_from = 0 and "
            "dataloader.relaned = true",
            old_lanes,
            new["step"],
            old_lanes,
            new["num_lanes"],
        )
        self._read_relaned(new)
        new["lanes"] = {str(i): new["lanes"][str(i)] for i in self.lanes}
        return new

    def close(self) -> None:
        """Stop the worker pools."""
        self.multiplexer.close()
        self.pool.close()
