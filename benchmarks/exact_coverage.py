"""The exact coverage of the two binomial intervals fairaudit reports, per n, over the rates they may meet.

    python benchmarks/exact_coverage.py [--n 10 25 50 100 250 1000]

No simulation: at each n and each rate of a grid (0.02, 0.03, ..., 0.98), the coverage is the sum over k ~
Binomial(n, rate) of P(k) where the interval at k holds the truth.
- Wilson (`stats.wilson_interval`; influence rates): n the contrasts, the truth the rate.
- the exact c/b ratio (`stats.ratio_interval_exact`): n the discordant pairs b + c, c ~ Binomial(n, share), the truth
  the ratio share / (1 - share) (c/b from 0.02 to 49); conditional on n, so its coverage at a study's random b + c
  is an average of these rows' values.
Printed per interval and n: the lowest, mean and highest coverage over the grid and how many of its rates lie
outside 93-97%.
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import stats as st

from fairaudit.analysis.stats import ratio_interval_exact, wilson_interval

RATES = np.round(np.arange(0.02, 0.985, 0.01), 2)  # 97 rates
BAND = (0.93, 0.97)


def coverage(n: int, rate: float, holds) -> float:
    """Exact coverage at `rate`: sum of P(k) over the k whose interval holds the truth (`holds(k)`)."""
    k = np.arange(n + 1)
    return float(np.dot(st.binom.pmf(k, n, rate), [holds(int(i)) for i in k]))


def wilson_row(n: int) -> np.ndarray:
    """Wilson's coverage at each rate of RATES over n units."""
    intervals = [wilson_interval(k, n) for k in range(n + 1)]
    return np.array([coverage(n, rate, lambda k: intervals[k][0] <= rate <= intervals[k][1]) for rate in RATES])


def ratio_row(n: int) -> np.ndarray:
    """The exact c/b interval's coverage at each share of RATES, given n discordant pairs."""
    intervals = [ratio_interval_exact(c, n - c) for c in range(n + 1)]
    ratios = RATES / (1.0 - RATES)
    return np.array([coverage(n, share, lambda c: intervals[c][0] <= ratio <= intervals[c][1])
                     for share, ratio in zip(RATES, ratios)])


def ratio_study_coverage(pairs: int, p_b: float, p_c: float) -> float:
    """The exact c/b interval's coverage of p_c / p_b over a study of `pairs` pairs, its b + c random:
    `ratio_row`'s sum at each d ~ Binomial(pairs, p_b + p_c), a study without a discordant pair a miss."""
    share, ratio = p_c / (p_b + p_c), p_c / p_b
    d = np.arange(1, pairs + 1)
    given = [coverage(int(n), share, lambda c, n=int(n): ratio_interval_exact(c, n - c)[0] <= ratio
                      <= ratio_interval_exact(c, n - c)[1]) for n in d]
    return float(np.dot(st.binom.pmf(d, pairs, p_b + p_c), given))


def markdown(ns: list[int]) -> str:
    """A row per interval and n: lowest, mean, highest coverage (%) and rates outside the band."""
    lines = ["| interval | n | lowest (%) | mean (%) | highest (%) | rates outside 93-97% |",
             "|---|---|---|---|---|---|"]
    for name, row in (("Wilson 95%", wilson_row), ("exact c/b 95% (n = b + c)", ratio_row)):
        for n in ns:
            values = row(n)
            outside = int(((values < BAND[0]) | (values > BAND[1])).sum())
            lines.append(f"| {name} | {n:,} | {100 * values.min():.1f} | {100 * values.mean():.1f} | "
                         f"{100 * values.max():.1f} | {outside} of {len(values)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="*", default=[10, 25, 50, 100, 250, 1000])
    print(markdown(parser.parse_args().n))


if __name__ == "__main__":
    main()
