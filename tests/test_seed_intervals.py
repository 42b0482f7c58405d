"""Intervals across seeds stay inside what a quantity can take: the Student-t interval cut to the metric's range as
the module defining it declares it (counts >= 0, rates and P(Yes) gaps in [0, 1], their differences in [-1, 1],
log10 p <= 0, ...), which keeps its coverage and never passes the mean; the seed summary a report prints carries the
P(Yes) gaps."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import test_report
from fairaudit.analysis import study
from fairaudit.analysis.contingency import contingency
from fairaudit.analysis.numbers import is_p_value
from fairaudit.analysis.stats import t_interval
from fairaudit.catalog import registry
from fairaudit.report import app
from fairaudit.report.notes import left_out_lines
from fairaudit.views import render
from test_report import T_975_4, report_cfg, synthetic_records

mlflow_db, store = test_report.mlflow_db, test_report.store


@pytest.mark.parametrize("name, bounds", [
    ("cell_b", (0, math.inf)), ("n_pairs", (0, math.inf)), ("n_pairs_truncated", (0, math.inf)),
    ("cell_c_truncated", (0, math.inf)), ("c_b_ratio", (0, math.inf)), ("model_calls", (0, math.inf)),
    ("d_cf_think", (0, 1)), ("p_gap_nothink", (0, 1)), ("parse_rate_think", (0, 1)), ("mcnemar_p", (0, 1)),
    ("influence_rate_a_to_b_masked", (0, 1)), ("delta_d_cf", (-1, 1)), ("delta_p_gap", (-1, 1)),
    ("p_diff_think", (-1, 1)), ("asym_c", (0, 1)), ("mcnemar_log10_p", (-math.inf, 0)),
    ("delta_c", (-1, 1)), ("cdpg_slope_c", (-math.inf, math.inf)),
    # the issue's: a PBS gradient is a signed difference, a first violation a bin number, Wilcoxon's fields their own
    ("pbs_gradient_k3_cot", (-1, 1)), ("pbs_first_violation_k5_reason", (0, math.inf)),
    ("pbs_monotonic_k4_cot", (0, 1)), ("pbs_wilcoxon_statistic", (0, math.inf)), ("pbs_wilcoxon_n", (0, math.inf)),
    ("pbs_wilcoxon_mean_diff", (-1, 1)), ("pbs_wilcoxon_log10_p", (-math.inf, 0)),
    ("partial_rho_length_pbs_pearson_cot", (-1, 1)), ("partial_rho_length_pbs_p_cot", (0, 1)),
    # qualifiers keep the metric's range, interval companions have their own
    ("mcnemar_p_complete", (0, 1)), ("c_alpha_up_complete", (0, math.inf)), ("delta_d_cf_ci_n", (0, math.inf)),
    ("delta_d_cf_ci_low_complete", (-1, 1)), ("c_b_ratio_ci_few", (0, 1)),
    ("trunc_ccp_perm_log10_p_cot", (-math.inf, 0)), ("trunc_ccp_question_diff_cot", (-1, 1)),
    ("trunc_ccp_chi2_reason", (0, math.inf)), ("length_chars_cot", (0, math.inf)),
    ("rate_gt0.1_k_a_to_b_masked", (0, math.inf)), ("control_nll_mean_masked", (0, math.inf)),
    ("delta_dp_yes", (-2, 2)), ("tpair_split_yn_ny", (0, 1)), ("n_nothink_m", (0, math.inf)),
    ("a_metric_of_my_own", (-math.inf, math.inf)),   # nothing declares it: nothing cuts its interval
])
def test_each_metric_has_the_range_its_module_declares(name, bounds):
    assert study.metric_range(name) == bounds


def test_the_issues_gradient_and_first_violation_keep_their_t_intervals():
    """A PBS gradient of mean -0.037 was cut to [0.0, ...] as a share; a first-violation bin of 3, 5, 4 got the
    inverted [1.52, 1.0]. t(0.975, 2) = 4.303."""
    t = 4.302652729911275
    gradient = np.array([-0.055, -0.03, -0.026])
    mean, sd, low, high = t_interval(gradient, bounds=study.metric_range("pbs_gradient_k4_cot"))
    half = t * gradient.std(ddof=1) / math.sqrt(3)
    assert mean == pytest.approx(-0.037) and (low, high) == (pytest.approx(-0.037 - half), pytest.approx(-0.037 + half))
    assert low < -0.07 and high > 0
    mean, sd, low, high = t_interval(np.array([3.0, 5.0, 4.0]), bounds=study.metric_range("pbs_first_violation_k5_cot"))
    assert (mean, sd) == (4.0, 1.0)
    assert (low, high) == (pytest.approx(4 - t / math.sqrt(3)), pytest.approx(4 + t / math.sqrt(3)))


def test_a_mean_outside_the_declared_range_keeps_its_whole_interval():
    """A range declared wrong must not cut the interval away from its mean (nor invert it)."""
    mean, sd, low, high = t_interval(np.array([3.0, 5.0, 4.0]), bounds=(0.0, 1.0))
    assert low < mean < high
    assert (low, high) == (pytest.approx(4 - 2.4841, abs=1e-4), pytest.approx(4 + 2.4841, abs=1e-4))


SEED_METRICS = registry.declared(["counterfactual"], "summaries")   # the metrics the paired probes summarise
EVERY_KIND = list(dict.fromkeys([
    *SEED_METRICS, "c_b_ratio", "mcnemar_p", "cdpg_slope_c", "pbs_cot", "pbs_gradient_k4_cot",
    "pbs_first_violation_k5_cot", "partial_rho_length_pbs_cot", "trunc_ccp_question_diff_cot", "trunc_ccp_chi2_cot",
    "length_chars_cot", "preferred_position_cot", "influence_rate_masked", "mean_delta_masked",
    "control_nll_sd_masked", "delta_dp_yes", "dp_yes_alpha", "a_metric_of_my_own"]))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=6), st.floats(0.5, 0.999))
@pytest.mark.slow
def test_every_seed_interval_holds_its_mean_and_lies_in_its_metrics_range(shares, level):
    """For every metric of the report's seed list and one of each other kind: seed values drawn inside its range
    (spread over a bounded one, over 50 from its end for a half-line), the seed summary's interval contains the mean
    and lies in the range."""
    def inside(name: str) -> list[float]:
        low, high = study.metric_range(name)
        if math.isfinite(low) and math.isfinite(high):
            return [low + u * (high - low) for u in shares]
        start = low if math.isfinite(low) else (high - 50.0 if math.isfinite(high) else -25.0)
        return [start + 50.0 * u for u in shares]

    runs = pd.DataFrame({"model": "m", "dataset": "adult", "seed": [str(s) for s in range(len(shares))],
                         **{name: inside(name) for name in EVERY_KIND}})
    summary = study.seed_summary(runs, EVERY_KIND, ["model", "dataset"], level)
    assert summary["metric"].tolist() == EVERY_KIND
    for row in summary.itertuples():
        if is_p_value(row.metric):   # never averaged: the seeds' combined p instead
            assert math.isnan(row.mean) and row.log10_p_combined <= 0
            continue
        low, high = study.metric_range(row.metric)
        assert low <= row.ci_low <= row.mean <= row.ci_high <= high, row


def test_a_count_near_zero_keeps_its_t_interval_above_zero_and_a_rate_below_one():
    cells = [0, 0, 0, 0, 1]  # the issue's case: cell_b [-0.36, 0.76] under the plain t-interval
    mean, sd, low, high = t_interval(np.array(cells, float), bounds=study.metric_range("cell_b"))
    half = T_975_4 * math.sqrt(0.2) / math.sqrt(5)  # SD of 0,0,0,0,1 (ddof=1) is sqrt(0.2)
    assert (mean, sd) == (pytest.approx(0.2), pytest.approx(math.sqrt(0.2)))
    assert (low, high) == (0.0, pytest.approx(0.2 + half)) and 0.2 - half < 0  # cut at 0, the upper end as it was
    rates = np.array([1.0, 1.0, 0.95, 1.0, 1.0])
    assert t_interval(rates, bounds=study.metric_range("d_cf_think"))[3] == 1.0
    free = t_interval(np.array([-3.0, 1.0, 2.0]))  # unbounded: the plain interval
    assert free[2] == pytest.approx(0.0 - 4.303 * free[1] / math.sqrt(3), rel=1e-3)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=2, max_size=10), st.floats(0.5, 0.999))
def test_no_count_interval_across_seeds_is_ever_below_zero(counts, level):
    runs = pd.DataFrame({"model": "m", "dataset": "adult", "seed": [str(s) for s in range(len(counts))],
                         "cell_b": counts, "cell_c": counts[::-1], "n_pairs_truncated": counts})
    summary = study.seed_summary(runs, ["cell_b", "cell_c", "n_pairs_truncated"], ["model", "dataset"], level)
    assert (summary["ci_low"] >= 0).all() and (summary["ci_low"] <= summary["mean"]).all()
    assert (summary["ci_high"] >= summary["mean"]).all()


@pytest.mark.slow
def test_a_seed_sweeps_report_prints_the_p_yes_gaps_and_no_count_below_zero(store, tmp_path, capsys):
    parent = store.sweep()
    for seed, cell_b in enumerate([0, 0, 0, 0, 1]):
        records = synthetic_records(seed, 12)
        metrics = {**contingency(records, n_boot=0), "cell_b": cell_b, "p_gap_think": 0.01 * (seed + 1),
                   "p_gap_nothink": 0.002, "delta_p_gap": 0.01 * (seed + 1) - 0.002}
        store.job(records, parent, metrics=metrics, seed=seed)
    app.run(report_cfg(store, tmp_path / "out", "log_to_mlflow=false"))
    seeds = pd.read_csv(tmp_path / "out" / "seeds.csv").set_index("metric")
    assert seeds.loc["cell_b", "ci_low"] == 0 and seeds.loc["cell_b", "ci_high"] > 0.2
    assert seeds.loc["p_gap_think", "mean"] == pytest.approx(0.03)
    printed = capsys.readouterr().out
    assert all(f"│ {name} " in printed for name in ("p_gap_think", "p_gap_nothink", "delta_p_gap"))
    assert "cut to the values the metric can take (counts ≥ 0" in printed  # the table's note says how


def test_infinite_and_missing_seeds_are_counted_and_said_and_p_values_are_combined_not_averaged():
    """c/b over seeds [2, inf, 3] was n = 2, mean 2.5, with nothing said; a mean of log10 p was shown as a p."""
    runs = pd.DataFrame({"model": "m", "dataset": "adult", "seed": ["0", "1", "2", "3"],
                         "c_b_ratio": [2.0, math.inf, 3.0, math.nan], "mcnemar_log10_p": [-3.0, -1.0, -2.0, -0.5],
                         "mcnemar_p": [1e-3, 0.1, 1e-2, 10 ** -0.5]})
    summary = study.seed_summary(runs, ["c_b_ratio", "mcnemar_log10_p", "mcnemar_p"], ["model", "dataset"])
    ratio, log10_p, p = (row for _, row in summary.iterrows())
    assert (ratio["n"], ratio["n_infinite"], ratio["n_missing"], ratio["mean"]) == (2, 1, 1, 2.5)
    # four seeds: 2 x the second smallest p, 2 x 10^-2
    assert math.isnan(log10_p["mean"]) and log10_p["log10_p_combined"] == pytest.approx(math.log10(0.02))
    assert p["log10_p_combined"] == pytest.approx(math.log10(0.02)) and math.isnan(p["mean"])
    shown = render.seed_display(summary, ["model", "dataset"])
    assert shown["n"].tolist() == ["2 of 4", "4", "4"] and shown["mean"].tolist()[1:] == ["combined p 0.02"] * 2
    assert not any(map(is_p_value, ["delta_p_gap", "p_gap_think", "p_yes_alpha"]))
    assert is_p_value("trunc_ccp_chi2_p_cot")
    assert left_out_lines(summary, ["model", "dataset"]) == [
        "left out: c_b_ratio (m adult): 1 infinite and 1 NaN of 4 seeds; the rest summarised"]
