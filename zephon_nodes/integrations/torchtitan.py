"""TorchTitan 0.3.0 integration: a ``BaseDataLoader`` whose checkpoint resumes at any dp size.

TorchTitan's trainer builds the loader with ``config.dataloader.build(dp_world_size=,
dp_rank=, tokenizer=, seq_len=, local_batch_size=, snapshot_every_n_steps=)``; it yields
TorchTitan's batch format ``({"input": ..., "positions": ...}, labels)``, one micro-batch of
``local_batch_size`` rows per call, ``G / (R * local_batch_size)`` calls per recipe step.

Checkpoint state goes through TorchTitan's own ``CheckpointManager`` (DCP) as small int64 /
uint8 tensors, never pickled objects (keys below live under ``dataloader.``):

* one key per lane, unique to that lane: ``lane_00003 -> int64[window, consumed, step]``
  (DCP keeps one value per key, so lanes must never share a key);
* replicated keys, identical on every rank: ``zephon_format``, ``num_lanes``, ``step``,
  ``micro``, ``dp_world_size``, ``local_batch_size`` (int64[1]), ``fingerprint``
  (uint8[32]) and one ``recipe_<field>`` per top-level recipe field (int64[kind, value]),
  so a refused resume names the field that changed.

On load, DCP first calls :meth:`ZephonDataLoader.state_dict` on the *new* loader to learn
which keys to read: it lists exactly the lanes this rank owns in the new layout, so a
checkpoint written at dp 2 loads at dp 1, 4, 8, ... (any divisor of ``num_lanes``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torchdata.nodes import BaseNode, Prefetcher
from torchtitan.components.dataloader import BaseDataLoader

from zephon_nodes.engine.checkpoint import FORMAT, validate_state
from zephon_nodes.engine.multiplexer import Multiplexer
from zephon_nodes.engine.pipeline import Pipeline, lanes_for_rank
from zephon_nodes.engine.pool import RUNNERS, WorkerPool
from zephon_nodes.errors import CheckpointError, RecipeError
from zephon_nodes.io.nodecache import parse_size, set_cache_limit
from zephon_nodes.operators.tokenize import load_tokenizer
from zephon_nodes.recipe.spec import Recipe

__all__ = [
    "DCP_FORMAT",
    "ZephonDataLoader",
    "check_launch",
    "check_tokenizer",
    "from_dcp_state",
    "lane_key",
    "to_dcp_state",
]

logger = logging.getLogger(__name__)

DCP_FORMAT = 1
"""Version of the DCP key layout (``zephon_format``); the JSON state inside is ``FORMAT``."""

FORMAT_KEY = "zephon_format"
NUM_LANES_KEY = "num_lanes"
STEP_KEY = "step"
MICRO_KEY = "micro"
DP_KEY = "dp_world_size"
LBS_KEY = "local_batch_size"
FINGERPRINT_KEY = "fingerprint"
RECIPE_PREFIX = "recipe_"
LANE_PREFIX = "lane_"

_KIND_INT, _KIND_HASH, _KIND_OTHER = 0, 1, 2


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
    blob = json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return _KIND_OTHER, int.from_bytes(hashlib.sha256(blob).digest()[:8], "little", signed=True)


def _decode_field(kind: int, value: int) -> Any:
    if kind == _KIND_INT:
        return value
    raw = value.to_bytes(8, "little", signed=True).hex()
    return f"sha256:{raw}" if kind == _KIND_HASH else f"sha256(json):{raw}"


def to_dcp_state(
    state: Mapping[str, Any], *, dp_world_size: int, local_batch_size: int
) -> dict[str, torch.Tensor]:
    """Convert a :class:`~zephon_nodes.engine.multiplexer.Multiplexer` state to DCP tensors.

    Args:
        state: The rank's JSON-safe multiplexer state.
        dp_world_size: The job's data-parallel size (stored for mid-step states).
        local_batch_size: The rank's micro-batch size (stored for mid-step states).

    Returns:
        ``{key: tensor}``: one ``lane_NNNNN`` per lane in ``state`` plus the replicated keys.
    """
    step = int(state["step"])
    out: dict[str, torch.Tensor] = {
        FORMAT_KEY: _scalar(DCP_FORMAT),
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
    for key, (window, consumed) in sorted(state["lanes"].items(), key=lambda kv: int(kv[0])):
        out[lane_key(int(key))] = torch.tensor([window, consumed, step], dtype=torch.int64)
    return out


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
) -> dict[str, Any]:
    """Convert loaded DCP tensors back to a JSON-safe multiplexer state for ``lanes``.

    Args:
        sd: The dataloader's part of the checkpoint (as filled in by DCP).
        pipeline: The running recipe.
        lanes: Lanes this rank owns now.
        dp_world_size: This job's data-parallel size.
        local_batch_size: This job's micro-batch size.

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
    if fmt != DCP_FORMAT:
        raise CheckpointError(f"dataloader state has zephon_format={fmt}, expected {DCP_FORMAT}")
    fp = sd.get(FINGERPRINT_KEY)
    if not isinstance(fp, torch.Tensor) or fp.dtype != torch.uint8 or fp.numel() != 32:
        raise CheckpointError(f"dataloader.fingerprint: expected uint8[32], got {fp!r:.80}")
    fingerprint = bytes(fp.tolist()).hex()
    if fingerprint != pipeline.fingerprint:
        diffs = _recipe_diff(sd, pipeline.summary)
        detail = "; ".join(diffs) if diffs else "no per-field difference was recorded"
        raise CheckpointError(
            f"the checkpoint was written with a different recipe (fingerprint "
            f"{fingerprint[:12]}..., this recipe {pipeline.fingerprint[:12]}...): {detail}"
        )
    (num_lanes,) = _as_ints(sd, NUM_LANES_KEY, 1)
    (step,) = _as_ints(sd, STEP_KEY, 1)
    (micro,) = _as_ints(sd, MICRO_KEY, 1)
    (saved_dp,) = _as_ints(sd, DP_KEY, 1)
    (saved_lbs,) = _as_ints(sd, LBS_KEY, 1)
    positions: dict[str, list[int]] = {}
    for lane in lanes:
        key = lane_key(lane)
        if key not in sd:
            raise CheckpointError(f"the checkpoint has no state for lane {lane} ({key})")
        window, consumed, lane_step = _as_ints(sd, key, 3)
        if lane_step != step:
            raise CheckpointError(
                f"lane {lane} was saved at step {lane_step}, the checkpoint is at step {step}"
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


def check_launch(
    recipe: Recipe, *, dp_world_size: int, dp_rank: int, seq_len: int, local_batch_size: int
) -> None:
    """Check that a TorchTitan job's geometry fits the recipe; say what to change if not.

    Raises:
        RecipeError: Naming the TorchTitan option or recipe field to change.
    """
    L, G = recipe.num_lanes, recipe.global_batch_size
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
            f"{local_batch_size}: set --training.local_batch_size to one of {ok} and "
            f"--training.global_batch_size {G}"
        )
    if seq_len != recipe.seq_len:
        raise RecipeError(
            f"training.seq_len={seq_len} but the recipe's seq_len={recipe.seq_len}: set "
            f"--training.seq_len {recipe.seq_len} (seq_len is part of the recipe)"
        )


