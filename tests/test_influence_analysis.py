"""Influence analysis (paper 002) against hand-computed values and the paper's printed tables."""

import math

import numpy as np
import pandas as pd
import pytest

from fairaudit.analysis.influence import control_summary, influence, influence_rates, ngram_overlap
from fairaudit.analysis.influence_study import table1, table2, table3, table4, table5
from fairaudit.analysis.stats import wilson_interval
from fairaudit.probes.influence_report import add_influence_tables, rate_with_ci
from fairaudit.views.sections import Report

# Table 3's printed counts and intervals: (k, n) -> "rate% [low, high]"
TABLE3 = {(546, 2311): "23.6% [21.9, 25.4]", (54, 2348): "2.3% [1.8, 3.0]",
          (886, 2273): "39.0% [37.0, 41.0]", (160, 2279): "7.0% [6.0, 8.1]",
          (881, 2244): "39.3% [37.3, 41.3]", (157, 2279): "6.9% [5.9, 8.0]"}


@pytest.mark.parametrize("counts,printed", TABLE3.items())
def test_wilson_reproduces_table3_from_its_printed_counts(counts, printed):
    k, n = counts
    assert rate_with_ci(k / n, *wilson_interval(k, n)) == printed


def test_wilson_by_hand_and_edges():
    low, high = wilson_interval(546, 2311)
    z = 1.959963984540054
    p, n = 546 / 2311, 2311
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert (low, high) == pytest.approx((center - half, center + half), abs=1e-12)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == pytest.approx(1.0)
    assert all(math.isnan(v) for v in wilson_interval(0, 0))
    assert wilson_interval(5, 10, level=0.99)[0] < wilson_interval(5, 10)[0]


def test_ngram_overlap_raw_and_corrected():
    source = [1, 2, 3, 4, 5, 6]                 # 4-grams 1234, 2345, 3456
    target = [1, 2, 3, 4, 5, 9, 9, 9]           # 1234, 2345, 3459, 4599, 5999
    assert ngram_overlap(source, target) == pytest.approx(2 / 5)
    assert ngram_overlap(source, target, exclude_ids=[0, 1, 2, 3, 4]) == pytest.approx(1 / 4)  # 1234 was in the prompt
    assert ngram_overlap(source, target, n=2) == pytest.approx(4 / 6)  # 12 23 34 45 of 12 23 34 45 59 99
    assert math.isnan(ngram_overlap(source, [1, 2, 3]))                # no 4-gram in the target
    assert ngram_overlap([7, 7, 7, 7], target) == 0.0


def contrasts_frame():
    return pd.DataFrame({
        "condition": ["masked"] * 6 + ["unmasked"] * 2,
        "direction": ["a_to_b", "a_to_b", "a_to_b", "b_to_a", "b_to_a", "b_to_a", "a_to_b", "b_to_a"],
        "delta": [0.10, 0.02, -0.01, 0.0, 0.06, np.nan, 0.2, 0.3],
        "bridge_used": [False, False, False, True, False, True, False, True],
        "nll_nat": [0.5, 0.45, 0.3, 0.25, 0.1, np.nan, 0.5, 0.5],
        "control_nll_nat": [0.5, 0.4, 0.3, 0.2, 0.1, np.nan, 0.5, 0.5],
        "control_nll_cf": [0.5, 0.4, 0.3, 0.2, 0.1, np.nan, 0.6, 0.5],
        "skip_reason": [None, None, None, None, None, "identical", None, None],
    })


def test_influence_rates_by_hand():
    rates = influence_rates(contrasts_frame().query("condition == 'masked'"))
    row = rates.set_index(["direction", "threshold"])
    assert row.loc[("a_to_b", 0.0), ["n", "k"]].tolist() == [3, 2]
    assert row.loc[("a_to_b", 0.05), "k"] == 1
    assert row.loc[("a_to_b", 0.0), "mean_delta"] == pytest.approx(0.11 / 3)
    assert row.loc[("b_to_a", 0.0), ["n", "k"]].tolist() == [2, 1]  # the NaN (no donor) row is left out
    assert row.loc[("b_to_a", 0.0), "ci_low"] == pytest.approx(wilson_interval(1, 2)[0])


