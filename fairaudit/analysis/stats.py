"""Exact tests in log space, Wilson, Clopper-Pearson and bootstrap intervals, partial correlation, a clustered
sign-flip test."""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np
from scipy import stats
from scipy.special import gammaln, logsumexp

from fairaudit.analysis.numbers import LOG10_SMALLEST, NOISE, cancelled_mean

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


def p_value(log10_p: float) -> float:
    """p = 10^log10_p where that is a normal double, else NaN: below the smallest double (1e-308) a p-value lives
    as its log10 alone (every `*_p` metric has its `*_log10_p` beside it), never as a 0 it is not."""
    if math.isnan(log10_p) or log10_p < LOG10_SMALLEST:
        return math.nan
    return 10.0 ** log10_p


def sign_test_log10_p(successes: int, n: int, alternative: str = "greater") -> float:
    """log10 p of the exact sign test: `successes` of `n` non-tied cells in the predicted direction."""
    if alternative == "greater":
        log_p = binom_log_cdf_half(n - successes, n)
    elif alternative == "two-sided":
        log_p = math.log(2.0) + binom_log_cdf_half(min(successes, n - successes), n)
    else:
        raise ValueError(f"alternative must be 'greater' or 'two-sided', got {alternative!r}")
    return min(0.0, log_p / LN10)


def interval_size(name: str, n: int) -> dict[str, float]:
    """`<name>_ci_n`, the units an interval of metric `name` rests on, and `<name>_ci_few`, 1.0 below FEW of them
    (where a bootstrap interval covers far less than its level: benchmarks/interval_coverage.py)."""
    return {f"{name}_ci_n": n, f"{name}_ci_few": float(n < FEW)}


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


def wilcoxon_log10_p(diff: np.ndarray, alternative: str, zero_method: str, p: float) -> float:
    """log10 of scipy's Wilcoxon signed-rank p on `diff`; where that p underflows (only the normal approximation
    can, past ~470 pairs all one way) from the approximation's z statistic in log space."""
    if p >= 10.0 ** LOG10_SMALLEST:
        return math.log10(p)
    z = float(stats.wilcoxon(diff, alternative=alternative, zero_method=zero_method, method="approx").zstatistic)
    log_p = {"greater": stats.norm.logsf(z), "less": stats.norm.logcdf(z)}.get(alternative)
    if log_p is None:  # two-sided
        log_p = math.log(2.0) + stats.norm.logsf(abs(z))
    return min(0.0, float(log_p) / LN10)


PARTIAL_METHODS = ("pearson", "spearman")


class Correlation(NamedTuple):
    """A correlation, its two-sided p-value (NaN below the smallest double) and that p's log10 (always)."""

    r: float
    p: float
    log10_p: float


def partial_correlation(x, y, covariate, method: str = "pearson") -> Correlation:
    """Correlation of x and y controlling for one covariate, its two-sided p-value and log10 p.

    Residual method: x and y are each regressed on (1, covariate); the p-value is the t-test
    of the residual correlation on n - 3 degrees of freedom (for Pearson, exactly the OLS t-test of
    x's coefficient in y ~ 1 + x + covariate). method="spearman" does the same on the ranks of x, y
    and the covariate (average ranks for ties), as pingouin's partial_corr does; its p-value is then
    the usual large-sample approximation, computed in log space (far below 1e-308 when n is large). Rows with a
    NaN are dropped; NaN throughout with fewer than 4 rows or a constant residual.
    """
    if method not in PARTIAL_METHODS:
        raise ValueError(f"method must be one of {list(PARTIAL_METHODS)}, got {method!r}")
    data = np.column_stack([x, y, covariate]).astype(float)
    data = data[~np.isnan(data).any(axis=1)]
    n = len(data)
    if n < 4:
        return Correlation(math.nan, math.nan, math.nan)
    if method == "spearman":
        data = np.column_stack([stats.rankdata(column) for column in data.T])
    design = np.column_stack([np.ones(n), data[:, 2]])
    fitted = design @ np.linalg.lstsq(design, data[:, :2], rcond=None)[0]
    residuals = data[:, :2] - fitted
    if (residuals.std(axis=0) <= 1e-10 * np.abs(data[:, :2]).max(axis=0)).any():  # x or y explained by the covariate
        return Correlation(math.nan, math.nan, math.nan)
    r = float(np.corrcoef(residuals.T)[0, 1])
    dof = n - 3
    t = r * math.sqrt(dof / max(1.0 - r * r, np.finfo(float).tiny))
    log10_p = min(0.0, (math.log(2.0) + float(stats.t.logsf(abs(t), dof))) / LN10)
    return Correlation(r, p_value(log10_p), log10_p)


