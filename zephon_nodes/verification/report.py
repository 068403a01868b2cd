"""The ``zephon verify --report`` picture: settings x steps, coloured by digest agreement.

Left: every physical setting of the recipe (rows) by step (columns), green where the global
batch digest equals the reference, red where it differs, grey where no batch was produced,
with each setting's throughput as a bar. Right: the same matrix for a naive rank-sharded
loader at each dp size (:mod:`zephon_nodes.verification.baselines`). HTML pages use inline SVG (no
dependency); PNG files need matplotlib (``pip install zephon-nodes[report]``).
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.verification.matrix import VerifyResult

__all__ = ["ReportData", "ReportRow", "render_html", "render_png", "write_report"]

GREEN, RED, GREY = "#2e7d32", "#c62828", "#d0d0d0"


@dataclass(frozen=True)
class ReportRow:
    """One row of a matrix.

    Attributes:
        name: The setting's label.
        cells: Per step: True (same digest as the reference), False (differs), None (no batch).
        tokens_per_s: Throughput of the setting, if measured.
    """

    name: str
    cells: tuple[bool | None, ...]
    tokens_per_s: float | None = None


@dataclass(frozen=True)
class ReportData:
    """Everything the picture shows.

    Attributes:
        title: What was verified (e.g. the recipe path).
        steps: Number of step columns.
        rows: The zephon-nodes settings (the reference first).
        baseline: The naive loader's rows, one per dp size (reference: its smallest dp).
    """

    title: str
    steps: int
    rows: tuple[ReportRow, ...]
    baseline: tuple[ReportRow, ...] = field(default_factory=tuple)

    @staticmethod
    def _cells(reference: Sequence[str], digests: Sequence[str], steps: int) -> tuple:
        out: list[bool | None] = []
        for t in range(steps):
            if t >= len(digests) or t >= len(reference):
                out.append(None)
            else:
                out.append(digests[t] == reference[t])
        return tuple(out)

    @classmethod
    def from_results(
        cls,
        result: VerifyResult,
        baseline: Mapping[int, Sequence[str]] | None = None,
        title: str = "",
    ) -> ReportData:
        """Build the picture's data from a verification and naive-loader digests by dp size."""
        steps = result.steps
        ref = result.reference.digests
        rows = [
            ReportRow(
                "reference: " + result.reference.setting.name,
                cls._cells(ref, ref, steps),
                result.reference.tokens_per_s,
            )
        ]
        rows += [
            ReportRow(r.setting.name, cls._cells(ref, r.digests, steps), r.tokens_per_s)
            for r in result.results
        ]
        base_rows: list[ReportRow] = []
        if baseline:
            dps = sorted(baseline)
            bref = baseline[dps[0]]
            base_rows = [
                ReportRow(f"naive dp={d}", cls._cells(bref, baseline[d], steps)) for d in dps
            ]
        return cls(title, steps, tuple(rows), tuple(base_rows))

    def summary(self) -> str:
        """One line: how many settings (and naive dp sizes) agree on every step."""
        ours = sum(all(c is True for c in r.cells) for r in self.rows[1:])
        text = f"zephon-nodes: {ours}/{len(self.rows) - 1} settings identical on every step"
        if self.baseline:
            naive = sum(all(c is True for c in r.cells) for r in self.baseline[1:])
            text += f"; naive rank-sharded: {naive}/{len(self.baseline) - 1} dp sizes identical"
        return text


def _colour(cell: bool | None) -> str:
    return GREY if cell is None else GREEN if cell else RED


