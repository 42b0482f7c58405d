"""CDPG figures (paper 000 Figs. 3, 4 and 6) drawn from the tables of `cdpg`, pooled rows only.

Figures are built on `matplotlib.figure.Figure` directly (no pyplot state), so they render
with the Agg canvas anywhere and are saved with `fig.savefig`.
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd
from matplotlib.figure import Figure

from fairaudit.analysis.cdpg import DISCORDANT_CELLS, GROUP_COLUMNS, POOLED
from fairaudit.analysis.contingency import CELLS

CELL_COLOURS = {"a": "tab:gray", "b": "tab:green", "c": "tab:red", "d": "tab:purple"}
ROLE_COLOURS = {"anchor": "tab:blue", "mover": "tab:orange"}
ANSWER_STYLES = {"Yes": "-", "No": "--"}


def _pooled(table: pd.DataFrame) -> pd.DataFrame:
    for column in GROUP_COLUMNS:
        if column in table:
            table = table[table[column] == POOLED]
    return table


ARMS = ("think", "nothink")  # (treatment, baseline): whose trace is cut, and what k = 0 reads


def depth_label(arms: tuple[str, str]) -> str:
    return f"depth k/K into the {arms[0]} trace (0: {arms[1]} arm)"


def _depth_axis(ax, ylabel: str, arms: tuple[str, str], own_label: bool = True) -> None:
    """A depth axis; panels of one figure share a figure-wide label instead (`own_label=False`), since the
    label is wider than a panel and would run into its neighbour or off the figure's edge."""
    if own_label:
        ax.set_xlabel(depth_label(arms))
    ax.set_ylabel(ylabel)
    ax.set_xlim(-0.03, 1.03)
    ax.grid(alpha=0.3)


def depth_by_cell_figure(by_cell: pd.DataFrame, K: int = 10, arms: tuple[str, str] = ARMS) -> Figure:
    """Fig. 3: mean |CDPG_k| per cell against k/K (k = 1..K); the hollow marker at 0 is the baseline arm."""
    table = _pooled(by_cell)
    table = table[table["K"] == K]
    fig = Figure(figsize=(5.5, 4), layout="constrained")
    ax = fig.subplots()
    for cell in CELLS:
        rows = table[table["cell"] == cell]
        if rows.empty:
            continue
        depth_rows, start = rows[rows["k"] >= 1], rows[rows["k"] == 0]
        colour = CELL_COLOURS[cell]
        label = f"{cell} (n={rows['n'].iloc[0]})"
        ax.plot(depth_rows["depth"], depth_rows["mean_abs_cdpg"], "o-", color=colour, label=label)
        ax.plot(start["depth"], start["mean_abs_cdpg"], "o", mfc="none", color=colour, label="_baseline")
    _depth_axis(ax, "mean |CDPG_k|", arms)
    ax.set_title(f"CDPG by contingency cell (K={K}; hollow: {arms[1]} arm)")
    ax.legend(title="cell")
    return fig


def _legend_or_empty_note(ax) -> None:
    if ax.lines:
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no pairs in this cell", ha="center", va="center", transform=ax.transAxes)


def anchor_mover_figure(sides: pd.DataFrame, K: int = 10, arms: tuple[str, str] = ARMS) -> Figure:
    """Fig. 4: mean P(Yes) of anchor and mover sides in cells b and c, from the baseline arm (k = 0) to k = K.

    Lines are split by the anchor's final answer, so Yes- and No-anchored pairs do not average out.
    """
    table = _pooled(sides)
    table = table[table["K"] == K]
    fig = Figure(figsize=(10, 4), layout="constrained")
    for ax, cell in zip(fig.subplots(1, len(DISCORDANT_CELLS), sharey=True), DISCORDANT_CELLS):
        for (answer, role), rows in table[table["cell"] == cell].groupby(["anchor_answer", "role"]):
            ax.plot(
                rows["depth"], rows["p_yes"], marker="o", color=ROLE_COLOURS[role], linestyle=ANSWER_STYLES[answer],
                label=f"{role}, anchor ends {answer} (n={rows['n'].iloc[0]})",
            )
        _depth_axis(ax, "P(Yes)", arms, own_label=False)
        ax.set_ylim(0, 1)
        ax.set_title(f"cell {cell}")
        _legend_or_empty_note(ax)
    fig.supxlabel(depth_label(arms))
    return fig


def k_sensitivity_figure(by_cell: pd.DataFrame, k_list: Sequence[int] = (5, 10, 20),
                         arms: tuple[str, str] = ARMS) -> Figure:
    """Fig. 6: mean |CDPG_k| against k/K (k = 1..K), one panel per cell, one line per K."""
    table = _pooled(by_cell)
    table = table[table["k"] >= 1]
    fig = Figure(figsize=(14, 3.6), layout="constrained")
    for ax, cell in zip(fig.subplots(1, len(CELLS), sharey=True), CELLS):
        for K in sorted(set(k_list)):
            rows = table[(table["cell"] == cell) & (table["K"] == K)]
            if rows.empty:
                continue
            ax.plot(rows["depth"], rows["mean_abs_cdpg"], marker=".", label=f"K={K}")
        _depth_axis(ax, "mean |CDPG_k|", arms, own_label=False)
        ax.set_title(f"cell {cell}")
        _legend_or_empty_note(ax)
    fig.supxlabel(depth_label(arms))
    return fig


def cdpg_figures(
    tables: dict[str, pd.DataFrame], K: int = 10, k_list: Sequence[int] = (5, 10, 20), arms: tuple[str, str] = ARMS
) -> dict[str, Figure]:
    """The three CDPG figures from `cdpg(...)["tables"]`, keyed by a file-friendly name; `arms` =
    (treatment, baseline) name the axes."""
    return {
        "cdpg_by_cell": depth_by_cell_figure(tables["cdpg_by_cell"], K, arms),
        "cdpg_anchor_mover": anchor_mover_figure(tables["cdpg_sides"], K, arms),
        "cdpg_k_sensitivity": k_sensitivity_figure(tables["cdpg_by_cell"], k_list, arms),
    }
