"""Figures of the influence analysis."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure


def label_rates(ax, bars, rates: np.ndarray) -> None:
    """Each bar's rate written at its top ("0%" on the axis for a bar of height 0, which would otherwise show as a
    lone whisker; "n/a" where there is no rate), over the whisker, which its white box hides there."""
    labels = [f"{r:.0f}%" if np.isfinite(r) else "n/a" for r in rates]
    ax.bar_label(bars, labels=labels, padding=2, fontsize=7, zorder=4,
                 bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none"})


def influence_rates_figure(rates: pd.DataFrame) -> Figure:
    """Influence rate with its Wilson 95% interval per direction x condition, one panel per threshold.

    rates: condition, direction, threshold, n, rate, ci_low, ci_high (the `influence_rates` table).
    """
    thresholds = sorted(rates["threshold"].unique()) or [0.0]
    fig = Figure(figsize=(4.0 * len(thresholds), 3.4), layout="constrained")
    conditions = list(dict.fromkeys(rates["condition"]))
    directions = list(dict.fromkeys(rates["direction"]))
    width = 0.8 / max(1, len(conditions))
    for p, threshold in enumerate(thresholds):
        ax = fig.add_subplot(1, len(thresholds), p + 1)
        shown = rates[rates["threshold"] == threshold]
        for c, condition in enumerate(conditions):
            mine = shown[shown["condition"] == condition].set_index("direction").reindex(directions)
            x = np.arange(len(directions)) + (c - (len(conditions) - 1) / 2) * width
            rate = 100 * mine["rate"].to_numpy(float)
            errors = 100 * np.vstack([mine["rate"] - mine["ci_low"], mine["ci_high"] - mine["rate"]]).astype(float)
            errors = np.clip(errors, 0.0, None)  # a Wilson bound can sit a rounding error past the rate at k = 0 or n
            bars = ax.bar(x, rate, width, label=condition)
            ax.errorbar(x, rate, yerr=errors, fmt="none", color="black", capsize=3)
            label_rates(ax, bars, rate)
        ax.set_xticks(np.arange(len(directions)), [d.replace("_to_", "→").upper() for d in directions])
        ax.set_ylim(0, 125)  # the band above 100% holds the legend, so it covers no bar
        ax.set_yticks(range(0, 101, 20))
        ax.set_ylabel("influence rate (%)")
        ax.set_title(f"Δ_NLL > {threshold:g} (Wilson 95% CI)")
        if conditions:
            ax.legend(fontsize=8, loc="upper center", ncols=len(conditions), frameon=False)
    return fig


def checkpoint_rates_figure(table3: pd.DataFrame, axes: list[str], threshold: str) -> Figure:
    """Paper 002 Fig. 4: A-to-B and B-to-A rates (%) with Wilson 95% intervals, one pair of bars per row of
    Table 3 (per checkpoint, and per setting where those differ), the A/B ratio above each pair.

    table3: `influence_study.table3` (axes, rate_<d>, ci_low_<d>, ci_high_<d> for d in a_to_b, b_to_a).
    """
    labels = [" ".join(str(v) for v in row) for row in table3[axes].itertuples(index=False)] if axes else ["all runs"]
    fig = Figure(figsize=(max(4.0, 1.4 * len(labels) + 1.5), 3.6), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(labels))
    for offset, (d, name) in zip((-0.2, 0.2), (("a_to_b", "A→B"), ("b_to_a", "B→A"))):
        rate = 100 * table3[f"rate_{d}"].to_numpy(float)
        errors = 100 * np.vstack([table3[f"rate_{d}"] - table3[f"ci_low_{d}"],
                                  table3[f"ci_high_{d}"] - table3[f"rate_{d}"]]).astype(float)
        bars = ax.bar(x + offset, np.nan_to_num(rate), 0.4, label=name)
        ax.errorbar(x + offset, rate, yerr=np.clip(np.nan_to_num(errors), 0.0, None), fmt="none", color="black",
                    capsize=3)
        label_rates(ax, bars, rate)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = table3["rate_a_to_b"].to_numpy(float) / table3["rate_b_to_a"].to_numpy(float)
    for i, r in enumerate(ratio):
        if np.isfinite(r):
            ax.annotate(f"×{r:.1f}", (x[i] - 0.2, 100 * table3["ci_high_a_to_b"].iloc[i]), ha="center", va="bottom",
                        fontsize=8)
    ax.set_xticks(x, labels, rotation=20 if len(labels) > 3 else 0, ha="right" if len(labels) > 3 else "center")
    ax.set_ylabel("influence rate (%)")
    ax.set_title(f"A→B and B→A per checkpoint, Δ_NLL {threshold} (Wilson 95% CI)", fontsize=10)
    ax.legend(fontsize=8)
    return fig
