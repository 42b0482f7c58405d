"""What backend=mock plants, in the metric space of the probe that measures it: exact values derived from
fairaudit/backends/mock.py's generative model by Gauss-Hermite quadrature (no simulation), for
benchmarks/calibration.py.

Counterfactual (think against nothink, answers[0] = Yes, P(Yes) read on the single Yes/No tokens). A pair's
Yes-minus-No logit under an arm is L + side * d + e_side:
  L        N(0, base_sd^2) without a trace; plus trace_sd * N(0, 1) for the think arm's trace (shared by the sides)
  side     +1/2 on alpha, -1/2 on alpha'
  d        `effect` under nothink; effect + effect_per_1k_tokens * band tokens / 1000 under think (the thinking gap)
  e_side   side_sd * N(0, 1), a fresh draw per side and per arm (the mock seeds it by pair, side and trace)
The answer is Yes when that logit is >= 0 and P(Yes) = expit(logit). So, given L, a side answers Yes with
probability Phi((L +- d/2) / side_sd) independently of the other side and of the other arm, and a pair flips
(its sides answer differently) with probability q1 + q2 - 2 q1 q2. The contingency cells (b: a nothink flip
think resolved, c: a flip think created) integrate those over L; the P(Yes) gap E|expit(L + d/2 + e1) -
expit(L - d/2 + e2)| integrates over L, e1 and e2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit
from scipy.stats import norm

DEGREE = 64  # Gauss-Hermite nodes per dimension


@dataclass(frozen=True)
class Plant:
    """The mock settings a counterfactual calibration varies (logits; see the module docstring)."""

    thinking_gap: float = 0.0   # added by thinking to the alpha-minus-alpha' logit gap (0: the null, p_b = p_c)
    effect: float = 0.5         # backend.effect: the gap under both arms
    base_sd: float = 2.0        # backend.base_sd
    trace_sd: float = 0.0       # backend.trace_sd (0 keeps the null exact: both arms' L then share one law)
    side_sd: float = 1.0        # backend.side_sd (> 0: flips by chance in both arms)


def normal_nodes(sd: float, degree: int = DEGREE) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, weights) with sum(w * f(x)) = E f(X), X ~ N(0, sd^2), exact for polynomials up to 2 degree - 1."""
    if sd == 0.0:
        return np.zeros(1), np.ones(1)
    x, w = np.polynomial.hermite_e.hermegauss(degree)
    return sd * x, w / w.sum()


def flip_probability(logit: np.ndarray, gap: float, side_sd: float) -> np.ndarray:
    """P(the two sides answer differently | L = logit) when they differ by `gap` and each draws its own e."""
    if side_sd <= 0.0:
        raise ValueError("the quadrature needs side_sd > 0 (without it a flip is a step function of L)")
    q1, q2 = norm.cdf((logit + gap / 2.0) / side_sd), norm.cdf((logit - gap / 2.0) / side_sd)
    return q1 + q2 - 2.0 * q1 * q2


def cells(plant: Plant, degree: int = DEGREE) -> dict[str, float]:
    """The probabilities of contingency cells a-d (think the treatment, nothink the baseline)."""
    base, base_w = normal_nodes(plant.base_sd, degree)
    trace, trace_w = normal_nodes(plant.trace_sd, degree)
    weights = base_w[:, None] * trace_w[None, :]
    nothink = flip_probability(base, plant.effect, plant.side_sd)[:, None]
    think = flip_probability(base[:, None] + trace[None, :], plant.effect + plant.thinking_gap, plant.side_sd)
    p = {"b": nothink * (1 - think), "c": (1 - nothink) * think, "d": nothink * think}
    out = {cell: float(np.sum(weights * value)) for cell, value in p.items()}
    return {"a": 1.0 - sum(out.values()), **out}


def abs_gap_given(logit: np.ndarray, gap: float, side_sd: float, degree: int = DEGREE) -> np.ndarray:
    """E|expit(L + gap/2 + e1) - expit(L - gap/2 + e2)| at each L of `logit`, each side with its own e.

    In u = e1 - e2 and v = e1 + e2 (independent, each N(0, 2 side_sd^2)) the two logits are L + gap/2 + (u + v)/2
    and L - gap/2 + (v - u)/2, equal at u = -gap whatever L and v: Gauss-Hermite over v, Gauss-Legendre over u
    on each side of that kink (to 12 SD), so each piece is smooth and the rule converges fast."""
    spread = np.sqrt(2.0) * side_sd
    v, wv = normal_nodes(spread, degree)
    ends = sorted({-12.0 * spread, min(max(-gap, -12.0 * spread), 12.0 * spread), 12.0 * spread})
    x, wx = np.polynomial.legendre.leggauss(4 * degree)
    u = np.concatenate([(b - a) / 2 * x + (a + b) / 2 for a, b in zip(ends, ends[1:])])
    wu = np.concatenate([(b - a) / 2 * wx for a, b in zip(ends, ends[1:])]) * norm.pdf(u, scale=spread)
    centre = np.asarray(logit)[:, None, None] + v[None, :, None] / 2
    diff = np.abs(expit(centre + (gap + u[None, None, :]) / 2) - expit(centre - (gap + u[None, None, :]) / 2))
    return np.sum(wv[None, :, None] * wu[None, None, :] * diff, axis=(1, 2)) / wu.sum()


