"""Figures of the position-bias probe (paper Figs. 1, 3, 4), drawn from its tables.

Each function returns a matplotlib Figure built without pyplot, so it works under any
backend (Agg included) and is never shown; the caller saves or logs it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure


def pbs_by_length_figure(pbs_by_length: pd.DataFrame, by: str = "arm", k: int = 4) -> Figure:
    """Fig. 1: mean PBS per length bin (quartiles by default), one line with SE bars per `by` value.

    pbs_by_length: <by>, k, bin, pbs_mean, pbs_se (the `pbs_by_length` table, several runs concatenated)
    """
    fig = Figure(figsize=(5, 3.5), layout="constrained")  # constrained: a title added later is never clipped
    ax = fig.add_subplot()
    rows = pbs_by_length[pbs_by_length["k"] == k]
    for name, group in rows.groupby(by, sort=True):
        ax.errorbar(group["bin"], group["pbs_mean"], yerr=group["pbs_se"], marker="o", capsize=3, label=str(name))
    ax.set_xticks(range(1, k + 1), [f"Q{b}" if k == 4 else str(b) for b in range(1, k + 1)])
    ax.set_xlabel("length bin (shortest to longest)")
    ax.set_ylabel("mean PBS")
    ax.legend(frameon=False)
    return fig


def truncation_figure(truncation_by_position: pd.DataFrame, by: str | None = None) -> Figure:
    """Fig. 3: (a) answer-change rate and (b) share of changes toward the preferred position, per position bucket.

    truncation_by_position: bucket, change_rate, directional_shift[, <by>] (the truncation table)
    """
    fig = Figure(figsize=(9, 3.5), layout="constrained")
    panels = fig.subplots(1, 2, sharex=True)
    groups = truncation_by_position.groupby(by, sort=True) if by else [("", truncation_by_position)]
    for name, group in groups:
        for ax, column in zip(panels, ("change_rate", "directional_shift")):
            ax.plot(group["bucket"].astype(str), group[column], marker="o", label=str(name) or None)
    for ax, title, ylabel in zip(panels, ("(a) answer change", "(b) directional shift"),
                                 ("change rate", "share of changes to preferred position")):
        ax.set_title(title)
        ax.set_xlabel("absolute trajectory position")
        ax.set_ylabel(ylabel)
    if by:
        panels[1].legend(frameon=False)
    return fig


def pbs_length_figure(summary: pd.DataFrame, label: str = "arm", baseline_arms=("direct",)) -> Figure:
    """Fig. 4: PBS against mean trajectory length (log scale), one point per configuration.

    summary: arm, <label>, length_chars, pbs (`position_summary` rows of several runs). Arms in
    `baseline_arms` are grey; a least-squares line of PBS on log10 length runs through the others.
    """
    fig = Figure(figsize=(5, 3.5), layout="constrained")  # constrained: a title added later is never clipped
    ax = fig.add_subplot()
    baseline = summary["arm"].isin(baseline_arms)
    for rows, colour in ((summary[baseline], "grey"), (summary[~baseline], "tab:red")):
        ax.scatter(rows["length_chars"], rows["pbs"], color=colour)
        for row in rows.itertuples(index=False):
            ax.annotate(str(getattr(row, label)), (row.length_chars, row.pbs), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    reasoning = summary[~baseline]
    if len(reasoning) >= 2:
        slope, intercept = np.polyfit(np.log10(reasoning["length_chars"]), reasoning["pbs"], 1)
        xs = np.geomspace(reasoning["length_chars"].min(), reasoning["length_chars"].max(), 50)
        ax.plot(xs, intercept + slope * np.log10(xs), color="tab:red", alpha=0.4, linestyle="--")
    ax.set_xscale("log")
    ax.set_xlabel("mean trajectory length (chars)")
    ax.set_ylabel("PBS")
    return fig


def length_pbs_panels(length_bins: pd.DataFrame, metrics: pd.DataFrame, arms=("cot", "reason"), k: int = 4) -> Figure:
    """Fig. 2: per configuration, mean PBS per length quartile with SE bars and a dashed linear fit on
    the quartile centres, the partial rho(length, PBS | accuracy) annotated; one panel per
    (model, arm, dataset) of the reasoning modes in `arms`.

    length_bins: model, arm, dataset, k, bin, length_mean, pbs_mean, pbs_se; metrics: model, arm,
    dataset, partial_rho_length_pbs (`analysis.position_tables`).
    """
    keys = ["model", "arm", "dataset"]
    configurations = metrics[metrics["arm"].isin(arms)][keys + ["partial_rho_length_pbs"]]
    n = max(len(configurations), 1)
    fig = Figure(figsize=(3.2 * min(n, 4), 2.8 * -(-n // 4)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(-(-n // 4), min(n, 4), squeeze=False)).ravel()
    for ax, row in zip(axes, configurations.itertuples(index=False)):
        bins = length_bins[(length_bins[keys] == pd.Series(row[:3], index=keys)).all(axis=1) & (length_bins["k"] == k)]
        ax.errorbar(bins["length_mean"], bins["pbs_mean"], yerr=bins["pbs_se"], marker="o", capsize=3, linestyle="none")
        if len(bins) >= 2:
            slope, intercept = np.polyfit(bins["length_mean"].astype(float), bins["pbs_mean"].astype(float), 1)
            xs = np.array([bins["length_mean"].min(), bins["length_mean"].max()], dtype=float)
            ax.plot(xs, intercept + slope * xs, linestyle="--", color="grey")
        ax.set_title(f"{row.model} {row.arm}, {row.dataset}", fontsize=8)
        ax.annotate(f"partial ρ = {row.partial_rho_length_pbs:.2f}", (0.05, 0.9), xycoords="axes fraction", fontsize=8)
        ax.set_xlabel("mean length (chars)")
        ax.set_ylabel("PBS")
    for ax in axes[len(configurations):]:
        ax.set_axis_off()
    return fig
