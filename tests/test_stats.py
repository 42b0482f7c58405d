"""The statistics this round added, against hand-computed values, scipy and statsmodels: the exact and
bootstrap c/b ratio intervals, Clopper-Pearson, the Spearman partial correlation, p-values in log space and the
exact stratified permutation test."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

from fairaudit.analysis import permutation
from fairaudit.analysis.permutation import stratified_exact_test, subset_sum_log_pmf
from fairaudit.analysis.stats import (
    bootstrap_ci,
    clopper_pearson,
    p_value,
    partial_correlation,
    ratio_interval_exact,
    t_interval,
    wilcoxon_log10_p,
    wilson_interval,
)


@pytest.mark.parametrize("k,n", [(0, 5), (3, 10), (10, 10), (54, 2348), (1, 1)])
def test_clopper_pearson_equals_statsmodels_beta_method(k, n):
    assert clopper_pearson(k, n) == pytest.approx(proportion_confint(k, n, method="beta"), abs=1e-12)
    assert clopper_pearson(k, n, 0.9) == pytest.approx(proportion_confint(k, n, alpha=0.1, method="beta"), abs=1e-12)
    assert all(math.isnan(v) for v in clopper_pearson(0, 0))


def test_wilson_ends_at_0_of_n_and_n_of_n_are_exactly_0_and_1():
    """Center and half width are equal at k = 0 (and at k = n for the upper end); in floats their difference was
    5.6e-17 at 0 of 3, logged as a lower end. The other end is z^2 / (n + z^2) by hand."""
    z2 = stats.norm.ppf(0.975) ** 2
    assert wilson_interval(0, 3) == (0.0, pytest.approx(z2 / (3 + z2), rel=1e-12))
    assert wilson_interval(3, 3) == (pytest.approx(3 / (3 + z2), rel=1e-12), 1.0)
    assert wilson_interval(1, 3) == pytest.approx(proportion_confint(1, 3, method="wilson"), rel=1e-12)
    for n in range(1, 60):
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0


def test_exact_ratio_interval_by_hand_and_its_edges():
    # c = 20, b = 2: the share c/(b+c) of 22 discordant pairs has the CP interval (lo, hi); the ratio is p/(1-p)
    lo, hi = proportion_confint(20, 22, method="beta")
    assert ratio_interval_exact(20, 2) == pytest.approx((lo / (1 - lo), hi / (1 - hi)))
    assert ratio_interval_exact(5, 0)[1] == math.inf and ratio_interval_exact(5, 0)[0] > 0   # b = 0: unbounded above
    assert ratio_interval_exact(0, 4)[0] == 0.0
    assert all(math.isnan(v) for v in ratio_interval_exact(0, 0))
    # 1 created against 1 resolved: the share's CP interval (0.0126, 0.9874) gives [1/78.5, 78.5]
    low, high = ratio_interval_exact(1, 1)
    assert low == pytest.approx(1 / high) and high == pytest.approx(0.98742088 / (1 - 0.98742088), rel=1e-6)


def _ratio_statistic(c: int, b: int, n: int):
    is_b, is_c = np.zeros(n, bool), np.zeros(n, bool)
    is_b[:b], is_c[b:b + c] = True, True

    def ratio(i):
        num, den = is_c[i].sum(), is_b[i].sum()
        return num / den if den else math.inf if num else math.nan
    return ratio


def test_ratio_bootstrap_keeps_the_resamples_without_a_b_pair():
    """The issue's case: b = 2, c = 20 of 1,000 pairs; about e^-2 = 13.5% of resamples hold no b pair."""
    statistic = _ratio_statistic(20, 2, 1000)
    dropped = bootstrap_ci(statistic, 1000, 2000, 0)
    kept = bootstrap_ci(statistic, 1000, 2000, 0, keep_infinite=True)
    assert dropped == pytest.approx((3.2, 26.0))          # what dropping them printed: a bounded interval
    assert kept[1] == math.inf and kept[0] == pytest.approx(3.25)
    rng = np.random.default_rng(0)
    resamples = np.array([statistic(rng.integers(0, 1000, size=1000)) for _ in range(2000)])
    assert np.isinf(resamples).mean() == pytest.approx(0.137, abs=0.02)


