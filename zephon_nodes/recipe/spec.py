"""The recipe: everything that defines the data stream, and its fingerprint.

A :class:`Recipe` holds the datasets, tokenizer, seed, lanes, batch geometry and operator
parameters. Physical settings (ranks, workers, runner, prefetch, micro-batch size) are *not*
part of it and never change a byte of output. :meth:`Recipe.fingerprint` is the SHA-256 of
:meth:`Recipe.canonical`, a canonical JSON of every data-defining field, including a digest
of the tokenizer file and the list of data files with their sizes.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import math
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zephon_nodes.chat.spec import ChatSpec
from zephon_nodes.errors import RecipeError
from zephon_nodes.multimodal.spec import ImageSpec
from zephon_nodes.recipe.bounds import SETTINGS, check_setting, did_you_mean

__all__ = [
    "DatasetSpec",
    "MixtureSpec",
    "OperatorSpec",
    "PackSpec",
    "Recipe",
    "ShuffleSpec",
    "TokenizerSpec",
    "WorkSpec",
    "diff_canonical",
]

RECIPE_FORMAT = 1
TOKENIZER_KINDS = ("sentencepiece", "bytes", "hf", "custom")
PACK_MODES = ("concat", "bestfit")
LONG_DOCUMENTS = ("split", "drop")
ON_ERROR = ("raise", "skip")
ON_EXHAUSTED = ("end", "repeat")
END_OF_DATA = ("drop_report", "error", "wrap")
DEALS = ("auto", "balanced", "round_robin")
SCHEDULE_UNITS = ("steps", "tokens")
OPERATOR_KINDS = ("filter", "map")
_WEIGHT = SETTINGS["datasets.weight"]


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class TokenizerSpec:
    """Which tokenizer turns text into token ids.

    Args:
        kind: ``"sentencepiece"`` (a ``.model`` file), ``"hf"`` (a Hugging Face ``tokenizers``
            ``tokenizer.json`` file), ``"custom"`` (an object registered in Python with
            :func:`~zephon_nodes.register_tokenizer`) or ``"bytes"`` (UTF-8 bytes + 3;
            ids 0/1/2 are pad/bos/eos; needs no file, meant for tests and examples).
        path: Tokenizer file, resolved relative to the recipe file (optional for
            ``"custom"``: when given, its digest joins the fingerprint).
        add_bos: Prepend the beginning-of-sequence id to every document.
        add_eos: Append the end-of-sequence id to every document.
        name: Registered name of a ``"custom"`` tokenizer.
    """

    kind: str = "sentencepiece"
    path: Path | None = None
    add_bos: bool = True
    add_eos: bool = True
    name: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in TOKENIZER_KINDS:
            raise RecipeError(f"tokenizer.kind={self.kind!r} must be one of {TOKENIZER_KINDS}")
        if self.kind in ("sentencepiece", "hf") and self.path is None:
            raise RecipeError(f"tokenizer.path is required for kind={self.kind!r}")
        if self.kind == "custom" and not self.name:
            raise RecipeError(
                "tokenizer.name is required for kind='custom' (the name given to "
                "zephon_nodes.register_tokenizer)"
            )
        if self.kind != "custom" and self.name is not None:
            raise RecipeError(f"tokenizer.name is only used with kind='custom', not {self.kind!r}")

    def canonical(self) -> dict[str, Any]:
        """Data-defining fields: the kind, the file's SHA-256 (not its path) and bos/eos."""
        digest = None
        if self.path is not None:
            if not Path(self.path).is_file():
                raise RecipeError(f"tokenizer file not found: {self.path}")
            digest = _file_sha256(Path(self.path))
        out: dict[str, Any] = {
            "kind": self.kind,
            "sha256": digest,
            "add_bos": self.add_bos,
            "add_eos": self.add_eos,
        }
        if self.kind == "custom":
            from zephon_nodes.recipe.registry import lookup

            assert self.name is not None
            out["name"] = self.name
            out["version"] = lookup("tokenizer", self.name).version
        return out


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset: shard files (glob patterns) or, for tests, in-memory records.

    Args:
        name: Name used in errors, stats and the fingerprint.
        paths: Glob patterns of ``.jsonl`` / ``.jsonl.zst`` / ``.parquet`` / ``.arrow``
            shards or Hugging Face ``save_to_disk`` folders, relative to ``base_dir``.
        text_field: JSON field holding the document text.
        weight: Mixture weight (a token share when several datasets are mixed).
        records: In-memory records (dicts) instead of files; for tests and notebooks.
        base_dir: Directory the patterns are relative to (the recipe file's directory).
        on_exhausted: When the dataset has run ``work.epochs`` passes: ``"end"`` ends the
            whole stream (default), ``"repeat"`` starts another pass in a new seeded order,
            forever.
        on_error: Bad input (corrupt or truncated file, invalid JSON or UTF-8, missing or
            non-string field, empty file): ``"raise"`` (default) or ``"skip"`` (skip and count).
        image_field: Field holding base64 image bytes (one string or a list) in jsonl records
            of a recipe with an ``[image]`` table; ``None``: ``"image"``.
        chunk_size: Records per work item for this dataset (default ``work.chunk_size``);
            smaller for long documents keeps a mixture's shares smooth over short horizons.
        index: Where the dataset index (``zephon index``) is, if not next to the shards
            (a path relative to ``base_dir`` or a URI); not fingerprinted.
    """

    name: str
    paths: tuple[str, ...] = ()
    text_field: str = "text"
    weight: float = 1.0
    records: tuple[Mapping[str, Any], ...] | None = None
    base_dir: Path = field(default_factory=Path.cwd)
    on_exhausted: str = "end"
    on_error: str = "raise"
    image_field: str | None = None
    chunk_size: int | None = None
    index: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise RecipeError("dataset name must be a non-empty string")
        if self.records is None and not self.paths:
            raise RecipeError(f"dataset {self.name!r}: give `paths` (glob patterns) or `records`")
        check_setting("weight", self.weight, where=f"dataset {self.name!r}: ", bound=_WEIGHT)
        if self.on_exhausted not in ON_EXHAUSTED:
            raise RecipeError(
                f"dataset {self.name!r}: on_exhausted={self.on_exhausted!r} must be one of "
                f"{ON_EXHAUSTED}"
            )
        if self.on_error not in ON_ERROR:
            raise RecipeError(
                f"dataset {self.name!r}: on_error={self.on_error!r} must be one of {ON_ERROR}"
            )
        if self.chunk_size is not None:
            check_setting(
                "chunk_size",
                self.chunk_size,
                where=f"dataset {self.name!r}: ",
                bound=SETTINGS["datasets.chunk_size"],
            )

    def files(self) -> list[Any]:
        """Resolve the glob patterns into a sorted list of files.

        Local files come back as :class:`~pathlib.Path`, remote ones (``s3://``, ...) as
        URI strings (see :mod:`zephon_nodes.io.storage`); each pattern's matches are sorted.

        Raises:
            RecipeError: If a pattern matches no file.
        """
        from zephon_nodes.io import storage
        from zephon_nodes.io.checksum import build_memo

        memo = build_memo()  # one listing per pipeline build
        if memo is not None and ("files", id(self)) in memo:
            return list(memo[("files", id(self))])
        out: list[Any] = []
        for pattern in self.paths:
            if storage.is_remote(pattern):
                matches = storage.expand(pattern)
            else:
                local = storage.local_path(pattern)
                full = local if os.path.isabs(local) else str(Path(self.base_dir) / local)
                matches = sorted(glob.glob(full, recursive=True))
                # A Hugging Face `datasets` folder stands for its .arrow files (io/arrow.py).
                from zephon_nodes.io.arrow import expand_dataset_dirs

                named = not glob.has_magic(local)
                matches = [m for m in expand_dataset_dirs(matches, named) if os.path.isfile(m)]
            if not matches:
                if storage.is_remote(pattern):
                    where = storage.redact(pattern)
                else:
                    where = str((Path(self.base_dir) / storage.local_path(pattern)).parent)
                raise RecipeError(
                    f"dataset {self.name!r}: pattern {storage.redact(pattern)!r} matches no "
                    f"file (looked in {where})"
                )
            out.extend(m if storage.is_remote(m) else Path(m) for m in matches)
        seen: set[Any] = set()
        unique = []
        for p in out:
            if p not in seen:
                seen.add(p)
                unique.append(p)
        if self.index is not None:
            from zephon_nodes.io.index import use_index

            location = self.index
            if not storage.is_remote(location) and not os.path.isabs(location):
                location = str(Path(self.base_dir) / location)
            use_index([str(p) for p in unique], location)
        if memo is not None:
            memo[("files", id(self))] = list(unique)
        return unique

    def canonical(self, *, lazy: bool = False) -> dict[str, Any]:
        """Data-defining fields, with each file's content checksum and size, in order.

        Paths are not part of it: the same bytes elsewhere are the same data. A local file
        is read once to hash it unless a dataset index covers it (see
        :mod:`zephon_nodes.io.identity`). ``lazy``: an indexed dataset's files stay a
        :class:`~zephon_nodes.io.identity.FileIdentities` (serialize the result with
        :func:`~zephon_nodes.recipe.canonical.canonical_json`).
        """
        out: dict[str, Any] = {
            "name": self.name,
            "text_field": self.text_field,
            "weight": float(self.weight),
        }
        if self.records is not None:
            blob = json.dumps(list(self.records), sort_keys=True, ensure_ascii=False)
            out["records_sha256"] = hashlib.sha256(blob.encode("utf-8")).hexdigest()
            out["num_records"] = len(self.records)
        else:
            from zephon_nodes.io.identity import dataset_identities

            out["files"] = dataset_identities(self, lazy)
        # New fields join the canonical form only when set, so older recipes keep their
        # fingerprint.
        if self.on_exhausted != "end":
            out["on_exhausted"] = self.on_exhausted
        if self.on_error != "raise":
            out["on_error"] = self.on_error
        if self.chunk_size is not None:
            out["chunk_size"] = self.chunk_size
        if self.image_field is not None:
            out["image_field"] = self.image_field
        return out


@dataclass(frozen=True)
class WorkSpec:
    """How datasets are cut into work items and repeated.

    Args:
        chunk_size: Records per work item (the last item of a shard may be shorter).
        epochs: Passes over the data; ``None`` repeats forever (a new seeded order each epoch).
        end_of_data: What a finite stream does with the samples its lanes still hold after
            the last full global batch: ``"drop_report"`` stops there and counts them
            (``Multiplexer.unused_samples``, ``zephon digest``, ``zephon stats``);
            ``"error"`` stops there too but raises ``DataError`` if any were left (neither
            is part of the fingerprint: the batches are the same); ``"wrap"`` never stops:
            a lane that runs dry continues into the next pass's data (single-dataset
            recipes; part of the fingerprint, as it changes the batches after the first
            lane runs dry).
        deal: How a finite stream's work items go to lanes: ``"balanced"`` (largest first
            to the lane holding the fewest tokens, so lanes end together; single-dataset
            text recipes), ``"round_robin"`` (item ``g`` to lane ``g % L``) or ``"auto"``
            (the default: balanced where it applies, round-robin for mixtures and image
            recipes). Endless streams are always dealt round-robin.
    """

    chunk_size: int = 64
    epochs: int | None = 1
    end_of_data: str = "drop_report"
    deal: str = "auto"

    def __post_init__(self) -> None:
        check_setting("work.chunk_size", self.chunk_size)
        if self.epochs is not None:
            check_setting("work.epochs", self.epochs)
        if self.deal not in DEALS:
            raise RecipeError(f"work.deal={self.deal!r} must be one of {list(DEALS)}")
        if self.end_of_data not in END_OF_DATA:
            raise RecipeError(
                f"work.end_of_data={self.end_of_data!r} must be one of {list(END_OF_DATA)}"
            )


@dataclass(frozen=True)
class ShuffleSpec:
    """Per-lane shuffle buffer applied to packed samples.

    Args:
        buffer_size: Samples held per lane; 0 disables the shuffle.
    """

    buffer_size: int = 0

    def __post_init__(self) -> None:
        check_setting("shuffle.buffer_size", self.buffer_size)


@dataclass(frozen=True)
class PackSpec:
    """How documents are packed into ``seq_len`` samples.

    Args:
        mode: ``"concat"``: TorchTitan-compatible concatenation (labels shifted inside each
            document, positions reset per document).
            ``"bestfit"``: documents are not split; each goes whole into the open sample with
            the least room that fits it (samples carry ``document_ids``).
        pad_id: Input id used to pad the partial sample emitted at a flush; ``None`` uses the
            tokenizer's pad id, or its eos id when it has none.
        long_documents: ``"bestfit"`` only: a document longer than ``seq_len`` is cut into
            ``seq_len`` pieces (``"split"``, default) or dropped and counted (``"drop"``).
        bins: ``"bestfit"`` only: samples held open at once (more: less padding).
    """

    mode: str = "concat"
    pad_id: int | None = None
    long_documents: str = "split"
    bins: int = 16

    def __post_init__(self) -> None:
        if self.mode not in PACK_MODES:
            raise RecipeError(f"pack.mode={self.mode!r} must be one of {PACK_MODES}")
        if self.long_documents not in LONG_DOCUMENTS:
            raise RecipeError(
                f"pack.long_documents={self.long_documents!r} must be one of {LONG_DOCUMENTS}"
            )
        check_setting("pack.bins", self.bins)
        if self.pad_id is not None:
            check_setting("pack.pad_id", self.pad_id)

    def canonical(self) -> dict[str, Any]:
        """Data-defining fields (best-fit settings only in best-fit mode)."""
        out: dict[str, Any] = {"mode": self.mode, "pad_id": self.pad_id}
        if self.mode == "bestfit":
            out["long_documents"] = self.long_documents
            out["bins"] = self.bins
        return out


@dataclass(frozen=True)
class MixtureSpec:
    """How several datasets are mixed (ignored with a single dataset).

    Weights are *token* shares. Without a schedule each dataset's ``weight`` is used; a
    schedule gives the weights at points of training progress, interpolated linearly
    between points and held after the last one.

    Args:
        schedule: ``((at, {dataset name: weight, ...}), ...)``, ``at`` strictly increasing from
            0; every point names every dataset.
        unit: Unit of ``at``: ``"steps"`` (global batches) or ``"tokens"``.
        estimate_records: Records sampled (seeded) per dataset to estimate tokens per record.
        tokens_per_record: Stored estimate per dataset name; skips the sampling when given.
        block: Work items per plan block (a power of two): the plan is exact per block, and
            the order inside a block is shuffled so lanes see a mix.
    """

    schedule: tuple[tuple[float, Mapping[str, float]], ...] | None = None
    unit: str = "steps"
    estimate_records: int = 512
    tokens_per_record: Mapping[str, float] | None = None
    block: int = 1024

    def __post_init__(self) -> None:
        if self.unit not in SCHEDULE_UNITS:
            raise RecipeError(f"mixture.unit={self.unit!r} must be one of {SCHEDULE_UNITS}")
        check_setting("mixture.estimate_records", self.estimate_records)
        if not 1 <= self.block <= 1 << 20 or self.block & (self.block - 1):
            raise RecipeError(f"mixture.block={self.block} must be a power of two <= 2**20")
        if self.tokens_per_record is not None:
            for name, value in self.tokens_per_record.items():
                check_setting(
                    f"mixture.tokens_per_record[{name!r}]",
                    value,
                    bound=SETTINGS["mixture.tokens_per_record"],
                )
        if self.schedule is not None:
            if not self.schedule:
                raise RecipeError("mixture.weights must hold at least one point")
            last = None
            for k, (at, weights) in enumerate(self.schedule):
                check_setting(f"mixture.weights[{k}].at", at)
                if k == 0 and at != 0:
                    raise RecipeError(f"mixture.weights[0].at={at!r} must be 0")
                if last is not None and not at > last:
                    raise RecipeError(
                        f"mixture.weights[{k}].at={at!r} must be > the previous point's {last!r}"
                    )
                last = at
                for name, w in weights.items():
                    check_setting(
                        f"mixture.weights[{k}].{name}", w, bound=SETTINGS["mixture.weights.weight"]
                    )
                if not sum(weights.values()) > 0:
                    raise RecipeError(f"mixture.weights[{k}]: the weights sum to 0")

    def check(self, names: Sequence[str]) -> None:
        """Check the schedule and stored estimate against the recipe's dataset names."""
        expected = sorted(names)
        if self.schedule is not None:
            for k, (_, weights) in enumerate(self.schedule):
                if sorted(weights) != expected:
                    raise RecipeError(
                        f"mixture.weights[{k}] names {sorted(weights)}; every point must give "
                        f"a weight to each dataset {expected}"
                    )
        if self.tokens_per_record is not None and sorted(self.tokens_per_record) != expected:
            raise RecipeError(
                f"mixture.tokens_per_record names {sorted(self.tokens_per_record)}, expected "
                f"{expected}"
            )

    def canonical(self) -> dict[str, Any]:
        """Data-defining fields of the mixture plan."""
        return {
            "plan": "split-tree/1",
            "block": self.block,
            "unit": self.unit,
            "estimate_records": self.estimate_records,
            "tokens_per_record": (
                {k: float(v) for k, v in sorted(self.tokens_per_record.items())}
                if self.tokens_per_record is not None
                else None
            ),
            "schedule": (
                [
                    {"at": float(at), "weights": {k: float(v) for k, v in sorted(w.items())}}
                    for at, w in self.schedule
                ]
                if self.schedule is not None
                else None
            ),
        }


