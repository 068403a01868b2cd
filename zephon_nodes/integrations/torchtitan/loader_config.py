"""The settings both TorchTitan adapters share: one ``Config`` base, checked in one place.

``ZephonDataLoader.Config`` of each adapter is ``(its TorchTitan BaseDataLoader.Config,
LoaderConfig)`` plus the one field its validator sets (``infinite`` on 0.3.0, ``repeat`` on
main). :class:`LoaderConfig` is the recipe and the physical settings, typed as in
:class:`zephon_nodes.core.settings.Settings` (a byte size is an int; ``"50G"`` given from
Python or an ``--override.imports`` JSON object is read as a size), then
:class:`CheckpointPlumbing`: the room and the switches of the checkpoint's layout. Nothing
here imports TorchTitan.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from zephon_nodes.core.environment import is_location, parse_bool, parse_limit, parse_size
from zephon_nodes.core.errors import RecipeError
from zephon_nodes.engine.operator_pools import parse_operator_workers
from zephon_nodes.engine.pool import RUNNERS
from zephon_nodes.recipe.bounds import SETTINGS, check_setting

__all__ = ["ENGINES", "CheckpointPlumbing", "LoaderConfig", "check_config"]

ENGINES = ("thread", "process")
"""Where a rank's pipeline runs: in the trainer's process, or in a child process."""


@dataclass(kw_only=True)
class CheckpointPlumbing:
    """How the checkpoint is laid out: fixed room for DCP's tensors and what to convert."""

    max_decisions: int = -1
    """Room for set_mixture decisions in the checkpoint (fixed-shape DCP tensors); -1:
    256 for a recipe of several datasets, 0 (no mixture keys) for one dataset."""

    relane_from: int = 0
    """Lane count of the checkpoint to re-lane at load (0: never; docs/lanes.md)."""

    relaned: bool = False
    """The checkpoint to load was written after a re-lane (it carries a lineage)."""

    max_lineage_bytes: int = 65536
    """Room for a re-lane's lineage in the checkpoint (about 12 bytes per old lane)."""

    amended: bool = False
    """The checkpoint to load was written after a recipe change (``zephon amend``, or a
    stage of another recipe): it carries a stage section. A recipe with stages reserves
    its keys without this."""

    max_stage_bytes: int = 16384
    """Room for a stage section's shared part in the checkpoint (its dataset names,
    streams and amendments: about 40 bytes per dataset, 90 per amendment)."""

    max_stage_datasets: int = 32
    """Room per lane for the datasets a changing recipe has read (8 bytes each)."""

    amend_from: str = ""
    """Recipe TOML the checkpoint to load was written with, to amend it at load to this
    job's recipe, as ``zephon amend`` does (empty: never; docs/changing-recipes.md)."""


@dataclass(kw_only=True)
class LoaderSettings:
    """The recipe, then the physical settings (none changes a byte of the batches)."""

    recipe: str = ""
    """Path of the zephon-nodes recipe TOML that defines the data (required)."""

    num_workers: int = 2
    """Worker threads or processes shared by this rank's lanes (0 runs inline)."""

    runner: Literal["thread", "process", "ray"] = "thread"
    """Where operators run: threads (GIL-releasing tokenizers), spawned processes, or Ray
    tasks on a Ray cluster (``RAY_ADDRESS``; needs the ``ray`` extra)."""

    engine: Literal["thread", "process"] = "thread"
    """Where the rank's pipeline (lanes, accumulators, collation) runs: in the trainer's
    process, or in a child process that hands batches over (``zephon_nodes.engine.child``)."""

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

    cache_limit: int | None = None
    """Bytes of the node cache shared by the node's ranks (the settings' cache_limit; None:
    ZEPHON_CACHE_LIMIT, else the default share of the free disk). Physical."""

    token_cache: bool | str | None = None
    """Reuse tokenized work items across runs: True/False, or a storage URI shared by the
    cluster behind each node's cache (None: ZEPHON_TOKEN_CACHE, else off). Physical: never
    changes a batch (docs/storage.md)."""

    token_cache_limit: int | None = None
    """Bytes the token cache may hold (None: ZEPHON_TOKEN_CACHE_LIMIT, else 16 GiB)."""

    dump_batches: str = ""
    """Folder for this rank's rows of every step (step-S.rank-R.npz; zephon digest-dump)."""


@dataclass(kw_only=True)
class LoaderConfig(CheckpointPlumbing, LoaderSettings):
    """Every setting both adapters share; checked when the config is made."""

    def __post_init__(self) -> None:
        check_config(self)


