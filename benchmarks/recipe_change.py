"""What a recipe change mid-run costs, on the demo corpus (``examples/stages``).

Usage::

    python -m benchmarks.recipe_change                 # Markdown on stdout
    python -m benchmarks.recipe_change --json out.json --steps 20 60

For each change step ``S``: the run of ``examples/stages/base.toml`` (8 lanes, 128-token
samples, a 32-sample shuffle buffer) is saved after step ``S`` at dp 4 and amended to
``extended.toml`` (512-token samples, a second dataset). Reported:

* the samples and tokens the change drops (per lane: the shuffle buffer's samples and the
  rest of the document cut), against the tokens delivered before it;
* CPU seconds (this process, all threads) to amend, and to resume the amended state and
  produce one step, against resuming the plain checkpoint and producing one step;
* whether the amended run's next 5 steps equal the staged recipe's (``staged.toml`` with
  its stage moved to ``S``) at dp 2 (they must).

The demo corpus and tokenizer are built on first use (``make demo`` builds them too).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from zephon_nodes.commands.demo import default_recipe_path, prepare_default
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.stages import amend_state
from zephon_nodes.recipe import Recipe
from zephon_nodes.verification.simulate import simulate

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "stages"


def _cpu() -> float:
    return time.process_time()


def _digests(p: Pipeline, steps: int, dp: int, state: Any = None) -> list[str]:
    return [r.digest for r, _ in simulate(p, dp, steps, resume_state=state)]


def measure(step: int) -> dict[str, Any]:
    """Amend the demo run after ``step``; see the module docstring."""
    base = Pipeline(Recipe.from_toml(EXAMPLE / "base.toml"))
    extended = Pipeline(Recipe.from_toml(EXAMPLE / "extended.toml"))
    saved: list[dict[str, Any]] = []
    tokens_before = 0
    for result, _ in simulate(base, 4, step, save_at=step, on_save=saved.append):
        tokens_before += result.tokens
    t0 = _cpu()
    amended = amend_state(base, saved[0], extended)
    amend_s = _cpu() - t0
    t0 = _cpu()
    _digests(base, 1, 4, saved[0])
    plain_resume_s = _cpu() - t0
    t0 = _cpu()
    after = _digests(extended, 5, 2, amended)
    amended_resume_s = _cpu() - t0
    staged_recipe = Recipe.from_toml(EXAMPLE / "staged.toml")
    moved = dataclasses.replace(staged_recipe.stages[0], start_step=step)
    staged = Pipeline(staged_recipe.replace(stages=(moved,)))
    same = _digests(staged, step + 5, 2)[step:] == after
    rows = amended["stage"]["lanes"].values()
    return {
        "step": step,
        "tokens_before": tokens_before,
        "dropped_samples": sum(r[-2] for r in rows),
        "dropped_tokens": sum(r[-1] for r in rows),
        "amend_cpu_s": round(amend_s, 2),
        "resume_plain_cpu_s": round(plain_resume_s, 2),
        "resume_amended_5_steps_cpu_s": round(amended_resume_s, 2),
        "same_as_stage": same,
    }


def main(argv: list[str] | None = None) -> int:
    """Print the table (and write ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[20, 60])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    prepare_default(default_recipe_path())
    rows = [measure(s) for s in args.steps]
    print(
        "| change after step | tokens before | dropped samples | dropped tokens | share "
        "| amend CPU s | resume (plain) CPU s | amended: resume + 5 steps CPU s | = stage |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        share = r["dropped_tokens"] / max(1, r["tokens_before"])
        print(
            f"| {r['step']} | {r['tokens_before']} | {r['dropped_samples']} | "
            f"{r['dropped_tokens']} | {share:.1%} | {r['amend_cpu_s']} | "
            f"{r['resume_plain_cpu_s']} | {r['resume_amended_5_steps_cpu_s']} | "
            f"{r['same_as_stage']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if all(r["same_as_stage"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
