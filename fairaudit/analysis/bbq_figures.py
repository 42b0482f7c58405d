"""The bbq probe's depth figure: the three options' mean probability along each thinking arm's trace."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

ROLE_STYLES = {"biased": ("tab:red", "the biased option"), "other": ("tab:blue", "the other person"),
               "unknown": ("tab:gray", "unknown")}


def depth_figure(table: pd.DataFrame) -> Figure:
    """One panel per arm: mean probability of each option's role against depth k/K (0: no trace read).
    table: `analysis.bbq.depth_table` (arm, depth, p_biased, p_other, p_unknown)."""
    arms = list(dict.fromkeys(table["arm"]))
    fig = Figure(figsize=(4.5 * len(arms), 3.4), layout="constrained")
    axes = fig.subplots(1, len(arms), squeeze=False)[0]
    for ax, arm in zip(axes, arms):
        rows = table[table["arm"] == arm]
        for role, (colour, label) in ROLE_STYLES.items():
            ax.plot(rows["depth"], rows[f"p_{role}"], marker="o", color=colour, label=label)
        ax.set_xlabel(f"depth k/K into the {arm} trace")
        ax.set_ylim(0, 1)
        ax.set_title(arm)
    axes[0].set_ylabel("mean probability")
    axes[0].legend(fontsize="small")
    return fig