def test_bootstrap_with_finite_replicates_is_numpys_quantile_either_way():
    values = np.random.default_rng(3).normal(size=40)

    def stat(i):
        return values[i].mean()

    assert bootstrap_ci(stat, 40, 500, 1) == bootstrap_ci(stat, 40, 500, 1, keep_infinite=True)
    rng = np.random.default_rng(1)
    replicates = [stat(rng.integers(0, 40, size=40)) for _ in range(500)]
    assert bootstrap_ci(stat, 40, 500, 1) == pytest.approx(tuple(np.quantile(replicates, [0.025, 0.975])), abs=1e-15)


def test_t_interval_of_a_skewed_five_by_hand():
    """1, 2, 3, 4, 10: mean 4, squared deviations 9 + 4 + 1 + 0 + 36 = 50, SD sqrt(50 / 4) = 3.5355, SE sqrt(2.5);
    t(0.975, 4) = 2.7764 (scipy's quantile, as a table gives it), half width 2.7764 x 1.5811 = 4.3899."""
    half = stats.t.ppf(0.975, 4) * math.sqrt(2.5)
    assert half == pytest.approx(4.3899, abs=1e-4)
    mean, sd, low, high = t_interval(np.array([1.0, 2.0, 3.0, 4.0, 10.0]))
    assert (mean, sd) == (4.0, pytest.approx(math.sqrt(12.5)))
    assert (low, high) == (pytest.approx(4.0 - half), pytest.approx(4.0 + half))
    assert all(math.isnan(end) for end in t_interval(np.array([0.7]))[1:])   # one value: no SD, no interval


def test_spearman_partial_correlation_equals_the_formula_on_spearman_correlations_and_ols_on_ranks():
    rng = np.random.default_rng(11)
    z = rng.exponential(size=80)
    x = np.exp(z + rng.normal(size=80))                  # heavy-tailed, like trajectory lengths
    y = np.round(4 * (0.3 * np.log(x) - z + rng.normal(size=80))) / 4   # ties, like PBS
    r, p, log10_p = partial_correlation(x, y, z, method="spearman")
    rxy, rxz, ryz = (stats.spearmanr(u, v)[0] for u, v in ((x, y), (x, z), (y, z)))
    assert r == pytest.approx((rxy - rxz * ryz) / math.sqrt((1 - rxz ** 2) * (1 - ryz ** 2)), abs=1e-12)
    ranks = [stats.rankdata(v) for v in (x, y, z)]
    ols = sm.OLS(ranks[1], sm.add_constant(np.column_stack([ranks[0], ranks[2]]))).fit()
    assert p == pytest.approx(ols.pvalues[1], rel=1e-9) and log10_p == pytest.approx(math.log10(p), rel=1e-12)
    pearson = partial_correlation(x, y, z)
    assert pearson[:2] != pytest.approx((r, p))              # the two methods differ on such data
    with pytest.raises(ValueError, match="method must be one of"):
        partial_correlation(x, y, z, method="kendall")


def test_the_issues_minimal_case_is_exact_where_the_sign_flip_said_1e_4():
    """20 questions, each 1 unchanged after-continuation and 9 before, one of which changed in 15 questions: the
    after-changes T ~ Binomial(15, 1/10) given the counts; T = 0, so p = 2 P(T <= 0) = 2 x 0.9^15 = 0.41."""
    question, after = np.repeat(np.arange(20), 10), np.tile([True] + [False] * 9, 20)
    changed = np.zeros(200, dtype=int)
    changed[np.arange(15) * 10 + 1] = 1
    out = stratified_exact_test(question, after, changed)
    assert out["p"] == pytest.approx(2 * 0.9 ** 15, rel=1e-12) and out["log10_p"] == pytest.approx(math.log10(out["p"]))
    assert (out["statistic"], out["expected"], out["exact"]) == (0.0, pytest.approx(1.5), 1.0)
    assert (out["n_strata"], out["n_one_sided"]) == (20, 0)
    # Mantel-Haenszel: weights 1 x 9 / 10 each; after 0 - before 1/9 in 15 questions, 0 - 0 in 5
    assert out["mh_diff"] == pytest.approx(15 * 0.9 * (-1 / 9) / (20 * 0.9))


