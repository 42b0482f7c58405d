"""Figures of the influence analysis."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure


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
            ax.bar(x, rate, width, label=condition)
            ax.errorbar(x, rate, yerr=errors, fmt="none", color="black", capsize=3)
        ax.set_xticks(np.arange(len(directions)), [d.replace("_to_", "→").upper() for d in directions])
        ax.set_ylim(0, 125)  # the band above 100% holds the legend, so it covers no bar
        ax.set_yticks(range(0, 101, 20))
        ax.set_ylabel("influence rate (%)")
        ax.set_title(f"Δ_NLL > {threshold:g} (Wilson 95% CI)")
        ax.legend(fontsize=8, loc="upper center", ncols=len(conditions), frameon=False)
    return fig
