"""The recipe's ``[[stages]]``: planned changes of the recipe at given steps of a run.

A stage starts after step ``start_step`` and overrides, for the rest of the run (until the
next stage), what a long run may change::

    [[stages]]
    start_step = 1000
    seq_len = 8192                      # a context extension
    global_batch_size = 32              # a batch ramp is a list of stages
    remove_datasets = ["forum"]         # a dataset pulled
    weights = {web = 0.7}               # new token shares of kept datasets
    [stages.pack]                       # packing mode (and its options)
    mode = "bestfit"
    [stages.shuffle]
    buffer_size = 64
    [[stages.datasets]]                 # a dataset added (a table like [[datasets]])
    name = "papers"
    paths = ["papers/*.jsonl"]
    weight = 0.3
    [[stages.operators]]                # replaces the operator list (filters, maps)
    kind = "filter"
    name = "min_chars"

Each stage applies over the one before it; the result is a whole recipe (its effective
recipe, :attr:`StageSpec.recipe`) checked like any other. What fixes the identity of every
stream position (tokenizer, seed, lanes, flush windows, work items) cannot change inside a
run: :data:`FIXED` says why for each, and a stage that names one is refused. How a run
moves from one stage to the next is the engine's (:mod:`zephon_nodes.engine.stages`); an
unplanned change (``zephon amend``) is the same move.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.recipe.bounds import did_you_mean

__all__ = [
    "FIXED",
    "STAGE_KEYS",
    "StageSpec",
    "StagedRecipe",
    "fixed_differences",
    "parse_stages",
]


class StagedRecipe(Protocol):
    """What this module reads of a recipe.

    :class:`~zephon_nodes.recipe.recipe.Recipe` is one; it imports this module, so this
    module names only what it reads (no import back).
    """

    @property
    def seed(self) -> int:
        """The run's seed."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The tokenizer spec."""
        ...

    @property
    def num_lanes(self) -> int:
        """Lanes ``L``."""
        ...

    @property
    def flush_every(self) -> int:
        """Work items per flush window ``K``."""
        ...

    @property
    def work(self) -> Any:
        """The work spec."""
        ...

    @property
    def mixture(self) -> Any:
        """The mixture spec."""
        ...

    @property
    def image(self) -> Any:
        """The image spec (None: none)."""
        ...

    @property
    def chat(self) -> Any:
        """The chat spec (None: none)."""
        ...

    def chat_tokenizer_path(self) -> Any:
        """The tokenizer file of the default chat template (None: none)."""
        ...

    def canonical(self, *, lazy: bool = False) -> dict[str, Any]:
        """The canonical form (the fingerprint's input)."""
        ...


#: The recipe type of a stage (the whole recipe's own type).
R = TypeVar("R", bound=StagedRecipe)

#: Keys a ``[[stages]]`` table may hold.
STAGE_KEYS = (
    "start_step",
    "seq_len",
    "global_batch_size",
    "weights",
    "remove_datasets",
    "datasets",
    "pack",
    "shuffle",
    "operators",
)

#: What must stay fixed for the whole run, and why.
FIXED: dict[str, str] = {
    "seed": "every order (dataset permutations, mixture plans, shuffles) derives from it",
    "tokenizer": "the token ids already trained on would change meaning",
    "num_lanes": "lanes own the streams; change the lane count with `zephon relane`",
    "flush_every": "checkpoint positions count flush windows of flush_every work items",
    "work": "work items (chunk_size, epochs, deal) are the unit every stream position counts",
    "mixture": "the plan settings and the weight schedule are the run's; give a stage "
    "`weights` instead",
    "chat": "the sample format (chat rendering, labels) is the run's",
    "image": "the sample format (image patches) is the run's",
    "on_error": "give on_error per dataset in the dataset's own table",
    "stages": "stages do not nest",
}