def test_control_counts_exact_zeros_only():
    frame = contrasts_frame()
    frame.loc[0, "control_nll_cf"] = 0.5 + 1e-15   # isclose would call this zero; == does not
    summary = control_summary(frame).set_index(["condition", "direction"])
    assert summary.loc[("masked", "a_to_b"), ["n", "zero_count"]].tolist() == [3, 2]
    assert summary.loc[("unmasked", "a_to_b"), "zero_count"] == 0


def test_influence_metrics_per_condition():
    traces = pd.DataFrame({"condition": ["masked"] * 3 + ["unmasked"], "valid": [True, True, False, True],
                           "ngram_raw": [0.5, 0.0, 0.9, 0.2], "ngram_corrected": [0.1, np.nan, 0.9, 0.0],
                           "canary_reproduced": [False, True, None, False],
                           "a_private_truncated": [True, False, False, False],
                           "b_public_truncated": [True, True, False, False]})
    m = influence(contrasts_frame(), traces)["metrics"]
    # skips by reason, truncation per graph and per block (over every trace, valid or not)
    assert (m["skipped_identical_b_to_a_masked"], m["skipped_no_donor_b_to_a_masked"]) == (1, 0)
    assert m["truncated_rate_masked"] == pytest.approx(3 / 6)
    assert m["truncated_rate_b_public_masked"] == pytest.approx(2 / 3)
    assert m["truncated_rate_unmasked"] == 0.0
    # B->A by origin: natural (delta 0.06) and bridge (delta 0.0)
    assert (m["n_contrasts_b_to_a_natural_masked"], m["substantive_k_b_to_a_natural_masked"]) == (1, 1)
    assert (m["n_contrasts_b_to_a_bridge_masked"], m["influence_k_b_to_a_bridge_masked"]) == (1, 0)
    assert m["mean_delta_b_to_a_natural_masked"] == pytest.approx(0.06)
    # the control's natural NLL range and how often it differs from the primary natural NLL (0.4 vs 0.45, 0.2 vs 0.25)
    assert (m["control_nll_min_masked"], m["control_nll_max_masked"]) == (0.1, 0.5)
    assert m["control_nll_mean_masked"] == pytest.approx(0.3)
    assert m["control_nll_sd_masked"] == pytest.approx(np.std([0.5, 0.4, 0.3, 0.2, 0.1], ddof=1))
    assert (m["control_differs_k_masked"], m["control_differs_rate_masked"]) == (2, pytest.approx(0.4))
    assert m["influence_rate_a_to_b_masked"] == pytest.approx(2 / 3)
    assert m["substantive_k_b_to_a_masked"] == 1 and m["skipped_b_to_a_masked"] == 1
    assert m["influence_rate_masked"] == pytest.approx(3 / 5) and m["influence_k_masked"] == 3
    assert m["validity_rate_masked"] == pytest.approx(2 / 3) and m["n_valid_masked"] == 2
    assert m["bridge_share_masked"] == pytest.approx(0.5)
    assert m["control_zero_rate_masked"] == 1.0 and m["control_n_masked"] == 5
    assert m["control_zero_count_unmasked"] == 1 and m["control_mean_delta_unmasked"] == pytest.approx(0.05)
    assert (m["ngram_raw_k_masked"], m["ngram_raw_n_masked"]) == (1, 2)     # the invalid trace is left out
    assert (m["ngram_corrected_k_masked"], m["ngram_corrected_n_masked"]) == (1, 1)
    assert m["canary_rate_masked"] == 0.5 and m["canary_rate_unmasked"] == 0.0


