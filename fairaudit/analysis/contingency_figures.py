"""Figures of the contingency analysis."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

MIN_HALF_RANGE = 0.01  # y axis spans at least ±0.01, so float noise (1e-17) is not blown up to full height


def change_bars(ax, x, values, **style):
    """Bars of differences labelled with their values ("n/a" for missing), float noise rounded off."""
    heights = np.round(np.asarray(values, dtype=float), 12)
    bars = ax.bar(x, np.nan_to_num(heights), **style)
    ax.bar_label(bars, labels=["n/a" if np.isnan(h) else f"{h:+.3f}" if h else "0" for h in heights],
                 fontsize=7, padding=2)
    return bars


def readable_range(ax) -> None:
    """Once every bar is drawn: a y range of at least ±0.01, so all-zero changes show as labelled zeros on a
    readable scale rather than an empty axis scaled to 1e-17."""
    ax.margins(y=0.2)
    low, high = ax.get_ylim()
    ax.set_ylim(min(low, -MIN_HALF_RANGE), max(high, MIN_HALF_RANGE))


def disparity_shift_figure(metrics: dict[str, float], title: str = "",
                           arms: tuple[str, str] = ("treatment", "baseline")) -> Figure:
    """Change under the treatment of counterfactual (D_cf) vs group (D_group) disparity (paper 000 Fig. 2).

    metrics: the output of `contingency`, with its per-arm values shown as annotations; arms: (treatment, baseline).
    """
    fig = Figure(figsize=(4.5, 3.5), layout="constrained")
    ax = fig.add_subplot()
    names = ["delta_d_cf", "delta_d_group"]
    values = [metrics[n] for n in names]
    change_bars(ax, ["ΔD_cf", "ΔD_group"], values, color=["#3b4cc0", "#b0c4f5"], edgecolor="#222", linewidth=0.5)
    low, high = metrics.get("delta_d_cf_ci_low"), metrics.get("delta_d_cf_ci_high")
    if low is not None and high is not None:
        ax.errorbar([0], [values[0]], yerr=[[values[0] - low], [high - values[0]]], color="black", capsize=4)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    readable_range(ax)
    ax.set_ylabel(f"{arms[0]} − {arms[1]}")
    ax.set_title(title or f"N = {int(metrics['n_pairs'])} pairs", wrap=True)
    return fig
