"""Position-bias probe, model-free parts: prompts, extraction regexes, CCP, PBS, statistics, truncation, figures."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats

from fairaudit.analysis.permutation import stratified_exact_test
from fairaudit.analysis.position import length_bins, monotonic_profile, pbs, pbs_wilcoxon, position
from fairaudit.analysis.position_figures import pbs_by_length_figure, pbs_length_figure, truncation_figure
from fairaudit.analysis.position_truncation import (
    OFFSETS,
    _changes,
    ccp_chi_square,
    ccp_cluster_test,
    extraction_by_side,
    extraction_warning,
    truncation,
    truncation_cuts,
)
from fairaudit.analysis.stats import clustered_t_interval, fisher_z_interval, partial_correlation
from fairaudit.errors import AuditError
from fairaudit.probes.position_report import _truncation_sections
from fairaudit.prompts.mcq import (
    ANSWER_PATTERNS,
    TRAJECTORY_PATTERNS,
    commitment_change_point,
    effective_switching,
    extract_answer,
    mcq_messages,
    trajectory,
)

SQRT_075 = math.sqrt(0.75)


# --- A.1 prompts -------------------------------------------------------------------------

def test_direct_prompt_is_verbatim():
    system, user = mcq_messages("direct", "Q?", "A. x\nB. y\nC. z\nD. w")
    assert system == {"role": "system", "content": (
        "You are a helpful assistant. Answer the multiple-choice question with ONLY the letter of the correct "
        "answer in this exact format:\nThe answer is (X).\nDo NOT explain your reasoning. Do NOT show any work.")}
    assert user == {"role": "user", "content": "Q?\n\nA. x\nB. y\nC. z\nD. w"}


def test_cot_and_reason_differ_only_in_the_concise_instruction():
    cot, reason = mcq_messages("cot", "Q?", "OPTS"), mcq_messages("reason", "Q?", "OPTS")
    assert cot[1] == reason[1] == {"role": "user",
                                   "content": "Q?\n\nOPTS\n\nThink step by step, then give your final answer."}
    assert cot[0]["content"].replace(" Keep your reasoning concise.", "") == reason[0]["content"]
    assert reason[0]["content"].endswith("clearly state your final answer as: The answer is (X).")


def test_unknown_arm_lists_choices():
    with pytest.raises(AuditError, match=r"'think'.*\['direct', 'cot', 'reason'\]"):
        mcq_messages("think", "Q?", "OPTS")


# --- A.2 final-answer cascade ---------------------------------------------------------------

@pytest.mark.parametrize("index, text, letter", [
    (0, "The answer is B", "B"),
    (0, "so the answer is (C).", "C"),
    (0, "The answer is\uff1aD", "D"),
    (1, "Answer: A", "A"),
    (1, "**Answer:** C", "C"),
    (1, "**Answer**: (D)", "D"),
    (1, "Answer\uff1aB", "B"),
    (2, "Final: \\boxed{C}", "C"),
    (3, "After all that, my pick is\nD", "D"),
    (3, "...\nB.\n", "B"),
])
def test_answer_pattern_matches_its_documented_example(index, text, letter):
    assert ANSWER_PATTERNS[index].findall(text)[-1] == letter
    assert extract_answer(text) == letter


def test_cascade_order_last_match_and_no_match():
    assert extract_answer("\\boxed{A} ... The answer is (B)") == "B"  # pattern 1 beats pattern 3
    assert extract_answer("the answer is B? No. The answer is (C).") == "C"  # last match of the winning pattern
    assert extract_answer("The answer is E, or maybe a cat") is None


# --- A.3 trajectory, CCP, switching ---------------------------------------------------------

@pytest.mark.parametrize("index, text, letter", [
    (0, "Option B is tempting", "B"),
    (0, "OPTION c is tempting; option D", "D"),
    (1, "the answer is C", "C"),
    (1, "Choice\uff1a(A)", "A"),
    (1, "I select D", "D"),
    (2, "maybe (B) fits", "B"),
    (3, "C. Paris is wrong", "C"),
    (4, "A is correct", "A"),
    (4, "D seems right", "D"),
    (4, "B looks better", "B"),
    (4, "C appears more plausible", "C"),
    (5, "I choose B", "B"),
    (5, "pick (C)", "C"),
    (5, "let's go with D", "D"),
    (5, "leaning towards A", "A"),
    (6, "So it\u2019s C", "C"),
    (6, "so it's B", "B"),
    (6, "So the answer is D", "D"),
    (7, "I think the best is A", "A"),
    (7, "I believe C", "C"),
    (8, "\\boxed{D}", "D"),
])
@pytest.mark.parametrize("case", ["insensitive", "strict"])
def test_trajectory_pattern_matches_its_documented_example(case, index, text, letter):
    assert TRAJECTORY_PATTERNS[case][index].findall(text)[-1] == letter
    assert TRAJECTORY_PATTERNS["insensitive"][index].findall(text.lower())[-1] == letter.lower()


def test_a3_scans_case_insensitively_by_default_and_strict_keeps_letters_upper_case():
    """A.3: "(case-insensitive)": "option b" and "(c)" are mentions, and so is the article "a" after "pick"."""
    text = "a. I think option b, or (c), would pick a dog"
    assert [(m.letter, m.char) for m in trajectory(text)] == [("A", 0), ("B", 18), ("C", 25), ("A", 40)]
    assert trajectory(text, "strict") == []
    assert trajectory(text.upper(), "strict") == trajectory(text)
    with pytest.raises(AuditError, match="mention_case 'upper'"):
        trajectory(text, "upper")


def test_lower_case_mentions_move_ccp():
    """The insensitive reading adds mentions the strict one ignores; here a late "so a" pushes CCP to the end."""
    text = "Option B looks right.\nThe answer is (B), so a fine choice."
    strict, insensitive = trajectory(text, "strict"), trajectory(text)
    assert commitment_change_point(strict, "B") == 0.0
    assert commitment_change_point(insensitive, "B") == 1.0


def test_trajectory_is_ordered_and_deduplicated_by_position():
    text = "I think A here.\nThen option C looks odd.\nSo the answer is (B).\nIndeed (B)."
    mentions = trajectory(text)
    assert [(m.letter, m.char) for m in mentions] == [("A", 8), ("C", 28), ("B", 59), ("B", 71)]
    assert mentions[2].position == pytest.approx(59 / 74)


def test_ccp_is_the_first_mention_after_the_last_non_final_one():
    mentions = trajectory("I think A here.\nThen option C looks odd.\nSo the answer is (B).\nIndeed (B).")
    assert commitment_change_point(mentions, "B") == pytest.approx(59 / 74)
    assert effective_switching(mentions) == pytest.approx(2 / 4)  # A->C, C->B over 4 mentions


def test_ccp_edge_cases():
    all_final = trajectory("Option B. So it's B. The answer is (B).")
    assert len(all_final) == 3 and commitment_change_point(all_final, "B") == 0.0
    assert effective_switching(all_final) == 0.0
    assert commitment_change_point(trajectory("Option B first.\nThe answer is (B)."), "C") == 1.0  # never settles
    assert math.isnan(commitment_change_point(all_final, None))
    assert math.isnan(commitment_change_point([], "B")) and math.isnan(effective_switching([]))


# --- PBS and the position() report ---------------------------------------------------------

def test_pbs_of_hand_distributions():
    assert pbs([1, 0, 0, 0]) == pytest.approx(SQRT_075)
    assert pbs([0.25] * 4) == 0.0
    assert pbs([0.5, 0.5, 0, 0]) == pytest.approx(0.5)
    assert pbs([0.75, 0.25, 0, 0]) == pytest.approx(math.sqrt(0.375))


def _records(arm: str, answers: dict[int, list], gold_k: dict[int, int], lengths: dict[int, float]) -> pd.DataFrame:
    """MCQ records: answers[q][s] is the position answered under permutation s (None: not extracted)."""
    rows = []
    for q, per_perm in answers.items():
        for s, answer in enumerate(per_perm):
            text = "no answer" if answer is None else f"Option A first.\nThe answer is ({'ABCD'[answer]})."
            rows.append({"arm": arm, "question_id": q, "permutation": s, "gold_position": (gold_k[q] + s) % 4,
                         "answer_position": answer, "length_chars": lengths[q], "text": text})
    return pd.DataFrame(rows)


HAND = _records(
    "reason",
    answers={0: [0, 0, 0, 0], 1: [0, 1, 2, 3], 2: [0, 0, 1, 1], 3: [2, None, 2, 2]},
    gold_k={0: 1, 1: 0, 2: 0, 3: 2},
    lengths={0: 900.0, 1: 100.0, 2: 500.0, 3: 300.0},
)


def test_position_metrics_on_a_hand_example():
    out = position(HAND)
    m = out["metrics"]
    assert m["n_records_reason"] == 16 and m["n_questions_reason"] == 4 and m["n_questions_complete_reason"] == 3
    assert m["extraction_rate_reason"] == 15 / 16
    assert m["accuracy_reason"] == pytest.approx(7 / 15)  # q0 at s=3, q1 always, q2 at s=0, q3 at s=0
    assert m["pbs_reason"] == pytest.approx((SQRT_075 + 0.0 + 0.5) / 3)
    assert m["answer_share_a_reason"] == pytest.approx(7 / 15) and m["preferred_position_reason"] == 0
    # "Option A first." then the final answer: CCP 0 when the answer is A, else the final mention.
    texts = HAND.dropna(subset=["answer_position"])["text"]
    expected_ccp = [0.0 if "(A)" in t else t.index("(") / len(t) + 1 / len(t) for t in texts]
    assert m["ccp_reason"] == pytest.approx(np.mean(expected_ccp))
    assert m["eff_sw_reason"] == pytest.approx(np.mean([0.0 if "(A)" in t else 0.5 for t in texts]))
    assert m["length_chars_reason"] == pytest.approx(450.0)
    q = out["tables"]["per_question"].set_index("question_id")
    assert q.loc[0, "pbs"] == pytest.approx(SQRT_075) and q.loc[0, "accuracy"] == 0.25
    assert q.loc[1, "pbs"] == 0.0 and q.loc[1, "accuracy"] == 1.0
    assert math.isnan(q.loc[3, "pbs"]) and q.loc[3, "n_extracted"] == 3 and q.loc[3, "share_c"] == 1.0
    summary = out["tables"]["position_summary"]
    assert summary.loc[0, "arm"] == "reason" and summary.loc[0, "pbs"] == m["pbs_reason"]


def test_precomputed_ccp_is_used_as_given():
    m = position(HAND.assign(ccp=0.4, eff_sw=0.1).drop(columns="text"))["metrics"]
    assert m["ccp_reason"] == pytest.approx(0.4) and m["eff_sw_reason"] == pytest.approx(0.1)


def test_length_quartiles_and_monotonicity():
    questions = pd.DataFrame({"length_chars": [800, 100, 200, 700, 300, 600, 400, 500],
                              "pbs": [0.8, 0.1, 0.1, 0.7, 0.3, 0.5, 0.4, 0.5]})
    bins = length_bins(questions, 4)
    assert bins["n"].tolist() == [2, 2, 2, 2]
    assert bins["pbs_mean"].tolist() == pytest.approx([0.1, 0.35, 0.5, 0.75])
    assert bins["length_min"].tolist() == [100, 300, 500, 700]
    assert bins["pbs_se"].iloc[1] == pytest.approx(0.05)
    assert monotonic_profile(bins["pbs_mean"]) == pytest.approx({"monotonic": 1.0, "first_violation": 0.0,
                                                                 "gradient": 0.65})
    assert monotonic_profile([0.1, 0.3, 0.3, 0.2, 0.5]) == pytest.approx({"monotonic": 0.0, "first_violation": 3.0,
                                                                          "gradient": 0.4})
    tied = length_bins(questions.assign(length_chars=1.0), 4)
    assert tied["n"].tolist() == [2, 2, 2, 2]
    assert length_bins(questions.head(2), 3).empty


def test_position_reports_quartile_metrics():
    answers = {q: [0, 0, 0, 0] if q >= 6 else [0, 1, 2, 3] if q < 2 else [0, 0, 1, 1] for q in range(8)}
    records = _records("cot", answers, gold_k={q: 0 for q in range(8)}, lengths={q: 100.0 * (q + 1) for q in range(8)})
    m = position(records)["metrics"]
    assert [m[f"pbs_q{i}_cot"] for i in range(1, 5)] == pytest.approx([0.0, 0.5, 0.5, SQRT_075])
    assert m["pbs_monotonic_k4_cot"] == 0.0 and m["pbs_first_violation_k4_cot"] == 3.0
    assert m["pbs_gradient_k4_cot"] == pytest.approx(SQRT_075)
    assert m["pbs_monotonic_k3_cot"] == 1.0


# --- statistics ---------------------------------------------------------------------------------

def test_partial_correlation_matches_recursive_formula_and_ols_t_test():
    rng = np.random.default_rng(7)
    z = rng.normal(size=60)
    x = 2 * z + rng.normal(size=60)
    y = 0.5 * x - z + rng.normal(size=60)
    r, p, log10_p = partial_correlation(x, y, z)
    rxy, rxz, ryz = np.corrcoef([x, y, z])[[0, 0, 1], [1, 2, 2]]
    assert r == pytest.approx((rxy - rxz * ryz) / math.sqrt((1 - rxz**2) * (1 - ryz**2)))
    ols = sm.OLS(y, sm.add_constant(np.column_stack([x, z]))).fit()
    assert p == pytest.approx(ols.pvalues[1])  # t-test of x in y ~ 1 + x + z: same statistic, n - 3 df
    assert log10_p == pytest.approx(math.log10(ols.pvalues[1]))


def test_partial_correlation_degenerate_inputs():
    assert all(math.isnan(v) for v in partial_correlation([1, 2, 3], [1, 2, 4], [0, 1, 0]))
    assert all(math.isnan(v) for v in partial_correlation([1, 1, 1, 1, 1], [1, 2, 3, 4, 6], [0, 1, 0, 1, 1]))


def test_pbs_wilcoxon_against_scipy_and_exact_value():
    a = _records("reason", {0: [0, 0, 0, 0], 1: [0, 0, 0, 1], 2: [0, 0, 1, 1], 3: [0, 0, 1, 2],
                            4: [0, 0, 0, 0], 5: [0, 1, 2, 3], 6: [0, 0, 0, 0]},
                 gold_k={q: 0 for q in range(7)}, lengths={q: 1.0 for q in range(7)})
    b = _records("cot", {0: [0, 1, 2, 3], 1: [0, 1, 2, 3], 2: [0, 1, 2, 3], 3: [0, 1, 2, 3],
                         4: [0, 0, 1, 2], 5: [0, 1, 2, 3], 6: [0, None, 0, 0]},
                 gold_k={q: 0 for q in range(7)}, lengths={q: 1.0 for q in range(7)})
    out = pbs_wilcoxon(a, b)
    diffs = [SQRT_075, math.sqrt(0.375), 0.5, math.sqrt(0.125), SQRT_075 - math.sqrt(0.125), 0.0]  # q6 unpaired
    assert out["pbs_wilcoxon_n"] == 6
    assert out["pbs_wilcoxon_mean_diff"] == pytest.approx(np.mean(diffs))
    expected = stats.wilcoxon(diffs, alternative="greater")
    assert out["pbs_wilcoxon_statistic"] == expected.statistic == 15.0
    assert out["pbs_wilcoxon_p"] == pytest.approx(expected.pvalue) and out["pbs_wilcoxon_p"] == pytest.approx(1 / 32)
    assert pbs_wilcoxon(b, a)["pbs_wilcoxon_p"] == pytest.approx(1.0)
    assert math.isnan(pbs_wilcoxon(a, a)["pbs_wilcoxon_p"])
    # one zero difference (q5) among the six pairs: each zero method gives scipy's statistic and p
    assert out["pbs_wilcoxon_zeros"] == 1
    for method in ("wilcox", "pratt", "zsplit"):
        test = pbs_wilcoxon(a, b, zero_method=method)
        expected = stats.wilcoxon(diffs, alternative="greater", zero_method=method)
        assert (test["pbs_wilcoxon_statistic"], test["pbs_wilcoxon_p"]) == pytest.approx((expected.statistic,
                                                                                          expected.pvalue))
    with pytest.raises(ValueError, match="zero_method must be one of"):
        pbs_wilcoxon(a, b, zero_method="drop")


def test_wilcoxon_zero_methods_by_hand():
    """Differences 0, 1, -2, 3: wilcox drops the zero (ranks 1, 2, 3; T+ = 4), pratt ranks it first and drops
    its rank (ranks 2, 3, 4; T+ = 6), zsplit gives half its rank to each sign (T+ = 6.5); one-sided exact p = 3/8."""
    for method, statistic in (("wilcox", 4.0), ("pratt", 6.0), ("zsplit", 6.5)):
        result = stats.wilcoxon([0, 1, -2, 3], alternative="greater", zero_method=method)
        assert (result.statistic, result.pvalue) == (statistic, pytest.approx(3 / 8))


def test_position_keeps_both_partial_correlations_and_names_the_chosen_one():
    rng = np.random.default_rng(4)
    answers = {q: list(rng.integers(0, 4, 4)) for q in range(12)}
    records = _records("reason", answers, gold_k={q: 0 for q in range(12)},
                       lengths={q: float(rng.integers(10, 2000)) for q in range(12)})
    pearson = position(records)["metrics"]
    spearman = position(records, partial_corr="spearman")["metrics"]
    assert pearson["partial_rho_length_pbs_reason"] == pearson["partial_rho_length_pbs_pearson_reason"]
    assert spearman["partial_rho_length_pbs_reason"] == spearman["partial_rho_length_pbs_spearman_reason"]
    assert spearman["partial_rho_length_pbs_p_reason"] == spearman["partial_rho_length_pbs_spearman_p_reason"]
    assert pearson["partial_rho_length_pbs_spearman_reason"] == spearman["partial_rho_length_pbs_spearman_reason"]


def test_clustered_t_interval_by_hand():
    """[0.1, 0.3, 0.5, 0.7]: mean 0.4, SD sqrt(0.2 / 3) = 0.25820, t_{0.975, 3} = 3.18245, half 0.41085."""
    assert clustered_t_interval([0.1, 0.3, 0.5, 0.7]) == pytest.approx((0.4 - 0.41085, 0.4 + 0.41085), abs=1e-5)
    assert clustered_t_interval([0.1, 0.3, 0.5, 0.7], bounds=(0.0, 1.0)) == pytest.approx((0.0, 0.81085), abs=1e-5)
    # totals [1, 2, 0] over sizes [2, 2, 1]: mean 3/5, deviations (totals - 0.6 sizes) / (5/3) = [-0.12, 0.48, -0.36],
    # SD sqrt(0.3744 / 2) = 0.43267, se 0.24980, t_{0.975, 2} = 4.30265: half 1.07480
    assert clustered_t_interval([1, 2, 0], [2, 2, 1]) == pytest.approx((0.6 - 1.07480, 0.6 + 1.07480), abs=1e-5)
    assert clustered_t_interval([2, 4, 7], [2, 2, 2]) == pytest.approx(clustered_t_interval([1, 2, 3.5]))
    assert all(math.isnan(end) for end in clustered_t_interval([0.5]))


def test_fisher_z_interval_by_hand():
    """r = 0.3 over 60 questions, one controlled: atanh 0.3 = 0.30952, 1.95996 / sqrt(60 - 4) = 0.26191, so
    tanh(0.04761) = 0.04757 and tanh(0.57143) = 0.51641; Spearman's variance 1.06: half 0.26965, tanh(0.03987) =
    0.03984 and tanh(0.57917) = 0.52206."""
    assert fisher_z_interval(0.3, 60, controlled=1) == pytest.approx((0.04757, 0.51641), abs=1e-5)
    assert fisher_z_interval(0.3, 60, controlled=1, variance=1.06) == pytest.approx((0.03984, 0.52206), abs=1e-5)
    assert fisher_z_interval(-1.0, 10, controlled=1) == (-1.0, -1.0)
    assert all(math.isnan(end) for end in (*fisher_z_interval(0.3, 4, 1), *fisher_z_interval(math.nan, 60, 1)))


def test_position_logs_an_interval_beside_each_mean_and_partial_correlation():
    rng = np.random.default_rng(4)
    answers = {q: list(rng.integers(0, 4, 4)) for q in range(12)}
    records = _records("reason", answers, gold_k={q: 0 for q in range(12)},
                       lengths={q: 100.0 * (q + 1) for q in range(12)})
    out = position(records, partial_corr="spearman")
    m, questions = out["metrics"], out["tables"]["per_question"]
    assert (m["pbs_reason_ci_low"], m["pbs_reason_ci_high"]) == pytest.approx(
        clustered_t_interval(questions["pbs"], bounds=(0.0, 1.0)))
    assert (m["pbs_reason_ci_n"], m["pbs_reason_ci_few"]) == (12, 0.0)
    shortest = questions["pbs"].iloc[:3]   # quartile 1: questions 0, 1, 2 (lengths 100 to 300)
    assert (m["pbs_q1_reason_ci_low"], m["pbs_q1_reason_ci_high"]) == pytest.approx(
        clustered_t_interval(shortest, bounds=(0.0, 1.0)))
    assert (m["pbs_q1_reason_ci_n"], m["pbs_q1_reason_ci_few"]) == (3, 1.0)
    for method, variance in (("pearson", 1.0), ("spearman", 1.06)):
        name = f"partial_rho_length_pbs_{method}_reason"
        assert (m[f"{name}_ci_low"], m[f"{name}_ci_high"]) == pytest.approx(
            fisher_z_interval(m[name], 12, controlled=1, variance=variance))
    assert m["partial_rho_length_pbs_reason_ci_low"] == m["partial_rho_length_pbs_spearman_reason_ci_low"]
    assert m["partial_rho_length_pbs_reason_ci_n"] == 12 and m["ccp_reason_ci_n"] == 12
    summary = out["tables"]["position_summary"].iloc[0]
    assert summary["pbs_ci_low"] == m["pbs_reason_ci_low"]


def test_record_means_resample_whole_questions():
    """HAND's accuracy: 1, 4, 1 and 1 correct of 4, 4, 4 and 3 extracted (7/15); deviations (correct - 7/15
    extracted) / 3.75 = [-0.23111, 0.56889, -0.23111, -0.10667], SD 0.38377, half 3.18245 x 0.38377 / 2 = 0.61066:
    [-0.14399, 1.07732], cut to [0, 1]. CCP over the 4 questions with one; a question without any has none."""
    m = position(HAND)["metrics"]
    assert (m["accuracy_reason_ci_low"], m["accuracy_reason_ci_high"], m["accuracy_reason_ci_n"]) == (0.0, 1.0, 4)
    assert m["ccp_reason_ci_n"] == m["eff_sw_reason_ci_n"] == 4
    silent = HAND.assign(text=np.where(HAND["question_id"] == 1, "no letter here", HAND["text"]))
    assert position(silent)["metrics"]["ccp_reason_ci_n"] == 3


# --- truncation intervention ----------------------------------------------------------------------

def test_truncation_cuts():
    text = "x" * 1000
    assert truncation_cuts(text, 0.6) == [(-0.15, 0.45, 450), (-0.05, 0.55, 550), (0.05, 0.65, 650), (0.15, 0.75, 750)]
    assert truncation_cuts(text, 0.1) == [(-0.05, 0.05, 50), (0.05, 0.15, 150), (0.15, 0.25, 250)]
    assert [c.offset for c in truncation_cuts(text, 0.0)] == [0.05, 0.15]
    assert [c.offset for c in truncation_cuts(text, 0.9)] == [-0.15, -0.05, 0.05]
    assert truncation_cuts(text, math.nan) == [] and OFFSETS == (-0.15, -0.05, 0.05, 0.15)


CONTINUATIONS = pd.DataFrame(
    [(-0.15, 0.10, 2, 2), (-0.15, 0.10, 2, 0), (-0.05, 0.20, 2, 1), (-0.05, 0.20, 2, None),
     (0.05, 0.30, 2, 2), (0.05, 0.30, 2, 2), (0.15, 0.95, 2, 0), (0.15, 0.95, 2, 0)],
    columns=["offset", "position", "answer_position", "new_answer_position"],
).assign(question_id=1, permutation=0, sample=[0, 1, 0, 1, 0, 1, 0, 1], preferred_position=0)


def test_truncation_metrics_on_a_hand_example():
    out = truncation(CONTINUATIONS)
    m = out["metrics"]
    assert m["trunc_n_continuations"] == 8 and m["trunc_n"] == 7 and m["trunc_extraction_rate"] == 7 / 8
    assert m["trunc_change_rate"] == pytest.approx(4 / 7)
    assert m["trunc_directional_shift"] == pytest.approx(3 / 4)
    assert m["trunc_change_rate_before_ccp"] == pytest.approx(2 / 3)
    assert m["trunc_change_rate_after_ccp"] == pytest.approx(2 / 4)
    by_position = out["tables"]["truncation_by_position"]
    assert by_position["bucket"].tolist() == ["0-0.3", "0.3-0.5", "0.5-0.7", "0.7-0.9", "0.9-1"]
    assert by_position["n"].tolist() == [3, 2, 0, 0, 2]
    assert by_position["change_rate"].tolist()[:2] == pytest.approx([2 / 3, 0.0])
    assert by_position["directional_shift"].iloc[0] == 0.5 and by_position["directional_shift"].iloc[4] == 1.0
    assert by_position["directional_shift"].iloc[1:4].isna().all()
    by_offset = out["tables"]["truncation_by_offset"].set_index("offset")
    assert by_offset["n_changed"].tolist() == [1, 1, 0, 2]


def test_truncation_reports_the_test_within_questions_beside_the_chi_square():
    two = pd.concat([CONTINUATIONS, CONTINUATIONS.assign(question_id=2, new_answer_position=2)], ignore_index=True)
    m = truncation(two)["metrics"]
    rows = _changes(two)
    after, before = rows[rows["offset"] > 0], rows[rows["offset"] < 0]
    assert m["trunc_ccp_rate_diff"] == pytest.approx(after["changed"].mean() - before["changed"].mean())
    # question 1: after 2/4 - before 2/3; question 2 (new answer 2 = its answer): no change either side
    assert m["trunc_ccp_question_diff"] == pytest.approx(((2 / 4 - 2 / 3) + 0.0) / 2)
    assert (m["trunc_ccp_perm_n_questions"], m["trunc_ccp_perm_n_one_sided"], m["trunc_ccp_perm_exact"]) == (2, 0, 1.0)
    # the test relabels question 1's cuts (rates 1/2 and 1/1 before, 0/2 and 2/2 after): 2 of (1/2, 1, 0, 1) sum to
    # 1/2, 1 (twice), 3/2 (twice) or 2, so T = 1 gives p = min(1, 2 x 3/6) = 1; question 2 changes nowhere
    assert m["trunc_ccp_perm_p"] == 1.0 and m["trunc_ccp_perm_log10_p"] == 0.0
    # Mantel-Haenszel over the cuts' rates: question 1 (2 cuts a side, weight 2 x 2 / 4) after 1/2 - before 3/4;
    # question 2 (the same weight) 0
    assert m["trunc_ccp_mh_diff"] == pytest.approx((1 / 2 - 3 / 4) / 2)
    assert m["trunc_ccp_chi2_log10_p"] == pytest.approx(math.log10(m["trunc_ccp_chi2_p"]))


def test_a_cut_is_one_runs_trajectory_at_one_offset_and_the_report_keeps_runs_apart():
    """Question 1 in runs a and b, cut at -0.05 and +0.05 with 2 continuations each, changing 0 and 2 times in a,
    1 and 2 in b: four cuts (0, 2, 1, 2), two after. 2 of them sum to 4 in 1 of 6 ways, so T = 4 gives p = 1/3;
    merged across runs the two cuts (1, 4) would give p = 1."""
    rows = pd.DataFrame({"question_id": 1, "run_id": list("aaaabbbb"), "offset": [-0.05, -0.05, 0.05, 0.05] * 2,
                         "changed": [0, 0, 1, 1, 1, 0, 1, 1]})
    assert ccp_cluster_test(rows)["trunc_ccp_perm_p"] == pytest.approx(1 / 3)
    assert ccp_cluster_test(rows.drop(columns="run_id"))["trunc_ccp_perm_p"] == 1.0
    frames = {run: CONTINUATIONS.assign(new_answer_position=answers, arm="cot", dataset="mmlu", model="m")
              for run, answers in (("a", [2, 2, 2, 2, 0, 0, 0, 0]), ("b", [2, 0, 2, 2, 0, 0, 0, 2]))}
    runs = pd.DataFrame({"run_id": ["a", "b"], "model": "m", "dataset": "mmlu", "trunc_n_continuations_cot": 8})
    (section,), figures = _truncation_sections(runs, lambda ids, name: {run: frames[run] for run in ids})
    shown = section.table.iloc[0]
    expected = ccp_cluster_test(_changes(pd.concat([f.assign(run_id=r) for r, f in frames.items()])))
    assert shown["trunc_ccp_perm_p"] == expected["trunc_ccp_perm_p"] and "p001_fig3_truncation" in figures
    assert shown["trunc_ccp_mh_diff"] == expected["trunc_ccp_mh_diff"] and shown["trunc_n"] == 16


def _kept(cuts: list[tuple[float, int, int]], questions: int) -> pd.DataFrame:
    """Continuations of `questions` questions, each cut (offset, continuations kept, of them changed)."""
    return pd.DataFrame([(q, offset, i < k) for q in range(questions) for offset, n, k in cuts for i in range(n)],
                        columns=["question_id", "offset", "changed"])


def test_every_rate_a_third_on_both_sides_is_no_effect_however_many_continuations_each_side_kept():
    """100 questions, each cut changing 1 in 3: before the CCP two cuts kept 6 continuations (2 changed), after it
    two kept 3 (1 changed). The count per cut said the after side changes less (p ~ 1e-23); the rates are equal."""
    rows = _kept([(-0.15, 6, 2), (-0.05, 6, 2), (0.05, 3, 1), (0.15, 3, 1)], 100)
    out = ccp_cluster_test(rows)
    assert (out["trunc_ccp_perm_p"], out["trunc_ccp_mh_diff"], out["trunc_ccp_rate_diff"]) == (1.0, 0.0, 0.0)
    counts = stratified_exact_test(rows["question_id"], rows["offset"] > 0, rows["changed"].astype(int), rows["offset"])
    assert counts["p"] < 1e-20


def test_the_rate_test_is_every_relabeling_of_whole_cuts_by_brute_force():
    """Two questions whose cuts kept 1, 2 or 3 continuations: T, the rates summed after the CCP, against all
    relabelings of each question's cuts keeping how many it has on each side, summed in exact fractions."""
    cuts = {0: [(-0.15, 3, 1), (-0.05, 2, 2), (0.05, 1, 0), (0.15, 3, 3)],
            1: [(-0.05, 2, 1), (0.05, 3, 0), (0.15, 1, 1)]}
    rows = pd.concat([_kept(c, 1).assign(question_id=q) for q, c in cuts.items()], ignore_index=True)
    strata = [([Fraction(k, n) for _, n, k in c], sum(offset > 0 for offset, _, _ in c)) for c in cuts.values()]
    totals = [sum(parts) for parts in itertools.product(
        *[[sum(pick) for pick in itertools.combinations(rates, picked)] for rates, picked in strata])]
    t = Fraction(0, 1) + 1 + 0 + 1   # after: 0/1 and 3/3 in question 0, 0/3 and 1/1 in question 1
    brute = min(1.0, 2 * min(np.mean([x <= t for x in totals]), np.mean([x >= t for x in totals])))
    out = ccp_cluster_test(rows)
    assert out["trunc_ccp_perm_p"] == pytest.approx(brute, rel=1e-12) and out["trunc_ccp_perm_exact"] == 1.0
    # Mantel-Haenszel over the cuts' rates: q0 (2 after, 2 before) weight 1, q1 (2 after, 1 before) weight 2/3
    diffs = [(Fraction(0) + 1) / 2 - (Fraction(1, 3) + 1) / 2, (Fraction(0) + 1) / 2 - Fraction(1, 2)]
    assert out["trunc_ccp_mh_diff"] == pytest.approx(float(diffs[0] * 1 + diffs[1] * Fraction(2, 3)) / (5 / 3))


