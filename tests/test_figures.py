"""Every figure a run or a report draws, rendered and checked: no two labels collide, none is cut off at the
figure's edge, no legend covers a bar (disparity_changes.png printed "+0.250+0.250"; Fig. 6 cut its x label)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fairaudit.analysis.cdpg_figures import cdpg_figures
from fairaudit.analysis.contingency_figures import disparity_shift_figure
from fairaudit.analysis.influence import influence
from fairaudit.analysis.influence_figures import influence_rates_figure
from fairaudit.analysis.position_figures import pbs_by_length_figure, pbs_length_figure, truncation_figure
from fairaudit.analysis.position_truncation import truncation
from fairaudit.analysis.study import checkpoint_curve
from fairaudit.analysis.study_figures import checkpoint_curve_figure, delta_figure
from fairaudit.analysis.transition_figures import group_transition_heatmaps, tpair_heatmap
from fairaudit.analysis.transitions import transitions
from fairaudit.job.run import title_figures
from figure_checks import layout_problems
from test_cdpg_analysis import run as cdpg_run
from test_influence_analysis import contrasts_frame
from test_position_analysis import CONTINUATIONS
from test_transitions import TABLE4_ADULT, expand, records_from_pairs


def table9() -> pd.DataFrame:
    """Equal changes side by side (the labels that collided) and a pooled row, as the report draws them."""
    return pd.DataFrame({"model": ["qwen3", "qwen3", "qwq", "r1_distill_qwen", "Pooled (4 cells)"],
                         "dataset": ["adult", "compas", "credit", "adult", ""],
                         "delta_d_cf": [0.25, 0.05, -0.1, 0.25, 0.25],
                         "delta_d_group": [0.25, 0.0, np.nan, 0.25, 0.25]})


def curve() -> pd.DataFrame:
    runs = pd.DataFrame({"model": "m", "dataset": np.repeat(["adult", "compas"], 6), "arm": "think",
                         "checkpoint": np.tile(np.repeat(["step1000", "step20000", "step300000"], 2), 2),
                         "seed": np.tile(["0", "1"], 6), "d_cf_think": np.linspace(0.1, 0.4, 12)})
    return checkpoint_curve(runs, "d_cf_think", ["dataset"])


def traces() -> pd.DataFrame:
    return pd.DataFrame({"condition": ["masked", "unmasked"], "valid": True, "ngram_raw": 0.1, "ngram_corrected": 0.0,
                         "canary_reproduced": [True, False]})


def figures() -> dict:
    tables = transitions(records_from_pairs(expand(TABLE4_ADULT)))["tables"]
    out = {
        "disparity_changes": delta_figure(table9(), ["model", "dataset"], ("think", "nothink")),
        "disparity_shift": disparity_shift_figure({"delta_d_cf": 0.25, "delta_d_group": 0.25, "n_pairs": 20,
                                                   "delta_d_cf_ci_low": 0.1, "delta_d_cf_ci_high": 0.4},
                                                  arms=("think", "nothink")),
        "checkpoint_d_cf_think": checkpoint_curve_figure(curve(), "d_cf_think", ["dataset"]),
        "tpair_split": tpair_heatmap(tables["tpair_split"]),
        "t_alpha_vs_alpha_prime": group_transition_heatmaps(tables["t_alpha"], tables["t_alpha_prime"]),
        "influence_rates": influence_rates_figure(influence(contrasts_frame(), traces())["tables"]["influence_rates"]),
        "pbs_by_length": pbs_by_length_figure(pd.DataFrame({"arm": "reason", "k": 4, "bin": [1, 2, 3, 4],
                                                            "pbs_mean": [0.1, 0.2, 0.3, 0.4], "pbs_se": 0.01})),
        "truncation": truncation_figure(truncation(CONTINUATIONS)["tables"]["truncation_by_position"]),
        "pbs_length": pbs_length_figure(pd.DataFrame({"arm": ["direct", "cot", "reason"], "label": ["d", "c", "r"],
                                                      "length_chars": [10.0, 1000.0, 5000.0], "pbs": [0.4, 0.2, 0.25]}),
                                        label="label"),
    }
    cdpg = cdpg_figures(cdpg_run()["tables"], K=2, k_list=(2, 4), arms=("think", "nothink"))
    return out | {f"cdpg_{k}": v for k, v in cdpg.items()}


# Every figure `figures()` draws, named here so that collection draws none (1.4 s in every pytest process).
NAMES = ["disparity_changes", "disparity_shift", "checkpoint_d_cf_think", "tpair_split", "t_alpha_vs_alpha_prime",
         "influence_rates", "pbs_by_length", "truncation", "pbs_length", "cdpg_cdpg_by_cell", "cdpg_cdpg_anchor_mover",
         "cdpg_cdpg_k_sensitivity"]


@pytest.fixture(scope="module")
def drawn() -> dict:
    return figures()


def test_the_names_are_every_figure_drawn(drawn):
    assert list(drawn) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_no_label_collides_or_is_cut_off(name, drawn):
    assert layout_problems(drawn[name]) == []


@pytest.mark.parametrize("name", ["disparity_shift", "cdpg_cdpg_k_sensitivity", "influence_rates", "pbs_by_length",
                                  "truncation", "pbs_length"])
@pytest.mark.slow
def test_a_runs_title_above_the_panels_stays_inside_the_figure(name):
    fig = figures()[name]
    title_figures({name: fig}, "r1_distill_qwen_7b_q4km, openbookqa: think vs nothink")
    assert layout_problems(fig) == []


def test_the_checker_sees_collisions_cut_labels_and_a_legend_over_a_bar():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2))
    ax = fig.add_subplot()
    ax.bar([0, 1], [1, 1], label="a long legend entry")
    ax.legend(loc="center")
    ax.text(0.5, 0.5, "+0.250")
    ax.text(0.52, 0.5, "+0.250")
    ax.set_xlabel("a label far too long for a figure this narrow to hold")
    problems = layout_problems(fig)
    assert "'+0.250' overlaps '+0.250'" in problems
    assert any("is cut by the figure's edge" in p for p in problems)
    assert any("covers a bar" in p for p in problems)


def test_a_zero_rate_bar_is_labelled_not_a_lone_whisker():
    rates = pd.DataFrame({"condition": "masked", "direction": ["a_to_b", "b_to_a"], "threshold": 0.05, "n": 10,
                          "rate": [0.0, 0.3], "ci_low": [0.0, 0.11], "ci_high": [0.28, 0.6]})
    fig = influence_rates_figure(rates)
    assert [t.get_text() for t in fig.axes[0].texts] == ["0%", "30%"]
    assert layout_problems(fig) == []
