"""Plot the curriculum example's weights and per-domain losses over steps (docs/curriculum.png).

    python examples/curriculum/run.py work/ --json work/summary.json
    python examples/curriculum/plot.py work/summary.json docs/curriculum.png

Solid lines: the dp 2 job; markers: the dp 1 and dp 4 jobs resumed from its checkpoint
(they fall on the dp 2 lines). Needs matplotlib (the ``report`` extra).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

DOMAINS = ("stdlib", "repeat", "noise")


def plot(summary: dict[str, Any], path: Path) -> None:
    """Draw the two panels (weights in force, per-domain loss) into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6), sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for job, style in (("dp2", "-"), ("dp1", "o"), ("dp4", "x")):
        if job not in summary["journal"]:  # a run with fewer resumes (``--resume-on``)
            continue
        journal = summary["journal"][job]
        steps = [r["step"] for r in journal]
        for k, name in enumerate(DOMAINS):
            label = name if job == "dp2" else None
            kw: dict[str, Any] = {"color": colors[k], "label": label}
            if style != "-":
                kw.update(linestyle="none", marker=style, markersize=4, alpha=0.7)
            top.plot(steps, [r["weights"][k] for r in journal], **kw)
            points = [(r["step"], r["loss"][k]) for r in journal if r["loss"][k] is not None]
            bottom.plot(*zip(*points, strict=True), **kw)
    for ax in (top, bottom):
        ax.axvline(summary["save_at"] + 0.5, color="grey", linestyle=":", linewidth=1)
    top.set_ylabel("decided weight (effect: next flush window)", fontsize=8)
    bottom.set_ylabel("per-domain loss (all-reduced)")
    bottom.set_xlabel("step")
    top.legend(loc="upper left")
    top.set_title(
        f"exponentiated-gradient controller, TorchTitan Trainer: dp 2 (lines), "
        f"resumed at step {summary['save_at']} on dp 1 (o) and dp 4 (x)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("summary", type=Path, help="the --json summary of run.py")
    ap.add_argument("out", type=Path, help="PNG to write")
    args = ap.parse_args()
    plot(json.loads(args.summary.read_text()), args.out)


if __name__ == "__main__":
    main()
