"""Contingency cells, McNemar and disparities against hand counts and paper 000 Tables 2, 5 and 9."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from fairaudit.analysis import contingency
from fairaudit.analysis.contingency import cell_disparity_table, contingency_table
from fairaudit.analysis.stats import bootstrap_ci, mcnemar_exact_log10_p, sign_test_log10_p

# Table 2: (a, b, c, d, printed McNemar p) and Table 5: (c_alpha_up, c_alpha_prime_up).
TABLE2 = {
    ("qwen3", "adult"): (4531, 75, 362, 32, 3.7e-46, (186, 176)),
    ("qwen3", "compas"): (4511, 143, 344, 2, 3.7e-20, (170, 174)),
    ("qwq", "compas"): (4634, 15, 351, 0, 2.3e-84, (82, 269)),
    ("r1", "adult"): (4255, 77, 646, 21, 7.6e-113, (337, 309)),
    ("r1", "credit"): (4502, 10, 483, 0, 1.7e-128, (276, 207)),
}


def records_from_cells(a: int, b: int, c: int, d: int, c_split: tuple[int, int] | None = None) -> pd.DataFrame:
    """Records whose pairs fall into cells a-d; cell c split into (alpha Yes, alpha' Yes) favoured pairs."""
    c_alpha_up, _ = c_split or (c, 0)
    # (nothink alpha, nothink alpha', think alpha, think alpha')
    patterns = ([("No", "No", "No", "No")] * a + [("Yes", "No", "No", "No")] * b
                + [("No", "No", "Yes", "No")] * c_alpha_up + [("No", "No", "No", "Yes")] * (c - c_alpha_up)
                + [("Yes", "No", "Yes", "No")] * d)
    rows = []
    for i, (na, nap, ta, tap) in enumerate(patterns):
        for arm, side, answer in (("nothink", "alpha", na), ("nothink", "alpha_prime", nap),
                                  ("think", "alpha", ta), ("think", "alpha_prime", tap)):
            rows.append({"pair_id": i, "side": side, "arm": arm, "answer": answer,
                         "p_yes": 0.9 if answer == "Yes" else 0.1})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("key", sorted(TABLE2))
def test_mcnemar_reproduces_table2(key):
    a, b, c, d, printed, _ = TABLE2[key]
    log10_p = mcnemar_exact_log10_p(b, c)
    mantissa_exponent = f"{10 ** (log10_p - math.floor(log10_p)):.1f}e{math.floor(log10_p)}"
    assert float(mantissa_exponent) == pytest.approx(printed, rel=1e-9)


def test_mcnemar_pooled_counts_stay_finite_in_log_space():
    log10_p = mcnemar_exact_log10_p(620, 3508)
    assert math.isfinite(log10_p) and log10_p < -485  # Table 2: pooled p < 10^-485


@pytest.mark.parametrize("b, c", [(0, 0), (0, 5), (3, 3), (7, 19), (40, 12)])
def test_mcnemar_matches_scipy_exact_binomial(b, c):
    expected = 1.0 if b + c == 0 else binomtest(min(b, c), b + c, 0.5).pvalue
    assert 10 ** mcnemar_exact_log10_p(b, c) == pytest.approx(expected, rel=1e-10)


def test_sign_test_all_fifteen_one_way():
    assert sign_test_log10_p(15, 15) == pytest.approx(-15 * math.log10(2))
    assert 10 ** sign_test_log10_p(12, 15) == pytest.approx(binomtest(12, 15, 0.5, alternative="greater").pvalue)


@pytest.mark.parametrize("key", [("qwen3", "adult"), ("qwq", "compas"), ("r1", "credit")])
def test_contingency_recovers_table2_5_9_from_records(key):
    a, b, c, d, printed, c_split = TABLE2[key]
    m = contingency(records_from_cells(a, b, c, d, c_split), n_boot=200)
    n = a + b + c + d
    assert (m["cell_a"], m["cell_b"], m["cell_c"], m["cell_d"], m["n_pairs"]) == (a, b, c, d, n)
    assert m["d_cf_think"] == pytest.approx((c + d) / n)  # Table 9
    assert m["d_cf_nothink"] == pytest.approx((b + d) / n)
    assert m["delta_d_cf"] == pytest.approx((c - b) / n)
    assert (m["c_alpha_up"], m["c_alpha_prime_up"]) == c_split  # Table 5
    assert m["asym_c"] == pytest.approx(abs(c_split[0] - c_split[1]) / c)
    assert m["delta_c"] == pytest.approx((c_split[0] - c_split[1]) / n)
    assert f"{10 ** (m['mcnemar_log10_p'] % 1):.1f}" == f"{printed:.1e}"[:3]
    assert m["delta_d_cf_ci_low"] <= m["delta_d_cf"] <= m["delta_d_cf_ci_high"]


def test_table9_rounded_values_qwen3_adult():
    m = contingency(records_from_cells(4531, 75, 362, 32, (186, 176)), n_boot=50)
    assert round(m["d_cf_think"], 3) == 0.079 and round(m["d_cf_nothink"], 3) == 0.021
    # Table 9 prints delta as the difference of the rounded arms (0.079 - 0.021); exactly it is 0.0574.
    assert round(m["d_cf_think"], 3) - round(m["d_cf_nothink"], 3) == pytest.approx(0.058)
    assert m["delta_d_cf"] == pytest.approx(0.0574)
    assert round(m["asym_c"], 2) == 0.03 and round(100 * m["delta_c"], 2) == 0.20


def hand_records() -> pd.DataFrame:
    """Five pairs worked by hand; pair 5's think alpha' output did not parse."""
    rows = [
        # pair, side, arm, answer, p_yes
        (1, "alpha", "nothink", "No", 0.20), (1, "alpha_prime", "nothink", "No", 0.30),
        (1, "alpha", "think", "No", 0.10), (1, "alpha_prime", "think", "No", 0.05),  # a
        (2, "alpha", "nothink", "Yes", 0.60), (2, "alpha_prime", "nothink", "No", 0.40),
        (2, "alpha", "think", "Yes", 0.90), (2, "alpha_prime", "think", "Yes", 0.80),  # b
        (3, "alpha", "nothink", "No", 0.45), (3, "alpha_prime", "nothink", "No", 0.35),
        (3, "alpha", "think", "No", 0.20), (3, "alpha_prime", "think", "Yes", 0.95),  # c, alpha' favoured
        (4, "alpha", "nothink", "Yes", 0.70), (4, "alpha_prime", "nothink", "No", 0.20),
        (4, "alpha", "think", "Yes", 0.99), (4, "alpha_prime", "think", "No", 0.01),  # d, alpha favoured
        (5, "alpha", "nothink", "Yes", 0.70), (5, "alpha_prime", "nothink", "Yes", 0.80),
        (5, "alpha", "think", "Yes", 0.90), (5, "alpha_prime", "think", None, 0.50),  # dropped
    ]
    return pd.DataFrame(rows, columns=["pair_id", "side", "arm", "answer", "p_yes"])


def test_contingency_by_hand():
    m = contingency(hand_records(), n_boot=100)
    assert (m["cell_a"], m["cell_b"], m["cell_c"], m["cell_d"]) == (1, 1, 1, 1)
    assert m["n_pairs"] == 4 and m["n_pairs_total"] == 5
    assert m["d_cf_think"] == 0.5 and m["d_cf_nothink"] == 0.5 and m["delta_d_cf"] == 0.0
    # think Yes rates: alpha 2/4 (pairs 2, 4), alpha' 2/4 (pairs 2, 3); nothink: alpha 2/4, alpha' 0/4
    assert m["d_group_think"] == 0.0 and m["d_group_nothink"] == 0.5 and m["delta_d_group"] == -0.5
    assert m["d_disp_b_nothink"] == pytest.approx(0.20) and m["d_disp_b_think"] == pytest.approx(0.10)
    assert m["d_disp_c_nothink"] == pytest.approx(0.10) and m["d_disp_c_think"] == pytest.approx(0.75)
    assert (m["c_alpha_up"], m["c_alpha_prime_up"], m["asym_c"], m["delta_c"]) == (0, 1, 1.0, -0.25)
    assert (m["d_alpha_up"], m["d_alpha_prime_up"], m["delta_d"]) == (1, 0, 0.25)
    assert m["parse_rate_think"] == pytest.approx(9 / 10) and m["parse_rate_think_alpha_prime"] == pytest.approx(4 / 5)
    assert m["parse_rate_nothink"] == 1.0
    assert m["mcnemar_log10_p"] == 0.0 and m["c_b_ratio"] == 1.0


def test_tables_have_the_paper_layout():
    m = contingency(records_from_cells(5, 2, 3, 1), n_boot=50)
    table = contingency_table(m)
    assert table.loc["nothink_no_flip", "think_no_flip"] == 5 and table.loc["nothink_no_flip", "think_flip"] == 3
    assert table.loc["nothink_flip", "think_no_flip"] == 2 and table.loc["nothink_flip", "think_flip"] == 1
    cells = cell_disparity_table(m)
    assert cells["n"].tolist() == [5, 2, 3, 1]
    assert cells.loc[cells["cell"] == "c", "d_disp_think"].item() == pytest.approx(0.8)


def test_missing_arm_is_a_clear_error():
    with pytest.raises(ValueError, match="no rows for arm"):
        contingency(hand_records(), treatment="cot")


def test_bootstrap_interval_is_reproducible_and_covers_the_mean():
    values = np.arange(100, dtype=float)
    first = bootstrap_ci(lambda i: values[i].mean(), 100, n_boot=500, seed=1)
    assert first == bootstrap_ci(lambda i: values[i].mean(), 100, n_boot=500, seed=1)
    assert first[0] < 49.5 < first[1] and first[1] - first[0] < 20


def test_answer_accounting_counts_pairs_dropped_per_cause_and_arm():
    """§6 compliance and the budget cut: both drop pairs like unparsed answers, counted per arm."""
    from fairaudit.analysis.pairs import answer_accounting

    rows = []
    for pair in (1, 2, 3):
        for arm in ("think", "nothink"):
            for side in ("alpha", "alpha_prime"):
                truncated = (pair, arm, side) == (2, "think", "alpha")
                noncompliant = (pair, arm, side) == (3, "nothink", "alpha_prime")
                rows.append({"pair_id": pair, "side": side, "arm": arm, "parsed_answer": None if truncated else "Yes",
                             "answer": None if truncated or noncompliant else "Yes", "p_yes": 0.5,
                             "truncated": truncated, "compliant": None if arm == "think" else not noncompliant})
    records = pd.DataFrame(rows).astype({"compliant": "boolean"})
    m = answer_accounting(records, "think", "nothink")
    assert m["n_dropped_truncated_think"] == 1 and m["n_dropped_truncated_nothink"] == 0
    assert m["n_dropped_noncompliant_nothink"] == 1 and m["compliance_rate_nothink"] == pytest.approx(5 / 6)
    assert "compliance_rate_think" not in m and m["parse_rate_think"] == pytest.approx(5 / 6)
    assert m["parse_rate_nothink"] == 1.0
    assert contingency(records, n_boot=0)["n_pairs"] == 1


def test_ratio_interval_for_b2_c20_of_1000_pairs_is_unbounded_above_and_reports_its_n():
    """Resamples with no resolved (b) pair stay in as +inf; 13.7% of them exceed the 2.5% upper tail."""
    m = contingency(records_from_cells(975, 2, 20, 3), n_boot=2000, seed=0)
    assert (m["cell_b"], m["cell_c"], m["c_b_ratio"]) == (2, 20, 10.0)
    assert m["c_b_ratio_ci_high"] == math.inf and 2.5 < m["c_b_ratio_ci_low"] < 5.0
    assert m["c_b_ratio_exact_ci_high"] == pytest.approx(88.2412, rel=1e-5)   # Clopper-Pearson on 20 of 22
    assert m["c_b_ratio_exact_ci_low"] == pytest.approx(2.4292, rel=1e-4)
    assert (m["c_b_ratio_ci_n"], m["c_b_ratio_ci_few"]) == (22, 0.0)
    assert (m["delta_d_cf_ci_n"], m["delta_d_cf_ci_few"]) == (1000, 0.0)
    from fairaudit.tracking.content import finite_metrics, json_metrics, unbounded_note
    assert "c_b_ratio_ci_high" not in finite_metrics(m) and json_metrics(m)["c_b_ratio_ci_high"] is None
    assert unbounded_note(m) == "c_b_ratio_ci_high=+inf (unbounded; not logged as metrics)"   # the run's tag
    assert unbounded_note({"c_b_ratio": 2.0, "x": math.nan}) is None


def test_an_interval_over_fewer_than_ten_units_is_flagged():
    m = contingency(records_from_cells(5, 1, 3, 0), n_boot=200)
    assert (m["c_b_ratio_ci_n"], m["c_b_ratio_ci_few"], m["delta_d_cf_ci_few"]) == (4, 1.0, 1.0)