EXACT_CLUSTERS = 16  # up to 2^16 sign vectors are enumerated; more are sampled


def cluster_difference_test(cluster, group, outcome, n_flips: int = 10000, seed: int = 0) -> dict[str, float]:
    """Two-sided test of a difference in mean outcome between two groups whose observations come in clusters,
    each cluster its own control: d_q = its mean outcome in group True minus its mean in group False.

    cluster: the unit (a question); group: bool per observation (True: e.g. after the change point); outcome:
    0/1 or any number. Statistic: the mean of d_q over the clusters holding both groups (one with a single group
    has no difference of its own and is left out, counted in n_one_sided). Under the null a cluster's labels are
    exchangeable, so d_q is as likely as -d_q: the test flips the signs of whole clusters, all 2^Q sign vectors
    for Q <= EXACT_CLUSTERS, else `n_flips` seeded draws with p = (1 + #{|T*| >= |T|}) / (1 + n_flips). Every
    cluster weighs the same whatever its counts, so its weight does not move when it is flipped, as it does for
    the pooled difference of rates (whose relabeling test rejects a true null 3 times too often when clusters
    lose observations on one side: benchmarks/cluster_test_size.py). Returns diff, p, log10_p, n_clusters (with
    both groups), n_one_sided, exact (1.0 / 0.0); NaN diff and p without a cluster holding both groups.
    """
    ids, index = np.unique(np.asarray(cluster), return_inverse=True)
    side = np.asarray(group, dtype=bool).astype(int)
    counts, sums = np.zeros((len(ids), 2)), np.zeros((len(ids), 2))
    np.add.at(counts, (index, side), 1.0)
    np.add.at(sums, (index, side), np.asarray(outcome, dtype=float))
    both = (counts > 0).all(axis=1)
    out = {"n_clusters": float(both.sum()), "n_one_sided": float((~both).sum()), "diff": math.nan, "p": math.nan,
           "log10_p": math.nan, "exact": math.nan}
    if not both.any():
        return out
    d = sums[both, 1] / counts[both, 1] - sums[both, 0] / counts[both, 0]
    p, exact = sign_flip_p(d, n_flips, seed)
    return {**out, "diff": cancelled_mean(d), "p": p, "log10_p": math.log10(p), "exact": float(exact)}


def sign_flip_p(d: np.ndarray, n_flips: int = 10000, seed: int = 0) -> tuple[float, bool]:
    """Two-sided p of the mean of `d` under random signs, and whether every sign vector was enumerated."""
    n = len(d)
    exact = n <= EXACT_CLUSTERS
    if exact:
        flips = (np.arange(2 ** n)[:, None] >> np.arange(n)[None, :]) & 1
    else:
        flips = np.random.default_rng(seed).integers(0, 2, size=(n_flips, n), dtype=np.int8)
    means = (d.sum() - 2.0 * (flips.astype(float) @ d)) / n  # a flipped unit (1) adds -d instead of d
    observed = abs(d.mean()) - NOISE * np.abs(d).mean()  # a relabeling as extreme as the data, up to rounding
    extreme = int((np.abs(means) >= observed).sum())
    return (extreme / len(means) if exact else (1 + extreme) / (1 + n_flips)), exact