def check_tokenizer(recipe: Recipe, tokenizer: Any) -> None:
    """Refuse a TorchTitan tokenizer that does not describe the recipe's vocabulary.

    The recipe's tokenizer produces every token id the loader yields; TorchTitan's
    tokenizer (built from ``--hf_assets_path``) is not used by the loader. They must be
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
            f"TorchTitan's tokenizer (--hf_assets_path) has vocab_size={theirs_vocab}, the "
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

        runner: Literal["thread", "process"] = "thread"
        """Where operators run: threads (GIL-releasing tokenizers) or spawned processes."""

        lookahead: int = 4
        """Work items each lane submits to the workers ahead of the one it reads."""

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

        def __post_init__(self) -> None:
            if self.num_workers < 0:
                raise RecipeError(f"dataloader.num_workers={self.num_workers} must be >= 0")
            if self.runner not in RUNNERS:
                raise RecipeError(f"dataloader.runner={self.runner!r} must be one of {RUNNERS}")
            if self.lookahead < 1:
                raise RecipeError(f"dataloader.lookahead={self.lookahead} must be >= 1")
            if self.prefetch < 0:
                raise RecipeError(f"dataloader.prefetch={self.prefetch} must be >= 0")
            if self.cache_limit:
                try:
                    parse_size(self.cache_limit)
                except ValueError as e:
                    raise RecipeError(f"dataloader.cache_limit: {e}") from None
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
        self.multiplexer: Multiplexer = self.pipeline.rank_node(
            dp_world_size,
            dp_rank,
            local_batch_size=local_batch_size,
            pool=self.pool,
            lanes=self.lanes,
            lookahead=config.lookahead,
        )
        self._node: BaseNode[dict[str, torch.Tensor]] = (
            Prefetcher(self.multiplexer, config.prefetch)
            if config.prefetch > 0
            else self.multiplexer
        )
        self._state: dict[str, Any] = self._fresh_state()
        self._restore: dict[str, Any] | None = None
        self._started = False

    def cache_stats(self) -> dict[str, int] | None:
        """Return the node cache's counters in this process, or None without a cache limit.

        Keys: hits, misses, bytes_fetched, evictions, peak_bytes, limit_bytes and more (see
        :meth:`~zephon_nodes.io.nodecache.NodeCache.stats`); log them with your metrics.
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
        if not self._started or self._restore is not None:
            self._start()
        while True:
            try:
                batch = next(self._node)
            except StopIteration:
                return
            self._state = self._current_state()
            yield {"input": batch["input"], "positions": batch["positions"]}, batch["labels"]

    def state_dict(self) -> dict[str, Any]:
        """Return the checkpoint: one ``lane_NNNNN`` tensor per owned lane + replicated keys.

        On a freshly built loader this is a placeholder of the right keys and shapes for the
        lanes this rank owns, which is what DCP needs to load a checkpoint written at
        another dp size.
        """
        state = self._restore if self._restore is not None else self._state
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
            state, dp_world_size=self.dp_world_size, local_batch_size=self.local_batch_size
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
        state = from_dcp_state(
            state_dict,
            self.pipeline,
            self.lanes,
            dp_world_size=self.dp_world_size,
            local_batch_size=self.local_batch_size,
        )
        p = self.pipeline
        validate_state(
            state,
            fingerprint=p.fingerprint,
            summary=p.summary,
            num_lanes=p.num_lanes,
            lanes=self.lanes,
        )
        self._restore = state
        self._state = state

    def close(self) -> None:
        """Stop the worker pool."""
        self.pool.close()
