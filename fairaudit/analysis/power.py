"""Statistical power of a study's primary tests and the width of its intervals at a planned n, and the n a target
power or width needs.

Pure: rates and sizes in, probabilities and counts out; no I/O, no model. Each function says whether it is
exact or an approximation:
  McNemar (paired yes/no flips, cells b and c)  exact: the conditional binomial test summed over the
                                                number of discordant pairs, the test `stats.mcnemar_exact_log10_p`
                                                computes
  paired gap (mean of paired differences)       exact for normal differences: the one-sample t-test's
                                                noncentral t law; over one cell's pairs, averaged over the
                                                cell's Binomial count
  a (partial) correlation's test (position)     approximate: Fisher's z, normal with SD 1 / sqrt(n - 3 - controls)
  a rate's Wilson interval (influence rates)    exact: its expected width summed over k ~ Binomial(n, rate), the
                                                interval `stats.wilson_interval` computes
  a hypothesis the report decides             exact for independent replicates and hypotheses alike: its K seed
  (K replicates combined, Holm over m)          replicates' p combined as the report combines them (K / k times
                                                the k-th smallest, k = ceil(K / 2)), then Holm over m hypotheses
                                                (`holm_power`, by exact sum); a lower bound ("at least") for BH, for
                                                hypotheses that differ, or past HOLM_MOST: each at alpha / m, the
                                                Bonferroni level of Holm's first step
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from fairaudit.analysis.stats import wilson_interval

CORRECTIONS = ("none", "holm", "bh")
LARGEST_N = 1_000_000  # the inverse searches no further: a target it cannot reach there is reported as None
HOLM_MOST = 100  # hypotheses `holm_power` sums over exactly (its work grows as their cube); past it, Bonferroni's bound


def family_alpha(alpha: float, tests: int, correction: str) -> float:
    """The level each of `tests` tests is held to under `correction`: alpha itself for `none`, else alpha / tests,
    Bonferroni's level: a p at or below it is rejected by Holm (its first step) and by BH (rank r's threshold is
    r alpha / tests), so a power computed at it is a lower bound of the power under Holm or BH."""
    if correction not in CORRECTIONS:
        raise ValueError(f"correction must be one of {CORRECTIONS}, got {correction!r}")
    if not 0.0 < alpha < 1.0 or tests < 1:
        raise ValueError(f"alpha must be in (0, 1) and tests >= 1, got alpha={alpha}, tests={tests}")
    return alpha if correction == "none" else alpha / tests


def mcnemar_critical_counts(discordant: np.ndarray, alpha: float) -> np.ndarray:
    """Per number of discordant pairs d, the largest k with 2 P(X <= k) <= alpha, X ~ Binomial(d, 1/2): the exact
    two-sided McNemar test rejects when min(b, c) <= k (-1: it cannot reject at that d)."""
    d = np.asarray(discordant, dtype=int)
    k = stats.binom.ppf(alpha / 2.0, d, 0.5).astype(int)  # smallest k with P(X <= k) >= alpha / 2
    return np.where(stats.binom.cdf(k, d, 0.5) <= alpha / 2.0, k, k - 1)


def mcnemar_power(pairs: int, p_b: float, p_c: float, alpha: float = 0.05) -> float:
    """Exact power of the two-sided exact McNemar test over `pairs` pairs whose cells b and c have probabilities
    p_b and p_c: sum over d of P(D = d) P(min(B, C) <= k_d | d), D ~ Binomial(pairs, p_b + p_c) and
    C | d ~ Binomial(d, p_c / (p_b + p_c))."""
    discordance = p_b + p_c
    if pairs < 1 or discordance <= 0.0:
        return 0.0
    d = np.arange(pairs + 1)
    k = mcnemar_critical_counts(d, alpha)
    share_c = p_c / discordance
    rejects = stats.binom.cdf(k, d, share_c) + stats.binom.sf(d - k - 1, d, share_c)
    rejects = np.where(k >= 0, rejects, 0.0)
    return float(np.sum(stats.binom.pmf(d, pairs, discordance) * rejects))


def paired_gap_power(pairs: int, mean_difference: float, sd_difference: float, alpha: float = 0.05) -> float:
    """Power of the two-sided one-sample t-test of paired differences with this mean and standard deviation over
    `pairs` pairs; exact when the differences are normal (the noncentral t law)."""
    if pairs < 2 or sd_difference <= 0.0:
        return 0.0
    df = pairs - 1
    critical = stats.t.ppf(1.0 - alpha / 2.0, df)
    shift = mean_difference / sd_difference * math.sqrt(pairs)
    upper, lower = stats.nct.sf(critical, df, shift), stats.nct.cdf(-critical, df, shift)
    # scipy's noncentral t gives NaN for a tail many SDs out (n = 5,000 at shift 14): there the normal law's tail,
    # below 1e-40, is its value to every printed digit
    upper = upper if math.isfinite(upper) else stats.norm.sf(critical - shift)
    lower = lower if math.isfinite(lower) else stats.norm.cdf(-critical - shift)
    return float(upper + lower)


def first_n(reaches, smallest: int = 1) -> int | None:
    """The n at which `reaches(n)` first holds, found by bisection between `smallest` and the first power of two
    where it holds; None when LARGEST_N does not. Exact for a condition that stays true once it holds."""
    if reaches(smallest):
        return smallest
    low, high = smallest, smallest
    while not reaches(high):  # reaches(low) is false throughout
        if high >= LARGEST_N:
            return None
        low, high = high, min(2 * high, LARGEST_N)
    while high - low > 1:  # not reaches(low), reaches(high)
        middle = (low + high) // 2
        low, high = (low, middle) if reaches(middle) else (middle, high)
    return high


def pairs_for_power(power_at, target: float = 0.8, smallest: int = 1) -> int | None:
    """The n at which `power_at(n)` first reaches `target` (`first_n`). Exact for a power increasing in n (the
    t-test); the exact McNemar test's power saw-tooths in n by under a point, so there it is an n that reaches the
    target whose predecessor does not."""
    if not 0.0 < target < 1.0:
        raise ValueError(f"target power must be in (0, 1), got {target}")
    return first_n(lambda n: power_at(n) >= target, smallest)


def mcnemar_pairs_for_power(p_b: float, p_c: float, alpha: float = 0.05, target: float = 0.8) -> int | None:
    """The pairs the exact McNemar test needs to reach `target` power at cell probabilities p_b, p_c; None when
    p_b = p_c (no effect: its power never passes alpha) or LARGEST_N pairs do not reach it."""
    if p_b == p_c:
        return None
    return pairs_for_power(lambda n: mcnemar_power(n, p_b, p_c, alpha), target)


def paired_gap_pairs_for_power(mean_difference: float, sd_difference: float, alpha: float = 0.05,
                               target: float = 0.8) -> int | None:
    """The pairs the paired t-test needs to reach `target` power at this mean and standard deviation."""
    return pairs_for_power(lambda n: paired_gap_power(n, mean_difference, sd_difference, alpha), target, smallest=2)


def cells_at_ratio(discordance: float, c_b_ratio: float) -> tuple[float, float]:
    """(p_b, p_c) splitting a discordant share so that p_c / p_b = c_b_ratio (the effect `c_b_ratio` names)."""
    p_b = discordance / (1.0 + c_b_ratio)
    return p_b, discordance - p_b


def binomial_mean(value_at, units: int, rate: float) -> float:
    """E[value_at(k)] for k ~ Binomial(units, rate): the sum of P(k) value_at(k) over the k that hold all but 1e-12
    of the probability."""
    low, high = (int(x) for x in stats.binom.ppf([1e-13, 1.0 - 1e-13], units, rate))
    counts = np.arange(max(low, 0), min(high, units) + 1)
    return float(np.dot(stats.binom.pmf(counts, units, rate), [value_at(int(k)) for k in counts]))


def cell_gap_power(pairs: int, share: float, mean_difference: float, sd_difference: float,
                   alpha: float = 0.05) -> float:
    """Power of the t-test of a mean over the pairs of one cell that holds each of `pairs` pairs with chance `share`
    (a contingency cell): `paired_gap_power` at its count m ~ Binomial(pairs, share), averaged; exact when the
    per-pair values are normal (at share 1 it is `paired_gap_power` itself)."""
    return binomial_mean(lambda m: paired_gap_power(m, mean_difference, sd_difference, alpha), pairs, share)


def expected_wilson_width(units: int, rate: float, level: float = 0.95) -> float:
    """Expected width of the Wilson interval of a rate over `units` units: the width at k/units averaged over
    k ~ Binomial(units, rate) (`binomial_mean`)."""
    return binomial_mean(lambda k: np.subtract(*wilson_interval(k, units, level)[::-1]), units, rate)


def units_for_wilson_width(rate: float, width: float, level: float = 0.95) -> int | None:
    """The units at which a rate's expected Wilson interval first narrows to `width`."""
    return first_n(lambda n: expected_wilson_width(n, rate, level) <= width)


