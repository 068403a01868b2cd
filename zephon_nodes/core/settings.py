"""The physical settings of a process: one frozen object, read from the environment here only.

Physical settings change where bytes are kept and how fast they come, never a byte of
output, and stay outside every fingerprint: the cache directory and the node cache's limit,
policy and prefetch depth, the remote read cache, storage retries, the shared-memory arena
of process workers, the verify / immutable-data / index switches and Ray's retries.
:class:`Settings` holds them all, typed and checked against the bounds table
(:data:`zephon_nodes.core.bounds.PHYSICAL`). Its sources:

- the environment, through :meth:`Settings.from_env` (the only reader of ``ZEPHON_*``
  variables in the package; :data:`~zephon_nodes.core.environment.ENVIRONMENT` lists them
  and how their text is read, docs/cli.md documents them);
- the Python API (``Pipeline(recipe, settings=Settings(cache_limit=50 << 30))``), the CLI
  flags (``--cache-limit``) and the TorchTitan config, which produce a :class:`Settings`
  with :meth:`Settings.replace`.

Which settings apply is explicit: :func:`current` returns the settings of the innermost
:func:`using` block of the calling thread, else the process's (:func:`activate`,
:func:`update`), else the environment's. Pools run every call inside the settings of the
work that submitted it (thread, process and Ray runners alike: the object travels with the
call), so a worker process never depends on inherited environment variables.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from zephon_nodes.core.bounds import PHYSICAL
from zephon_nodes.core.environment import (
    ENVIRONMENT,
    EnvVar,
    is_location,
    parse_bool,
    parse_limit,
    parse_size,
)
from zephon_nodes.core.errors import RecipeError

__all__ = [
    "CACHE_CAP_BYTES",
    "CACHE_SHARE",
    "ENVIRONMENT",
    "EnvVar",
    "InSettings",
    "Settings",
    "activate",
    "current",
    "default_cache_dir",
    "parse_limit",
    "parse_size",
    "reset",
    "update",
    "using",
]

Policy = Literal["belady", "lru"]

CACHE_SHARE = 0.5
"""Share of the cache disk's free space the node cache takes when no limit is set."""
CACHE_CAP_BYTES = 100 << 30
"""Largest node cache taken when no limit is set (100 GiB)."""
TOKEN_CACHE_LIMIT = 16 << 30  # the token cache's default limit


def default_cache_dir() -> str:
    """``~/.cache/zephon_nodes``: the cache directory when ``ZEPHON_CACHE_DIR`` is unset."""
    return os.path.join(os.path.expanduser("~"), ".cache", "zephon_nodes")


