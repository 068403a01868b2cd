"""Run one recipe under a matrix of physical settings and compare every global batch digest.

The engine behind ``zephon verify`` and :func:`zephon_nodes.testing.assert_elastic`. A
*setting* is a physical way of running the recipe (data-parallel size, workers, runner, or a
checkpoint taken at one dp size and resumed at another). Each setting's per-step digests are
compared with a reference run (one rank, operators inline in the calling thread).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.engine.operator_pools import PoolSpec
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.pool import RUNNERS, WorkerPool
from zephon_nodes.verification.simulate import simulate

__all__ = [
    "REFERENCE",
    "Setting",
    "SettingResult",
    "VerifyResult",
    "default_dp_sizes",
    "default_matrix",
    "first_difference",
    "run_matrix",
]

# Per-operator pools a setting runs with, beside its own pool.
_PerOp = Mapping[str, WorkerPool] | None


@dataclass(frozen=True)
class Setting:
    """One physical way of running a recipe.

    Attributes:
        dp: Data-parallel world size (the resumed size for a resume setting).
        workers: Pool workers (0 runs operators inline in the calling thread).
        runner: ``"thread"`` or ``"process"``.
        resume_from: For a resume setting, the dp size that wrote the checkpoint.
        checkpoint_step: For a resume setting, the step after which the state was saved.
        local_batch_size: Micro-batch size per rank (None: one micro-batch per step).
    """

    dp: int
    workers: int
    runner: str = "thread"
    resume_from: int | None = None
    checkpoint_step: int | None = None
    local_batch_size: int | None = None

    @property
    def is_resume(self) -> bool:
        """True for a checkpoint-and-resume setting."""
        return self.resume_from is not None

    @property
    def name(self) -> str:
        """A short human-readable label, e.g. ``dp=2 workers=1 thread``."""
        pool = "inline" if self.workers == 0 else f"workers={self.workers} {self.runner}"
        if self.local_batch_size is not None:
            pool += f" micro={self.local_batch_size}"
        if self.is_resume:
            return f"resume dp={self.resume_from}->{self.dp} @{self.checkpoint_step} {pool}"
        return f"dp={self.dp} {pool}"


REFERENCE = Setting(dp=1, workers=0)


def default_dp_sizes(num_lanes: int, up_to: int = 8) -> list[int]:
    """Return every dp size that divides ``num_lanes``, from 1 up to ``up_to``."""
    return [d for d in range(1, min(num_lanes, up_to) + 1) if num_lanes % d == 0]


def default_matrix(
    num_lanes: int,
    *,
    dp_sizes: Sequence[int] | None = None,
    workers: Sequence[int] = (1, 2),
    runners: Sequence[str] = ("thread", "process"),
    resume: bool = True,
    checkpoint_step: int | None = None,
    resume_workers: int = 2,
    micro_batch_sizes: Sequence[int] = (),
    global_batch_size: int | None = None,
) -> list[Setting]:
    """Build the default matrix of settings.

    Every dp size x workers x runner, then (with ``resume``) a checkpoint after
    ``checkpoint_step`` resumed from each dp size at each other dp size, on ``resume_workers``
    thread workers. A ``checkpoint_step`` of None means half the steps the reference produces
    (see :func:`run_matrix`). Each of ``micro_batch_sizes`` adds one setting per dp size
    (``resume_workers`` threads) that cuts each rank's step into micro-batches of that size,
    where it divides the rank's ``global_batch_size / dp`` rows.

    Raises:
        RecipeError: If a dp size does not divide ``num_lanes`` or a runner is unknown.
    """
    sizes = list(dp_sizes) if dp_sizes is not None else default_dp_sizes(num_lanes)
    for d in sizes:
        if d < 1 or num_lanes % d:
            raise RecipeError(f"dp size {d} does not divide {num_lanes=}")
    for r in runners:
        if r not in RUNNERS:
            raise RecipeError(f"runner {r!r} must be one of {RUNNERS}")
    out = [Setting(d, w, r) for r in runners for w in workers for d in sizes]
    for b in micro_batch_sizes:
        if b < 1:
            raise RecipeError(f"micro-batch size {b} must be >= 1")
        split = [
            Setting(d, resume_workers, "thread", local_batch_size=b)
            for d in sizes
            if global_batch_size is None or (global_batch_size // d) % b == 0
        ]
        if not split and global_batch_size is not None:  # never silently dropped
            local = sorted({global_batch_size // d for d in sizes})
            raise RecipeError(
                f"micro-batch size {b} divides no rank's batch: global_batch_size="
                f"{global_batch_size} at dp sizes {list(sizes)} gives local batches {local}; "
                "give a divisor of one of them"
            )
        out += split
    if resume:
        out += [
            Setting(b, resume_workers, "thread", resume_from=a, checkpoint_step=checkpoint_step)
            for a in sizes
            for b in sizes
            if a != b
        ]
    return out


def first_difference(reference: Sequence[str], digests: Sequence[str]) -> int | None:
    """Return the first step (from 1) where two digest lists differ, or None if identical."""
    for i, (a, b) in enumerate(zip(reference, digests, strict=False)):
        if a != b:
            return i + 1
    if len(reference) != len(digests):
        return min(len(reference), len(digests)) + 1
    return None


@dataclass
class SettingResult:
    """The outcome of one setting.

    Attributes:
        setting: The setting.
        digests: Digest of every step it produced, from step 1.
        tokens: Label tokens (not ignored) over all its steps.
        seconds: Wall time of the run(s).
        first_diff: First step that differs from the reference, or None.
        error: The error message if the setting failed to run.
    """

    setting: Setting
    digests: list[str]
    tokens: int
    seconds: float
    first_diff: int | None = None
    error: str | None = None

    @property
    def identical(self) -> bool:
        """True if every step matches the reference."""
        return self.first_diff is None and self.error is None

    @property
    def tokens_per_s(self) -> float:
        """Label tokens per second of wall time."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-safe summary."""
        s = self.setting
        return {
            "setting": s.name,
            "dp": s.dp,
            "workers": s.workers,
            "runner": s.runner,
            "resume_from": s.resume_from,
            "checkpoint_step": s.checkpoint_step,
            "local_batch_size": s.local_batch_size,
            "steps": len(self.digests),
            "identical": self.identical,
            "first_differing_step": self.first_diff,
            "error": self.error,
            "tokens_per_s": round(self.tokens_per_s, 1),
            "digests": list(self.digests),
        }