def seed_share(total: int, seed: int) -> int:
    """Seed `seed`'s part of `total` split over five seeds (the first total % 5 seeds take one more)."""
    return total // 5 + (1 if seed < total % 5 else 0)


def paper_runs():
    """Fifteen seed-checkpoint cells whose pooled counts are Table 3's (masked, Δ > 0.05)."""
    counts = {"ckpt1": (546, 2311, 54, 2348), "ckpt2": (886, 2273, 160, 2279), "ckpt3": (881, 2244, 157, 2279)}
    rows = []
    for checkpoint, (ka, na, kb, nb) in counts.items():
        for seed in range(5):
            a_k, a_n, b_k, b_n = (seed_share(total, seed) for total in (ka, na, kb, nb))
            rows.append({"run_id": f"{checkpoint}-{seed}", "model": "m", "dataset": "mmlu", "probe": "influence",
                         "arm": "think", "checkpoint": checkpoint, "seed": str(seed),
                         "substantive_k_a_to_b_masked": a_k, "n_contrasts_a_to_b_masked": a_n,
                         "substantive_k_b_to_a_masked": b_k, "n_contrasts_b_to_a_masked": b_n,
                         "substantive_rate_a_to_b_masked": a_k / a_n, "substantive_rate_b_to_a_masked": b_k / b_n,
                         "mean_delta_a_to_b_masked": 0.034, "mean_delta_b_to_a_masked": 0.011 + 0.001 * seed,
                         "control_n_masked": a_n + b_n, "control_zero_count_masked": a_n + b_n,
                         "control_mean_delta_masked": 0.0})
    return pd.DataFrame(rows)


def test_study_tables_reproduce_table3_table4_and_the_sign_test():
    runs = paper_runs()
    t3 = table3(runs).set_index("checkpoint")
    shown = {cp: rate_with_ci(t3.loc[cp, "rate_a_to_b"], t3.loc[cp, "ci_low_a_to_b"], t3.loc[cp, "ci_high_a_to_b"])
             for cp in t3.index}
    assert shown == {"ckpt1": "23.6% [21.9, 25.4]", "ckpt2": "39.0% [37.0, 41.0]", "ckpt3": "39.3% [37.3, 41.3]"}
    assert rate_with_ci(t3.loc["ckpt1", "rate_b_to_a"], t3.loc["ckpt1", "ci_low_b_to_a"],
                        t3.loc["ckpt1", "ci_high_b_to_a"]) == "2.3% [1.8, 3.0]"
    t4 = table4(runs)
    assert t4["control_n"].iloc[-1] == 13734 and t4["zero_rate"].tolist() == [1.0] * 4
    t5, tests = table5(runs)
    assert t5["a_gt_b_by_rate"].tolist() == [5, 5, 5] and tests["by_rate"][:2] == (15, 15)
    assert 10 ** tests["by_delta"][2] == pytest.approx(2 ** -15)


def test_report_sections_for_influence_runs():
    runs = paper_runs()
    report = Report()
    add_influence_tables(report, runs)
    names = [s.name for s in report.sections]
    assert names == [f"influence_table{i}" for i in range(1, 6)] + ["influence_diagnostics"]
    table3_shown = report.section("influence_table3").shown
    assert table3_shown["A-to-B rate (95% CI)"].tolist()[0] == "23.6% [21.9, 25.4]"
    assert table3_shown["A-to-B k/n"].tolist()[0] == "546/2311"
    assert set(table3_shown["threshold"]) == {"Δ_NLL > 0.05"}   # these runs logged no Δ > 0 counts
    assert report.section("influence_table5").shown["A>B by rate"].iloc[-1] == "15/15"
    assert {"influence_rates", "influence_fig4_checkpoints"} <= set(report.figures)
    assert "probe.target=with_tags" in report.section("influence_table3").note   # runs from before the setting


