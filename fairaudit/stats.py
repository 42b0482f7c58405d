"""Exact tests in log space, Wilson, Clopper-Pearson and bootstrap intervals, partial correlation, a cluster
permutation test."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pandas as pd
from scipy import stats
from scipy.special import gammaln, logsumexp

LN10 = math.log(10.0)
FEW = 10  # an interval over fewer units than this is flagged (`..._few` metrics, marked in tables)


def binom_log_cdf_half(k: int, n: int) -> float:
    """ln P(X <= k) for X ~ Binomial(n, 1/2), exact in log space (no underflow)."""
    if k < 0:
        return -math.inf
    if k >= n:
        return 0.0
    i = np.arange(k + 1)
    log_pmf = gammaln(n + 1) - gammaln(i + 1) - gammaln(n - i + 1) - n * math.log(2.0)
    return float(logsumexp(log_pmf))


def mcnemar_exact_log10_p(b: int, c: int) -> float:
    """log10 of McNemar's exact two-sided p-value on the discordant counts (b, c).

    p = min(1, 2 * P(X <= min(b, c))), X ~ Binomial(b + c, 1/2); 0.0 (p = 1) when b + c = 0.
    """
    n = b + c
    if n == 0:
        return 0.0
    log_p = math.log(2.0) + binom_log_cdf_half(min(b, c), n)
    return min(0.0, log_p / LN10)


def sign_test_log10_p(successes: int, n: int, alternative: str = "greater") -> float:
    """log10 p of the exact sign test: `successes` of `n` non-tied cells in the predicted direction."""
    if alternative == "greater":
        log_p = binom_log_cdf_half(n - successes, n)
    elif alternative == "two-sided":
        log_p = math.log(2.0) + binom_log_cdf_half(min(successes, n - successes), n)
    else:
        raise ValueError(f"alternative must be 'greater' or 'two-sided', got {alternative!r}")
    return min(0.0, log_p / LN10)


def wilson_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k/n; (nan, nan) when n = 0.

    center = (p + z^2/2n) / (1 + z^2/n), half width = z sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n),
    z the (1 + level)/2 normal quantile (paper 002 Table 3: 546/2311 -> [0.219, 0.254]).
    """
    if n == 0:
        return (math.nan, math.nan)
    z = float(stats.norm.ppf(0.5 + level / 2.0))
    p, z2 = k / n, z * z
    center = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (max(0.0, center - half), min(1.0, center + half))


def bootstrap_ci(
    statistic: Callable[[np.ndarray], float],
    n_units: int,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    keep_infinite: bool = False,
) -> tuple[float, float]:
    """Percentile interval of `statistic(indices)` over resamples of `n_units` units with replacement.

    `statistic` receives an index array into the units (pairs, questions...) so paired
    quantities stay paired. NaN replicates are dropped; infinite ones too unless `keep_infinite`,
    when they stay in the ranking (a ratio whose denominator is 0 in a resample): an end that
    falls among them, or between them and a finite replicate, is infinite (an unbounded interval).
    """
    if n_units == 0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    values = np.array([statistic(rng.integers(0, n_units, size=n_units)) for _ in range(n_boot)], dtype=float)
    values = values[~np.isnan(values)] if keep_infinite else values[np.isfinite(values)]
    if values.size == 0:
        return (math.nan, math.nan)
    tail = (1.0 - level) / 2.0
    if np.isfinite(values).all():
        low, high = np.quantile(values, [tail, 1.0 - tail])
        return (float(low), float(high))
    ranked = np.sort(values)
    return (_percentile(ranked, tail), _percentile(ranked, 1.0 - tail))