def correlation_power(units: int, rho: float, alpha: float = 0.05, controls: int = 0) -> float:
    """Power of the two-sided test of a (partial) correlation rho over `units` units, `controls` variables partialled
    out, by Fisher's z: atanh(r) ~ Normal(atanh(rho), 1 / (units - 3 - controls)); approximate (the normal law of z)."""
    dof = units - 3 - controls
    if dof < 1 or not -1.0 < rho < 1.0:
        return 0.0
    shift, critical = math.atanh(abs(rho)) * math.sqrt(dof), stats.norm.ppf(1.0 - alpha / 2.0)
    return float(stats.norm.sf(critical - shift) + stats.norm.cdf(-critical - shift))


def correlation_units_for_power(rho: float, alpha: float = 0.05, controls: int = 0, target: float = 0.8) -> int | None:
    """The units a (partial) correlation test needs to reach `target` power at rho (`correlation_power`)."""
    if rho == 0.0:
        return None
    return pairs_for_power(lambda n: correlation_power(n, rho, alpha, controls), target, smallest=4 + controls)


def combined_cdf(power_at, replicates: int, level: float) -> float:
    """P(the combined p of `replicates` independent replicates <= level), the report combining them as
    `multiplicity.combined_log10_p` does (K / k times the k-th smallest p, k = ceil(K / 2)): at least k of them at
    or below level k / K, each with chance power_at(level k / K). Exact for independent replicates."""
    k = math.ceil(replicates / 2)
    return float(stats.binom.sf(k - 1, replicates, power_at(min(level * k / replicates, 1.0))))