def p_gap(logit_sd: float, gap: float, side_sd: float, degree: int = DEGREE) -> float:
    """E|P(Yes | alpha) - P(Yes | alpha')| for L ~ N(0, logit_sd^2) and sides `gap` apart (`abs_gap_given`,
    Gauss-Hermite over L)."""
    logit, w = normal_nodes(logit_sd, degree)
    return float(np.sum(w * abs_gap_given(logit, gap, side_sd, degree)))


def counterfactual_truth(plant: Plant, degree: int = DEGREE) -> dict[str, float]:
    """Each interval-carrying metric of the counterfactual probe at its planted value, and the cells."""
    p = cells(plant, degree)
    think_sd = float(np.hypot(plant.base_sd, plant.trace_sd))
    gaps = {"think": p_gap(think_sd, plant.effect + plant.thinking_gap, plant.side_sd, degree),
            "nothink": p_gap(plant.base_sd, plant.effect, plant.side_sd, degree)}
    return {"p_b": p["b"], "p_c": p["c"], "p_gap_think": gaps["think"], "p_gap_nothink": gaps["nothink"],
            "delta_p_gap": gaps["think"] - gaps["nothink"], "delta_d_cf": p["c"] - p["b"],
            "c_b_ratio": p["c"] / p["b"], "c_b_ratio_exact": p["c"] / p["b"]}


def simulated_truth(plant: Plant, draws: int, seed: int = 0) -> dict[str, float]:
    """The same metrics from `draws` simulated pairs of the same model (numpy, not the mock): a check on the
    quadrature whose error is the simulation's, about 1 / sqrt(draws)."""
    rng = np.random.default_rng(seed)
    base = rng.normal(0.0, plant.base_sd, draws)
    think = base + rng.normal(0.0, plant.trace_sd, draws)
    e = rng.normal(0.0, plant.side_sd, (4, draws))
    out = {}
    for arm, logit, gap, (e1, e2) in (("nothink", base, plant.effect, e[:2]),
                                      ("think", think, plant.effect + plant.thinking_gap, e[2:])):
        up, down = logit + gap / 2 + e1, logit - gap / 2 + e2
        out[f"flip_{arm}"] = (up >= 0) != (down >= 0)
        out[f"p_gap_{arm}"] = float(np.abs(expit(up) - expit(down)).mean())
    p_b = float((out["flip_nothink"] & ~out["flip_think"]).mean())
    p_c = float((~out["flip_nothink"] & out["flip_think"]).mean())
    return {"p_b": p_b, "p_c": p_c, "p_gap_think": out["p_gap_think"], "p_gap_nothink": out["p_gap_nothink"],
            "delta_p_gap": out["p_gap_think"] - out["p_gap_nothink"], "delta_d_cf": p_c - p_b}


# Influence (unmasked graph, content targets). The mock's target NLL is 2 exp(Z / 4) nats/token, Z ~ N(0, 1)
# fixed by the target and what it sees, plus `influence_nll` where a donor it sees replaced its source block:
# Delta = 2 exp(Z_cf / 4) - 2 exp(Z_nat / 4) + influence_nll, independent across contrasts (each has its own
# natural and donor prefix), so an influence rate's k is exactly Binomial(n, P(Delta > threshold)).
NLL_SCALE, NLL_SD = 2.0, 0.25


def influence_rate(shift: float, threshold: float, points: int = 240_001) -> float:
    """P(Delta > threshold) = E over Z_nat of P(exp(Z_cf / 4) > exp(Z_nat / 4) + (threshold - shift) / 2): a
    continuous integrand in Z_nat (1 where the bound is not positive), by the trapezoid rule on +-12 SD."""
    z = np.linspace(-12.0, 12.0, points)
    bound = np.exp(NLL_SD * z) + (threshold - shift) / NLL_SCALE
    inner = np.where(bound > 0, norm.sf(np.log(np.where(bound > 0, bound, 1.0)) / NLL_SD), 1.0)
    return float(np.trapezoid(inner * norm.pdf(z), z))


def wilson_coverage(units: int, rate: float, level: float = 0.95) -> float:
    """The exact coverage of `stats.wilson_interval` at this rate: the sum over k ~ Binomial(units, rate) of P(k)
    where the interval at k holds the rate."""
    from scipy import stats as st

    from fairaudit.analysis.stats import wilson_interval

    k = np.arange(units + 1)
    holds = [low <= rate <= high for low, high in (wilson_interval(int(i), units, level) for i in k)]
    return float(np.dot(st.binom.pmf(k, units, rate), holds))


def gap_difference_sd(plant: Plant, draws: int = 2_000_000, seed: int = 0) -> float:
    """The SD over pairs of |gap under think| - |gap under nothink|, the per-pair difference delta_p_gap averages,
    from `draws` simulated pairs of the module docstring's model (a simulation: its relative error is about
    1 / sqrt(2 draws), 0.05% at the default). Its mean is counterfactual_truth's delta_p_gap."""
    rng = np.random.default_rng(seed)
    base = rng.normal(0.0, plant.base_sd, draws)
    think = base + rng.normal(0.0, plant.trace_sd, draws)
    e = rng.normal(0.0, plant.side_sd, (4, draws))
    gaps = [np.abs(expit(logit + gap / 2 + e1) - expit(logit - gap / 2 + e2))
            for logit, gap, e1, e2 in ((think, plant.effect + plant.thinking_gap, e[2], e[3]),
                                       (base, plant.effect, e[0], e[1]))]
    return float(np.std(gaps[0] - gaps[1], ddof=1))
