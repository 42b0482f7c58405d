"""Exact tests in log space, Wilson and bootstrap intervals, partial correlation."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from scipy import stats
from scipy.special import gammaln, logsumexp

LN10 = math.log(10.0)


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
) -> tuple[float, float]:
    """Percentile interval of `statistic(indices)` over resamples of `n_units` units with replacement.

    `statistic` receives an index array into the units (pairs, questions...) so paired
    quantities stay paired. Non-finite replicates are dropped.
    """
    if n_units == 0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    values = np.array([statistic(rng.integers(0, n_units, size=n_units)) for _ in range(n_boot)], dtype=float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return (math.nan, math.nan)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return (float(low), float(high))


def partial_correlation(x, y, covariate) -> tuple[float, float]:
    """Pearson correlation of x and y controlling for one covariate, and its two-sided p-value.

    Residual method: x and y are each regressed on (1, covariate); the p-value is the t-test
    of the residual correlation on n - 3 degrees of freedom. Rows with a NaN are dropped;
    (NaN, NaN) with fewer than 4 rows or a constant residual.
    """
    data = np.column_stack([x, y, covariate]).astype(float)
    data = data[~np.isnan(data).any(axis=1)]
    n = len(data)
    if n < 4:
        return math.nan, math.nan
    design = np.column_stack([np.ones(n), data[:, 2]])
    fitted = design @ np.linalg.lstsq(design, data[:, :2], rcond=None)[0]
    residuals = data[:, :2] - fitted
    if (residuals.std(axis=0) <= 1e-10 * np.abs(data[:, :2]).max(axis=0)).any():  # x or y explained by the covariate
        return math.nan, math.nan
    r = float(np.corrcoef(residuals.T)[0, 1])
    dof = n - 3
    t = r * math.sqrt(dof / max(1.0 - r * r, np.finfo(float).tiny))
    return r, float(2.0 * stats.t.sf(abs(t), dof))
