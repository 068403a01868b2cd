"""``zephon stats``: token shares, padding and skipped records over the first S global batches."""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from zephon_nodes.commands.cache import add_token_cache_args, settings_from_args
from zephon_nodes.commands.options import add_workers_arg
from zephon_nodes.core.errors import RecipeError
from zephon_nodes.core.settings import using
from zephon_nodes.engine.end_of_data import end_counts
from zephon_nodes.engine.mixture_log import read_updates
from zephon_nodes.engine.multiplexer import Multiplexer
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.engine.work import WorkSource
from zephon_nodes.operators.pack import IGNORE_INDEX
from zephon_nodes.recipe import Recipe
from zephon_nodes.state.merge import merge_states
from zephon_nodes.state.schema import LANES_KEY, STAGE_KEY
from zephon_nodes.state.stage import summarize_changes

__all__ = ["add_parser", "compute_stats", "run"]

FILTER_PREFIX = "filter:"


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        "stats",
        help="token shares per dataset, padding and skipped records over the first S steps",
        description=(
            "Run the recipe for --steps global batches and report, over those batches: "
            "trained tokens (labels that count in the loss) per dataset and their shares "
            "(token_shares), non-padding tokens, the padding fraction (padding_fraction), "
            "and, over the work items read to make them (whole flush windows), documents per "
            "dataset and records skipped by reason."
        ),
    )
    p.add_argument("recipe", help="recipe TOML file")
    p.add_argument("--steps", type=int, required=True, help="global batches to measure")
    p.add_argument("--dp-world-size", type=int, default=1, help="simulated ranks (default 1)")
    add_workers_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--cache-limit",
        default=None,
        help="node cache size, e.g. 50G (default: $ZEPHON_CACHE_LIMIT, else min(50%% of "
        "free disk, 100G)); reports its hits",
    )
    p.add_argument(
        "--mixture-updates",
        default=None,
        metavar="FILE",
        help='JSON list of decisions [{"step": 5, "weights": {"web": 0.2, "code": 0.8}}, ...], '
        "each made after its step (dynamic mixture)",
    )
    p.add_argument(
        "--window-steps",
        type=int,
        default=None,
        metavar="N",
        help="also report token shares per window of N steps (token_shares_per_window)",
    )
    add_token_cache_args(p)
    p.set_defaults(run=__name__)


def _shares(counts: Mapping[str, float]) -> dict[str, float]:
    total = sum(counts.values())
    return {k: (v / total if total else 0.0) for k, v in counts.items()}