def test_with_every_cut_keeping_as_many_the_rate_test_is_the_count_test():
    rng = np.random.default_rng(4)
    rows = pd.DataFrame({"question_id": np.repeat(np.arange(30), 12), "offset": np.tile(np.repeat(OFFSETS, 3), 30),
                         "changed": rng.random(360) < 0.3})
    counts = stratified_exact_test(rows["question_id"], rows["offset"] > 0, rows["changed"].astype(int), rows["offset"])
    out = ccp_cluster_test(rows)
    assert out["trunc_ccp_perm_p"] == pytest.approx(counts["p"], rel=1e-12) and out["trunc_ccp_perm_p"] < 1
    assert out["trunc_ccp_mh_diff"] == pytest.approx(counts["mh_diff"], rel=1e-12)   # the same effect, per continuation


def test_the_extraction_rate_per_side_is_reported_with_a_warning_when_the_sides_differ():
    kept = pd.DataFrame([(q, offset, s, 2, 2 if offset < 0 or s == 0 else None) for q in range(30)
                         for offset in OFFSETS for s in range(3)],
                        columns=["question_id", "offset", "sample", "answer_position", "new_answer_position"])
    m = extraction_by_side(kept)
    assert (m["trunc_extraction_rate_before_ccp"], m["trunc_extraction_rate_after_ccp"]) == (1.0, pytest.approx(1 / 3))
    assert m["trunc_extraction_diff_log10_p"] < -10 and m["trunc_extraction_diff_p"] < 1e-10
    line = extraction_warning(m)
    assert line.startswith("truncation: answers were extracted from 100.0% of the continuations before the CCP and "
                           "33.3% after (exact p = ") and "read the exact test" in line
    same = extraction_by_side(kept.assign(new_answer_position=2))
    assert same["trunc_extraction_diff_p"] == 1.0 and extraction_warning(same) is None
    assert truncation(kept.assign(position=0.5, permutation=0, preferred_position=0))["metrics"].items() >= m.items()