def holm_power(cdf, tests: int, alpha: float) -> float:
    """The power of one of `tests` independent tests alike under Holm at `alpha`, each p with P(p <= t) = cdf(t):
    E[rejections] / tests, exact. Holm rejects the r smallest p when p_(j) <= alpha / (tests - j + 1) for every
    j <= r, that is when the count N_j of p at or below the j-th threshold is at least j: the law of N_j, step by
    step over the thresholds, sums P(R >= j)."""
    thresholds = alpha / (tests - np.arange(tests))
    counts = np.arange(tests + 1)
    alive, below, total = (counts == 0).astype(float), 0.0, 0.0
    for j, threshold in enumerate(thresholds, start=1):
        at = cdf(threshold)
        share = min(max((at - below) / (1.0 - below), 0.0), 1.0) if below < 1.0 else 0.0
        # [count so far, count now]: the rest's new ones at this threshold, each with chance `share`
        steps = stats.binom.pmf(counts[None, :] - counts[:, None], tests - counts[:, None], share)
        moved = alive @ np.nan_to_num(steps)
        moved[:j] = 0.0
        alive, below, total = moved, at, total + moved.sum()
    return float(total / tests)


def decided_power(power_at, replicates: int, tests: int, alpha: float, correction: str,
                  alike: bool = True) -> tuple[float, bool]:
    """(power, exact) of one hypothesis as the report decides it: its `replicates` p combined (`combined_cdf`), then
    `correction` over `tests` hypotheses. Exact (`holm_power`) for Holm over hypotheses `alike` (independent, each
    with this power) up to HOLM_MOST, and for `none`; else Bonferroni's level alpha / tests, a lower bound (Holm
    and BH reject at least what it rejects; BH at least what Holm does, so Holm's exact power bounds BH's)."""
    def cdf(level: float) -> float:
        return combined_cdf(power_at, replicates, level)

    if correction == "none" or tests == 1:
        return cdf(alpha), True
    if alike and tests <= HOLM_MOST:
        return holm_power(cdf, tests, alpha), correction == "holm"
    return cdf(family_alpha(alpha, tests, correction)), False
