"""Numbers as they are: a tiny McNemar p reaches MLflow, metrics.json, the verdict, the summary and the report
tables as 2.2e-46; one below the smallest double as its log10; float noise only where a sum cancels."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from fairaudit.analysis.cdpg import _cell_slopes, pair_slopes
from fairaudit.analysis.contingency import contingency
from fairaudit.analysis.gap import p_gap
from fairaudit.analysis.numbers import cancelled, format_number, format_p
from fairaudit.analysis.position import monotonic_profile
from fairaudit.analysis.position_truncation import ccp_cluster_test
from fairaudit.analysis.stats import mcnemar_exact_log10_p
from fairaudit.probes import ProbeResult
from fairaudit.probes.counterfactual import CounterfactualProbe
from fairaudit.probes.decisions import paired_metrics
from fairaudit.terminal.results import format_metric
from fairaudit.tracking.runs import Tracker
from fairaudit.views.render import display

CELLS = {"a": 40, "b": 75, "c": 363, "d": 32}   # paper 000's Qwen3-Adult discordant cells, a and d made small
FLIPS = {"a": (False, False), "b": (False, True), "c": (True, False), "d": (True, True)}  # (think flips, nothink flips)


def cell_records() -> pd.DataFrame:
    """Long records with the cells above: a pair flips when its two sides answer differently."""
    rows = []
    for cell, count in CELLS.items():
        for i in range(count):
            for arm, flipped in zip(("think", "nothink"), FLIPS[cell]):
                for side, answer in (("alpha", "Yes"), ("alpha_prime", "No" if flipped else "Yes")):
                    rows.append({"pair_id": f"{cell}{i}", "side": side, "arm": arm, "answer": answer,
                                 "parsed_answer": answer, "p_yes": 0.8 if answer == "Yes" else 0.3,
                                 "attribute_value": {"alpha": "Male", "alpha_prime": "Female"}[side],
                                 "dataset": "adult", "compliant": pd.NA if arm == "think" else True,
                                 "trace_tokens": 40 if arm == "think" else 0, "think_closed": True})
    return pd.DataFrame(rows).astype({"compliant": "boolean"})


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """The counterfactual metrics of those records, logged to a real sqlite MLflow store and read back."""
    from mlflow.tracking import MlflowClient

    tmp = tmp_path_factory.mktemp("numbers")
    records = cell_records()
    metrics = paired_metrics(lambda rows: contingency(rows, n_boot=200), records, "think", "nothink", n_boot=200)
    tracker = Tracker(f"sqlite:///{tmp}/mlflow.db", "numbers")
    run_id = tracker.start("tiny p", {"fairaudit.kind": "job"}, {})
    tracker.content.log_result(metrics, {}, {}, {})
    tracker.end()
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    path = client.download_artifacts(run_id, "metrics.json", str(tmp))
    return records, metrics, client.get_run(run_id).data.metrics, json.loads(open(path).read())


def test_a_tiny_mcnemar_p_is_logged_as_it_is_in_mlflow_and_metrics_json(logged):
    _, metrics, mlflow_metrics, metrics_json = logged
    assert (metrics["cell_b"], metrics["cell_c"]) == (75, 363)
    for source in (mlflow_metrics, metrics_json):
        assert source["mcnemar_p"] == pytest.approx(2.204e-46, rel=1e-3)
        assert source["mcnemar_p"] == pytest.approx(10 ** mcnemar_exact_log10_p(75, 363), rel=1e-6)
        assert round(source["mcnemar_log10_p"], 3) == -45.657


def test_the_verdict_and_the_summary_show_2_2e_46(logged):
    records, metrics, _, _ = logged
    verdict = CounterfactualProbe({"name": "nothink", "think": False, "max_new_tokens": 16}).verdict(
        ProbeResult(metrics=metrics, tables={}, figures={}, records={"records": records}, headline=[]))
    assert "created 363 and resolved 75 counterfactual flips (McNemar p = 2.2e-46)" in verdict[0]
    assert any(line.startswith("created per resolved flip, c/b = 4.84 [") for line in verdict)
    assert format_metric("mcnemar_p", metrics) == "2.2e-46" and format_metric("mcnemar_log10_p", metrics) == "-45.66"


def test_a_p_below_the_smallest_double_prints_from_its_log10():
    log10_p = mcnemar_exact_log10_p(620, 3508)          # paper 000's pooled row
    assert round(log10_p, 1) == -485.6 and 10.0 ** log10_p == 0.0
    metrics = {"mcnemar_log10_p": log10_p, "mcnemar_p": math.nan}   # as contingency logs it
    assert format_metric("mcnemar_p", metrics) == "10^-485.6" == format_p(log10_p)
    table = pd.DataFrame({"cell_b": [620.0], "cell_c": [3508.0], "mcnemar_log10_p": [log10_p]})
    assert display(table).iloc[0].tolist() == ["620", "3508", "10^-485.6"]


def test_p_values_read_as_people_read_them():
    assert [format_p(x) for x in (0.0, math.log10(0.0123), -2.0, math.log10(9.96e-7), -45.657, -307.0)] == [
        "1", "0.0123", "0.01", "1.0e-6", "2.2e-46", "1.0e-307"]
    assert format_p(math.nan) == "n/a" and format_p(-math.inf) == "0"


@pytest.mark.parametrize("p, shown", [
    (0.04996, "0.04996"), (0.05004, "0.05004"),   # both read "0.05" before: a p is never rounded onto a level
    (0.05, "0.05"), (0.0100001, "0.0100001"), (0.0099996, "0.0099996"), (0.00099996, "9.9996e-4"),
    (0.1001, "0.1001"), (0.0501, "0.0501"), (0.0126, "0.0126"), (0.04449, "0.0445"), (0.123456, "0.123"),
])
def test_a_p_next_to_a_level_gets_the_digits_that_tell_it_from_the_level(p, shown):
    assert format_p(math.log10(p)) == shown


def test_a_flat_trajectorys_slope_is_0_and_prints_0_while_small_values_stay():
    depth = np.arange(1, 11) / 10
    traj = pd.DataFrame({"pair_id": np.repeat([1, 2], 10), "K": 10, "cell": "c", "k": np.tile(np.arange(1, 11), 2),
                         "depth": np.tile(depth, 2), "abs_cdpg": 0.1})
    centred = depth - depth.mean()
    assert (centred * 0.1).sum() / (centred ** 2).sum() == pytest.approx(-5.9e-17, rel=0.01)  # the rounding residue
    slopes = pair_slopes(traj)
    assert slopes["slope"].tolist() == [0.0, 0.0]
    row = _cell_slopes(slopes).iloc[0]
    assert (row["slope"], row["ci_low"], row["ci_high"]) == (0.0, 0.0, 0.0)
    assert format_number(row["slope"]) == "0"
    assert display(pd.DataFrame({"slope_k10": [row["slope"]]})).iloc[0, 0] == "0.000"
    assert cancelled(-5.3e-18, 0.007) == 0.0 and cancelled(2e-9, 0.007) == 2e-9   # relative to the operands
    assert format_number(2.2e-46) == "2.2e-46" and format_number(3.2e-14) == "3.2e-14"  # never snapped to 0


def test_signed_p_yes_differences_that_cancel_name_no_favoured_side():
    records = pd.DataFrame({"pair_id": np.repeat([1, 2, 3], 2).tolist() * 2, "side": ["alpha", "alpha_prime"] * 6,
                            "arm": ["think"] * 6 + ["nothink"] * 6,
                            "p_yes": [0.4, 0.3, 0.5, 0.3, 0.2, 0.5] + [0.5] * 6})
    assert 0.1 + 0.2 - 0.3 != 0.0                     # (0.4 - 0.3) + (0.5 - 0.3) + (0.2 - 0.5) in floats
    assert p_gap(records, n_boot=50)["p_diff_think"] == 0.0


def test_other_differences_that_cancel_are_0_where_they_are_computed():
    assert monotonic_profile([0.1 + 0.2, 0.5, 0.3])["gradient"] == 0.0        # last bin minus first
    # ten continuations a side; after - before: 1/10 - 0, 2/10 - 0, 0 - 3/10, which cancel (0.1 + 0.2 - 0.3)
    changed = np.zeros(60, dtype=bool)
    changed[[0, 20, 21, 50, 51, 52]] = True
    rows = pd.DataFrame({"question_id": np.repeat([1, 2, 3], 20), "changed": changed,
                         "offset": np.tile(np.r_[[0.05] * 10, [-0.05] * 10], 3)})
    assert ccp_cluster_test(rows)["trunc_ccp_question_diff"] == 0.0 and np.mean([0.1, 0.2, -0.3]) != 0.0