@dataclass
class VerifyResult:
    """All settings of one verification run.

    Attributes:
        steps: Steps requested.
        reference: The reference run.
        results: One result per setting, in matrix order.
    """

    steps: int
    reference: SettingResult
    results: list[SettingResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True if every setting matched the reference."""
        return all(r.identical for r in self.results)

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-safe summary (with every digest)."""
        return {
            "ok": self.ok,
            "steps": self.steps,
            "reference": self.reference.to_json(),
            "settings": [r.to_json() for r in self.results],
        }


def _warm(_: Any) -> None:
    """A no-op task that makes a process pool spawn its workers (they import torch)."""
    time.sleep(0.05)


class _Pools:
    """Worker pools shared by all settings with the same (workers, runner)."""

    def __init__(self) -> None:
        self._pools: dict[tuple[int, str], WorkerPool] = {}

    def get(self, workers: int, runner: str) -> WorkerPool:
        key = (workers, runner if workers else "thread")
        pool = self._pools.get(key)
        if pool is None:
            pool = WorkerPool(workers, key[1])
            if workers and runner == "process":
                for f in [pool.submit(_warm, None) for _ in range(2 * workers)]:
                    f.result(timeout=pool.timeout_s)
            self._pools[key] = pool
        return pool

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


def _run_plain(
    pipeline: Pipeline, setting: Setting, steps: int, pool: WorkerPool, per_op: _PerOp = None
) -> tuple[list[str], int]:
    digests, tokens = [], 0
    for res, _ in simulate(
        pipeline,
        setting.dp,
        steps,
        pool=pool,
        local_batch_size=setting.local_batch_size,
        operator_pools=per_op,
    ):
        digests.append(res.digest)
        tokens += res.tokens
    return digests, tokens


def _run_resume(
    pipeline: Pipeline, setting: Setting, steps: int, pool: WorkerPool, per_op: _PerOp = None
) -> tuple[list[str], int]:
    k = setting.checkpoint_step
    assert k is not None and setting.resume_from is not None
    saved: list[dict[str, Any]] = []
    digests, tokens = [], 0
    for res, _ in simulate(
        pipeline,
        setting.resume_from,
        k,
        pool=pool,
        save_at=k,
        on_save=saved.append,
        operator_pools=per_op,
    ):
        digests.append(res.digest)
        tokens += res.tokens
    if not saved:
        raise RecipeError(
            f"the data ended after step {len(digests)}, before checkpoint step {k}; choose a "
            f"smaller checkpoint step"
        )
    # Round-trip through JSON, as a real checkpoint would.
    state = json.loads(json.dumps(saved[0]))
    for res, _ in simulate(
        pipeline, setting.dp, steps - k, pool=pool, resume_state=state, operator_pools=per_op
    ):
        digests.append(res.digest)
        tokens += res.tokens
    return digests, tokens


def run_setting(
    pipeline: Pipeline,
    setting: Setting,
    steps: int,
    pool: WorkerPool,
    operator_pools: _PerOp = None,
) -> SettingResult:
    """Run one setting for ``steps`` steps (errors are recorded, not raised).

    ``operator_pools`` (see :meth:`Pipeline.rank_node`) run the named operators on their
    own pools; the setting's pool runs the rest.
    """
    t0 = time.perf_counter()
    try:
        if setting.is_resume:
            digests, tokens = _run_resume(pipeline, setting, steps, pool, operator_pools)
        else:
            digests, tokens = _run_plain(pipeline, setting, steps, pool, operator_pools)
        error = None
    except Exception as e:  # a failing setting is a finding, not a crash
        digests, tokens, error = [], 0, f"{type(e).__name__}: {e}"
    return SettingResult(setting, digests, tokens, time.perf_counter() - t0, error=error)


def run_matrix(
    pipeline: Pipeline,
    settings: Iterable[Setting],
    steps: int,
    *,
    on_result: Callable[[SettingResult], None] | None = None,
    operator_pools: Mapping[str, PoolSpec] | None = None,
) -> VerifyResult:
    """Run the reference and every setting; compare each step's digest with the reference.

    Args:
        pipeline: The compiled recipe.
        settings: Settings to check. A resume setting without a checkpoint step gets half
            the reference's steps (and is dropped if the reference has a single step).
        steps: Steps per setting.
        on_result: Called after each setting (reference first), e.g. for a progress bar.
        operator_pools: Per-operator pools every setting but the reference also uses
            (created once, shared by the settings, closed at the end).

    Raises:
        RecipeError: If ``steps < 1``, the reference fails, or a checkpoint step is not
            before the last step the reference produced.
    """
    if steps < 1:
        raise RecipeError(f"{steps=} must be >= 1")
    settings = list(settings)
    pools = _Pools()
    per_op = {k: v.build() for k, v in (operator_pools or {}).items()}
    try:
        ref = run_setting(pipeline, REFERENCE, steps, pools.get(0, "thread"))
        if ref.error is not None:
            raise RecipeError(f"the reference run failed: {ref.error}")
        if not ref.digests:
            raise RecipeError("the recipe produced no global batch (is the data too small?)")
        auto = max(1, len(ref.digests) // 2)
        settings = [
            dataclasses.replace(s, checkpoint_step=auto)
            if s.is_resume and s.checkpoint_step is None
            else s
            for s in settings
            if not (s.is_resume and s.checkpoint_step is None and len(ref.digests) < 2)
        ]
        for s in settings:
            if s.is_resume and not 1 <= (s.checkpoint_step or 0) < len(ref.digests):
                raise RecipeError(
                    f"checkpoint step {s.checkpoint_step} must be in [1, {len(ref.digests)}) "
                    f"(the reference produced {len(ref.digests)} steps)"
                )
        if on_result is not None:
            on_result(ref)
        out = VerifyResult(steps, ref)
        for s in settings:
            res = run_setting(pipeline, s, steps, pools.get(s.workers, s.runner), per_op)
            res.first_diff = first_difference(ref.digests, res.digests)
            out.results.append(res)
            if on_result is not None:
                on_result(res)
        return out
    finally:
        pools.close()
        for p in per_op.values():
            p.close()
