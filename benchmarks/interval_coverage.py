"""Coverage of the intervals whose assumptions issue 20 questioned, by simulation (not a timed test).

    python benchmarks/interval_coverage.py [--reps 400] [--boot 2000] [--seed 0]

1. The c/b ratio of paper 000 (created over resolved flips) at 1,000 pairs with few resolved pairs:
   pi_b = 0.003 (b ~ 3), pi_c = 0.02, so the true ratio is 6.67. Each replicate draws the four cells,
   then computes the paired bootstrap dropping resamples without a b pair (the old interval), the
   same bootstrap keeping them as +inf (`contingency`'s c_b_ratio_ci_*), and the exact conditional
   Clopper-Pearson interval (c_b_ratio_exact_ci_*). A replicate without any discordant pair counts as
   a miss for every method. Printed: coverage (nominal 0.95), its ratio to the old method's, and the
   share of unbounded intervals.
2. CDPG's per-cell slope interval (the Student t interval of a mean of pair slopes; the percentile bootstrap
   it replaced beside it) at 3, 5, 10 and 30 pairs, slopes drawn from a skewed two-component mixture like
   paper 000's cells (most pairs flat, a few steep): coverage of the true mean. Cells under `stats.FEW` (10)
   pairs are the ones flagged.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from fairaudit.analysis.stats import FEW, bootstrap_ci, ratio_interval_exact, t_interval


def ratio_replicate(rng: np.random.Generator, n: int, pi_b: float, pi_c: float, boot: int, seed: int) -> dict:
    """One simulated study: the intervals of c/b by the three methods."""
    cells = rng.choice(3, size=n, p=[1 - pi_b - pi_c, pi_b, pi_c])   # 0: a or d, 1: b, 2: c
    is_b, is_c = cells == 1, cells == 2

    def ratio(i: np.ndarray) -> float:
        num, den = is_c[i].sum(), is_b[i].sum()
        return num / den if den else math.inf if num else math.nan
    return {"old": bootstrap_ci(ratio, n, boot, seed),
            "kept": bootstrap_ci(ratio, n, boot, seed, keep_infinite=True),
            "exact": ratio_interval_exact(int(is_c.sum()), int(is_b.sum()))}


def covers(interval: tuple[float, float], truth: float) -> bool:
    low, high = interval
    return bool(np.isfinite(low) and low <= truth <= high)


def ratio_coverage(reps: int, boot: int, seed: int, n: int = 1000, pi_b: float = 0.003, pi_c: float = 0.02) -> None:
    rng, truth = np.random.default_rng(seed), pi_c / pi_b
    hits = {"old": 0, "kept": 0, "exact": 0}
    unbounded = dict.fromkeys(hits, 0)
    for r in range(reps):
        for method, interval in ratio_replicate(rng, n, pi_b, pi_c, boot, seed + r).items():
            hits[method] += covers(interval, truth)
            unbounded[method] += interval[1] == math.inf
    print(f"c/b ratio, {n} pairs, pi_b={pi_b} (b ~ {n * pi_b:.0f}), pi_c={pi_c}, true ratio {truth:.2f}; "
          f"{reps} replicates x {boot} resamples; nominal 0.95")
    print(f"  {'method':<32} {'coverage':>9} {'vs old':>7} {'unbounded':>10}")
    labels = {"old": "bootstrap, +inf resamples dropped", "kept": "bootstrap, +inf resamples kept",
              "exact": "exact conditional (Clopper-Pearson)"}
    for method, label in labels.items():
        coverage = hits[method] / reps
        print(f"  {label:<32} {coverage:>9.3f} {coverage / max(hits['old'] / reps, 1e-12):>7.3f} "
              f"{unbounded[method] / reps:>10.3f}")


def slope_coverage(reps: int, boot: int, seed: int, sizes=(3, 5, 10, 30)) -> None:
    rng = np.random.default_rng(seed)
    steep, p_steep = 0.8, 0.2                      # a fifth of the pairs steep, the rest flat with noise
    truth = p_steep * steep
    print(f"CDPG cell slope (mean of pair slopes): the percentile bootstrap it had and the Student t interval it has, "
          f"{reps} replicates x {boot} resamples; flagged below {FEW} pairs")
    print(f"  {'pairs':>5} {'bootstrap':>9} {'t':>9} {'flagged':>8}")
    for n in sizes:
        hits = {"bootstrap": 0, "t": 0}
        for r in range(reps):
            slopes = np.where(rng.random(n) < p_steep, steep, 0.0) + rng.normal(0, 0.05, n)
            hits["bootstrap"] += covers(bootstrap_ci(lambda i: slopes[i].mean(), n, boot, seed + r), truth)
            hits["t"] += covers(t_interval(slopes)[2:], truth)
        print(f"  {n:>5} {hits['bootstrap'] / reps:>9.3f} {hits['t'] / reps:>9.3f} {'yes' if n < FEW else 'no':>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=400)
    parser.add_argument("--boot", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ratio_coverage(args.reps, args.boot, args.seed)
    print()
    slope_coverage(args.reps, args.boot, args.seed)


if __name__ == "__main__":
    main()