@dataclass(frozen=True)
class StageSpec(Generic[R]):
    """One planned stage: the recipe in force from ``start_step`` on.

    Attributes:
        start_step: The stage starts after this step (its first batch is step
            ``start_step + 1``).
        recipe: The effective recipe of the stage (every override applied, no stages).
        overrides: The stage's table as written (canonical, for the fingerprint).
    """

    start_step: int
    recipe: R
    overrides: Mapping[str, Any]

    def canonical(self) -> dict[str, Any]:
        """The stage's part of the recipe's canonical form."""
        return {"start_step": self.start_step, "recipe": self.recipe.canonical(lazy=True)}


def _refuse_key(key: str, where: str) -> None:
    reason = FIXED.get(key)
    if reason is not None:
        raise RecipeError(f"{where}.{key} cannot change within a run: {reason}")
    known = (*STAGE_KEYS, *FIXED)
    raise RecipeError(f"{where}: unknown key {key!r}{did_you_mean(key, known)}")


def _names(datasets: Sequence[Any], where: str) -> list[str]:
    out = []
    for i, d in enumerate(datasets):
        if not isinstance(d, Mapping):
            raise RecipeError(f"{where}: datasets[{i}] must be a table")
        out.append(str(d.get("name", f"dataset{i}")))
    return out


