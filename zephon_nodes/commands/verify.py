"""``zephon verify``: run a recipe under many physical settings and compare every digest."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from zephon_nodes.commands.cache import add_token_cache_args, settings_from_args
from zephon_nodes.core.errors import RecipeError
from zephon_nodes.core.progress import Progress, is_terminal
from zephon_nodes.core.settings import using
from zephon_nodes.engine.operator_pools import OPERATOR_WORKERS_HELP, operator_workers_arg
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.pool import RUNNERS
from zephon_nodes.recipe import Recipe
from zephon_nodes.recipe.bounds import check_setting
from zephon_nodes.verification.baselines import naive_digests
from zephon_nodes.verification.matrix import (
    SettingResult,
    VerifyResult,
    default_dp_sizes,
    default_matrix,
    run_matrix,
)
from zephon_nodes.verification.report import ReportData, write_report

__all__ = ["add_parser", "format_table", "run"]


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _runner_list(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in values if v not in RUNNERS]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"runners must be among {RUNNERS}, got {text!r}")
    return values


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        "verify",
        help="check that a recipe gives identical global batches under many settings",
        description=(
            "Run RECIPE under a matrix of physical settings (dp sizes, workers, thread and "
            "process runners, micro-batch splits, checkpoint-and-resume from each dp size to "
            "each other) and "
            "compare every step's global batch digest with a reference run (one rank, "
            "operators inline). Exit status 0 only if every setting is identical."
        ),
    )
    p.add_argument("recipe", help="recipe TOML file")
    p.add_argument("--steps", type=int, default=16, help="steps per setting (default 16)")
    p.add_argument(
        "--dp",
        type=_int_list,
        default=None,
        help="dp sizes, e.g. 1,2,4 (default: every divisor of num_lanes up to 8)",
    )
    p.add_argument(
        "--num-workers",
        "--workers",
        dest="workers",
        type=_int_list,
        default=[1, 2],
        help="pool workers per rank, the counts to compare (default 1,2; --workers is the "
        "same flag)",
    )
    p.add_argument(
        "--runners",
        type=_runner_list,
        default=["thread", "process"],
        help="runners (default thread,process)",
    )
    p.add_argument(
        "--checkpoint-step",
        type=int,
        default=None,
        help="save after this step and resume at every other dp size (default: half the steps)",
    )
    p.add_argument("--no-resume", action="store_true", help="skip the checkpoint settings")
    p.add_argument(
        "--operator-workers",
        type=operator_workers_arg,
        default=None,
        metavar="OP=RUNNER:N,...",
        help=OPERATOR_WORKERS_HELP + "; used by every setting except the reference",
    )
    p.add_argument(
        "--micro-batch-sizes",
        type=_int_list,
        default=[1],
        help="micro-batch sizes to split each rank's step into, one setting per dp size each "
        "(default 1; 0 for none)",
    )
    p.add_argument(
        "--report",
        action="append",
        default=[],
        metavar="PATH",
        help="also write a picture: .html (inline SVG) or .png (needs matplotlib); repeatable",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    add_token_cache_args(p)
    p.set_defaults(run=__name__)


def format_table(result: VerifyResult) -> str:
    """Render the result as a plain-text table (one row per setting)."""
    rows = [("setting", "steps", "result", "tokens/s")]

    def row(r: SettingResult, label: str | None = None) -> tuple[str, str, str, str]:
        if label is not None:
            verdict = label
        elif r.error is not None:
            verdict = "error: " + r.error[:60]
        elif r.first_diff is None:
            verdict = "identical"
        else:
            verdict = f"differs at step {r.first_diff}"
        return (r.setting.name, str(len(r.digests)), verdict, f"{r.tokens_per_s:,.0f}")

    rows.append(row(result.reference, "(reference)"))
    rows.extend(row(r) for r in result.results)
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for i, r in enumerate(rows):
        lines.append(
            f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]:>{widths[3]}}"
        )
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    same = sum(r.identical for r in result.results)
    lines.append("")
    lines.append(
        f"{same}/{len(result.results)} settings identical to the reference over "
        f"{len(result.reference.digests)} steps"
        + ("" if result.ok else "  ** MISMATCH: the guarantee does not hold **")
    )
    return "\n".join(lines)


class _Progress:
    """Each setting's verdict: a live bar on a terminal, one plain line each otherwise.

    The reference run is announced apart, so the count is the count of the summary.
    """

    def __init__(self, total: int, stream: TextIO) -> None:
        self.stream = stream
        self.total = total
        self.done = -1  # the first result is the reference
        # On a terminal a live bar; elsewhere the plain lines below are the progress.
        self.bar = Progress(
            total, "settings", "setting", stream=stream, disable=not is_terminal(stream)
        )

    def __call__(self, r: SettingResult) -> None:
        self.done += 1
        if self.done == 0:
            line = (
                f"[reference] {r.setting.name}: {len(r.digests)} steps, {r.seconds:.2f} s; "
                f"{self.total} settings to go, about {self.total * r.seconds:.0f} s or more"
            )
        else:
            verdict = "identical" if r.identical else "DIFFERS"
            line = (
                f"[{self.done}/{self.total}] {r.setting.name}: {verdict} "
                f"({len(r.digests)} steps, {r.seconds:.2f} s)"
            )
        if self.bar.is_bar:
            self.bar.describe(r.setting.name)
            if self.done > 0:
                self.bar.update(1)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        self.bar.close()


def run(args: argparse.Namespace) -> int:
    """Run ``zephon verify``; return 0 if every setting matches, 1 otherwise."""
    with using(settings_from_args(args)):
        return _run(args)


def _check_before_running(args: argparse.Namespace) -> None:
    """Refuse, before the matrix runs (minutes or hours), what would fail only after it.

    Raises:
        RecipeError: A worker count out of range, a checkpoint step outside the run, a report
            that cannot be written (its folder missing or read-only, a folder at its path, a
            ``.png`` without matplotlib).
    """
    for w in args.workers:
        check_setting("--num-workers", w)
    k = args.checkpoint_step
    if k is not None and not args.no_resume and not 1 <= k < args.steps:
        raise RecipeError(
            f"--checkpoint-step: checkpoint step {k} must be in [1, {args.steps}) (a step "
            f"before --steps={args.steps}, so that the resumed runs have steps to compare)"
        )
    for path in args.report:
        p = Path(path)
        folder = p.parent
        if p.suffix.lower() not in (".html", ".htm", ".png") or p.is_dir():
            raise RecipeError(f"--report {path}: expected a .html or .png file name")
        if not folder.is_dir():
            raise RecipeError(f"--report {path}: the folder {folder} does not exist")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise RecipeError(f"--report {path}: the folder {folder} is not writable")
        if p.suffix.lower() == ".png" and importlib.util.find_spec("matplotlib") is None:
            raise RecipeError(
                f"--report {path}: a .png report needs matplotlib "
                "(pip install zephon-nodes[report]); a .html report needs nothing"
            )


def _run(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise RecipeError(f"--steps={args.steps} must be >= 1")
    _check_before_running(args)
    recipe = Recipe.from_toml(args.recipe)
    pipeline = Pipeline(recipe)
    pipeline.check_produces()
    dp_sizes = args.dp if args.dp is not None else default_dp_sizes(recipe.num_lanes)
    settings = default_matrix(
        recipe.num_lanes,
        dp_sizes=dp_sizes,
        workers=args.workers,
        runners=args.runners,
        resume=not args.no_resume,
        checkpoint_step=args.checkpoint_step,
        micro_batch_sizes=[b for b in args.micro_batch_sizes if b != 0],
        global_batch_size=recipe.global_batch_size,
    )
    print(
        f"zephon verify: a reference run, then {len(settings)} settings of {args.steps} steps "
        "each, one line per setting (--dp, --workers, --runners, --no-resume and --steps "
        "make fewer or shorter; decoding images makes each longer)",
        file=sys.stderr,
        flush=True,
    )
    progress = _Progress(len(settings), sys.stderr)
    try:
        result = run_matrix(
            pipeline,
            settings,
            args.steps,
            on_result=progress,
            operator_pools=args.operator_workers,
        )
    finally:
        progress.close()
    if args.report:
        baseline = {d: naive_digests(pipeline, d, args.steps) for d in dp_sizes}
        data = ReportData.from_results(result, baseline, title=str(args.recipe))
        for path in args.report:
            write_report(data, path)
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print(format_table(result))
    return 0 if result.ok else 1