def _brute_force_p(strata: list[tuple[list[int], int]], t: int) -> float:
    """Every relabeling of every stratum (its units' outcomes, how many are after), equally likely."""
    sums = [[sum(c) for c in itertools.combinations(values, picked)] for values, picked in strata]
    totals = np.array([sum(parts) for parts in itertools.product(*sums)])
    return min(1.0, 2 * min(np.mean(totals <= t), np.mean(totals >= t)))


def test_the_exact_law_is_every_relabeling_of_whole_units_equally_likely():
    """Three questions whose cuts hold 1 to 3 continuations: a cut's continuations move together."""
    question = [1] * 7 + [2] * 5 + [3] * 4
    cut = ["a", "a", "b", "c", "c", "c", "d"] + ["a", "b", "b", "c", "c"] + ["a", "b", "c", "c"]
    after = [1, 1, 0, 0, 0, 0, 1] + [1, 0, 0, 0, 0] + [0, 0, 1, 1]
    changed = [1, 1, 0, 1, 0, 1, 0] + [1, 0, 1, 0, 0] + [0, 1, 1, 1]
    out = stratified_exact_test(question, np.array(after, bool), changed, cut)
    # units: q1 a=2 (after), b=0, c=2, d=0 (after); q2 a=1 (after), b=1, c=0; q3 a=0, b=1, c=2 (after)
    strata = [([2, 0, 2, 0], 2), ([1, 1, 0], 1), ([0, 1, 2], 1)]
    assert out["statistic"] == 2 + 1 + 2 and out["p"] == pytest.approx(_brute_force_p(strata, 5), rel=1e-12)
    assert out["expected"] == pytest.approx(2 / 4 * 4 + 1 / 3 * 2 + 1 / 3 * 3)
    singly = stratified_exact_test(question, np.array(after, bool), changed)   # each continuation a unit
    assert singly["p"] != out["p"]  # a different law: continuations relabeled one by one
    assert singly["p"] == pytest.approx(_brute_force_p([([1, 1, 0, 1, 0, 1, 0], 3), ([1, 0, 1, 0, 0], 1),
                                                        ([0, 1, 1, 1], 2)], 2 + 1 + 2), rel=1e-12)


def test_one_2x2_table_is_the_hypergeometric_law_of_fishers_test():
    # after: 7 of 12 changed; before: 2 of 10; 9 changes among 22
    after = np.r_[[True] * 12, [False] * 10]
    changed = np.r_[[1] * 7, [0] * 5, [1] * 2, [0] * 8]
    out = stratified_exact_test(np.zeros(22), after, changed)
    law = stats.hypergeom(22, 9, 12)
    assert out["p"] == pytest.approx(2 * min(law.cdf(7), law.sf(6)), rel=1e-12)
    assert out["expected"] == pytest.approx(12 * 9 / 22)
    assert out["mh_diff"] == pytest.approx(7 / 12 - 2 / 10)


def test_subset_sums_by_hand():
    # two of (3, 0, 2, 2, 1): the ten pairs sum to 1 once, 2 twice, 3 three times, 4 twice, 5 twice
    assert np.exp(subset_sum_log_pmf(np.array([3, 0, 2, 2, 1]), 2)) == pytest.approx([0, .1, .2, .3, .2, .2])
    assert np.exp(subset_sum_log_pmf(np.array([1, 1, 0, 0]), 0)) == pytest.approx([1.0])


def test_one_sided_questions_are_counted_and_left_out_and_none_gives_nan():
    out = stratified_exact_test([1, 1, 2, 2, 3], [True, False, True, False, True], [1, 0, 0, 1, 1])
    assert (out["n_strata"], out["n_one_sided"], out["statistic"]) == (2, 1, 1.0) and out["p"] == 1.0
    none = stratified_exact_test([1, 2], [True, True], [0, 1])
    assert (none["n_strata"], none["n_one_sided"]) == (0, 2) and math.isnan(none["p"]) and math.isnan(none["mh_diff"])


