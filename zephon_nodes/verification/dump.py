"""Batch dumps: the micro-batches of each step written as ``.npz`` files, and their digests.

A dump folder lets a user check what a real job trained on, not only a digest: the
TorchTitan loader writes one file per step and rank (``dump_batches``), ``zephon digest
--dump-batches`` one file per step with every rank's rows, and ``zephon digest-dump DIR``
prints the same ``{"step", "digest"}`` JSON lines as ``zephon digest`` from either form.

File layout: ``step-SSSSSSSS.npz`` (the whole global batch) or ``step-SSSSSSSS.rank-RRRRR.npz``
(one rank's rows of the step), each holding one array per batch field (``input``, ``labels``,
``positions``, ``lane``, and whatever else the recipe's samples carry), rows in the order
the rank yielded them. Plain ``.npz`` (``numpy.savez``, never pickled objects).

Provenance (``zephon digest --dump-batches``, text and chat recipes with concatenated
packing): per token, ``dataset_ids`` (the dataset's index in the recipe in force),
``source_shard`` (the shard's index in that dataset) and ``source_record`` (the record's
number in the shard), -1 on padding; ``sources.json`` names them: ``{"stages": [{"after_step":
S, "datasets": [{"name": ..., "shards": [path, ...]}, ...]}, ...]}`` (one entry for a recipe
that never changes, ``after_step`` 0; a stage's entry applies to the steps after its step).
The source fields are never part of a digest.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zephon_nodes.core.errors import DataError
from zephon_nodes.engine.multiplexer import LANE_KEY
from zephon_nodes.io.storage.cache import umask_mode
from zephon_nodes.io.storage.storage import redact
from zephon_nodes.verification.digest import digest_microbatches

__all__ = ["StepDumper", "dump_digests", "write_sources", "write_step"]

_NAME = re.compile(r"^step-(\d{8})(?:\.rank-(\d{5}))?\.npz$")


def _as_numpy(value: torch.Tensor | np.ndarray) -> np.ndarray:
    return value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def write_step(
    folder: str | os.PathLike[str],
    step: int,
    microbatches: Sequence[Mapping[str, torch.Tensor | np.ndarray]],
    rank: int | None = None,
) -> Path:
    """Write one step's micro-batches (concatenated, in order) as one ``.npz`` file.

    Args:
        folder: The dump folder (created if missing).
        step: The step number (1-based, as ``zephon digest`` prints it).
        microbatches: The micro-batches of the step, in the order they were yielded.
        rank: The rank that yielded them; ``None`` when they are the whole global batch.

    Returns:
        The file written (atomically: a reader never sees a partial file).
    """
    if not microbatches:
        raise ValueError(f"step {step}: no micro-batches to write")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:08d}.npz" if rank is None else f"step-{step:08d}.rank-{rank:05d}.npz"
    arrays = {
        key: np.concatenate([_as_numpy(mb[key]) for mb in microbatches]) for key in microbatches[0]
    }
    fd, tmp = tempfile.mkstemp(dir=out, prefix=name + ".", suffix=".tmp")
    umask_mode(fd)  # the usual mode (umask), not mkstemp's 0600
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
        os.replace(tmp, out / name)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return out / name


def dump_digests(folder: str | os.PathLike[str]) -> dict[int, str]:
    """Digest every step found in a dump folder, as ``zephon digest`` would.

    Rank files of one step are combined (any rank order: rows are put in lane order).

    Raises:
        DataError: If the folder holds no dump, a file cannot be read, or a step mixes a
            whole-batch file with rank files.
    """
    root = Path(folder)
    if not root.is_dir():
        raise DataError(f"{root}: dump folder not found")
    by_step: dict[int, list[Path]] = {}
    whole: set[int] = set()
    for path in sorted(root.iterdir()):
        m = _NAME.match(path.name)
        if m is None:
            continue
        step = int(m.group(1))
        by_step.setdefault(step, []).append(path)
        if m.group(2) is None:
            whole.add(step)
    if not by_step:
        raise DataError(f"{root}: no step-*.npz files (expected a batch dump)")
    digests = {}
    for step, paths in sorted(by_step.items()):
        if step in whole and len(paths) > 1:
            raise DataError(f"{root}: step {step} has both a whole-batch file and rank files")
        digests[step] = digest_microbatches(_check_fields([_load(p) for p in paths], paths))
    return digests


def _load(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        # EOFError: an empty file; BadZipFile, zlib.error: a truncated or damaged one.
        raise DataError(f"{path}: cannot read batch dump: {e or type(e).__name__}") from None


def _check_fields(
    batches: list[dict[str, np.ndarray]], paths: Sequence[Path]
) -> list[dict[str, np.ndarray]]:
    """Refuse files of one step that the digest cannot combine: naming the file and field.

    Each needs the ``lane`` field (one integer per row), the fields of the step's first
    file, and as many rows in every field as in ``lane``.

    Raises:
        DataError: Naming the file and what is wrong.
    """
    fields = sorted(batches[0])
    for batch, path in zip(batches, paths, strict=True):
        lanes = batch.get(LANE_KEY)
        if lanes is None or lanes.ndim != 1 or lanes.dtype.kind not in "iu":
            raise DataError(
                f"{path}: not a batch dump: expected a '{LANE_KEY}' field of one integer per "
                f"row, got fields {sorted(batch)}"
            )
        if sorted(batch) != fields:
            raise DataError(
                f"{path}: fields {sorted(batch)} differ from {paths[0].name}'s {fields}"
            )
        for key, value in batch.items():
            if value.ndim == 0 or len(value) != len(lanes):
                raise DataError(
                    f"{path}: field {key!r} has {len(value) if value.ndim else 'no'} rows, "
                    f"'{LANE_KEY}' has {len(lanes)}"
                )
    return batches


class StepDumper:
    """Collect one rank's micro-batches and write each complete step to a dump folder.

    A step whose first micro-batches were yielded before this dumper started (a resume in
    the middle of a step) is not written: its file would hold only part of the rank's rows.

    Args:
        folder: The dump folder.
        rank: The rank whose rows are collected.
        micro_per_step: Micro-batches this rank yields per step.
    """

    def __init__(self, folder: str | os.PathLike[str], rank: int, micro_per_step: int) -> None:
        self.folder = Path(folder)
        self.rank = rank
        self.micro_per_step = micro_per_step
        self._step: int | None = None
        self._pending: list[dict[str, np.ndarray]] = []

    def add(self, step: int, micro: int, batch: Mapping[str, torch.Tensor]) -> None:
        """Add micro-batch ``micro`` (0-based) of ``step``; writes the step when complete."""
        if step != self._step:
            # A new step; one joined after its first micro-batch (a resume) is skipped.
            self._step, self._pending = (step if micro == 0 else None), []
        if self._step is None:
            return
        self._pending.append({k: _as_numpy(v).copy() for k, v in batch.items()})
        if len(self._pending) == self.micro_per_step:
            write_step(self.folder, step, self._pending, rank=self.rank)
            self._pending = []

    def steps_written(self) -> Iterable[int]:
        """The steps this rank's folder holds files for."""
        for path in sorted(self.folder.glob(f"step-*.rank-{self.rank:05d}.npz")):
            yield int(path.name[5:13])


def write_sources(folder: str | os.PathLike[str], pipeline: Any) -> Path:
    """Write ``sources.json``: the datasets and shards the dump's source fields index.

    Args:
        folder: The dump folder.
        pipeline: The run's :class:`~zephon_nodes.engine.pipeline.Pipeline` (its stages
            entered so far included).
    """

    def datasets(p: Any) -> list[dict[str, Any]]:
        return [
            {"name": d.name, "shards": [redact(str(s.path)) for s in d.shards]} for d in p.datasets
        ]

    stages = [{"after_step": 0, "datasets": datasets(pipeline)}]
    for k, seg in sorted(pipeline.segments.items()):
        if k:
            start = pipeline.recipe.stages[k - 1].start_step
            stages.append({"after_step": start, "datasets": datasets(seg)})
    out = Path(folder) / "sources.json"
    out.write_text(json.dumps({"stages": stages}, indent=1) + "\n")
    return out