def compute_stats(
    recipe: Recipe,
    steps: int,
    dp_world_size: int = 1,
    num_workers: int = 2,
    *,
    mixture_updates: Sequence[tuple[int, Mapping[str, float]]] = (),
    window_steps: int | None = None,
) -> dict[str, Any]:
    """Measure a recipe's first ``steps`` global batches (see the command's description).

    Token counts come from a ``dataset_ids`` field the pipeline adds in provenance mode
    (every other field is as in training). Documents and skipped records are counted by
    running the stateless operators again over the work items each lane read up to the end
    of its last flush window touched; the counts travel on the batches
    (:attr:`~zephon_nodes.operators.documents.DocBatch.skipped`) and are summed in lane and
    item order, so they are the same at every dp size and worker count.

    ``mixture_updates`` are decisions ``(step, weights)`` made on every rank after their
    step; with ``window_steps``, ``token_shares_per_window`` lists per window of that many
    steps its first and last step, token shares and the weights in force (the last decision
    made before the window, or the recipe's static weights).

    Returns:
        A JSON-safe dict. ``tokens`` counts trained tokens (label positions that count in
        the loss: not padding, not a chat recipe's prompt or system turns);
        ``non_padding_tokens`` counts input positions holding a document's token;
        ``token_shares`` maps dataset names to fractions of the trained tokens;
        ``padding_fraction`` is the padded share of all positions; ``weights`` are the
        recipe's and ``weights_in_force`` those after the last decision. With a node
        cache limit set, ``cache`` holds its counters over the run (hits, misses,
        bytes_fetched, peak_bytes, ...).
    """
    if steps < 1:
        raise RecipeError(f"--steps={steps} must be >= 1")
    if window_steps is not None and window_steps < 1:
        raise RecipeError(f"--window-steps={window_steps} must be >= 1")
    pipeline = Pipeline(recipe, provenance=True)
    pipeline.check_produces()
    names = _dataset_names(recipe)
    static = _static_weights(recipe, names)
    tally = _Tally(names, window_steps, static)
    with WorkerPool(num_workers, "thread") as pool:
        ranks: list[Multiplexer] = [
            pipeline.rank_node(dp_world_size, r, pool=pool) for r in range(dp_world_size)
        ]
        for node in ranks:
            node.reset(None)
        ended: dict[str, Any] | None = None
        try:
            for t in range(steps):
                tally.in_force = _apply_updates(t, ranks, mixture_updates, tally.in_force)
                tally.open_window(t)
                before = [node.state_dict() for node in ranks]
                batches = [next(node) for node in ranks for _ in range(node.micro_per_step)]
                tally.add(ranks[0], batches)
                tally.close_step(steps)
        except StopIteration:
            ended = merge_states(before)
        cache = pipeline.cache_stats()  # before the documents are counted (they read again)
        changes, documents, skipped = _documents(pipeline, ranks, pool, ended)
        end_of_data = None
        if ended is not None:
            end_of_data = _end_of_data(pipeline, ended, tally.produced, pool)
    per_dataset = {n: int(t) for n, t in zip(names, tally.tokens.tolist(), strict=True)}
    skipped_records, filtered = _split_skipped(names, skipped)
    out: dict[str, Any] = {
        "recipe": str(recipe.source) if recipe.source else None,
        "fingerprint": pipeline.fingerprint,
        "steps": tally.produced,
        "dp_world_size": dp_world_size,
        "tokens": int(tally.tokens.sum()),
        "non_padding_tokens": tally.non_padding,
        "positions": tally.positions,
        "padding_fraction": tally.padding / tally.positions if tally.positions else 0.0,
        "tokens_per_dataset": per_dataset,
        "token_shares": _shares(per_dataset),
        "documents_per_dataset": documents,
        "document_shares": _shares(documents),
        "recipe_change": changes,
        "skipped_records": skipped_records,
        "skipped_files": pipeline.skipped_files,
        "filtered": filtered,
        "end_of_data": end_of_data,
    }
    if cache is not None:
        out["cache"] = cache
    tokens_cached = pipeline.token_cache_stats()
    if tokens_cached is not None:
        out["token_cache"] = tokens_cached
    if static is not None:
        out["weights"] = static
        # The weights in force after the last step: the recipe's, or the last decision's.
        out["weights_in_force"] = tally.in_force
    if mixture_updates:
        out["mixture_log"] = [{"step": s, "weights": dict(w)} for s, w in ranks[0].mixture_log]
    if window_steps:
        out["token_shares_per_window"] = tally.windows
    if "estimate" in pipeline.canonical.get("mixture", {}):
        out["estimated_tokens_per_record"] = pipeline.canonical["mixture"]["estimate"]
    return out


def _dataset_names(recipe: Recipe) -> list[str]:
    """Every dataset the run reads, its stages' included.

    A sample's dataset ids index the datasets of the recipe in force when it was made.
    """
    names = [d.name for d in recipe.datasets]
    for stage in recipe.stages:
        names += [d.name for d in stage.recipe.datasets if d.name not in names]
    return names


def _static_weights(recipe: Recipe, names: Sequence[str]) -> dict[str, float] | None:
    """The recipe's weights as shares, when it mixes several datasets without a schedule."""
    if len(names) > 1 and recipe.mixture.schedule is None:
        return _shares({d.name: d.weight for d in recipe.datasets})
    return None


def _apply_updates(
    t: int,
    ranks: Sequence[Multiplexer],
    mixture_updates: Sequence[tuple[int, Mapping[str, float]]],
    in_force: dict[str, float] | None,
) -> dict[str, float] | None:
    """Apply the decisions made after step ``t`` on every rank; return the weights in force."""
    for at, weights in mixture_updates:
        if at == t:
            for node in ranks:
                node.set_mixture(weights)
            in_force = dict(ranks[0].mixture_log[-1][1])
    return in_force