def _apply(raw: dict[str, Any], stage: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Return the raw recipe ``raw`` with the stage table ``stage`` applied (a new dict)."""
    out = copy.deepcopy(raw)
    _apply_settings(out, stage, where)
    datasets = list(out.get("datasets", []))
    names = _names(datasets, where)
    # Each dataset keeps its name as its stream identity: give it explicitly.
    datasets = [{**d, "name": name} for d, name in zip(datasets, names, strict=True)]
    datasets, names = _remove(datasets, names, stage.get("remove_datasets", []), where)
    _reweight(datasets, names, stage.get("weights", {}), where)
    _add(datasets, names, stage.get("datasets", []), where)
    if not datasets:
        raise RecipeError(f"{where} removes every dataset; a stage needs at least one")
    out["datasets"] = datasets
    return out


def _apply_settings(out: dict[str, Any], stage: Mapping[str, Any], where: str) -> None:
    """The stage's geometry, ``pack``/``shuffle`` tables (merged) and ``operators`` (replaced)."""
    for key in ("seq_len", "global_batch_size"):
        if key in stage:
            out[key] = stage[key]
    for table in ("pack", "shuffle"):
        if table in stage:
            value = stage[table]
            if not isinstance(value, Mapping):
                raise RecipeError(f"{where}.{table} must be a table")
            out[table] = {**out.get(table, {}), **value}
    if "operators" in stage:
        out["operators"] = copy.deepcopy(stage["operators"])


def _remove(
    datasets: list[dict[str, Any]], names: list[str], removed: Any, where: str
) -> tuple[list[dict[str, Any]], list[str]]:
    """The datasets and names left once ``remove_datasets`` is applied."""
    if not isinstance(removed, list) or not all(isinstance(n, str) for n in removed):
        raise RecipeError(f"{where}.remove_datasets must be a list of dataset names")
    for name in removed:
        if name not in names:
            raise RecipeError(
                f"{where}.remove_datasets: {name!r} is not a dataset of the recipe in force "
                f"before this stage ({names})"
            )
    kept = [d for d, n in zip(datasets, names, strict=True) if n not in removed]
    return kept, [n for n in names if n not in removed]


def _reweight(datasets: list[dict[str, Any]], names: list[str], weights: Any, where: str) -> None:
    """Set the ``weights`` of datasets in force (in place)."""
    if not isinstance(weights, Mapping):
        raise RecipeError(f"{where}.weights must be a table {{dataset = weight}}")
    for name, w in weights.items():
        if name not in names:
            raise RecipeError(
                f"{where}.weights: {name!r} is not a dataset of this stage ({names}); add it "
                f"with [[stages.datasets]]"
            )
        datasets[names.index(name)]["weight"] = w


def _add(datasets: list[dict[str, Any]], names: list[str], added: Any, where: str) -> None:
    """Append the stage's new datasets (in place), each named, none already in force."""
    if not isinstance(added, list):
        raise RecipeError(f"{where}.datasets must be a list of dataset tables")
    for i, name in enumerate(_names(added, f"{where}.datasets")):
        if name in names:
            raise RecipeError(
                f"{where}.datasets[{i}]: a dataset named {name!r} is already in the recipe; "
                f"change its weight with `weights` (a dataset's files cannot change in a run)"
            )
        if "name" not in added[i]:
            raise RecipeError(f"{where}.datasets[{i}] needs a `name` (its stream's identity)")
        datasets.append(copy.deepcopy(dict(added[i])))
        names.append(name)


def parse_stages(
    data: Mapping[str, Any],
    base: R,
    build: Callable[[Mapping[str, Any], str], R],
    where: str,
) -> tuple[StageSpec[R], ...]:
    """Parse the ``stages`` list of a raw recipe (``data``) whose base recipe is ``base``.

    Args:
        data: The whole raw recipe (TOML structure).
        base: The recipe without its stages.
        build: Builds a recipe from a raw recipe (relative paths as the recipe's own); the
            second argument names the stage in messages.
        where: Prefix of messages (the recipe file).

    Raises:
        RecipeError: Naming the stage and the key that is wrong or may not change.
    """
    raw_stages = data.get("stages", [])
    if not isinstance(raw_stages, list):
        raise RecipeError(f"{where}stages must be a list of [[stages]] tables")
    if not raw_stages:
        return ()
    if base.mixture.schedule is not None:
        raise RecipeError(
            f"{where}stages: a recipe with a [mixture] weights schedule cannot have stages "
            f"(write the curriculum as stages with `weights`)"
        )
    current = {k: copy.deepcopy(v) for k, v in data.items() if k != "stages"}
    out: list[StageSpec[R]] = []
    previous = 0
    for i, stage in enumerate(raw_stages):
        here = f"{where}stages[{i}]"
        if not isinstance(stage, Mapping):
            raise RecipeError(f"{here} must be a table")
        for key in stage:
            if key not in STAGE_KEYS:
                _refuse_key(str(key), here)
        start = stage.get("start_step")
        if isinstance(start, bool) or not isinstance(start, int) or start < 1:
            raise RecipeError(f"{here}.start_step={start!r} must be an integer >= 1")
        if start <= previous:
            raise RecipeError(
                f"{here}.start_step={start} must be greater than the previous stage's "
                f"({previous}): stages are listed in the order they start"
            )
        previous = start
        current = _apply(current, stage, here)
        recipe = build(current, f"{here} (start_step={start}): ")
        overrides = {k: copy.deepcopy(v) for k, v in stage.items()}
        out.append(StageSpec(start_step=start, recipe=recipe, overrides=overrides))
    return tuple(out)


def _fixed_parts(recipe: StagedRecipe) -> dict[str, Any]:
    """The fields fixed for a run (never the datasets: no file is read here)."""
    work = recipe.work
    return {
        "seed": recipe.seed,
        "tokenizer": recipe.tokenizer.canonical(),
        "num_lanes": recipe.num_lanes,
        "flush_every": recipe.flush_every,
        "work": (work.chunk_size, work.epochs, work.deal, work.end_of_data),
        "chat": recipe.chat.canonical(recipe.chat_tokenizer_path()) if recipe.chat else None,
        "image": recipe.image.canonical() if recipe.image is not None else None,
    }


def fixed_differences(old: StagedRecipe, new: StagedRecipe) -> list[str]:
    """Name each field that must stay fixed in a run and differs between two recipes.

    Returns:
        Lines such as ``seed cannot change within a run: <why>`` (empty: none differs).
    """
    a, b = _fixed_parts(old), _fixed_parts(new)
    return [
        f"{key} cannot change within a run ({a[key]!r:.60} -> {b[key]!r:.60}): {FIXED[key]}"
        for key in a
        if a[key] != b[key]
    ]
