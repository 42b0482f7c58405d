"""The statistics this round added, against hand-computed values, scipy and statsmodels: the exact and
bootstrap c/b ratio intervals, Clopper-Pearson, the Spearman partial correlation, p-values in log space and the
clustered sign-flip test."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

from fairaudit.analysis.stats import (
    EXACT_CLUSTERS,
    bootstrap_ci,
    clopper_pearson,
    cluster_difference_test,
    p_value,
    partial_correlation,
    ratio_interval_exact,
    wilcoxon_log10_p,
)


@pytest.mark.parametrize("k,n", [(0, 5), (3, 10), (10, 10), (54, 2348), (1, 1)])
def test_clopper_pearson_equals_statsmodels_beta_method(k, n):
    assert clopper_pearson(k, n) == pytest.approx(proportion_confint(k, n, method="beta"), abs=1e-12)
    assert clopper_pearson(k, n, 0.9) == pytest.approx(proportion_confint(k, n, alpha=0.1, method="beta"), abs=1e-12)
    assert all(math.isnan(v) for v in clopper_pearson(0, 0))


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


def test_cluster_difference_test_enumerates_every_sign_vector_by_hand():
    # three questions: d = (1 - 0), (1 - 0), (0 - 1) -> mean 1/3; of the 8 sign vectors, |mean| is 1/3 or 1: all count
    out = cluster_difference_test([1, 1, 2, 2, 3, 3], [0, 1, 0, 1, 0, 1], [0, 1, 0, 1, 1, 0])
    assert out["diff"] == pytest.approx(1 / 3) and out["n_clusters"] == 3 and out["exact"] == 1.0
    assert out["p"] == 1.0 and out["log10_p"] == 0.0 and out["n_one_sided"] == 0
    # four questions all favouring "after": only the two all-one-way sign vectors reach |mean| = 1
    strong = cluster_difference_test(np.repeat([1, 2, 3, 4], 2), [0, 1] * 4, [0, 1] * 4)
    assert (strong["diff"], strong["p"]) == (1.0, pytest.approx(2 / 16))
    assert strong["log10_p"] == pytest.approx(math.log10(2 / 16))


def test_each_question_weighs_the_same_whatever_its_counts_and_one_sided_questions_are_left_out():
    # q1: 1 before (0), 3 after (1, 1, 0) -> d = 2/3; q2: 2 before (1, 1), 1 after (0) -> d = -1; q3: after only
    cluster = [1, 1, 1, 1, 2, 2, 2, 3, 3]
    group = [0, 1, 1, 1, 0, 0, 1, 1, 1]
    outcome = [0, 1, 1, 0, 1, 1, 0, 1, 1]
    out = cluster_difference_test(cluster, group, outcome)
    assert out["diff"] == pytest.approx((2 / 3 - 1) / 2) and (out["n_clusters"], out["n_one_sided"]) == (2, 1)
    assert out["p"] == 1.0   # signs (+, +), (-, -) give |mean| 1/6; (+, -), (-, +) give 5/6: all at least 1/6
    assert math.isnan(cluster_difference_test([1, 2], [True, True], [0, 1])["p"])   # no question holds both


def test_cluster_difference_test_against_brute_force_and_the_sampled_approximation():
    rng = np.random.default_rng(5)
    cluster = np.repeat(np.arange(6), 5)
    group = np.tile([True, False, True, False, True], 6)
    outcome = (rng.random(30) < np.where(group, 0.6, 0.3)).astype(float)
    out = cluster_difference_test(cluster, group, outcome)
    d = np.array([outcome[(cluster == q) & group].mean() - outcome[(cluster == q) & ~group].mean() for q in range(6)])
    means = [np.mean(np.array(signs) * d) for signs in itertools.product([1, -1], repeat=6)]
    assert out["diff"] == pytest.approx(d.mean())
    assert out["p"] == pytest.approx(np.mean(np.abs(means) >= abs(d.mean()) - 1e-12))
    # more clusters than EXACT_CLUSTERS: sampled sign vectors, (1 + hits) / (1 + draws), close to the exact value
    many = np.repeat(np.arange(EXACT_CLUSTERS + 4), 4)
    g, o = np.tile([True, False], len(many) // 2), (rng.random(len(many)) < 0.4).astype(float)
    sampled = cluster_difference_test(many, g, o, n_flips=20000, seed=1)
    d = o[g].reshape(-1, 2).mean(axis=1) - o[~g].reshape(-1, 2).mean(axis=1)
    signs = 1 - 2 * ((np.arange(2 ** len(d))[:, None] >> np.arange(len(d))) & 1)   # all 2^20 sign vectors
    exact = np.mean(np.abs(signs @ d / len(d)) >= abs(d.mean()) - 1e-12)
    assert sampled["exact"] == 0.0 and sampled["p"] == pytest.approx(exact, abs=0.01)


def test_clustered_data_makes_the_pooled_chi_square_overconfident():
    """Ten questions whose twelve continuations all change or none do; the fragile five happen to hold 8 after-CCP
    cuts and 4 before, the stable five the reverse. Pooled, after changes 40/60 and before 20/60 and the chi-square,
    counting 120 independent continuations, finds p < 1e-3; but no question changes more after its CCP than
    before it (each d = 0), and the sign-flip test says so: p = 1."""
    questions = np.repeat(np.arange(10), 12)
    fragile = np.repeat(np.arange(10) < 5, 12)
    after = np.concatenate([np.r_[[True] * 8, [False] * 4] if q < 5 else np.r_[[True] * 4, [False] * 8]
                            for q in range(10)])
    flip = cluster_difference_test(questions, after, fragile)
    assert flip["diff"] == 0.0 and flip["p"] == 1.0
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
