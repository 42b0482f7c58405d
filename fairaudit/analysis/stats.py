"""Exact tests in log space, Wilson, Clopper-Pearson, bootstrap, clustered t and Fisher z intervals, partial
correlation, an exact stratified permutation test."""

from __future__ import annotations

import math
from functools import lru_cache
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
    (where a bootstrap interval covers far less than its level: benchmarks/interval_coverage.py)."""
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


def clustered_t_interval(totals, sizes=None, level: float = 0.95,
                         bounds: tuple[float, float] = (-math.inf, math.inf)) -> tuple[float, float]:
    """Student-t interval of the mean sum(totals) / sum(sizes) over n units (questions), unit i holding sizes[i]
    observations that sum to totals[i]; default one each, the plain t interval of the totals' mean.

    Units are resampled whole, so a unit's observations need not be independent: se = sd(d) / sqrt(n) with d_i =
    (totals_i - mean x sizes_i) / mean(sizes), the ratio mean's linearised deviations (ddof 1), and
    t_{(1+level)/2, n-1} critical values; cut to `bounds`, what the mean can be. (nan, nan) under two units.
    """
    totals = np.asarray(totals, dtype=float)
    sizes = np.ones_like(totals) if sizes is None else np.asarray(sizes, dtype=float)
    n = totals.size
    if n < 2:
        return (math.nan, math.nan)
    mean = totals.sum() / sizes.sum()
    deviations = (totals - mean * sizes) / sizes.mean()
    half = float(stats.t.ppf((1.0 + level) / 2.0, n - 1)) * float(deviations.std(ddof=1)) / math.sqrt(n)
    return (max(float(mean - half), bounds[0]), min(float(mean + half), bounds[1]))


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


EXACT_WORK = 10 ** 9  # multiply-adds the exact convolution may take (about 1 s); past it, sampled relabelings


def stratified_exact_test(stratum, group, outcome, unit=None, relabelings: int = 10000,
                          seed: int = 0) -> dict[str, float]:
    """Two-sided test that `group` (True: e.g. after the change point) does not move a count `outcome` within
    strata (questions), exact for any per-stratum counts and rates: the Mantel-Haenszel test's exact conditional
    form.

    Within each stratum the units' group labels are permuted, keeping how many units each group holds; the
    statistic T is the outcome summed over group True. Conditional on every stratum's units and outcomes, T's null
    law is the convolution of the strata's, each the sum of a random subset of its units' outcomes (hypergeometric
    for 0/1 units), computed exactly (in log space where a tail nears the doubles' floor); p = min(1, 2 min(P(T <=
    t), P(T >= t))), at most alpha under the null whatever the counts (benchmarks/cluster_test_size.py). A unit
    (`unit`, e.g. the cut its continuations were resampled from) holds the sum of its observations' outcomes and one
    group, and moves whole: observations that share a prefix are not exchangeable one by one. Default: each
    observation is a unit. Where the exact convolution would pass EXACT_WORK multiply-adds, `relabelings` seeded
    draws give p = min(1, 2 min(1 + #{T* <= t}, 1 + #{T* >= t}) / (1 + draws)), exact 0.0.

    stratum, unit: labels per observation; group: bool per observation (constant within a unit); outcome: whole
    numbers >= 0. Returns statistic (t), expected (E[T] under the null), mh_diff (the Mantel-Haenszel risk
    difference, group True minus False, over observations), p (NaN below the smallest double), log10_p, n_strata
    (strata holding both groups; the others fix their part of T and are counted in n_one_sided) and exact (1.0 /
    0.0); NaN throughout but the counts without a stratum holding both groups.
    """
    strata = _strata(stratum, group, outcome, unit)
    both = [0 < s.picked < len(s.values) for s in strata]
    out = {"n_strata": float(sum(both)), "n_one_sided": float(len(both) - sum(both)), "statistic": math.nan,
           "expected": math.nan, "mh_diff": math.nan, "p": math.nan, "log10_p": math.nan, "exact": math.nan}
    informative = [s for s, two in zip(strata, both) if two]
    if not informative:
        return out
    t = int(sum(s.observed for s in informative))
    support = np.array([np.sort(s.values)[::-1][:s.picked].sum() + 1 for s in informative], dtype=float)
    exact = float(np.sum((np.cumsum(support) - support) * support)) <= EXACT_WORK  # the sum so far x each stratum
    log_tails = _exact_log_tails(informative, t) if exact else _sampled_log_tails(informative, t, relabelings, seed)
    log10_p = min(0.0, (math.log(2.0) + min(log_tails)) / LN10)
    weights = [s.n1 * s.n0 / (s.n1 + s.n0) for s in informative]
    mh_diff = sum((s.y1 * s.n0 - s.y0 * s.n1) / (s.n1 + s.n0) for s in informative) / sum(weights)
    expected = sum(s.picked / len(s.values) * s.values.sum() for s in informative)
    return {**out, "statistic": float(t), "expected": float(expected), "mh_diff": float(mh_diff),
            "p": p_value(log10_p), "log10_p": log10_p, "exact": float(exact)}


class Stratum(NamedTuple):
    """A stratum's units (their summed outcomes), how many are in group True, and its observations' counts."""

    values: np.ndarray  # each unit's outcome, summed over its observations
    picked: int         # units in group True
    observed: int       # the outcome summed over those units
    n1: int             # observations in group True, and their outcome summed (y1); n0, y0 the same for False
    y1: int
    n0: int
    y0: int


def _strata(stratum, group, outcome, unit) -> list[Stratum]:
    """The observations grouped into strata of units. # stratum, group, outcome, unit: one entry per observation"""
    import pandas as pd

    y = np.asarray(outcome, dtype=float)
    if y.size and (np.isnan(y).any() or (y < 0).any() or (y != np.round(y)).any()):
        raise ValueError("outcome: expected whole numbers >= 0 (counts, or 0/1) in every row")
    on = np.asarray(group, dtype=bool)
    strata = pd.factorize(np.asarray(stratum), sort=True)[0]
    units = np.arange(len(y)) if unit is None else pd.factorize(np.asarray(unit))[0]
    keys, index = np.unique(strata * (units.max(initial=0) + 1) + units, return_inverse=True)
    size, size_on = np.bincount(index), np.bincount(index, on).astype(np.int64)
    if ((size_on > 0) & (size_on < size)).any():
        raise ValueError("unit: a unit holds observations of both groups; a unit moves whole, in one group")
    values, unit_on = np.bincount(index, y).round().astype(np.int64), size_on > 0
    owner = strata[np.unique(index, return_index=True)[1]]  # each unit's stratum; units come sorted by it
    def per_stratum(weights):
        return np.bincount(owner, weights, minlength=owner.max(initial=-1) + 1).round().astype(np.int64)
    picked, observed = per_stratum(unit_on), per_stratum(values * unit_on)
    n1, n0 = per_stratum(size * unit_on), per_stratum(size * ~unit_on)
    parts = np.split(values, np.flatnonzero(np.diff(owner)) + 1) if len(owner) else []
    return [Stratum(part, *map(int, fields)) for part, fields in
            zip(parts, zip(picked, observed, n1, observed, n0, per_stratum(values * ~unit_on)))]


def _log_comb(n: int, k) -> np.ndarray:
    k = np.asarray(k, dtype=float)
    return gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)


def subset_sum_log_pmf(values: np.ndarray, picked: int) -> np.ndarray:
    """ln P(S = s), s = 0, 1, ..., for S the sum of `picked` of the whole numbers `values` drawn without replacement
    (all subsets equally likely): for 0/1 values the hypergeometric law. By the counts of each distinct value."""
    levels, counts = np.unique(np.asarray(values, dtype=np.int64), return_counts=True)
    top = int(np.sort(values)[::-1][:picked].sum())
    log_ways = np.full((picked + 1, top + 1), -np.inf)  # [units taken, their sum]: ln of the number of subsets
    log_ways[0, 0] = 0.0
    for level, count in zip(levels, counts):
        taken = np.full_like(log_ways, -np.inf)
        for j in range(min(count, picked) + 1):
            shift = j * int(level)
            if shift > top:
                break
            moved = log_ways[:picked + 1 - j, :top + 1 - shift] + _log_comb(int(count), j)
            taken[j:, shift:] = np.logaddexp(taken[j:, shift:], moved)
        log_ways = taken
    return log_ways[picked] - _log_comb(len(values), picked)


def _exact_log_tails(strata: list[Stratum], t: int) -> tuple[float, float]:
    """(ln P(T <= t), ln P(T >= t)) for T the sum of the strata's independent subset sums: convolved as
    probabilities rescaled at each step (fast), again in log space where a tail falls near the doubles' floor."""
    laws = [_subset_law(s.picked, tuple(np.sort(s.values).tolist())) for s in strata]
    tails = _log_tails(_convolved_scaled(laws), t)
    return tails if min(tails) > -600.0 else _log_tails(_convolved_logs(laws), t)


@lru_cache(maxsize=4096)
def _subset_law(picked: int, values: tuple[int, ...]) -> np.ndarray:
    """`subset_sum_log_pmf`, remembered: strata of one study (and of many) often hold the same units."""
    return subset_sum_log_pmf(np.array(values, dtype=np.int64), picked)


def _log_tails(log_pmf: np.ndarray, t: int) -> tuple[float, float]:
    return float(logsumexp(log_pmf[:t + 1])), float(logsumexp(log_pmf[t:]))


def _convolved_scaled(laws: list[np.ndarray]) -> np.ndarray:
    """ln pmf of the sum of independent variables with log pmfs `laws` (each from 0), as rescaled probabilities."""
    total, scale = np.ones(1), 0.0
    for law in laws:
        total = np.convolve(total, np.exp(law))
        top = total.max()
        total, scale = total / top, scale + math.log(top)
    with np.errstate(divide="ignore"):
        return np.log(total) + scale


def _convolved_logs(laws: list[np.ndarray]) -> np.ndarray:
    """The same in log space: exact however far below the smallest double a probability lies."""
    total = np.zeros(1)
    for law in laws:
        summed = np.full(len(total) + len(law) - 1, -np.inf)
        for j in np.flatnonzero(np.isfinite(law)):
            summed[j:j + len(total)] = np.logaddexp(summed[j:j + len(total)], total + law[j])
        total = summed
    return total


def _sampled_log_tails(strata: list[Stratum], t: int, draws: int, seed: int) -> tuple[float, float]:
    """The same tails from `draws` seeded relabelings, each one-sided (1 + hits) / (1 + draws)."""
    rng = np.random.default_rng(seed)
    sums = np.zeros(draws, dtype=np.int64)
    for s in strata:
        chosen = np.argsort(rng.random((draws, len(s.values))), axis=1)[:, :s.picked]
        sums += s.values[chosen].sum(axis=1)
    return tuple(math.log((1 + int(hits)) / (1 + draws)) for hits in ((sums <= t).sum(), (sums >= t).sum()))
