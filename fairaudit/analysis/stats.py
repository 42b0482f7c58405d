"""Exact tests in log space, Wilson, Clopper-Pearson, Student t (plain and clustered), bootstrap and Fisher z
intervals, partial correlation (the exact stratified permutation test is in `analysis.permutation`)."""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np
from scipy import stats
from scipy.special import gammaln, logsumexp

from fairaudit.analysis.numbers import LOG10_SMALLEST

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
    (where a bootstrap interval, or a t interval of skewed values, covers far less than its level:
    benchmarks/interval_coverage.py)."""
    return {f"{name}_ci_n": n, f"{name}_ci_few": float(n < FEW)}


def wilson_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k/n; (nan, nan) when n = 0.

    center = (p + z^2/2n) / (1 + z^2/n), half width = z sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n),
    z the (1 + level)/2 normal quantile (paper 002 Table 3: 546/2311 -> [0.219, 0.254]). At k = 0 the lower end
    is 0 and at k = n the upper end 1 exactly (center and half width are equal there; their difference in floats
    is rounding, 5.6e-17 at 0 of 3).
    """
    if n == 0:
        return (math.nan, math.nan)
    z = float(stats.norm.ppf(0.5 + level / 2.0))
    p, z2 = k / n, z * z
    center = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (0.0 if k == 0 else max(0.0, center - half), 1.0 if k == n else min(1.0, center + half))


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


def t_interval(values: np.ndarray, level: float = 0.95,
               bounds: tuple[float, float] = (-math.inf, math.inf)) -> tuple[float, float, float, float]:
    """(mean, SD with ddof=1, low, high): Student-t interval mean ± t_{(1+level)/2, n-1} SD / sqrt(n), cut to
    `bounds`, the values the quantity can take (`study.metric_range`): a mean in that range is covered by the cut
    interval whenever by the whole one, so the cut keeps the t-interval's coverage and never shows a count below 0.
    The cut never passes the mean: a mean outside `bounds` (a range declared wrong) keeps the whole interval."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    n = values.size
    if n == 0:
        return (math.nan, math.nan, math.nan, math.nan)
    mean = float(values.mean())
    if n == 1:
        return (mean, math.nan, math.nan, math.nan)
    sd = float(values.std(ddof=1))
    half = float(stats.t.ppf((1.0 + level) / 2.0, n - 1)) * sd / math.sqrt(n)
    if not bounds[0] <= mean <= bounds[1]:
        return (mean, sd, mean - half, mean + half)
    return (mean, sd, max(mean - half, bounds[0]), min(mean + half, bounds[1]))


def clustered_t_interval(totals, sizes=None, level: float = 0.95,
                         bounds: tuple[float, float] = (-math.inf, math.inf)) -> tuple[float, float]:
    """Student-t interval of the mean sum(totals) / sum(sizes) over n units (questions), unit i holding sizes[i]
    observations that sum to totals[i]; default one each, the plain t interval of the totals' mean.

    A unit's observations are taken together, so they need not be independent: se = sd(d) / sqrt(n) with d_i =
    (totals_i - mean x sizes_i) / mean(sizes), the ratio mean's linearised deviations (ddof 1), and
    t_{(1+level)/2, n-1} critical values; cut to `bounds`, what the mean can be. (nan, nan) under two units.
    """
    totals = np.asarray(totals, dtype=float)
    sizes = np.ones_like(totals) if sizes is None else np.asarray(sizes, dtype=float)
    n = totals.size
    if n < 2:
        return (math.nan, math.nan)
    mean = totals.sum() / sizes.sum()
    deviations = (totals - mean * sizes) / sizes.mean()  # mean 0: the t interval of mean + d is mean -+ t sd(d)/sqrt(n)
    return t_interval(mean + deviations, level, bounds)[2:]


SPEARMAN_Z_VARIANCE = 1.06  # Fieller, Hartley & Pearson (1957): Var(atanh r_s) ~ 1.06 / (n - 3), Pearson's 1 / (n - 3)


def fisher_z_interval(r: float, n: int, controlled: int = 0, level: float = 0.95,
                      variance: float = 1.0) -> tuple[float, float]:
    """Fisher z interval of a (partial) correlation r over n units with `controlled` variables held fixed:
    tanh(atanh(r) -+ z_{(1+level)/2} sqrt(variance / (n - 3 - controlled))), inside [-1, 1] by construction;
    `variance` SPEARMAN_Z_VARIANCE for a rank correlation. (nan, nan) for a NaN r or n - 3 - controlled < 1."""
    dof = n - 3 - controlled
    if math.isnan(r) or dof < 1:
        return (math.nan, math.nan)
    half = float(stats.norm.ppf(0.5 + level / 2.0)) * math.sqrt(variance / dof)
    with np.errstate(divide="ignore"):
        z = float(np.arctanh(r))   # +-inf at r = +-1: the interval is that end alone
    return (math.tanh(z - half), math.tanh(z + half))


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
