"""An exact stratified permutation test (the position paper's truncation intervention, §5.3): the count of one group's
successes against its law under relabelling within strata, by convolution when it fits, else sampled."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from scipy.special import gammaln, logsumexp

from fairaudit.analysis.stats import LN10, p_value

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
