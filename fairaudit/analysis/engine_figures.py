"""The engine study's figure: headline metrics per engine with their intervals, and the share of answers and pair
cells that change against the reference engine, by the reference's confidence."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

PALETTE = ("#3b4cc0", "#d1495b", "#2a9d8f", "#e9c46a", "#6d597a", "#8d99ae")


def _metric_panel(ax, values: pd.DataFrame, metric: str) -> None:
    """One metric: a point per engine with its interval (where the run logged one)."""
    rows = values[values["metric"] == metric].reset_index(drop=True)
    x = np.arange(len(rows))
    low = (rows["value"] - rows["ci_low"]).clip(lower=0).fillna(0)
    high = (rows["ci_high"] - rows["value"]).clip(lower=0).fillna(0)
    ax.errorbar(x, rows["value"], yerr=[low, high], fmt="o", color=PALETTE[0], ecolor="#555", capsize=3)
    ax.set_xticks(x, rows["engine"], rotation=30, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_title(metric, fontsize=9)
    ax.tick_params(axis="y", labelsize=8)
    ax.margins(y=0.2)


def _flip_panel(ax, flips: pd.DataFrame, share: str, title: str) -> None:
    """Grouped bars: per confidence bin, one bar per engine compared with the reference."""
    rows = flips[flips["confidence"] != "all"]
    bins = list(dict.fromkeys(rows["confidence"]))
    engines = list(dict.fromkeys(rows["engine"]))
    width = 0.8 / max(1, len(engines))
    x = np.arange(len(bins))
    for i, engine in enumerate(engines):
        mine = rows[rows["engine"] == engine].set_index("confidence").reindex(bins)
        offset = (i - (len(engines) - 1) / 2) * width
        ax.bar(x + offset, mine[share].fillna(0), width, color=PALETTE[(i + 1) % len(PALETTE)], label=engine)
    ax.set_xticks(x, bins, fontsize=8)
    ax.set_xlabel("reference |P(Yes) − 0.5|", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_title(title, fontsize=9)
    ax.tick_params(axis="y", labelsize=8)
    ax.legend(frameon=False, fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.08), ncols=min(2, len(engines)))


def engine_figure(values: pd.DataFrame, flips: pd.DataFrame, metrics: Sequence[str], reference: str) -> Figure:
    """Top: each metric in `metrics` per engine with its interval. Bottom: the share of answers (and of pair
    cells, when the records have them) that differ from `reference`'s, by the reference's confidence bin.

    values: analysis.engines.engine_values; flips: analysis.engines.flip_table (may be empty).
    """
    shares = [(s, t) for s, t in (("answer_change_share", f"answers changed vs {reference}"),
                                  ("cell_change_share", f"pair cells (a-d) changed vs {reference}")) if s in flips]
    columns = max(len(metrics), len(shares), 1)
    fig = Figure(figsize=(max(7.0, 2.6 * columns), 6.6 if shares else 3.4), layout="constrained")
    grid = fig.add_gridspec(2 if shares else 1, columns)
    for i, metric in enumerate(metrics):
        _metric_panel(fig.add_subplot(grid[0, i]), values, metric)
    for i, (share, title) in enumerate(shares):
        span = slice(i * columns // len(shares), (i + 1) * columns // len(shares))
        _flip_panel(fig.add_subplot(grid[1, span]), flips, share, title)
    return fig
