"""Figures of the contingency analysis."""

from __future__ import annotations

from matplotlib.figure import Figure


def disparity_shift_figure(metrics: dict[str, float], title: str = "", arms: tuple[str, str] = ("treatment", "baseline")) -> Figure:
    """Change under the treatment of counterfactual (D_cf) vs group (D_group) disparity (paper 000 Fig. 2).

    metrics: the output of `contingency`, with its per-arm values shown as annotations; arms: (treatment, baseline).
    """
    fig = Figure(figsize=(4.5, 3.5), layout="constrained")
    ax = fig.add_subplot()
    names = ["delta_d_cf", "delta_d_group"]
    values = [metrics[n] for n in names]
    bars = ax.bar(["ΔD_cf", "ΔD_group"], values, color=["#3b4cc0", "#b0c4f5"])
    low, high = metrics.get("delta_d_cf_ci_low"), metrics.get("delta_d_cf_ci_high")
    if low is not None and high is not None:
        ax.errorbar([0], [values[0]], yerr=[[values[0] - low], [high - values[0]]], color="black", capsize=4)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.bar_label(bars, fmt="%+.3f")
    ax.set_ylabel(f"{arms[0]} − {arms[1]}")
    ax.set_title(title or f"N = {int(metrics['n_pairs'])} pairs", wrap=True)
    return fig