def _percentile(ranked: np.ndarray, q: float) -> float:
    """numpy's linear-interpolation quantile of sorted values, with infinite neighbours giving an infinite end."""
    h = (len(ranked) - 1) * q
    below, frac = int(math.floor(h)), h - math.floor(h)
    a, b = float(ranked[below]), float(ranked[min(below + 1, len(ranked) - 1)])
    if frac == 0.0 or a == b or math.isinf(a):
        return a
    return b if math.isinf(b) else a + frac * (b - a)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval of a binomial proportion k/n from beta quantiles; (nan, nan) when n = 0."""
    if n == 0:
        return (math.nan, math.nan)
    tail = (1.0 - level) / 2.0
    low = float(stats.beta.ppf(tail, k, n - k + 1)) if k > 0 else 0.0
    high = float(stats.beta.ppf(1.0 - tail, k + 1, n - k)) if k < n else 1.0
    return (low, high)


def ratio_interval_exact(c: int, b: int, level: float = 0.95) -> tuple[float, float]:
    """Exact conditional interval of the ratio of two discordant-cell probabilities, pi_c / pi_b.

    Given the b + c discordant pairs, c ~ Binomial(b + c, pi_c / (pi_b + pi_c)), so the Clopper-Pearson
    interval (p_low, p_high) of that share maps to p / (1 - p): coverage is at least `level` for
    every b + c (the matched-pairs odds-ratio interval). b = 0 gives an upper end of +inf, c = 0 a
    lower end of 0; (nan, nan) without a discordant pair.
    """
    low, high = clopper_pearson(c, b + c, level)
    if math.isnan(low):
        return (math.nan, math.nan)
    return (low / (1.0 - low), math.inf if high >= 1.0 else high / (1.0 - high))


PARTIAL_METHODS = ("pearson", "spearman")


def partial_correlation(x, y, covariate, method: str = "pearson") -> tuple[float, float]:
    """Correlation of x and y controlling for one covariate, and its two-sided p-value.

    Residual method: x and y are each regressed on (1, covariate); the p-value is the t-test
    of the residual correlation on n - 3 degrees of freedom (for Pearson, exactly the OLS t-test of
    x's coefficient in y ~ 1 + x + covariate). method="spearman" does the same on the ranks of x, y
    and the covariate (average ranks for ties), as pingouin's partial_corr does; its p-value is then
    the usual large-sample approximation. Rows with a NaN are dropped; (NaN, NaN) with fewer than
    4 rows or a constant residual.
    """
    if method not in PARTIAL_METHODS:
        raise ValueError(f"method must be one of {list(PARTIAL_METHODS)}, got {method!r}")
    data = np.column_stack([x, y, covariate]).astype(float)
    data = data[~np.isnan(data).any(axis=1)]
    n = len(data)
    if n < 4:
        return math.nan, math.nan
    if method == "spearman":
        data = np.column_stack([stats.rankdata(column) for column in data.T])
    design = np.column_stack([np.ones(n), data[:, 2]])
    fitted = design @ np.linalg.lstsq(design, data[:, :2], rcond=None)[0]
    residuals = data[:, :2] - fitted
    if (residuals.std(axis=0) <= 1e-10 * np.abs(data[:, :2]).max(axis=0)).any():  # x or y explained by the covariate
        return math.nan, math.nan
    r = float(np.corrcoef(residuals.T)[0, 1])
    dof = n - 3
    t = r * math.sqrt(dof / max(1.0 - r * r, np.finfo(float).tiny))
    return r, float(2.0 * stats.t.sf(abs(t), dof))


EXACT_CLUSTERS = 16  # up to 2^16 relabelings are enumerated; more are sampled


def cluster_permutation_test(cluster, group, outcome, n_permutations: int = 10000, seed: int = 0) -> dict[str, float]:
    """Two-sided permutation test of a difference in means between two groups whose observations come in clusters.

    cluster: the unit (a question); group: bool per observation (True: e.g. after the change point);
    outcome: 0/1 or any number. Statistic: mean outcome of group True minus group False, pooled over
    observations. Under the null each cluster's labels are exchangeable as a block: a relabeling swaps
    True and False in whole clusters, so clusters, not observations, are the independent units (a
    chi-square on the pooled 2x2 table treats every observation as independent). All 2^Q relabelings
    are enumerated for Q <= EXACT_CLUSTERS clusters, else `n_permutations` are drawn (seeded) and
    p = (1 + #{|T*| >= |T|}) / (1 + n_permutations). Returns diff, p, n_clusters, exact (1.0 / 0.0);
    NaN diff and p when a group is empty.
    """
    frame = pd.DataFrame({"cluster": np.asarray(cluster), "group": np.asarray(group, dtype=bool),
                          "outcome": np.asarray(outcome, dtype=float)})
    out = {"n_clusters": float(frame["cluster"].nunique()), "diff": math.nan, "p": math.nan, "exact": math.nan}
    if frame["group"].nunique() < 2:
        return out
    columns = pd.MultiIndex.from_product([["sum", "count"], [False, True]])
    sums = frame.pivot_table(index="cluster", columns="group", values="outcome", aggfunc=["sum", "count"],
                             fill_value=0).reindex(columns=columns, fill_value=0)
    s0, s1, n0, n1 = (sums[(kind, g)].to_numpy(float) for kind, g in (("sum", False), ("sum", True),
                                                                      ("count", False), ("count", True)))
    exact = len(sums) <= EXACT_CLUSTERS
    if exact:
        flips = (np.arange(2 ** len(sums))[:, None] >> np.arange(len(sums))[None, :]) & 1
    else:
        flips = np.random.default_rng(seed).integers(0, 2, size=(n_permutations, len(sums)))
    keep = 1 - flips  # 1: the cluster keeps its labels, 0: its groups are swapped
    with np.errstate(invalid="ignore", divide="ignore"):
        diffs = ((keep @ s1 + flips @ s0) / (keep @ n1 + flips @ n0)
                 - (keep @ s0 + flips @ s1) / (keep @ n0 + flips @ n1))
    observed = s1.sum() / n1.sum() - s0.sum() / n0.sum()
    extreme = np.abs(diffs[np.isfinite(diffs)]) >= abs(observed) - 1e-12
    p = extreme.mean() if exact else (1 + extreme.sum()) / (1 + n_permutations)
    return {**out, "diff": float(observed), "p": float(p), "exact": float(exact)}
