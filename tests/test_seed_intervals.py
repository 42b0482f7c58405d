"""Intervals across seeds stay inside what a quantity can take: the Student-t interval cut to the metric's range
(counts >= 0, rates and P(Yes) gaps in [0, 1], their differences in [-1, 1], log10 p <= 0), which keeps its
coverage; the seed summary a report prints carries the P(Yes) gaps."""

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
from fairaudit.report import app
from test_report import T_975_4, report_cfg, synthetic_records

mlflow_db, store = test_report.mlflow_db, test_report.store


@pytest.mark.parametrize("name, bounds", [
    ("cell_b", (0, math.inf)), ("n_pairs", (0, math.inf)), ("n_pairs_truncated", (0, math.inf)),
    ("cell_c_truncated", (0, math.inf)), ("c_b_ratio", (0, math.inf)), ("model_calls", (0, math.inf)),
    ("d_cf_think", (0, 1)), ("p_gap_nothink", (0, 1)), ("parse_rate_think", (0, 1)), ("mcnemar_p", (0, 1)),
    ("influence_rate_a_to_b_masked", (0, 1)), ("delta_d_cf", (-1, 1)), ("delta_p_gap", (-1, 1)),
    ("p_diff_think", (-1, 1)), ("asym_c", (-1, 1)), ("mcnemar_log10_p", (-math.inf, 0)),
    ("delta_c", (-math.inf, math.inf)), ("cdpg_slope_c", (-math.inf, math.inf)),
])
def test_each_metric_has_the_range_its_name_says(name, bounds):
    assert study.metric_range(name) == bounds


def test_a_count_near_zero_keeps_its_t_interval_above_zero_and_a_rate_below_one():
    cells = [0, 0, 0, 0, 1]  # the case: cell_b [-0.36, 0.76] under the plain t-interval
    mean, sd, low, high = study.t_interval(np.array(cells, float), bounds=study.metric_range("cell_b"))
    half = T_975_4 * math.sqrt(0.2) / math.sqrt(5)  # SD of 0,0,0,0,1 (ddof=1) is sqrt(0.2)
    assert (mean, sd) == (pytest.approx(0.2), pytest.approx(math.sqrt(0.2)))
    assert (low, high) == (0.0, pytest.approx(0.2 + half)) and 0.2 - half < 0  # cut at 0, the upper end as it was
    rates = np.array([1.0, 1.0, 0.95, 1.0, 1.0])
    assert study.t_interval(rates, bounds=study.metric_range("d_cf_think"))[3] == 1.0
    free = study.t_interval(np.array([-3.0, 1.0, 2.0]))  # unbounded: the plain interval
    assert free[2] == pytest.approx(0.0 - 4.303 * free[1] / math.sqrt(3), rel=1e-3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=2, max_size=10), st.floats(0.5, 0.999))
def test_no_count_interval_across_seeds_is_ever_below_zero(counts, level):
    runs = pd.DataFrame({"model": "m", "dataset": "adult", "seed": [str(s) for s in range(len(counts))],
                         "cell_b": counts, "cell_c": counts[::-1], "n_pairs_truncated": counts})
    summary = study.seed_summary(runs, ["cell_b", "cell_c", "n_pairs_truncated"], ["model", "dataset"], level)
    assert (summary["ci_low"] >= 0).all() and (summary["ci_low"] <= summary["mean"]).all()
    assert (summary["ci_high"] >= summary["mean"]).all()


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