def test_table1_pools_counts_across_runs():
    runs = pd.DataFrame({"probe": ["influence"] * 2, "n_contrasts_masked": [10, 30], "influence_k_masked": [1, 3],
                         "mean_delta_masked": [0.01, 0.03], "ngram_corrected_k_masked": [5, 0],
                         "ngram_corrected_n_masked": [5, 5], "canary_k_masked": [0, 0], "canary_n_masked": [4, 4]})
    t1 = table1(runs, conditions=("masked",)).set_index("probe")["masked"]
    assert t1["Counterfactual influence (Δ > 0)"] == pytest.approx(10.0)
    assert math.isnan(t1["Counterfactual influence (Δ > 0.05)"])  # no substantive counts logged
    assert t1["Corrected n-gram overlap"] == pytest.approx(50.0)
    assert t1["Canary reproduction"] == 0.0
    assert t1["Mean Delta (nats/token)"] == pytest.approx(0.025)


def small_runs():
    """Two seeds of one cell, with counts at both thresholds, diagnostics and skips."""
    base = {"model": "m", "dataset": "mmlu", "probe": "influence", "arm": "think", "checkpoint": "c1",
            "probe.target": "content", "probe.length_match": "exact", "probe.max_block_tokens": "24"}
    rows = []
    for seed, (ka0, ka5, na, kb0, kb5, nb) in enumerate(((6, 3, 10, 2, 0, 8), (9, 4, 12, 0, 0, 0))):
        rows.append({**base, "run_id": f"r{seed}", "seed": str(seed),
                     "influence_k_a_to_b_masked": ka0, "substantive_k_a_to_b_masked": ka5,
                     "n_contrasts_a_to_b_masked": na,
                     "influence_k_b_to_a_masked": kb0, "substantive_k_b_to_a_masked": kb5,
                     "n_contrasts_b_to_a_masked": nb,
                     "influence_k_masked": ka0 + kb0, "substantive_k_masked": ka5 + kb5, "n_contrasts_masked": na + nb,
                     "mean_delta_a_to_b_masked": 0.02, "mean_delta_b_to_a_masked": -0.01 if nb else np.nan,
                     "substantive_rate_a_to_b_masked": ka5 / na,
                     "substantive_rate_b_to_a_masked": kb5 / nb if nb else np.nan,
                     "n_valid_masked": 10, "n_traces_masked": 10, "ngram_corrected_k_masked": 5,
                     "ngram_corrected_n_masked": 10,
                     "control_n_masked": na + nb, "control_zero_count_masked": na + nb,
                     "control_mean_delta_masked": 0.0, "control_nll_min_masked": 0.1 + seed,
                     "control_nll_max_masked": 0.9 + seed,
                     "control_nll_mean_masked": [0.5, 2.0][seed], "control_nll_sd_masked": [0.2, 0.1][seed],
                     "control_differs_k_masked": na + nb - 1, "truncated_rate_masked": [0.5, 0.25][seed],
                     "skipped_identical_a_to_b_masked": seed, "n_contrasts_b_to_a_bridge_masked": nb,
                     "n_contrasts_b_to_a_natural_masked": 0})
    return pd.DataFrame(rows)


def test_table2_at_both_thresholds_with_counts_and_wilson_intervals():
    t2 = table2(small_runs()).set_index("metric")
    row = t2.loc["A-to-B influence rate, Δ > 0 (%)"]
    assert (row["k"], row["n"], row["value"]) == (15, 22, pytest.approx(100 * 15 / 22))
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(tuple(100 * v for v in wilson_interval(15, 22)))
    assert t2.loc["A-to-B influence rate, Δ > 0.05 (%)", "k"] == 7
    assert t2.loc["Overall influence rate, Δ > 0 (%)", ["k", "n"]].tolist() == [17, 30]
    assert t2.loc["B-to-A mean delta (nats/token)", "value"] == pytest.approx(-0.01)  # the run without B->A weighs 0
    assert not row["few"] and t2.loc["B-to-A influence rate, Δ > 0 (%)", "few"]      # 22 contrasts, and 8 < FEW