_TEXT = ("recipe", "operator_workers", "dump_batches", "amend_from")
"""Fields that hold text (a path may be given as a ``PathLike``)."""

_SWITCHES = ("check_tokenizer", "relaned", "amended")
"""Fields that are true or false: ``"false"`` from Python must not read as true."""


def _check_types(config: Any) -> None:
    """Text fields are text, switches are booleans (given as text: read as on/off)."""
    for name in _TEXT:
        value = getattr(config, name)
        if isinstance(value, os.PathLike):
            setattr(config, name, os.fspath(value))
        elif not isinstance(value, str):
            raise RecipeError(
                f"dataloader.{name}={value!r} must be a string, got {type(value).__name__}"
            )
    for name in _SWITCHES:
        value = getattr(config, name)
        if isinstance(value, str):
            try:
                setattr(config, name, parse_bool(value.strip()))
            except ValueError:
                raise RecipeError(
                    f"dataloader.{name}={value!r} must be true or false (on/off, 1/0)"
                ) from None
        elif not isinstance(value, bool):
            raise RecipeError(
                f"dataloader.{name}={value!r} must be true or false, got {type(value).__name__}"
            )
    token_cache = config.token_cache
    if token_cache is not None and not isinstance(token_cache, (bool, str)):
        raise RecipeError(
            f"dataloader.token_cache={token_cache!r} must be true/false or a storage URI, got "
            f"{type(token_cache).__name__}"
        )


def _typed(config: Any) -> None:
    """Read a size or switch given as text (Python, an override's JSON) as its type."""
    _check_types(config)
    if isinstance(config.cache_limit, str):
        config.cache_limit = parse_limit(config.cache_limit, "dataloader.cache_limit")
    if isinstance(config.token_cache_limit, str):
        try:
            config.token_cache_limit = parse_size(config.token_cache_limit)
        except ValueError as e:
            raise RecipeError(f"dataloader.token_cache_limit: {e}") from None
    if isinstance(config.token_cache, str) and not is_location(config.token_cache.strip()):
        text = config.token_cache.strip()
        try:
            config.token_cache = parse_bool(text) if text else None
        except ValueError:
            raise RecipeError(
                f"dataloader.token_cache={config.token_cache!r} must be on/off (true/false) "
                "or a storage URI (a token cache shared by the cluster)"
            ) from None


def check_config(config: Any) -> None:
    """Check the settings of a :class:`LoaderConfig` (its ``__post_init__``).

    Raises:
        RecipeError: Naming the ``dataloader.*`` setting, what it must be and what it is.
    """
    _typed(config)
    if config.recipe and Path(config.recipe).is_dir():
        raise RecipeError(
            f"dataloader.recipe={config.recipe!r} is a directory; give the recipe's TOML file"
        )
    for name in ("num_workers", "lookahead", "prefetch", "worker_timeout_s"):
        check_setting(f"dataloader.{name}", getattr(config, name), bound=SETTINGS[name])
    for name in ("cache_limit", "token_cache_limit"):  # None: the environment's or default
        if getattr(config, name) is not None:
            check_setting(f"dataloader.{name}", getattr(config, name), bound=SETTINGS[name])
    if config.runner not in RUNNERS:
        raise RecipeError(f"dataloader.runner={config.runner!r} must be one of {RUNNERS}")
    if config.engine not in ENGINES:
        raise RecipeError(f"dataloader.engine={config.engine!r} must be one of {ENGINES}")
    try:
        parse_operator_workers(config.operator_workers)
    except RecipeError as e:
        raise RecipeError(f"dataloader.operator_workers: {e}") from None
    _check_plumbing(config)


def _check_plumbing(config: CheckpointPlumbing) -> None:
    """The checkpoint's room against the bounds table (DCP allocates tensors to it)."""
    for name in (
        "max_decisions",
        "relane_from",
        "max_lineage_bytes",
        "max_stage_bytes",
        "max_stage_datasets",
    ):
        check_setting(f"dataloader.{name}", getattr(config, name), bound=SETTINGS[name])
    if config.amend_from and config.relane_from:
        raise RecipeError(
            f"dataloader.amend_from={config.amend_from!r} and dataloader.relane_from="
            f"{config.relane_from} are both set: a run's recipe does not change across a "
            f"re-lane yet; amend or re-lane, not both"
        )
    if config.amend_from and not Path(config.amend_from).is_file():
        what = "a directory" if Path(config.amend_from).is_dir() else "not found"
        raise RecipeError(
            f"dataloader.amend_from={config.amend_from!r}: {what}; give the recipe TOML the "
            f"checkpoint was written with"
        )