def _svg_matrix(rows: Sequence[ReportRow], steps: int, title: str, bars: bool) -> str:
    cell, label_w, top, bar_w = 14, 260, 40, 160
    width = label_w + steps * cell + (bar_w + 90 if bars else 20)
    height = top + len(rows) * cell + 30
    peak = max((r.tokens_per_s or 0.0 for r in rows), default=0.0) or 1.0
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<text x="0" y="14" font-size="14" font-weight="bold">{html.escape(title)}</text>',
    ]
    for t in range(0, steps, max(1, steps // 10)):
        x = label_w + t * cell + cell / 2
        out.append(f'<text x="{x}" y="{top - 6}" text-anchor="middle">{t + 1}</text>')
    for i, r in enumerate(rows):
        y = top + i * cell
        out.append(
            f'<text x="{label_w - 6}" y="{y + cell - 3}" text-anchor="end">'
            f"{html.escape(r.name)}</text>"
        )
        for t, c in enumerate(r.cells):
            out.append(
                f'<rect x="{label_w + t * cell}" y="{y}" width="{cell - 1}" height="{cell - 1}" '
                f'fill="{_colour(c)}"><title>{html.escape(r.name)}, step {t + 1}: '
                f"{'no batch' if c is None else 'identical' if c else 'differs'}</title></rect>"
            )
        if bars and r.tokens_per_s is not None:
            x0 = label_w + steps * cell + 10
            w = bar_w * r.tokens_per_s / peak
            out.append(
                f'<rect x="{x0}" y="{y + 2}" width="{w:.1f}" height="{cell - 5}" fill="#1565c0"/>'
            )
            out.append(
                f'<text x="{x0 + w + 4:.1f}" y="{y + cell - 3}">{r.tokens_per_s:,.0f}</text>'
            )
    y = top + len(rows) * cell + 18
    out.append(f'<text x="{label_w}" y="{y}">step</text>')
    if bars:
        out.append(f'<text x="{label_w + steps * cell + 10}" y="{y}">tokens/s</text>')
    out.append("</svg>")
    return "\n".join(out)


def render_html(data: ReportData) -> str:
    """Return a self-contained HTML page (inline SVG, no scripts)."""
    left = _svg_matrix(data.rows, data.steps, "zephon-nodes: settings x steps", bars=True)
    right = (
        _svg_matrix(data.baseline, data.steps, "naive rank-sharded loader", bars=False)
        if data.baseline
        else ""
    )
    legend = (
        f'<span style="color:{GREEN}">&#9632;</span> same digest as the reference &nbsp; '
        f'<span style="color:{RED}">&#9632;</span> differs &nbsp; '
        f'<span style="color:{GREY}">&#9632;</span> no batch'
    )
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>zephon verify: {html.escape(data.title)}</title></head>\n"
        "<body style='font-family:sans-serif'>\n"
        f"<h2>zephon verify: {html.escape(data.title)}</h2>\n"
        f"<p>{html.escape(data.summary())}</p><p>{legend}</p>\n"
        "<div style='display:flex;gap:40px;align-items:flex-start'>\n"
        f"<div>{left}</div>\n<div>{right}</div>\n</div>\n</body></html>\n"
    )


def render_png(data: ReportData, path: str | os.PathLike[str], dpi: int = 100) -> None:
    """Draw the picture with matplotlib into a PNG file.

    Raises:
        RecipeError: If matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
        from matplotlib.colors import ListedColormap
        from matplotlib.patches import Patch
        from matplotlib.ticker import FuncFormatter, MaxNLocator
    except ImportError:
        raise RecipeError(
            "a .png report needs matplotlib: pip install 'zephon-nodes[report]' "
            "(or write a .html report, which needs nothing)"
        ) from None

    cmap = ListedColormap([RED, GREY, GREEN])

    def grid(rows: Sequence[ReportRow]) -> np.ndarray:
        code = {False: 0, None: 1, True: 2}
        return np.asarray([[code[c] for c in r.cells] for r in rows], dtype=float)

    n = len(data.rows)
    height = max(3.0, 1.6 + 0.28 * n)
    width = 7.0 + 0.12 * data.steps + (4.0 if data.baseline else 0.0)
    fig = plt.figure(figsize=(width, height), dpi=dpi)
    ratios = [max(4, data.steps * 0.35), 2.2] + (
        [max(4, data.steps * 0.35)] if data.baseline else []
    )
    gs = fig.add_gridspec(
        1, len(ratios), width_ratios=ratios, wspace=0.08 if not data.baseline else 0.5
    )
    ax = fig.add_subplot(gs[0, 0])
    ax.imshow(grid(data.rows), cmap=cmap, vmin=0, vmax=2, aspect="auto", interpolation="nearest")
    ax.set_yticks(range(n), [r.name for r in data.rows], fontsize=8)
    ax.set_xticks(range(data.steps), [str(t + 1) for t in range(data.steps)], fontsize=7)
    ax.set_xlabel("step")
    ax.set_title("zephon-nodes: settings x steps", fontsize=10)
    bx = fig.add_subplot(gs[0, 1], sharey=ax)
    speeds = [r.tokens_per_s or 0.0 for r in data.rows]
    bx.barh(range(n), speeds, color="#1565c0")
    bx.set_xlabel("tokens/s", fontsize=8)
    bx.tick_params(axis="y", labelleft=False)
    bx.tick_params(axis="x", labelsize=7)
    bx.xaxis.set_major_locator(MaxNLocator(3))
    bx.xaxis.set_major_formatter(FuncFormatter(_si))
    if data.baseline:
        m = len(data.baseline)
        rows_gs = gs[0, 2].subgridspec(max(n, m), 1, hspace=0)
        cx = fig.add_subplot(rows_gs[0:m, 0])
        cx.imshow(
            grid(data.baseline), cmap=cmap, vmin=0, vmax=2, aspect="auto", interpolation="nearest"
        )
        cx.set_yticks(range(m), [r.name for r in data.baseline], fontsize=8)
        cx.set_xticks(range(data.steps), [str(t + 1) for t in range(data.steps)], fontsize=7)
        cx.set_xlabel("step")
        cx.set_title("naive rank-sharded loader", fontsize=10)
    fig.legend(
        handles=[
            Patch(color=GREEN, label="same digest as the reference"),
            Patch(color=RED, label="differs"),
            Patch(color=GREY, label="no batch"),
        ],
        loc="lower center",
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(f"zephon verify: {data.title}\n{data.summary()}", fontsize=10)
    fig.subplots_adjust(left=0.2, right=0.98, top=1 - 0.9 / height, bottom=1.0 / height)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def _si(value: float, _: object = None) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.0f}"


def write_report(data: ReportData, path: str | os.PathLike[str]) -> Path:
    """Write ``data`` as ``.html`` or ``.png`` (chosen by the file name)."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in (".html", ".htm"):
        p.write_text(render_html(data), encoding="utf-8")
    elif suffix == ".png":
        render_png(data, p)
    else:
        raise RecipeError(f"report {p}: expected a .html or .png file name, got {suffix!r}")
    return p