def test_before_after_ccp_chi_square_by_hand():
    rows = pd.DataFrame({"offset": [-0.05] * 40 + [0.05] * 40,
                         "changed": [True] * 30 + [False] * 10 + [True] * 10 + [False] * 30})
    chi2, p, log10_p = ccp_chi_square(rows)
    assert chi2 == pytest.approx(4 * (10 - 0.5) ** 2 / 20)  # Yates-corrected, all expected counts 20
    assert p == pytest.approx(stats.chi2.sf(18.05, 1)) and log10_p == pytest.approx(math.log10(p))
    assert all(math.isnan(v) for v in ccp_chi_square(rows.assign(changed=False)))


def test_a_tiny_chi_square_p_is_kept_and_one_below_the_smallest_double_lives_in_its_log10():
    tiny = pd.DataFrame({"offset": [-0.05] * 400 + [0.05] * 400,
                         "changed": [True] * 300 + [False] * 400 + [True] * 100})
    chi2, p, log10_p = ccp_chi_square(tiny)
    assert p == pytest.approx(stats.chi2.sf(chi2, 1), rel=1e-9) and 1e-300 < p < 1e-40   # 3.2e-14 was logged as 0
    huge = pd.DataFrame({"offset": [-0.05] * 40000 + [0.05] * 40000,
                         "changed": [True] * 30000 + [False] * 40000 + [True] * 10000})
    chi2, p, log10_p = ccp_chi_square(huge)
    assert stats.chi2.sf(chi2, 1) == 0.0 and math.isnan(p)           # scipy's p underflows; ours is NaN, not 0
    assert log10_p == pytest.approx(stats.chi2.logsf(chi2, 1) / math.log(10)) and log10_p < -308