@dataclasses.dataclass
class _Tally:
    """Token and position counts over the steps measured, in total and per window."""

    names: list[str]
    window_steps: int | None
    in_force: dict[str, float] | None
    padding: int = 0
    positions: int = 0
    non_padding: int = 0
    produced: int = 0
    windows: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.tokens = np.zeros(len(self.names), dtype=np.int64)
        self.window = np.zeros(len(self.names), dtype=np.int64)
        self.window_weights = self.in_force

    def open_window(self, t: int) -> None:
        """Start a new window at step index ``t`` when one begins there."""
        if self.window_steps and t % self.window_steps == 0:
            self.window[:] = 0
            self.window_weights = self.in_force

    def add(self, first_rank: Multiplexer, batches: Sequence[Mapping[str, Any]]) -> None:
        """Count one step's micro batches (their dataset ids index the recipe in force)."""
        names = self.names
        in_use = [d.name for d in first_rank.pipeline.recipe.datasets]
        to_run = np.asarray([names.index(n) for n in in_use] + [-1], dtype=np.int64)
        for mb in batches:
            labels = mb["labels"].numpy()
            ds = to_run[mb["dataset_ids"].numpy()]  # -1 (padding) stays -1
            real = labels != IGNORE_INDEX
            counts = np.bincount(ds[real], minlength=len(names))[: len(names)]
            self.tokens += counts
            self.window += counts
            self.padding += int((ds < 0).sum())  # -1 on padding (chat masks are not)
            self.non_padding += int((ds >= 0).sum())
            self.positions += labels.size

    def close_step(self, steps: int) -> None:
        """Count a produced step; close its window when it is the window's last."""
        self.produced += 1
        produced, window_steps = self.produced, self.window_steps
        if window_steps and (produced % window_steps == 0 or produced == steps):
            start = (produced - 1) // window_steps * window_steps + 1
            shares = _shares(dict(zip(self.names, self.window.tolist(), strict=True)))
            self.windows.append(
                {
                    "steps": [start, produced],
                    "token_shares": shares,
                    "weights": self.window_weights,
                }
            )


def _documents(
    pipeline: Pipeline,
    ranks: Sequence[Multiplexer],
    pool: WorkerPool,
    ended: Mapping[str, Any] | None,
) -> tuple[dict[str, Any] | None, dict[str, int], dict[str, dict[str, int]]]:
    """The recipe changes the ranks went through, and the documents and skipped records.

    Each lane's items are those its rank's work source deals (the decisions made are in
    it), up to the lane's position after the last step produced: when the data ended, the
    merged state before the step that could not be filled (``ended``), since the ranks
    before the one that ran dry had read on into that step.
    """
    lanes: dict[int, tuple[WorkSource, tuple[int, int]]] = {}
    for node in ranks:
        positions = (ended if ended is not None else node.get_state())[LANES_KEY]
        for lane in node.lanes:
            w, c = positions[str(lane)]
            lanes[lane] = (node.work_source, (w, c))
    changes = summarize_changes(node.get_state().get(STAGE_KEY) for node in ranks)
    if changes:  # documents are counted over the base recipe's streams only
        return changes, {}, {}
    documents, skipped = _count_items(pipeline, lanes, pool)
    return changes, documents, skipped


def _end_of_data(
    pipeline: Pipeline, ended: dict[str, Any], produced: int, pool: WorkerPool
) -> dict[str, Any]:
    """What the data's end left unread, from the rank states before the step that ended."""
    recipe = pipeline.recipe
    unused, endless = end_counts(pipeline, ended, pool)
    delivered = produced * recipe.global_batch_size
    total = delivered + sum(unused.values())
    return {
        "delivered_samples": delivered,
        "unused_samples": sum(unused.values()),
        "unused_fraction": sum(unused.values()) / total if total else 0.0,
        "unused_per_lane": {str(lane): n for lane, n in sorted(unused.items())},
        "endless_lanes": endless,
        "policy": recipe.work.end_of_data,
    }