def test_a_table2_rate_row_over_no_contrast_is_flagged_few():
    """Seed 1 has no B-to-A contrast and seed 0's 8 are dropped here: n = 0, no interval, and few (0 < 10)."""
    runs = small_runs().assign(n_contrasts_b_to_a_masked=0, influence_k_b_to_a_masked=0)
    row = table2(runs).set_index("metric").loc["B-to-A influence rate, Δ > 0 (%)"]
    assert row["n"] == 0 and math.isnan(row["ci_low"]) and math.isnan(row["value"]) and row["few"]
    assert table2(runs.drop(columns="n_contrasts_b_to_a_masked")).set_index("metric").loc[
        "B-to-A influence rate, Δ > 0 (%)", "few"]   # no n logged at all: no interval either


def test_table2_marks_its_rows_over_fewer_than_ten_contrasts():
    report = Report()
    add_influence_tables(report, small_runs())
    shown = report.section("influence_table2").shown.set_index("metric")
    assert shown.loc["B-to-A influence rate, Δ > 0 (%)", "95% CI"].endswith(" †")       # 2 of 8 contrasts
    assert shown.loc["B-to-A influence rate, Δ > 0 (%)", "k/n"] == "2/8"
    assert not shown.loc["A-to-B influence rate, Δ > 0 (%)", "95% CI"].endswith("†")    # 15 of 22
    assert "†: fewer than 10 contrasts" in report.section("influence_table2").note


def test_table3_says_no_contrasts_flags_few_and_keeps_settings_apart():
    runs = small_runs()
    runs.loc[1, "probe.length_match"] = "complete"
    report = Report()
    add_influence_tables(report, runs, rate="influence")
    section = report.section("influence_table3")
    shown = section.shown.set_index(["threshold", "length_match"])
    # seed 1 ran another length_match: its own row, where B->A had no contrast at all
    assert shown.loc[("Δ_NLL > 0", "complete"), "B-to-A rate (95% CI)"] == "n/a (no contrasts)"
    assert shown.loc[("Δ_NLL > 0", "exact"), "B-to-A rate (95% CI)"].endswith(" †")   # 8 contrasts < 10
    assert not shown.loc[("Δ_NLL > 0", "complete"), "A-to-B rate (95% CI)"].endswith("†")  # 12 contrasts
    # probes.influence.rate first
    assert list(dict.fromkeys(section.shown["threshold"])) == ["Δ_NLL > 0", "Δ_NLL > 0.05"]
    assert "Runs differ in length_match" in section.note and "probe.target=content" in section.note


def test_diagnostics_pool_counts_ranges_and_the_control_sd():
    from fairaudit.analysis.influence_study import diagnostics
    d = diagnostics(small_runs(), ("masked",)).set_index("metric")
    assert d.loc["Control natural NLL, min", "masked"] == 0.1 and d.loc["Control natural NLL, max", "masked"] == 1.9
    # pooled SD from (n, mean, SD) per run equals the SD of the concatenated values it stands for
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.5, 0.2, 18), rng.normal(2.0, 0.1, 12)
    runs = small_runs().assign(control_nll_mean_masked=[a.mean(), b.mean()],
                               control_nll_sd_masked=[a.std(ddof=1), b.std(ddof=1)])
    pooled = diagnostics(runs, ("masked",)).set_index("metric").loc["Control natural NLL, SD", "masked"]
    assert pooled == pytest.approx(np.concatenate([a, b]).std(ddof=1), rel=1e-12)
    assert d.loc["Control evaluations differing from the primary natural NLL (%)",
                 ["k_masked", "n_masked"]].tolist() == [28, 30]
    assert d.loc["Blocks cut by the budget (%)", "masked"] == pytest.approx(37.5)   # weighted by traces
    assert d.loc["A-to-B skipped: token-identical donors only", "masked"] == 1
    assert d.loc["B-to-A on the bridge (%)", "masked"] == 100.0