@pytest.mark.parametrize("dtype", [bool, int, float, "Int64", "boolean"])
def test_a_0_1_column_reads_the_same_whatever_its_dtype(dtype):
    rows = pd.DataFrame({"question_id": np.tile(np.arange(20), 4), "offset": np.repeat([-0.15, -0.05, 0.05, 0.15], 20),
                         "changed": (np.arange(80) % 3 == 0) | (np.arange(80) >= 60)})
    typed = rows.assign(changed=rows["changed"].astype(dtype))
    assert ccp_chi_square(typed) == ccp_chi_square(rows) and not math.isnan(ccp_chi_square(typed)[0])
    assert ccp_cluster_test(typed) == ccp_cluster_test(rows)


@pytest.mark.parametrize("values,message", [
    ([0, 2] * 40, "changed: expected True/False or 1/0, got 2"),
    (["no", "yes"] * 40, "changed: expected True/False or 1/0, got dtype"),
    (pd.array([1, None] * 40, dtype="Int64"), "changed: 40 of 80 values are missing")])
def test_anything_else_in_a_0_1_column_is_refused_in_one_line(values, message):
    rows = pd.DataFrame({"question_id": np.arange(80), "offset": np.repeat([-0.05, 0.05], 40), "changed": values})
    for analysis in (ccp_chi_square, ccp_cluster_test):
        with pytest.raises(ValueError, match=message) as error:
            analysis(rows)
        assert "\n" not in str(error.value)