def _split_skipped(
    names: Sequence[str], skipped: Mapping[str, Mapping[str, int]]
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """Split skip counts into records skipped (by reason) and records filtered (by filter)."""
    skipped_records: dict[str, dict[str, int]] = {n: {} for n in names} | {
        n: {r: c for r, c in v.items() if not r.startswith(FILTER_PREFIX)}
        for n, v in skipped.items()
    }
    filtered = {
        n: {r[len(FILTER_PREFIX) :]: c for r, c in v.items() if r.startswith(FILTER_PREFIX)}
        for n, v in skipped.items()
    }
    return skipped_records, filtered


def _count_items(
    pipeline: Pipeline,
    lanes: Mapping[int, tuple[WorkSource, tuple[int, int]]],
    pool: WorkerPool,
) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Count documents and skipped records over the work items the lanes read.

    ``lanes`` maps each lane to the work source it reads and its position ``[window,
    consumed]``.
    """
    k = pipeline.recipe.flush_every
    names = [d.name for d in pipeline.recipe.datasets]
    items = []
    for lane in sorted(lanes):
        source, (window, consumed) = lanes[lane]
        for i in range((window + (1 if consumed else 0)) * k):
            item = source.work(lane, i)
            if item is None:
                break
            items.append(item)
    documents = dict.fromkeys(names, 0)
    skipped: dict[str, dict[str, int]] = {n: {} for n in names}
    with cf.ThreadPoolExecutor(max(pool.num_workers, 1)) as ex:
        for item, batch in zip(items, ex.map(pipeline.stateless, items), strict=True):
            name = names[item.dataset]
            documents[name] += len(batch.lengths)
            for reason, count in batch.skipped:
                skipped[name][reason] = skipped[name].get(reason, 0) + count
    return documents, skipped


def run(args: argparse.Namespace) -> int:
    """Run ``zephon stats`` (inside the settings its flags give, see core/settings)."""
    with using(settings_from_args(args)):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    recipe = Recipe.from_toml(args.recipe)
    updates: list[tuple[int, dict[str, float]]] = []
    if args.mixture_updates:
        updates = read_updates(args.mixture_updates, [d.name for d in recipe.datasets])
    stats = compute_stats(
        recipe,
        args.steps,
        args.dp_world_size,
        args.num_workers,
        mixture_updates=updates,
        window_steps=args.window_steps,
    )
    if args.json:
        print(json.dumps(stats, sort_keys=True))
        return 0
    print(
        f"{stats['steps']} steps, {stats['tokens']} trained tokens "
        f"({stats['non_padding_tokens']} non-padding), padding {stats['padding_fraction']:.4f}"
    )
    # The weights in force at the end: after a decision (--mixture-updates) that decision's.
    weights = stats.get("weights_in_force") or {}
    header = "weight now" if stats.get("mixture_log") else "weight"
    print(
        f"{'dataset':<20} {'trained tokens':>14} {'token share':>12} {header:>10} {'doc share':>10}"
    )
    for name, count in stats["tokens_per_dataset"].items():
        w = f"{weights[name]:.4f}" if name in weights else "-"
        docs = stats["document_shares"].get(name)
        print(
            f"{name:<20} {count:>14} {stats['token_shares'][name]:>12.4f} {w:>10} "
            f"{f'{docs:.4f}' if docs is not None else '-':>10}"
        )
    change = stats["recipe_change"]
    if change is not None:
        print(
            f"recipe changed: stage {change['stage']} in force since step "
            f"{change['after_step']} ({change['amendments']} amendment(s)); the changes "
            f"dropped {change['dropped_samples']} samples, {change['dropped_tokens']} tokens "
            f"(shuffle buffers and cut documents; documents are not counted across a change)"
        )
    if "cache" in stats:
        c = stats["cache"]
        print(
            f"node cache: {c['hits']} hits, {c['misses']} misses, {c['bytes_fetched']} bytes "
            f"fetched, peak {c['peak_bytes']} of {c['limit_bytes']} bytes"
        )
    if "token_cache" in stats:
        t = stats["token_cache"]
        print(
            f"token cache: {t['hits']} hits, {t['misses']} misses, {t['bytes_read']} bytes read, "
            f"{t['bytes_written']} written, {t['evictions']} evictions, {t['damaged']} damaged, "
            f"{t['cpu_s_saved']:.2f} CPU s saved"
        )
    end = stats["end_of_data"]
    if end is not None:
        per_lane = ", ".join(f"{k}: {v}" for k, v in end["unused_per_lane"].items())
        never = end["endless_lanes"]
        print(
            f"end of data after {stats['steps']} steps: {end['unused_samples']} of "
            f"{end['delivered_samples'] + end['unused_samples']} samples unused "
            f"({end['unused_fraction']:.2%}); per lane: {{{per_lane}}}"
            + (f"; lanes {never} never end, not counted" if never else "")
        )
    for key in ("skipped_records", "skipped_files", "filtered"):
        for name, reasons in stats[key].items():
            for reason, count in sorted(reasons.items()):
                print(f"{key}: {name}: {reason}: {count}")
    for entry in stats.get("mixture_log", []):
        w = " ".join(f"{n}={v:.4f}" for n, v in entry["weights"].items())
        print(f"decision after step {entry['step']}: {w}")
    for win in stats.get("token_shares_per_window", []):
        a, b = win["steps"]
        shares = " ".join(f"{n}={v:.4f}" for n, v in win["token_shares"].items())
        print(f"steps {a}-{b}: {shares}")
    return 0
