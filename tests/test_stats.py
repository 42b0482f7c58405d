"""The statistics this round added, against hand-computed values, scipy and statsmodels: the exact and
bootstrap c/b ratio intervals, Clopper-Pearson, the Spearman partial correlation and the cluster permutation test."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

from fairaudit.stats import (
    EXACT_CLUSTERS,
    bootstrap_ci,
    clopper_pearson,
    cluster_permutation_test,
    partial_correlation,
    ratio_interval_exact,
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
    r, p = partial_correlation(x, y, z, method="spearman")
    rxy, rxz, ryz = (stats.spearmanr(u, v)[0] for u, v in ((x, y), (x, z), (y, z)))
    assert r == pytest.approx((rxy - rxz * ryz) / math.sqrt((1 - rxz ** 2) * (1 - ryz ** 2)), abs=1e-12)
    ranks = [stats.rankdata(v) for v in (x, y, z)]
    ols = sm.OLS(ranks[1], sm.add_constant(np.column_stack([ranks[0], ranks[2]]))).fit()
    assert p == pytest.approx(ols.pvalues[1], rel=1e-9)
    pearson = partial_correlation(x, y, z)
    assert pearson != pytest.approx((r, p))              # the two methods differ on such data
    with pytest.raises(ValueError, match="method must be one of"):
        partial_correlation(x, y, z, method="kendall")


def test_cluster_permutation_test_enumerates_every_relabeling_by_hand():
    # three questions: two change only after CCP, one only before; pooled diff = 2/3 - 1/3
    out = cluster_permutation_test([1, 1, 2, 2, 3, 3], [0, 1, 0, 1, 0, 1], [0, 1, 0, 1, 1, 0])
    assert out["diff"] == pytest.approx(1 / 3) and out["n_clusters"] == 3 and out["exact"] == 1.0
    assert out["p"] == 1.0          # every one of the 8 relabelings is at least as extreme: |diff| is 1/3 or 1
    # four questions all favouring "after": only the two all-one-way relabelings reach |diff| = 1
    strong = cluster_permutation_test(np.repeat([1, 2, 3, 4], 2), [0, 1] * 4, [0, 1] * 4)
    assert (strong["diff"], strong["p"]) == (1.0, pytest.approx(2 / 16))


def test_cluster_permutation_test_against_brute_force_and_the_sampled_approximation():
    rng = np.random.default_rng(5)
    cluster = np.repeat(np.arange(6), 5)
    group = rng.random(30) < 0.5
    outcome = (rng.random(30) < np.where(group, 0.6, 0.3)).astype(float)
    out = cluster_permutation_test(cluster, group, outcome)
    diffs = []
    for flips in itertools.product([0, 1], repeat=6):
        swapped = np.where(np.array(flips)[cluster] == 1, ~group, group)
        diffs.append(outcome[swapped].mean() - outcome[~swapped].mean())
    observed = outcome[group].mean() - outcome[~group].mean()
    assert out["diff"] == pytest.approx(observed)
    assert out["p"] == pytest.approx(np.mean(np.abs(diffs) >= abs(observed) - 1e-12))
    # more clusters than EXACT_CLUSTERS: sampled relabelings, (1 + hits) / (1 + draws), close to the exact value
    many = np.repeat(np.arange(EXACT_CLUSTERS + 4), 3)
    g, o = rng.random(len(many)) < 0.5, (rng.random(len(many)) < 0.4).astype(float)
    sampled = cluster_permutation_test(many, g, o, n_permutations=20000, seed=1)
    assert sampled["exact"] == 0.0 and 0.0 < sampled["p"] <= 1.0
    assert math.isnan(cluster_permutation_test([1, 2], [True, True], [0, 1])["p"])   # one group only


def test_clustered_data_makes_the_pooled_chi_square_overconfident():
    """Ten questions whose twelve continuations all change or none do; the fragile five happen to hold 8 after-CCP
    cuts and 4 before, the stable five the reverse. Pooled, after changes 40/60 and before 20/60: the chi-square
    counts 120 independent continuations. Relabeling whole questions, only the observed split and its mirror
    image are that extreme: p = 2 / 2^10."""
    questions = np.repeat(np.arange(10), 12)
    fragile = np.repeat(np.arange(10) < 5, 12)
    after = np.concatenate([np.r_[[True] * 8, [False] * 4] if q < 5 else np.r_[[True] * 4, [False] * 8]
                            for q in range(10)])
    perm = cluster_permutation_test(questions, after, fragile)
    assert perm["diff"] == pytest.approx(40 / 60 - 20 / 60) and perm["p"] == pytest.approx(2 / 1024)
    chi2_p = stats.chi2_contingency([[40, 20], [20, 40]])[1]
    assert chi2_p < 1e-3 < perm["p"]
