"""Traces the token budget cut: counted per cell, and every paired metric again over the completed pairs
(hand-computed on four pairs), in a probe's metrics and in the report's section."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fairaudit.analysis.contingency import contingency
from fairaudit.analysis.truncation import completed, truncated_by_cell, truncated_pairs, with_complete
from fairaudit.probes.decisions import paired_metrics
from fairaudit.probes.paired_report import completed_traces
from fairaudit.views.sections import Report

ANSWERS = {  # pair -> (think alpha, think alpha', nothink alpha, nothink alpha'): cells a, c, c, b
    "p1": ("Yes", "Yes", "Yes", "Yes"), "p2": ("Yes", "No", "No", "No"),
    "p3": ("No", "Yes", "No", "No"), "p4": ("Yes", "Yes", "Yes", "No"),
}
CUT = {("p2", "think", "alpha"), ("p4", "nothink", "alpha_prime")}  # generations that hit the budget


def four_pairs() -> pd.DataFrame:
    rows = []
    for pair, answers in ANSWERS.items():
        for (arm, side), answer in zip([(a, s) for a in ("think", "nothink") for s in ("alpha", "alpha_prime")],
                                       answers):
            rows.append({"pair_id": pair, "side": side, "arm": arm, "answer": answer, "parsed_answer": answer,
                         "p_yes": 0.8 if answer == "Yes" else 0.3, "truncated": (pair, arm, side) in CUT,
                         "trace": "t" * 5, "text": "x", "prompt": "p"})
    return pd.DataFrame(rows)


def metrics_of(rows: pd.DataFrame) -> dict:
    return contingency(rows, "think", "nothink", n_boot=200, seed=0)


def test_cut_pairs_are_counted_per_cell_and_left_out_of_the_complete_metrics():
    records = four_pairs()
    assert sorted(truncated_pairs(records)) == ["p2", "p4"]
    assert sorted(completed(records)["pair_id"].unique()) == ["p1", "p3"]
    assert truncated_by_cell(records, "think", "nothink") == {
        "n_pairs_truncated": 2, "cell_a_truncated": 0, "cell_b_truncated": 1, "cell_c_truncated": 1,
        "cell_d_truncated": 0}
    metrics = paired_metrics(metrics_of, records, "think", "nothink")
    assert (metrics["cell_a"], metrics["cell_b"], metrics["cell_c"]) == (1, 1, 2)
    assert (metrics["n_pairs_complete"], metrics["cell_a_complete"], metrics["cell_b_complete"],
            metrics["cell_c_complete"]) == (2, 1, 0, 1)
    assert (metrics["d_cf_think"], metrics["d_cf_nothink"], metrics["delta_d_cf"]) == (0.5, 0.25, 0.25)
    assert (metrics["d_cf_think_complete"], metrics["d_cf_nothink_complete"],
            metrics["delta_d_cf_complete"]) == (0.5, 0.0, 0.5)
    assert metrics["mcnemar_log10_p_complete"] == pytest.approx(0.0)  # b=0, c=1: p = 1
    expected = metrics_of(records[records["pair_id"].isin(["p1", "p3"])])
    assert all(metrics[f"{k}_complete"] == v or (math.isnan(v) and math.isnan(metrics[f"{k}_complete"]))
               for k, v in expected.items())


def test_without_cut_traces_the_complete_metrics_repeat_the_metrics_and_with_only_cut_ones_they_are_nan():
    records = four_pairs().assign(truncated=False)
    metrics = with_complete(metrics_of, records)
    assert metrics["delta_d_cf_complete"] == metrics["delta_d_cf"] and metrics["n_pairs_complete"] == 4
    assert math.isnan(with_complete(metrics_of, records.assign(truncated=True))["n_pairs_complete"])


@pytest.mark.slow
def test_the_report_shows_table_2_over_completed_pairs_with_a_pooled_row():
    frames = {"r1": four_pairs(), "r2": four_pairs()}
    rows = []
    for run_id, frame in frames.items():
        rows.append({"run_id": run_id, "probe": "counterfactual", "model": "m", "dataset": f"d{run_id}", "arm": "think",
                     "baseline": "nothink", **paired_metrics(metrics_of, frame, "think", "nothink")})
    report = Report()
    settings = {"counterfactual": {"paper_tables": True}, "btm": {"paper_tables": False}}
    completed_traces(report, pd.DataFrame(rows), lambda ids, name="records": {i: frames[i] for i in ids}, settings)
    (section,) = report.sections
    pooled = section.table.iloc[-1]
    assert section.name == "table2_complete" and pooled["dataset"] == "" and pooled["model"].startswith("Pooled")
    assert (pooled["n_pairs_truncated"], pooled["cell_b_truncated"], pooled["n_pairs_complete"],
            pooled["cell_c_complete"]) == (4, 2, 4, 2)
    assert list(section.table["n_pairs_truncated"]) == [2, 2, 4]
    assert "c cut" in section.shown.columns and "N (complete)" in section.shown.columns
    assert report.metrics["pooled_n_pairs_complete"] == 4