def test_a_p_below_the_smallest_double_is_exact_in_log_space():
    """400 questions, each its one after-continuation changed and its 9 before not: T = 400 has probability
    10^-400 given the counts, so p = 2 x 10^-400, beyond the rescaled convolution's floor."""
    question, after = np.repeat(np.arange(400), 10), np.tile([True] + [False] * 9, 400)
    out = stratified_exact_test(question, after, after.astype(int))
    assert out["log10_p"] == pytest.approx(math.log10(2) - 400, abs=1e-9) and math.isnan(out["p"])


def test_a_very_large_study_draws_seeded_relabelings(monkeypatch):
    rng = np.random.default_rng(3)
    question, after = np.repeat(np.arange(40), 6), np.tile([True, True, False, False, False, False], 40)
    changed = (rng.random(240) < np.where(after, 0.35, 0.2)).astype(int)
    exact = stratified_exact_test(question, after, changed)
    monkeypatch.setattr(permutation, "EXACT_WORK", 10)
    sampled = stratified_exact_test(question, after, changed, relabelings=20000, seed=1)
    assert (exact["exact"], sampled["exact"]) == (1.0, 0.0) and sampled["p"] == pytest.approx(exact["p"], abs=0.01)
    assert sampled == stratified_exact_test(question, after, changed, relabelings=20000, seed=1)   # seeded
    assert sampled["statistic"] == exact["statistic"] and sampled["mh_diff"] == exact["mh_diff"]


@pytest.mark.parametrize("outcome,unit,message", [
    ([0, 2.5, 1, 0], None, "outcome: expected whole numbers >= 0"),
    ([0, -1, 1, 0], None, "outcome: expected whole numbers >= 0"),
    ([0, 1, 1, 0], ["a", "a", "b", "b"], "unit: a unit holds observations of both groups")])
def test_what_the_test_cannot_read_is_one_line(outcome, unit, message):
    with pytest.raises(ValueError, match=message):
        stratified_exact_test([1, 1, 1, 1], [True, False, True, False], outcome, unit)


def test_clustered_data_makes_the_pooled_chi_square_overconfident():
    """Ten questions whose twelve continuations all change or none do; the fragile five happen to hold 8 after-CCP
    cuts and 4 before, the stable five the reverse. Pooled, after changes 40/60 and before 20/60 and the chi-square,
    counting 120 independent continuations, finds p < 1e-3; but no question changes more after its CCP than
    before it, and the stratified test, which relabels within questions only, says so: p = 1."""
    questions = np.repeat(np.arange(10), 12)
    fragile = np.repeat(np.arange(10) < 5, 12).astype(int)
    after = np.concatenate([np.r_[[True] * 8, [False] * 4] if q < 5 else np.r_[[True] * 4, [False] * 8]
                            for q in range(10)])
    within = stratified_exact_test(questions, after, fragile)
    assert within["mh_diff"] == 0.0 and within["p"] == 1.0 and within["statistic"] == within["expected"] == 40
    chi2_p = stats.chi2_contingency([[40, 20], [20, 40]])[1]
    assert chi2_p < 1e-3


def test_p_value_is_the_double_where_there_is_one_and_nan_below():
    assert p_value(0.0) == 1.0 and p_value(-45.656743596968624) == pytest.approx(2.204227e-46, rel=1e-6)
    assert math.isnan(p_value(-485.6)) and math.isnan(p_value(math.nan)) and p_value(-307.6) > 0


def test_a_wilcoxon_p_that_underflows_comes_from_its_z_in_log_space():
    diff = np.abs(np.random.default_rng(0).normal(5, 1, 3000))       # 3000 questions, every difference positive
    assert stats.wilcoxon(diff, alternative="greater").pvalue == 0.0
    z = stats.wilcoxon(diff, alternative="greater", method="approx").zstatistic
    assert wilcoxon_log10_p(diff, "greater", "wilcox", 0.0) == pytest.approx(stats.norm.logsf(z) / math.log(10))
    assert wilcoxon_log10_p(diff, "two-sided", "wilcox", 0.0) == pytest.approx(
        (math.log(2) + stats.norm.logsf(abs(z))) / math.log(10))
    small = stats.wilcoxon(diff[:20], alternative="greater").pvalue          # exact, a double: its log10
    assert wilcoxon_log10_p(diff[:20], "greater", "wilcox", small) == math.log10(small)
