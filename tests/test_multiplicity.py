"""Multiple comparisons across a study: Holm and Benjamini-Hochberg against statsmodels, in log space below the
smallest double, and a 3-dataset sweep's report read back from a real sqlite MLflow store."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from statsmodels.stats.multitest import multipletests

import test_report
from fairaudit.analysis.contingency import contingency
from fairaudit.analysis.multiplicity import (
    adjusted_log10_p,
    combined_log10_p,
    family,
    family_phrase,
    family_settings,
    significant,
)
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
    assert tests["run_ids"].tolist() == ["a", "b", "c"]            # the run without a McNemar test is not one
    assert tests["n_replicates"].tolist() == [1, 1, 1]
    assert math.isnan(tests["p"].iloc[2]) and tests["log10_p"].iloc[2] == -485.6
    # Holm over (10^-485.6, 0.01, 0.04): 3 x 10^-485.6, 2 x 0.01 = 0.02, max(0.02, 1 x 0.04) = 0.04
    assert tests["p_holm"].iloc[:2].tolist() == pytest.approx([0.02, 0.04])
    # BH: 0.04 x 3/3 = 0.04, 0.01 x 3/2 = 0.015
    assert tests["p_bh"].iloc[:2].tolist() == pytest.approx([0.015, 0.04])
    assert significant(tests, 0.05) == {"n_tests": 3, "n_significant": 3, "n_significant_holm": 3,
                                        "n_significant_bh": 3}
    assert significant(tests, 0.03)["n_significant_holm"] == 2 and significant(tests, 0.03)["n_significant_bh"] == 2


def seeded_runs(p_by_dataset: dict[str, list[float]]) -> pd.DataFrame:
    """One run per data set and seed, each with its McNemar log10 p."""
    return pd.DataFrame([{"run_id": f"{dataset}{seed}", "model": "m", "dataset": dataset, "seed": str(seed),
                          "mcnemar_log10_p": math.log10(p)}
                         for dataset, ps in p_by_dataset.items() for seed, p in enumerate(ps)])


def test_seeds_are_combined_into_one_test_per_hypothesis_never_counted_as_tests():
    """The issue's case: three data sets at p = 0.01, 0.02, 0.04, each run with 3 seeds, are 3 tests, not 9; each
    one's p is 3/2 x its seeds' median (0.015, 0.03, 0.06). Holm: 3 x 0.015 = 0.045, max(0.045, 2 x 0.03) = 0.06,
    max(0.06, 0.06); BH: min over j >= i of 3 p_(j) / j = 0.045, 0.045, 0.06."""
    runs = seeded_runs({"adult": [0.01] * 3, "compas": [0.02] * 3, "credit": [0.04] * 3})
    tests = family(runs, ["mcnemar_log10_p"], ["model", "dataset", "seed"])
    assert tests["dataset"].tolist() == ["adult", "compas", "credit"] and "seed" not in tests
    assert tests["n_replicates"].tolist() == [3, 3, 3] and tests["run_ids"].iloc[0] == "adult0,adult1,adult2"
    assert tests["p"].tolist() == pytest.approx([0.015, 0.03, 0.06], rel=1e-12)
    assert tests["p_holm"].tolist() == pytest.approx([0.045, 0.06, 0.06], rel=1e-12)
    assert tests["p_bh"].tolist() == pytest.approx([0.045, 0.045, 0.06], rel=1e-12)
    assert tests["p_median"].tolist() == pytest.approx([0.01, 0.02, 0.04], rel=1e-12)
    assert significant(tests, 0.05) == {"n_tests": 3, "n_significant": 2, "n_significant_holm": 1,
                                        "n_significant_bh": 2}
    assert family_phrase(runs, tests) == ("one per model x dataset hypothesis; its 3 seed replicates combined into "
                                          "one p (3/2 x their median p, valid whatever their dependence), never "
                                          "counted as tests")
    spread = family(seeded_runs({"adult": [0.2, 0.001, 0.03]}), ["mcnemar_log10_p"], ["model", "dataset", "seed"])
    assert spread["p"].iloc[0] == pytest.approx(0.045) and spread["p_median"].iloc[0] == pytest.approx(0.03)
    assert 10 ** spread["log10_p_min"].iloc[0] == pytest.approx(0.001) and spread["log10_p_max"].iloc[0] == \
        pytest.approx(math.log10(0.2))
    engines = runs.assign(engine=["hf", "vllm", "hf"] * 3, seed="0")   # engine replicates are combined the same way
    assert family(engines, ["mcnemar_log10_p"], ["model", "dataset", "engine"])["n_replicates"].tolist() == [3] * 3


@pytest.mark.parametrize("p, combined", [
    ([0.01], 0.01),                       # one replicate: its own p
    ([0.01, 0.3], 0.02),                  # K = 2: 2 x the smaller
    ([0.2, 0.001, 0.03], 0.045),          # K = 3: 3/2 x the median
    ([0.01, 0.02, 0.5, 0.9], 0.04),       # K = 4: 4/2 x the 2nd smallest
    ([0.9, 0.8, 0.95], 1.0),              # never above 1
    ([0.04, math.nan, 0.02], 0.04),       # a NaN is no test
])
def test_replicates_combine_into_k_over_ceil_k_half_times_their_median(p, combined):
    assert 10 ** combined_log10_p([math.log10(v) if v == v else v for v in p]) == pytest.approx(combined, rel=1e-12)


def test_the_combined_p_is_valid_and_keeps_a_seed_below_the_smallest_double():
    assert math.isnan(combined_log10_p([])) and math.isnan(combined_log10_p([math.nan]))
    assert combined_log10_p([-485.6, math.log10(0.3)]) == pytest.approx(-485.6 + math.log10(2), abs=1e-12)
    # Markov: P(p_(k) <= t) <= K t / k for any dependence; independent and identical seeds both stay within alpha
    rng = np.random.default_rng(0)
    independent = np.log10(rng.random((20000, 3)))
    identical = np.repeat(np.log10(rng.random((20000, 1))), 3, axis=1)
    for draws in (independent, identical):
        combined = np.array([combined_log10_p(row) for row in draws])
        assert (combined <= math.log10(0.05)).mean() <= 0.05


def test_a_nan_in_the_family_is_no_test_and_not_counted_in_m():
    log10_p = [math.nan, math.log10(0.01), math.log10(0.04)]
    for method, name in (("holm", "holm"), ("bh", "fdr_bh")):
        adjusted = adjusted_log10_p(log10_p, method)
        assert math.isnan(adjusted[0])
        assert 10 ** adjusted[1:] == pytest.approx(multipletests([0.01, 0.04], method=name)[1], rel=1e-12)
    assert 10 ** adjusted_log10_p(log10_p, "bh")[1:] == pytest.approx([0.02, 0.04])   # m = 2: 0.01 x 2, 0.04 x 2/2
    assert np.isnan(adjusted_log10_p([math.nan, -500.0, -1.0], "holm")[0])
    assert adjusted_log10_p([math.nan, -500.0, -1.0], "holm")[1] == pytest.approx(-500.0 + math.log10(2))


def test_family_settings_refuse_what_is_not_a_log10_p():
    node = OmegaConf.create({"metrics": ["mcnemar_log10_p"], "alpha": 0.05})
    assert family_settings(node) == (["mcnemar_log10_p"], 0.05)
    with pytest.raises(AuditError, match=r"report.family.metrics: \['mcnemar_p'\] are not log10 p metrics"):
        family_settings({"metrics": ["mcnemar_p"], "alpha": 0.05})
    with pytest.raises(AuditError, match=r"report.family.alpha must be in \(0, 1\)"):
        family_settings({"metrics": [], "alpha": 5})


mlflow_db = test_report.mlflow_db   # one sqlite file for the module's tests, an experiment each


@pytest.fixture()
def store(mlflow_db, tmp_path, request) -> Store:
    return Store(mlflow_db, tmp_path, request.node.name)


@pytest.mark.slow
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
    assert header == "| model | dataset | test | runs | p | Holm p | BH p | median p | range |"
    adult = next(line for line in md.splitlines() if line.startswith("| m | adult | mcnemar_log10_p"))
    assert adult.split(" | ")[3:] == ["1", "2.2e-46", "6.6e-46", "6.6e-46", "2.2e-46", "2.2e-46 |"]
    reject = {m: multipletests(p, method=name)[0].sum() for m, name in (("holm", "holm"), ("bh", "fdr_bh"))}
    assert (f"3 tests in the family (mcnemar_log10_p: one per model x dataset hypothesis): 1 significant at 0.05 "
            f"uncorrected, {reject['holm']} after Holm, {reject['bh']} after Benjamini-Hochberg") in md
    assert result.report.metrics["family_n_significant_holm"] == reject["holm"] == 1
    logged = store.client.get_run(result.run_id).data.metrics
    assert (logged["family_n_tests"], logged["family_n_significant_bh"]) == (3, 1)


@pytest.mark.slow
def test_a_report_over_a_three_seed_sweep_of_three_data_sets_counts_three_tests(store, tmp_path):
    """Nine runs, three hypotheses: each data set's seeds are one test, whose p is 3/2 x their median."""
    parent = store.sweep()
    seeds = {"adult": [(75, 363), (80, 350), (70, 370)], "compas": [(10, 19), (9, 21), (12, 18)],
             "credit": [(8, 11), (11, 8), (9, 9)]}
    for dataset, cells in seeds.items():
        for seed, (b, c) in enumerate(cells):
            records = synthetic_records(seed, 20, dataset)
            metrics = {**contingency(records, n_boot=0), "mcnemar_log10_p": mcnemar_exact_log10_p(b, c)}
            store.job(records, parent, metrics=metrics, dataset=dataset, seed=seed)
    result = app.run(report_cfg(store, tmp_path / "out", "log_to_mlflow=false"))
    table = pd.read_csv(tmp_path / "out" / "family.csv")
    assert table["dataset"].tolist() == list(seeds) and table["n_replicates"].tolist() == [3, 3, 3]
    medians = [sorted(mcnemar_exact_log10_p(b, c) for b, c in cells)[1] for cells in seeds.values()]
    assert table["log10_p"].tolist() == pytest.approx([m + math.log10(1.5) for m in medians], abs=1e-9)
    assert table["p_holm"].tolist() == pytest.approx(multipletests(1.5 * 10 ** np.array(medians), method="holm")[1])
    assert result.report.metrics["family_n_tests"] == 3
    md = (tmp_path / "out" / "report.md").read_text()
    assert ("3 tests in the family (mcnemar_log10_p: one per model x dataset hypothesis; its 3 seed replicates "
            "combined into one p (3/2 x their median p, valid whatever their dependence), never counted as "
            "tests)") in md


