"""Multiple comparisons across a study: Holm and Benjamini-Hochberg against statsmodels, in log space below the
smallest double, and a 3-dataset sweep's report read back from a real sqlite MLflow store."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from statsmodels.stats.multitest import multipletests

from fairaudit.analysis.contingency import contingency
from fairaudit.analysis.multiplicity import adjusted_log10_p, family, family_settings, significant
from fairaudit.analysis.stats import mcnemar_exact_log10_p
from fairaudit.errors import AuditError
from fairaudit.report import app
from test_report import Store, report_cfg, synthetic_records


@pytest.mark.parametrize("method,name", [("holm", "holm"), ("bh", "fdr_bh")])
def test_adjusted_p_is_statsmodels_multipletests(method, name):
    p = np.array([0.04, 0.001, 0.3, 0.012, 0.049, 2.2e-46, 0.9, 0.02])
    expected = multipletests(p, method=name)[1]
    assert 10 ** adjusted_log10_p(np.log10(p), method) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("method,name", [("holm", "holm"), ("bh", "fdr_bh")])
def test_a_p_below_the_smallest_double_is_adjusted_in_log_space_the_others_as_statsmodels_has_them(method, name):
    """multipletests sees 10^-485.6 as 0.0 and adjusts it to 0; the log-space step-down / step-up keeps its size and,
    for the representable p's, agrees with multipletests on the family with that p set to 0."""
    log10_p = np.array([mcnemar_exact_log10_p(620, 3508), math.log10(0.03), math.log10(0.2), math.log10(0.011)])
    adjusted = adjusted_log10_p(log10_p, method)
    as_zero = multipletests(np.r_[0.0, 10 ** log10_p[1:]], method=name)[1]
    assert 10 ** adjusted[1:] == pytest.approx(as_zero[1:], rel=1e-12) and as_zero[0] == 0.0
    # the smallest p is first in either order: Holm multiplies it by m = 4, BH by m / 1 = 4
    assert adjusted[0] == pytest.approx(log10_p[0] + math.log10(4), abs=1e-12)


def test_family_and_its_counts_by_hand():
    runs = pd.DataFrame({"run_id": list("abcd"), "dataset": ["adult", "compas", "credit", "adult"],
                         "probe": ["counterfactual"] * 3 + ["btm"],
                         "mcnemar_log10_p": [math.log10(0.01), math.log10(0.04), -485.6, math.nan]})
    tests = family(runs, ["mcnemar_log10_p"], ["dataset"])
    assert tests["run_id"].tolist() == ["a", "b", "c"]            # the run without a McNemar test is not one
    assert math.isnan(tests["p"].iloc[2]) and tests["log10_p"].iloc[2] == -485.6
    # Holm over (10^-485.6, 0.01, 0.04): 3 x 10^-485.6, 2 x 0.01 = 0.02, max(0.02, 1 x 0.04) = 0.04
    assert tests["p_holm"].iloc[:2].tolist() == pytest.approx([0.02, 0.04])
    # BH: 0.04 x 3/3 = 0.04, 0.01 x 3/2 = 0.015
    assert tests["p_bh"].iloc[:2].tolist() == pytest.approx([0.015, 0.04])
    assert significant(tests, 0.05) == {"n_tests": 3, "n_significant": 3, "n_significant_holm": 3,
                                        "n_significant_bh": 3}
    assert significant(tests, 0.03)["n_significant_holm"] == 2 and significant(tests, 0.03)["n_significant_bh"] == 2


def test_family_settings_refuse_what_is_not_a_log10_p():
    node = OmegaConf.create({"metrics": ["mcnemar_log10_p"], "alpha": 0.05})
    assert family_settings(node) == (["mcnemar_log10_p"], 0.05)
    with pytest.raises(AuditError, match=r"report.family.metrics: \['mcnemar_p'\] are not log10 p metrics"):
        family_settings({"metrics": ["mcnemar_p"], "alpha": 0.05})
    with pytest.raises(AuditError, match=r"report.family.alpha must be in \(0, 1\)"):
        family_settings({"metrics": [], "alpha": 5})


@pytest.fixture()
def store(tmp_path_factory, tmp_path) -> Store:
    return Store(tmp_path_factory.mktemp("mlflow") / "mlflow.db", tmp_path, "family")


def test_a_three_dataset_sweeps_report_shows_holm_and_bh_beside_each_mcnemar_p(store, tmp_path):
    parent = store.sweep()
    cells = {"adult": (75, 363), "compas": (10, 19), "credit": (8, 11)}   # (b, c): p = 2.2e-46, ~0.14, ~0.65
    for dataset, (b, c) in cells.items():
        records = synthetic_records(len(dataset), 20, dataset)
        metrics = {**contingency(records, n_boot=0), "cell_b": b, "cell_c": c,
                   "mcnemar_log10_p": mcnemar_exact_log10_p(b, c)}
        store.job(records, parent, metrics=metrics, dataset=dataset)
    result = app.run(report_cfg(store, tmp_path / "out"))
    table = pd.read_csv(tmp_path / "out" / "family.csv")
    assert table["dataset"].tolist() == list(cells) and set(table["test"]) == {"mcnemar_log10_p"}
    p = np.array([10 ** mcnemar_exact_log10_p(b, c) for b, c in cells.values()])
    assert table["p"].tolist() == pytest.approx(p, rel=1e-6) and p[0] == pytest.approx(2.204e-46, rel=1e-3)
    assert table["p_holm"].tolist() == pytest.approx(multipletests(p, method="holm")[1], rel=1e-9)
    assert table["p_bh"].tolist() == pytest.approx(multipletests(p, method="fdr_bh")[1], rel=1e-9)
    md = (tmp_path / "out" / "report.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| model | dataset | test"))
    assert header == "| model | dataset | test | p | Holm p | BH p |"
    adult = next(line for line in md.splitlines() if line.startswith("| m | adult | mcnemar_log10_p"))
    assert adult.split(" | ")[3:] == ["2.2e-46", "6.6e-46", "6.6e-46 |"]
    reject = {m: multipletests(p, method=name)[0].sum() for m, name in (("holm", "holm"), ("bh", "fdr_bh"))}
    assert (f"3 tests in the family (mcnemar_log10_p, one per run): 1 significant at 0.05 uncorrected, "
            f"{reject['holm']} after Holm, {reject['bh']} after Benjamini-Hochberg") in md
    assert result.report.metrics["family_n_significant_holm"] == reject["holm"] == 1
    logged = store.client.get_run(result.run_id).data.metrics
    assert (logged["family_n_tests"], logged["family_n_significant_bh"]) == (3, 1)