@dataclass(frozen=True)
class Settings:
    """Every physical setting of a process (never part of a fingerprint or a digest).

    Attributes:
        cache_dir: Directory of record indexes, checksums and the node cache
            (``ZEPHON_CACHE_DIR``, default ``~/.cache/zephon_nodes``).
        cache_limit: Bytes the node cache may hold (``ZEPHON_CACHE_LIMIT`` /
            ``--cache-limit``, e.g. ``50G``); None: the automatic default,
            :meth:`cache_limit_bytes`.
        cache_policy: Node-cache eviction, ``"belady"`` or ``"lru"`` (``ZEPHON_CACHE_POLICY``).
        cache_prefetch: Shards the node cache fetches ahead of use; 0 turns the prefetcher
            off (``ZEPHON_CACHE_PREFETCH``).
        cache_free_bytes: Free bytes of the cache disk to derive the default limit from;
            None measures the disk (a test gives a small number instead of filling a disk).
        read_cache_mb: Megabytes of 1 MiB blocks of remote files kept per process; 0: one
            request per read (``ZEPHON_READ_CACHE_MB``).
        storage_retry_s: Seconds of retrying transient storage errors
            (``ZEPHON_STORAGE_RETRY_S``).
        storage_backoff_max_s: Longest single backoff delay (``ZEPHON_STORAGE_BACKOFF_MAX_S``).
        shm_arena_mb: Megabytes of each process worker's shared-memory arena; 0: a file per
            result (``ZEPHON_SHM_ARENA_MB``).
        verify_data: Full checks with a dataset index: list the folders and hash every local
            shard on first use (``ZEPHON_VERIFY_DATA=1``).
        immutable_data: Remember each local file's checksum by path, size, modification time
            and inode (``ZEPHON_IMMUTABLE_DATA=1``).
        use_index: Use dataset indexes (``ZEPHON_NO_INDEX=1`` sets False).
        ray_max_retries: Re-runs of a Ray task whose worker or node was lost
            (``ZEPHON_RAY_MAX_RETRIES``).
        ray_address: The Ray cluster to join (``RAY_ADDRESS``); None starts a local one.
        token_cache: Reuse tokenized work items across runs (``ZEPHON_TOKEN_CACHE=on`` /
            ``--token-cache on``; default off).
        gcs_emulator_host: A GCS emulator or private endpoint (``STORAGE_EMULATOR_HOST``, the
            variable Google's clients read); the plain JSON-API gcsfs class is used for it.
        token_cache_limit: Bytes the token cache may hold (``ZEPHON_TOKEN_CACHE_LIMIT`` /
            ``--token-cache-limit``, default 16 GiB).
        token_cache_shared: A storage URI (``s3://``, ``gs://``, ``az://``, or a folder on a
            shared mount) whose entries every node reads and the first writes, behind each
            node's own token cache (``ZEPHON_TOKEN_CACHE_SHARED`` / ``--token-cache URI``,
            which also turns the cache on); None: node-local only.
        item_sizes: Keep work-item sizes in the node cache for later builds
            (``ZEPHON_ITEM_SIZES=off``: compute them at every build; default on).

    Raises:
        RecipeError: A value of the wrong type or outside its bounds, naming the field, what
            was expected and what was got.
    """

    cache_dir: str = field(default_factory=default_cache_dir)
    cache_limit: int | None = None
    cache_policy: Policy = "belady"
    cache_prefetch: int = 4
    cache_free_bytes: int | None = None
    read_cache_mb: float = 128.0
    storage_retry_s: float = 120.0
    storage_backoff_max_s: float = 5.0
    shm_arena_mb: float = 32.0
    verify_data: bool = False
    immutable_data: bool = False
    use_index: bool = True
    ray_max_retries: int = 3
    ray_address: str | None = None
    token_cache: bool = False
    token_cache_limit: int = TOKEN_CACHE_LIMIT
    gcs_emulator_host: str | None = None
    token_cache_shared: str | None = None
    item_sizes: bool = True

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            problem = _problem(f.name, getattr(self, f.name))
            if problem is not None:
                raise RecipeError(f"Settings.{f.name}={getattr(self, f.name)!r} {problem}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings the environment gives (each unset variable: its default).

        Args:
            environ: The variables (default ``os.environ``).

        Raises:
            RecipeError: One line naming the variable, what was expected and what was got,
                e.g. ``ZEPHON_READ_CACHE_MB='abc': expected megabytes, a finite number in
                [0, 1e+07], got 'abc'``.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for var in ENVIRONMENT:
            raw = env.get(var.name)
            if raw is None or (raw.strip() == "" and var.empty_is_unset):
                continue
            try:
                value = var.parse(raw)
            except ValueError as e:
                raise RecipeError(f"{var.name}={raw!r}: expected {var.expects}, got {e}") from None
            problem = _problem(var.field, value)
            if problem is not None:
                raise RecipeError(f"{var.name}={raw!r} {problem}")
            values[var.field] = value
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` (checked like the constructor's values).

        A size such as ``"50G"`` is accepted for ``cache_limit`` (``"auto"``: None).

        Raises:
            RecipeError: An unknown name or a value out of bounds.
        """
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise RecipeError(f"unknown physical setting(s) {unknown}; known: {sorted(known)}")
        if isinstance(changes.get("cache_limit"), str):
            changes["cache_limit"] = parse_limit(changes["cache_limit"], "--cache-limit")
        _text_values(changes)
        return dataclasses.replace(self, **changes)

    @property
    def cache_root(self) -> Path:
        """The cache directory, created if missing."""
        path = Path(self.cache_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def cache_limit_bytes(self) -> int:
        """The node cache's limit: :attr:`cache_limit`, else the automatic default.

        The default is the smaller of :data:`CACHE_SHARE` of the space the cache could grow
        into (the free bytes of the cache directory's disk, plus what the node cache already
        holds: its own entries can be evicted) and :data:`CACHE_CAP_BYTES`.
        """
        if self.cache_limit is not None:
            return self.cache_limit
        node = self.cache_root / "node"
        if self.cache_free_bytes is not None:
            free = self.cache_free_bytes
        else:
            free = shutil.disk_usage(self.cache_root).free
        held = _bytes_under(node / "data")
        return min(int(CACHE_SHARE * (free + held)), CACHE_CAP_BYTES)

    def limit_source(self) -> str:
        """Where the node cache's limit comes from, in words (for messages)."""
        if self.cache_limit is not None:
            return "--cache-limit / ZEPHON_CACHE_LIMIT"
        return (
            f"the default: the smaller of {CACHE_SHARE:.0%} of the free space of "
            f"{self.cache_dir} and {CACHE_CAP_BYTES >> 30} GiB"
        )


def _bytes_under(folder: Path) -> int:
    total = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(folder):
            with contextlib.suppress(FileNotFoundError):
                total += entry.stat().st_size
    return total


def _problem(name: str, value: Any) -> str | None:
    """Why ``value`` is refused for field ``name``, or None."""
    if (
        name
        in (
            "cache_limit",
            "cache_free_bytes",
            "ray_address",
            "gcs_emulator_host",
            "token_cache_shared",
        )
        and value is None
    ):
        return None
    if name in ("cache_dir",):
        return None if isinstance(value, str) and value else "must be a non-empty path"
    if name in ("ray_address", "gcs_emulator_host", "token_cache_shared"):
        return None if isinstance(value, str) else f"must be an address, got {value!r}"
    if name == "cache_policy":
        return None if value in ("belady", "lru") else "must be 'belady' or 'lru'"
    if name == "token_cache_limit":
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return None if ok else f"must be a byte count >= 0, got {value!r}"
    if name in ("verify_data", "immutable_data", "use_index", "token_cache", "item_sizes"):
        return None if isinstance(value, bool) else f"must be a bool, got {type(value).__name__}"
    bound = PHYSICAL.get(name)
    if bound is None:
        return None
    if bound.kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    return bound.problem(value)


def _text_values(changes: dict[str, Any]) -> None:
    """Turn the token cache's text values (``"on"``, ``"16G"``) into their types, in place."""
    if isinstance(changes.get("token_cache"), str):
        text = changes["token_cache"]
        if is_location(text):  # a shared token cache: the cache is on, behind this node's
            changes["token_cache"], changes["token_cache_shared"] = True, text.strip()
            return _text_values(changes)
        try:
            changes["token_cache"] = parse_bool(text) if text.strip() else None
        except ValueError:
            raise RecipeError(
                f"--token-cache should be 'on', 'off' or a storage URI, got {text!r}"
            ) from None
    if isinstance(changes.get("token_cache_limit"), str):
        try:
            changes["token_cache_limit"] = parse_size(changes["token_cache_limit"])
        except ValueError as e:
            raise RecipeError(f"--token-cache-limit: {e}") from None


_NAMES = tuple(v.name for v in ENVIRONMENT)

# Which settings apply (see the module docstring): scoped, process-wide, overrides, env.
_SCOPED: contextvars.ContextVar[Settings | None] = contextvars.ContextVar(
    "zephon_settings", default=None
)
_LOCK = threading.Lock()
_PROCESS: list[Settings | None] = [None]  # set by activate()
_OVERRIDES: dict[str, Any] = {}  # set by update()
_MEMO: dict[Any, Settings] = {}


def current() -> Settings:
    """The settings that apply here and now.

    The innermost :func:`using` block of this thread, else the process's settings
    (:func:`activate`, else the environment's), with the changes of :func:`update` applied.
    Reading the environment is memoized by the variables' raw values (a changed variable is
    seen at once).

    Raises:
        RecipeError: A variable of the environment is invalid (naming it).
    """
    scoped = _SCOPED.get()
    if scoped is not None:
        return scoped
    with _LOCK:
        base = _PROCESS[0]
        overrides = tuple(sorted(_OVERRIDES.items()))
    key: Any = (id(base), base, overrides) if base is not None else None
    if key is None:
        env = os.environ
        key = (tuple(env.get(n) for n in _NAMES), overrides)
    hit = _MEMO.get(key)
    if hit is not None:
        return hit
    settings = base if base is not None else Settings.from_env()
    if overrides:
        settings = settings.replace(**dict(overrides))
    if len(_MEMO) > 64:
        _MEMO.clear()
    _MEMO[key] = settings
    return settings


def activate(settings: Settings | None) -> None:
    """Make ``settings`` the process's (None: the environment's again).

    Worker processes call this with the settings their pool sends; :func:`update`'s changes
    still apply on top.
    """
    if settings is not None and not isinstance(settings, Settings):
        raise RecipeError(f"settings must be a Settings, got {type(settings).__name__}")
    with _LOCK:
        _PROCESS[0] = settings


def update(**changes: Any) -> Settings:
    """Change some of the process's settings; a value of None drops that field's change.

    ``update(cache_limit="50G")`` is what ``--cache-limit 50G`` does; the change holds until
    dropped (``update(cache_limit=None)``: the environment's or the default limit again).

    Returns:
        The settings that now apply (outside :func:`using` blocks).

    Raises:
        RecipeError: An unknown name or a value out of bounds (nothing is changed then).
    """
    trial = {k: v for k, v in {**_OVERRIDES, **changes}.items() if v is not None}
    if isinstance(trial.get("cache_limit"), str):
        limit = parse_limit(trial["cache_limit"], "--cache-limit")
        if limit is None:
            trial.pop("cache_limit")
        else:
            trial["cache_limit"] = limit
    _text_values(trial)
    trial = {k: v for k, v in trial.items() if v is not None}
    Settings().replace(**trial)  # refuse a bad change before keeping it
    with _LOCK:
        _OVERRIDES.clear()
        _OVERRIDES.update(trial)
    return current()


def reset() -> None:
    """Forget :func:`activate` and :func:`update`: the environment's settings apply again."""
    with _LOCK:
        _PROCESS[0] = None
        _OVERRIDES.clear()


@contextlib.contextmanager
def using(settings: Settings | None) -> Iterator[Settings]:
    """Run the block (in this thread) with ``settings``; None: the ones that apply already."""
    if settings is None:
        yield current()
        return
    token = _SCOPED.set(settings)
    try:
        yield settings
    finally:
        _SCOPED.reset(token)


class InSettings:
    """``fn`` bound to the settings it runs under, wherever it is called (a pool's worker).

    Picklable when ``fn`` is: the settings travel with each call to a worker process or a
    Ray task. Attributes not its own (an operator's ``name``) are ``fn``'s.
    """

    def __init__(self, fn: Callable[[Any], Any], settings: Settings) -> None:
        self.fn = fn
        self.settings = settings

    def __call__(self, arg: Any) -> Any:
        """Call ``fn(arg)`` inside :func:`using` of the bound settings."""
        with using(self.settings):
            return self.fn(arg)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "fn" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["fn"], name)

    def __repr__(self) -> str:
        return f"InSettings({self.fn!r})"
