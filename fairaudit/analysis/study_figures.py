"""Figures of a study: per-cell disparity changes (paper 000 Fig. 2) and checkpoint curves."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from fairaudit.analysis.contingency_figures import change_bars, readable_range


def _label(row: pd.Series, axes: Sequence[str]) -> str:
    return " ".join(str(row[a]) for a in axes)


def delta_figure(table9: pd.DataFrame, axes: Sequence[str],
                 arms: tuple[str, str] = ("treatment", "baseline")) -> Figure:
    """ΔD_cf (dark) against ΔD_group (pale) per cell: counterfactual vs group verdicts side by side.

    table9: axes, delta_d_cf, delta_d_group; one bar pair per row (the pooled row included).
    Each bar is labelled with its value, so a zero (or missing) change still shows (see `change_bars`).
    """
    labels = [_label(row, axes) for _, row in table9.iterrows()]
    x = np.arange(len(labels))
    # room for two value labels per cell
    fig = Figure(figsize=(max(4.5, 1.0 * len(labels) + 1.5), 3.8), layout="constrained")
    ax = fig.add_subplot()
    for offset, column, colour, name in ((-0.2, "delta_d_cf", "#3b4cc0", "ΔD_cf"),
                                         (0.2, "delta_d_group", "#b0c4f5", "ΔD_group")):
        values = pd.to_numeric(table9[column], errors="coerce")
        change_bars(ax, x + offset, values, width=0.4, color=colour, edgecolor="#222", linewidth=0.5, label=name)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    readable_range(ax)
    ax.set_xticks(x, labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(f"{arms[0]} − {arms[1]}")
    ax.legend(frameon=False, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=2)  # above the axes: it covers no bar
    return fig


def checkpoint_curve_figure(curve: pd.DataFrame, metric: str, line_axes: Sequence[str]) -> Figure:
    """`metric` against checkpoint order, one line per cell; a band shows the interval across seeds.

    curve: the output of study.checkpoint_curve (line_axes, checkpoint, position, n, mean, ci_low, ci_high).
    """
    fig = Figure(figsize=(5.5, 3.8), layout="constrained")
    ax = fig.add_subplot()
    groups = curve.groupby(list(line_axes), sort=False) if line_axes else [((), curve)]
    for key, line in groups:
        key = key if isinstance(key, tuple) else (key,)
        line = line.sort_values("position")
        ax.plot(line["position"], line["mean"], marker="o", label=" ".join(map(str, key)) or metric)
        if (line["n"] > 1).any():
            ax.fill_between(line["position"], line["ci_low"], line["ci_high"], alpha=0.2)
    ticks = curve.drop_duplicates("position").sort_values("position")
    ax.set_xticks(ticks["position"], ticks["checkpoint"].astype(str), rotation=30, ha="right")
    ax.set_xlabel("checkpoint")
    ax.set_ylabel(metric)
    if line_axes:
        ax.legend(frameon=False, fontsize=8)
    return fig
