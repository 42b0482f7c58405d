"""Heatmaps of bias transition matrices (paper 000 Tables 3, 4, 13): T^pair, and T^alpha beside T^alpha'.

Each function takes tables in the `transition_table` layout and returns a matplotlib Figure built
without pyplot, so it renders under any backend (Agg included) and shows nothing on screen.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.image import AxesImage


def _draw_transitions(ax: Axes, table: pd.DataFrame, treatment: str, baseline: str) -> AxesImage:
    """P(to | from) as a heatmap on `ax`, each cell annotated with its probability and count."""
    # table: index states + "total", columns states + "n" (transition_table layout)
    states = [state for state in table.columns if state != "n"]
    probs = table.loc[states, states].to_numpy(float)
    counts = np.nan_to_num(probs * table.loc[states, "n"].to_numpy(float)[:, None]).round().astype(int)
    image = ax.imshow(probs, vmin=0.0, vmax=1.0, cmap="Blues")
    for (i, j), p in np.ndenumerate(probs):
        label = "–" if np.isnan(p) else f"{p:.3f}\n({counts[i, j]:,})"
        ax.text(j, i, label, ha="center", va="center", fontsize=8, color="white" if p > 0.5 else "black")
    ax.set_xticks(range(len(states)), states)
    ax.set_yticks(range(len(states)), [f"{s} (n={int(table.at[s, 'n']):,})" for s in states])
    ax.set_xlabel(treatment)
    ax.set_ylabel(baseline)
    return image


def tpair_heatmap(
    tpair: pd.DataFrame, treatment: str = "think", baseline: str = "nothink", title: str = "$T^{pair}$"
) -> Figure:
    """T^pair (split 4x4 or 3x3) as one heatmap with probabilities and counts."""
    fig = Figure(figsize=(6.0, 4.8), layout="constrained")
    ax = fig.subplots()
    image = _draw_transitions(ax, tpair, treatment, baseline)
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="P(to | from)")
    return fig


def group_transition_heatmaps(
    t_alpha: pd.DataFrame,
    t_alpha_prime: pd.DataFrame,
    treatment: str = "think",
    baseline: str = "nothink",
    labels: tuple[str, str] = (r"$T^{\alpha}$", r"$T^{\alpha'}$"),
) -> Figure:
    """T^alpha and T^alpha' side by side on one colour scale."""
    fig = Figure(figsize=(9.0, 4.0), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, table, label in zip(axes, (t_alpha, t_alpha_prime), labels):
        image = _draw_transitions(ax, table, treatment, baseline)
        ax.set_title(label)
    fig.colorbar(image, ax=axes, label="P(to | from)")
    return fig
