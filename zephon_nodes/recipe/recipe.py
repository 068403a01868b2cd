"""The recipe: everything that defines the data stream, and its fingerprint.

A :class:`Recipe` holds the datasets, tokenizer, seed, lanes, batch geometry and operator
parameters. Physical settings (ranks, workers, runner, prefetch, micro-batch size) are *not*
part of it and never change a byte of output. :meth:`Recipe.fingerprint` is the SHA-256 of
:meth:`Recipe.canonical`, a canonical JSON of every data-defining field, including a digest
of the tokenizer file and the list of data files with their sizes.
"""

from __future__ import annotations

import codecs
import dataclasses
import difflib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.recipe._fields import _Fields
from zephon_nodes.recipe.bounds import MAX_SHOWN_KEY, check_setting, did_you_mean, unknown_keys
from zephon_nodes.recipe.canonical import canonical_sha256
from zephon_nodes.recipe.chat import ChatSpec
from zephon_nodes.recipe.datasets import DatasetSpec
from zephon_nodes.recipe.image import ImageSpec
from zephon_nodes.recipe.mixture import MixtureSpec
from zephon_nodes.recipe.operators import OPERATOR_KINDS, OperatorSpec
from zephon_nodes.recipe.packing import PackSpec
from zephon_nodes.recipe.shuffle import ShuffleSpec
from zephon_nodes.recipe.stages import StageSpec, fixed_differences, parse_stages
from zephon_nodes.recipe.tokenizer import TokenizerSpec
from zephon_nodes.recipe.work import WorkSpec

__all__ = ["RECIPE_FORMAT", "Recipe"]

RECIPE_FORMAT = 1


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
        stages: Planned changes of the recipe at given steps (``[[stages]]``, see
            :mod:`zephon_nodes.recipe.stages`), in the order they start.
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
    stages: tuple[StageSpec[Recipe], ...] = ()

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
        if self.stages:
            self._check_stages()

    def _check_stages(self) -> None:
        """Refuse stages a run cannot move through (see :mod:`zephon_nodes.recipe.stages`)."""
        if self.balanced_dealing or self.wraps:
            raise RecipeError(
                "a recipe with [[stages]] needs its work items dealt round-robin: a stage "
                "continues each dataset's stream in every lane where it was, which a stream "
                "dealt by size (work.deal, the default for a finite single-dataset recipe) or "
                'wrapped (work.end_of_data = "wrap") cannot; set work.deal = "round_robin"'
            )
        previous = 0
        for i, stage in enumerate(self.stages):
            if stage.start_step <= previous:
                raise RecipeError(
                    f"stages[{i}].start_step={stage.start_step} must be greater than "
                    f"{previous} (stages are listed in the order they start)"
                )
            previous = stage.start_step
            if stage.recipe.stages:
                raise RecipeError(f"stages[{i}]: a stage's recipe cannot have stages")
            differs = fixed_differences(self.base, stage.recipe)
            if differs:
                raise RecipeError(f"stages[{i}] (start_step={stage.start_step}): {differs[0]}")

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
            **({"stages": [s.canonical() for s in self.stages]} if self.stages else {}),
        }

    @property
    def base(self) -> Recipe:
        """The recipe in force before the first stage (this recipe without its stages)."""
        return dataclasses.replace(self, stages=()) if self.stages else self

    def stage_recipe(self, index: int) -> Recipe:
        """The effective recipe of stage ``index`` (0: the base recipe, before any stage)."""
        return self.base if index == 0 else self.stages[index - 1].recipe

    def stage_at(self, step: int) -> int:
        """The stage whose batches follow step ``step`` (0: the base recipe)."""
        return sum(1 for s in self.stages if s.start_step <= step)

    def fingerprint(self) -> str:
        """Return the SHA-256 (hex) of the canonical JSON of :meth:`canonical`."""
        return canonical_sha256(self.canonical(lazy=True))

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> Recipe:
        """Load a recipe from a TOML file; relative paths are resolved against its directory.

        Raises:
            RecipeError: If the file is missing, is not valid TOML, or holds invalid fields.
        """
        p = Path(path)
        if p.exists() and not p.is_dir() and not p.is_file():  # a FIFO would block, /dev/zero
            raise RecipeError(f"{p}: not a regular file (a recipe is a TOML file)")  # never end
        try:
            raw = p.read_bytes()
            # Editors on Windows write a UTF-8 byte-order mark, which tomllib refuses.
            data = tomllib.loads(raw.removeprefix(codecs.BOM_UTF8).decode("utf-8"))
        except FileNotFoundError:
            raise RecipeError(f"recipe file not found: {p}") from None
        except IsADirectoryError:
            raise RecipeError(f"{p}: is a directory, not a recipe TOML file") from None
        except OSError as e:
            raise RecipeError(f"{p}: cannot read the recipe file: {e.strerror or e}") from None
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
        if isinstance(data, Mapping) and not data:
            raise RecipeError(
                f"{where}the recipe is empty: it needs a [tokenizer] table and at least one "
                f"[[datasets]] entry (docs/recipe.md)"
            )
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
                paths = ds.get("paths", (list, str), [])  # one pattern may be a string
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
                    raise RecipeError(unknown_keys(f"{where}datasets[{i}]", near, ["paths"]))
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
                        format=ds.get("format", str, None),
                        vocab_size=ds.get("vocab_size", int, None),
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
            raw_stages = top.raw("stages", list, [])
            top.done()
            if raw_stages:

                def build(raw: Mapping[str, Any], here: str) -> Recipe:
                    try:
                        return cls.from_dict(raw, base_dir=base)
                    except RecipeError as e:
                        raise RecipeError(here + str(e)) from None

                stages = parse_stages(data, recipe, build, where)
                recipe = dataclasses.replace(recipe, stages=stages)
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


_TABLES = ("tokenizer", "datasets", "mixture", "work", "shuffle", "pack", "chat", "image")


def _misspelled_tables(data: Mapping[str, Any], where: str) -> None:
    """Refuse a misspelled table (``[tokeniser]``) before its absence is blamed instead."""
    for key, value in data.items():
        if key in _TABLES or not isinstance(value, (Mapping, list)) or len(key) > MAX_SHOWN_KEY:
            continue
        close = difflib.get_close_matches(str(key), _TABLES, n=1, cutoff=0.8)
        if close and close[0] not in data:
            raise RecipeError(f"{where}recipe: unknown table [{key}] (did you mean [{close[0]}]?)")