# --- figures ----------------------------------------------------------------------------------

def test_figures_draw_the_table_values():
    bins = pd.DataFrame({"arm": "reason", "k": 4, "bin": [1, 2, 3, 4], "pbs_mean": [0.1, 0.2, 0.3, 0.4],
                         "pbs_se": 0.01})
    fig = pbs_by_length_figure(bins)
    assert fig.axes[0].lines[0].get_ydata().tolist() == [0.1, 0.2, 0.3, 0.4]
    trunc = truncation(CONTINUATIONS)["tables"]["truncation_by_position"]
    fig = truncation_figure(trunc)
    assert np.allclose(fig.axes[0].lines[0].get_ydata(), trunc["change_rate"], equal_nan=True)
    summary = pd.DataFrame({"arm": ["direct", "cot", "reason"], "label": ["d", "c", "r"],
                            "length_chars": [10.0, 1000.0, 5000.0], "pbs": [0.4, 0.2, 0.25]})
    fig = pbs_length_figure(summary, label="label")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and len(ax.collections) == 2 and len(ax.lines) == 1
    assert ax.lines[0].get_ydata()[[0, -1]] == pytest.approx([0.2, 0.25])


def test_truncation_trajectories_pick_interior_ccps_of_one_permutation():
    """§3.4: questions with a detectable CCP; CCP = 0 or 1 has no change point to cut around (by default)."""
    from fairaudit.analysis.position_truncation import truncation_trajectories

    records = pd.DataFrame({"question_id": [5, 5, 3, 3, 9, 9, 7, 7], "permutation": [0, 1] * 4,
                            "ccp": [0.4, 0.5, 0.0, 0.3, 1.0, 0.6, np.nan, 0.2]})
    assert truncation_trajectories(records)["question_id"].tolist() == [5]
    assert truncation_trajectories(records, include_ccp_bounds=True)["question_id"].tolist() == [5, 3, 9]
    assert truncation_trajectories(records, permutation=1)["question_id"].tolist() == [5, 3, 9, 7]
    assert truncation_trajectories(records, n_questions=2, permutation=None)["question_id"].tolist() == [5, 5, 3]


def test_extraction_rate_counts_the_cascade_alone():
    """Appendix B: extraction rate = records the A.2 cascade answers; the fallback is reported apart."""
    records = pd.DataFrame({"arm": "cot", "question_id": [0] * 4, "permutation": range(4), "gold_position": 0,
                            "answer_position": [0, 1, 2, None],
                            "answer_source": ["cascade", "cascade", "fallback", None],
                            "length_chars": 10, "ccp": 0.5, "eff_sw": 0.1})
    m = position(records)["metrics"]
    assert (m["extraction_rate_cot"], m["fallback_rate_cot"], m["answered_rate_cot"]) == (0.5, 0.25, 0.75)