@dataclass(frozen=True)
class OperatorSpec:
    """A user filter or map over document texts, registered in Python by name.

    Args:
        kind: ``"filter"`` (keep documents for which the function returns True) or ``"map"``.
        name: Name given to :func:`~zephon_nodes.register_filter` / ``register_map``.
        params: Keyword arguments passed to the function (JSON-safe values).
        datasets: Names of the datasets it applies to; ``None``: all.
    """

    kind: str
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    datasets: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in OPERATOR_KINDS:
            raise RecipeError(f"operator kind={self.kind!r} must be one of {OPERATOR_KINDS}")
        try:
            json.dumps(dict(self.params), sort_keys=True)
        except (TypeError, ValueError) as e:
            raise RecipeError(f"{self.kind} {self.name!r}: params must be JSON-safe: {e}") from None

    def canonical(self) -> dict[str, Any]:
        """Name, registered version, parameters and datasets."""
        from zephon_nodes.recipe.registry import lookup

        return {
            "kind": self.kind,
            "name": self.name,
            "version": lookup(self.kind, self.name).version,
            "params": json.loads(json.dumps(dict(self.params), sort_keys=True)),
            "datasets": list(self.datasets) if self.datasets is not None else None,
        }


@dataclass(frozen=True)
class Recipe:
    """Everything that defines the data stream (and nothing that does not).

    Args:
        datasets: The datasets; several are mixed by token share (see ``mixture``).
        tokenizer: The tokenizer.
        seed: Seed of every order-defining choice.
        num_lanes: Number of logical lanes ``L`` (fixed for the life of a run).
        global_batch_size: Samples per optimizer step ``G``; must be a multiple of ``L``.
        seq_len: Tokens per sample.
        flush_every: Work items per lane between flush points ``K``.
        work: Chunking and epochs.
        shuffle: Shuffle buffer.
        pack: Packing mode.
        mixture: Mixing plan settings and weight schedule (several datasets only).
        operators: User filters and maps over document texts, applied in order.
        image: Image decoding, patches and placeholder tokens (``[image]``); makes the
            recipe multimodal (tar shards, jsonl with base64 images; see ``docs/multimodal.md``).
        chat: Conversations rendered with a chat template, labels on trained turns only
            (``[chat]``); makes the recipe a chat / SFT recipe (see ``docs/sft.md``).
        source: Path of the TOML file the recipe came from, if any (not fingerprinted).
    """

    datasets: tuple[DatasetSpec, ...]
    tokenizer: TokenizerSpec
    seed: int = 0
    num_lanes: int = 8
    global_batch_size: int = 16
    seq_len: int = 2048
    flush_every: int = 8
    work: WorkSpec = field(default_factory=WorkSpec)
    shuffle: ShuffleSpec = field(default_factory=ShuffleSpec)
    pack: PackSpec = field(default_factory=PackSpec)
    mixture: MixtureSpec = field(default_factory=MixtureSpec)
    operators: tuple[OperatorSpec, ...] = ()
    image: ImageSpec | None = None
    source: Path | None = field(default=None, compare=False)
    chat: ChatSpec | None = None

    def __post_init__(self) -> None:
        if not self.datasets:
            raise RecipeError("a recipe needs at least one [[datasets]] entry")
        names = [d.name for d in self.datasets]
        if len(set(names)) != len(names):
            raise RecipeError(f"dataset names must be unique, got {names}")
        if len(self.datasets) > 1:
            self.mixture.check(names)
        elif self.mixture.schedule is not None:
            raise RecipeError("mixture.weights (a schedule) needs at least two datasets")
        for op in self.operators:
            unknown = sorted(set(op.datasets or ()) - set(names))
            if unknown:
                raise RecipeError(
                    f"{op.kind} {op.name!r}: datasets {unknown} are not in the recipe ({names})"
                )
        for name in ("num_lanes", "global_batch_size", "seq_len", "flush_every", "seed"):
            check_setting(name, getattr(self, name))
        if self.image is not None:
            self.image.check(self.seq_len)
            if self.pack.mode != "concat":
                raise RecipeError(
                    f"pack.mode={self.pack.mode!r}: a recipe with an [image] table packs with "
                    f"its own multimodal packer; leave pack.mode at 'concat'"
                )
            if self.operators:
                raise RecipeError("[[operators]] are not supported with an [image] table yet")
        if self.chat is not None and (self.image is not None or self.operators):
            raise RecipeError(
                "a [chat] recipe cannot have an [image] table or [[operators]] (they work on "
                "document texts; a chat record is a conversation)"
            )
        if self.global_batch_size % self.num_lanes:
            raise RecipeError(
                f"global_batch_size={self.global_batch_size} must be a multiple of "
                f"num_lanes={self.num_lanes} (every step takes the same number of samples "
                f"from each lane)"
            )

    @property
    def balanced_dealing(self) -> bool:
        """True if work items are dealt by size (``work.deal``, on a finite stream)."""
        finite = self.work.epochs is not None and any(
            d.on_exhausted == "end" for d in self.datasets
        )
        if self.work.deal == "auto":
            return finite and len(self.datasets) == 1 and self.image is None
        return finite and self.work.deal == "balanced"

    @property
    def wraps(self) -> bool:
        """True if a finite stream's lanes continue into the next pass (``end_of_data``)."""
        finite = self.work.epochs is not None and any(
            d.on_exhausted == "end" for d in self.datasets
        )
        return finite and self.work.end_of_data == "wrap"

    @property
    def samples_per_lane(self) -> int:
        """Samples each lane contributes to every global batch (``G / L``)."""
        return self.global_batch_size // self.num_lanes

    def chat_tokenizer_path(self) -> Path | None:
        """The tokenizer file whose ``tokenizer_config.json`` is the default chat template."""
        return self.tokenizer.path if self.tokenizer.kind == "hf" else None

    def replace(self, **changes: Any) -> Recipe:
        """Return a copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def canonical(self, *, lazy: bool = False) -> dict[str, Any]:
        """Return the canonical, JSON-safe description of every data-defining field.

        ``lazy``: the file lists of indexed datasets stay in their index's columns (see
        :meth:`DatasetSpec.canonical`); serialize with
        :func:`~zephon_nodes.recipe.canonical.canonical_json`.
        """
        return {
            "format": RECIPE_FORMAT,
            "seed": self.seed,
            "num_lanes": self.num_lanes,
            "global_batch_size": self.global_batch_size,
            "seq_len": self.seq_len,
            "flush_every": self.flush_every,
            "tokenizer": self.tokenizer.canonical(),
            "datasets": [d.canonical(lazy=lazy) for d in self.datasets],
            "work": {
                "chunk_size": self.work.chunk_size,
                "epochs": self.work.epochs,
                # Only where it changes the data: balanced dealing of a finite stream (by
                # tokens, or record counts above balance.EXACT_RECORDS records; the bytes
                # dealing of earlier versions was "balanced").
                **({"deal": "balanced-tokens"} if self.balanced_dealing else {}),
                **({"end_of_data": "wrap"} if self.wraps else {}),
            },
            "shuffle": {"buffer_size": self.shuffle.buffer_size},
            "pack": self.pack.canonical(),
            # Keys below appear only when used, so single-dataset recipes without operators
            # keep the fingerprint they had before these features existed.
            **({"mixture": self.mixture.canonical()} if len(self.datasets) > 1 else {}),
            **({"operators": [op.canonical() for op in self.operators]} if self.operators else {}),
            **({"image": self.image.canonical()} if self.image is not None else {}),
            **(
                {"chat": self.chat.canonical(self.chat_tokenizer_path())}
                if self.chat is not None
                else {}
            ),
        }

    def fingerprint(self) -> str:
        """Return the SHA-256 (hex) of the canonical JSON of :meth:`canonical`."""
        from zephon_nodes.recipe.canonical import canonical_sha256

        return canonical_sha256(self.canonical(lazy=True))

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> Recipe:
        """Load a recipe from a TOML file; relative paths are resolved against its directory.

        Raises:
            RecipeError: If the file is missing, is not valid TOML, or holds invalid fields.
        """
        p = Path(path)
        try:
            with open(p, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise RecipeError(f"recipe file not found: {p}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise RecipeError(f"{p}: not a valid TOML file: {e}") from None
        return cls.from_dict(data, base_dir=p.resolve().parent, source=p)

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], base_dir: Path | None = None, source: Path | None = None
    ) -> Recipe:
        """Build a recipe from the TOML structure (see ``docs/recipe.md``).

        Args:
            data: Parsed TOML.
            base_dir: Directory relative paths are resolved against (default: cwd).
            source: The file the data came from, used in error messages.
        """
        where = f"{source}: " if source else ""
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        top = _Fields(data, where + "recipe")
        _misspelled_tables(data, where)
        try:
            tok = top.table("tokenizer")
            tok_path = tok.get("path", str, None)
            tokenizer = TokenizerSpec(
                kind=tok.get("kind", str, "sentencepiece"),
                path=(base / tok_path) if tok_path is not None else None,
                add_bos=tok.get("add_bos", bool, True),
                add_eos=tok.get("add_eos", bool, True),
                name=tok.get("name", str, None),
            )
            tok.done()
            default_on_error = top.get("on_error", str, "raise")
            mx = top.table("mixture")
            schedule_raw = mx.raw("weights", list, None)
            datasets = []
            raw_datasets = top.raw("datasets", list, [])
            for i, raw in enumerate(raw_datasets):
                ds = _Fields(raw, f"{where}datasets[{i}]", "datasets")
                paths = ds.get("paths", list, [])
                if isinstance(paths, str):
                    paths = [paths]
                if not all(isinstance(x, str) for x in paths):
                    raise RecipeError(f"{where}datasets[{i}].paths must be a list of strings")
                if schedule_raw is not None and "weight" in raw:
                    raise RecipeError(
                        f"{where}datasets[{i}].weight: give weights either per dataset or as "
                        f"a schedule in [mixture] weights, not both"
                    )
                near = [k for k in raw if "paths" not in raw and did_you_mean(k, ["paths"])]
                if near:  # named before "give `paths` or `records`" hides the typo
                    raise RecipeError(
                        f"{where}datasets[{i}]: unknown key(s) {near} (did you mean `paths`?)"
                    )
                datasets.append(
                    DatasetSpec(
                        name=ds.get("name", str, f"dataset{i}"),
                        paths=tuple(paths),
                        text_field=ds.get("text_field", str, "text"),
                        weight=float(ds.get("weight", (int, float), 1.0)),
                        base_dir=base,
                        on_exhausted=ds.get("on_exhausted", str, "end"),
                        on_error=ds.get("on_error", str, default_on_error),
                        image_field=ds.get("image_field", str, None),
                        chunk_size=ds.get("chunk_size", int, None),
                        index=ds.get("index", str, None),
                    )
                )
                ds.done()
            mixture = _parse_mixture(mx, schedule_raw, where)
            mx.done()
            operators = []
            for i, raw in enumerate(top.raw("operators", list, [])):
                operators.append(
                    _parse_operator(_Fields(raw, f"{where}operators[{i}]", "operators"))
                )
            work = top.table("work")
            epochs_raw = work.get("epochs", (int, str), 1)
            if isinstance(epochs_raw, str):
                if epochs_raw != "inf":
                    raise RecipeError(
                        f"{where}work.epochs={epochs_raw!r} must be an integer >= 1 or "
                        f'"inf" (endless)'
                    )
                epochs: int | None = None
            else:
                epochs = epochs_raw
            work_spec = WorkSpec(
                chunk_size=work.get("chunk_size", int, 64),
                epochs=epochs,
                end_of_data=work.get("end_of_data", str, "drop_report"),
                deal=work.get("deal", str, "auto"),
            )
            work.done()
            sh = top.table("shuffle")
            shuffle = ShuffleSpec(buffer_size=sh.get("buffer_size", int, 0))
            sh.done()
            pk = top.table("pack")
            pack = PackSpec(
                mode=pk.get("mode", str, "concat"),
                pad_id=pk.get("pad_id", int, None),
                long_documents=pk.get("long_documents", str, "split"),
                bins=pk.get("bins", int, 16),
            )
            pk.done()
            recipe = cls(
                datasets=tuple(datasets),
                tokenizer=tokenizer,
                seed=top.get("seed", int, 0),
                num_lanes=top.get("num_lanes", int, 8),
                global_batch_size=top.get("global_batch_size", int, 16),
                seq_len=top.get("seq_len", int, 2048),
                flush_every=top.get("flush_every", int, 8),
                work=work_spec,
                shuffle=shuffle,
                pack=pack,
                mixture=mixture,
                operators=tuple(operators),
                image=ImageSpec.from_table(top.raw("image", dict, {}), f"{where}image")
                if "image" in data
                else None,
                source=source,
                chat=ChatSpec.from_table(top.raw("chat", dict, {}), base, f"{where}chat")
                if "chat" in data
                else None,
            )
            top.done()
        except RecipeError as e:
            msg = str(e)
            if where and not msg.startswith(where):
                msg = where + msg
            raise RecipeError(msg) from None
        return recipe


def _parse_mixture(mx: _Fields, schedule_raw: Any, where: str) -> MixtureSpec:
    schedule = None
    if schedule_raw is not None:
        points = []
        for k, point in enumerate(schedule_raw):
            if not isinstance(point, Mapping) or "at" not in point:
                raise RecipeError(
                    f"{where}mixture.weights[{k}] must be a table like "
                    f"{{at = 0, web = 0.7, code = 0.3}}, got {point!r}"
                )
            at = point["at"]
            weights = {str(n): w for n, w in point.items() if n != "at"}
            points.append((at, weights))
        schedule = tuple(points)
    tpr = mx.raw("tokens_per_record", Mapping, None)
    return MixtureSpec(
        schedule=schedule,
        unit=mx.get("unit", str, "steps"),
        estimate_records=mx.get("estimate_records", int, 512),
        tokens_per_record=dict(tpr) if tpr is not None else None,
        block=mx.get("block", int, 1024),
    )


def _parse_operator(op: _Fields) -> OperatorSpec:
    kinds = [k for k in OPERATOR_KINDS if k in op.data]
    if len(kinds) != 1:
        raise RecipeError(
            f"{op.where} must name exactly one of {list(OPERATOR_KINDS)} "
            f'(e.g. filter = "min_chars"), got keys {sorted(op.data)}'
        )
    datasets = op.get("datasets", list, None)
    if datasets is not None and not all(isinstance(x, str) for x in datasets):
        raise RecipeError(f"{op.where}.datasets must be a list of dataset names")
    spec = OperatorSpec(
        kind=kinds[0],
        name=op.get(kinds[0], str, ""),
        params=dict(op.raw("params", Mapping, {})),
        datasets=tuple(datasets) if datasets is not None else None,
    )
    op.done()
    return spec


class _Fields:
    """Typed access to one TOML table that reports unknown keys.

    Every value read is checked: its type, NaN and infinities for any number, and the
    range of :data:`~zephon_nodes.recipe.bounds.SETTINGS` under ``<table>.<key>``; an
    unknown key is named with the closest known one.
    """

    def __init__(self, data: Any, where: str, table: str = "") -> None:
        if not isinstance(data, Mapping):
            raise RecipeError(f"{where} must be a table, got {type(data).__name__}")
        self.data = data
        self.where = where
        self.table_name = table
        self.used: set[str] = set()

    def raw(self, key: str, typ: type | tuple[type, ...], default: Any) -> Any:
        self.used.add(key)
        if key not in self.data:
            return default
        value = self.data[key]
        if isinstance(value, bool) and typ is not bool and bool not in _as_tuple(typ):
            raise RecipeError(f"{self.where}.{key}={value!r} must be {_type_names(typ)}")
        if not isinstance(value, typ):
            raise RecipeError(
                f"{self.where}.{key}={value!r} must be {_type_names(typ)}, "
                f"got {type(value).__name__}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise RecipeError(f"{self.where}.{key}={value!r} must be a finite number")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            row = f"{self.table_name}.{key}" if self.table_name else key
            if row in SETTINGS:
                check_setting(f"{self.where}.{key}", value, bound=SETTINGS[row])
        return value

    def get(self, key: str, typ: type | tuple[type, ...], default: Any) -> Any:
        return self.raw(key, typ, default)

    def table(self, key: str) -> _Fields:
        self.used.add(key)
        top = not self.table_name and self.where.endswith("recipe")
        where = self.where.removesuffix("recipe") + key if top else f"{self.where}.{key}"
        return _Fields(self.data.get(key, {}), where, key)

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            hint = did_you_mean(unknown[0], self.used) if len(unknown) == 1 else ""
            raise RecipeError(f"{self.where}: unknown key(s) {unknown}{hint}")


_TABLES = ("tokenizer", "datasets", "mixture", "work", "shuffle", "pack", "chat", "image")


def _misspelled_tables(data: Mapping[str, Any], where: str) -> None:
    """Refuse a misspelled table (``[tokeniser]``) before its absence is blamed instead."""
    import difflib

    for key, value in data.items():
        if key in _TABLES or not isinstance(value, (Mapping, list)):
            continue
        close = difflib.get_close_matches(str(key), _TABLES, n=1, cutoff=0.8)
        if close and close[0] not in data:
            raise RecipeError(f"{where}recipe: unknown table [{key}] (did you mean [{close[0]}]?)")


def _as_tuple(typ: type | tuple[type, ...]) -> tuple[type, ...]:
    return typ if isinstance(typ, tuple) else (typ,)


def _type_names(typ: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in _as_tuple(typ))


def diff_canonical(expected: Any, got: Any, prefix: str = "") -> list[str]:
    """List the fields that differ between two canonical recipe descriptions.

    Args:
        expected: Canonical dict of the recipe the checkpoint was written with.
        got: Canonical dict of the recipe now in use.
        prefix: Dotted path prefix for nested fields.

    Returns:
        Lines such as ``"seq_len: checkpoint has 128, recipe has 256"``.
    """
    if isinstance(expected, Mapping) and isinstance(got, Mapping):
        out: list[str] = []
        for key in sorted(set(expected) | set(got)):
            name = f"{prefix}.{key}" if prefix else str(key)
            if key not in expected:
                out.append(f"{name}: only in the recipe ({got[key]!r})")
            elif key not in got:
                out.append(f"{name}: only in the checkpoint ({expected[key]!r})")
            else:
                out.extend(diff_canonical(expected[key], got[key], name))
        return out
    if (
        isinstance(expected, Sequence)
        and isinstance(got, Sequence)
        and not isinstance(expected, str)
        and not isinstance(got, str)
        and len(expected) == len(got)
    ):
        out = []
        for i, (a, b) in enumerate(zip(expected, got, strict=True)):
            out.extend(diff_canonical(a, b, f"{prefix}[{i}]"))
        return out
    if expected != got:
        return [f"{prefix}: checkpoint has {_short(expected)}, recipe has {_short(got)}"]
    return []


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 120 else text[:117] + "..."