def test_the_sweep_parent_shows_each_tests_p_with_its_holm_and_bh_p(store, tmp_path):
    """A 3-seed sweep of 3 data sets closed by the real `close_parent`: its verdict counts 3 tests and has a line per
    test with p, Holm p and BH p; the parent logs each as `family/<metric>[_holm|_bh]/<data set>`."""
    from fairaudit.tracking import tags as t
    from fairaudit.tracking.sweeps import close_parent

    parent = store.sweep()
    p = {"adult": [0.01, 0.02, 1e-400], "compas": [0.02] * 3, "credit": [0.5, 0.04, 0.04]}
    for dataset, values in p.items():
        for seed, value in enumerate(values):
            log10_p = -400.0 if value == 1e-400 else math.log10(value)
            run = store.job(synthetic_records(seed, 4, dataset), parent, dataset=dataset, seed=seed,
                            metrics={"mcnemar_log10_p": log10_p, "mcnemar_p": 10 ** log10_p})
            store.client.set_tag(run, t.HEADLINE_TAG, '["mcnemar_p", "mcnemar_log10_p"]')
    (tmp_path / t.PARENT_ID_FILE).write_text(parent)
    close_parent(store.uri, tmp_path, {"metrics": ["mcnemar_log10_p"], "alpha": 0.05})
    run = store.client.get_run(parent)
    # combined: adult 3/2 x 0.01 = 0.015, compas 0.03, credit 0.06; Holm 0.045, 0.06, 0.06; BH 0.045, 0.045, 0.06
    expected = {"adult": (0.015, 0.045, 0.045), "compas": (0.03, 0.06, 0.045), "credit": (0.06, 0.06, 0.06)}
    for dataset, (combined, holm, bh) in expected.items():
        logged = [run.data.metrics[f"family/mcnemar_p{s}/{dataset}"] for s in ("", "_holm", "_bh")]
        assert logged == pytest.approx([combined, holm, bh], rel=1e-9)
        assert 10 ** run.data.metrics[f"family/mcnemar_log10_p_holm/{dataset}"] == pytest.approx(holm, rel=1e-9)
    assert run.data.metrics["family_n_tests"] == 3 and run.data.metrics["family_n_significant_holm"] == 1
    note = run.data.tags[t.NOTE_TAG].split("\n\n")
    counted = next(i for i, line in enumerate(note) if line.startswith("3 tests (mcnemar_log10_p: one per model x "
                                                                       "dataset hypothesis; its 3 seed replicates"))
    assert note[counted + 1:counted + 4] == [
        "adult · mcnemar_log10_p: p = 0.015, Holm p = 0.045, BH p = 0.045 (3 runs: median p 0.01, 10^-400.0 to 0.02)",
        "compas · mcnemar_log10_p: p = 0.03, Holm p = 0.06, BH p = 0.045 (3 runs: median p 0.02, 0.02 to 0.02)",
        "credit · mcnemar_log10_p: p = 0.06, Holm p = 0.06, BH p = 0.06 (3 runs: median p 0.04, 0.04 to 0.5)"]


def test_a_step_never_averages_a_p_even_without_its_log10_twin():
    """Two seeds logged mcnemar_p alone, 0.02 and 0.3: the step's p is their combination, 2 x the smaller, 0.04,
    never their mean 0.16."""
    from fairaudit.tracking.sweeps import step_values

    group = pd.DataFrame({"seed": ["0", "1"], "job": [0, 1], "mcnemar_p": [0.02, 0.3], "p_gap_think": [0.1, 0.3]})
    values = {(name, label): value for name, label, value in step_values(group, ["mcnemar_p", "p_gap_think"])}
    assert values[("mcnemar_p", "")] == pytest.approx(0.04) and values[("p_gap_think", "")] == pytest.approx(0.2)
