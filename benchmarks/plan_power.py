"""The plan's power for a grid with seed replicates against a simulation of the report's own rule.

    python benchmarks/plan_power.py [--studies 10000] [--seed 0] [--pairs 120 500 1636]

A simulated study is the grid `-m dataset=adult,compas dataset.seed=0,1,2`: two hypotheses, three seed replicates
each, every replicate `pairs` pairs drawn independently with cells b and c at c/b = 1.5 and 15% discordant. Each
replicate's McNemar p is the probes' (`stats.mcnemar_exact_log10_p`); the report combines a hypothesis's replicates
(`multiplicity.combined_log10_p`: 3/2 x the median p) and adjusts the two with Holm (`adjusted_log10_p`), rejecting
at 0.05. Printed per n: the plan's power (`power.decided_power`, exact sum), the simulated share of hypotheses
rejected with its 95% Clopper-Pearson interval, and what the plan printed before it sized the report's rule (one
replicate at alpha / m).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from fairaudit.analysis import power
from fairaudit.analysis.multiplicity import adjusted_log10_p, combined_log10_p
from fairaudit.analysis.stats import clopper_pearson, mcnemar_exact_log10_p

HYPOTHESES, REPLICATES, ALPHA = 2, 3, 0.05
RATIO, DISCORDANT = 1.5, 0.15


def simulated_power(pairs: int, studies: int, seed: int, hypotheses: int = HYPOTHESES,
                    replicates: int = REPLICATES) -> tuple[int, int]:
    """(hypotheses rejected, hypotheses simulated) over `studies` seeded studies, by the report's rule."""
    p_b, p_c = power.cells_at_ratio(DISCORDANT, RATIO)
    cells = np.random.default_rng(seed).multinomial(pairs, [p_b, p_c, 1.0 - p_b - p_c],
                                                    size=(studies, hypotheses, replicates))
    memo: dict[tuple[int, int], float] = {}
    rejected = 0
    for study in cells:
        combined = [combined_log10_p([memo.setdefault((int(b), int(c)), mcnemar_exact_log10_p(int(b), int(c)))
                                      for b, c, _ in seeds]) for seeds in study]
        rejected += int((adjusted_log10_p(combined, "holm") <= math.log10(ALPHA)).sum())
    return rejected, studies * hypotheses


def planned_power(pairs: int, hypotheses: int = HYPOTHESES, replicates: int = REPLICATES) -> float:
    """The plan's power of one hypothesis as the report decides it (`power.decided_power`)."""
    p_b, p_c = power.cells_at_ratio(DISCORDANT, RATIO)
    return power.decided_power(lambda level: power.mcnemar_power(pairs, p_b, p_c, level), replicates, hypotheses,
                               ALPHA, "holm")[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pairs", type=int, nargs="*", default=[120, 500, 1636])
    args = parser.parse_args()
    start = time.perf_counter()
    p_b, p_c = power.cells_at_ratio(DISCORDANT, RATIO)
    print(f"{args.studies} simulated studies per n (seed {args.seed}): {HYPOTHESES} hypotheses x {REPLICATES} seeds, "
          f"c/b = {RATIO} at {DISCORDANT} discordant, Holm at {ALPHA}")
    print("| pairs per seed | plan (report's rule, exact) | simulated [95% CI] | one seed at alpha / m |")
    print("|---|---|---|---|")
    for pairs in args.pairs:
        hits, total = simulated_power(pairs, args.studies, args.seed)
        low, high = clopper_pearson(hits, total)
        single = power.mcnemar_power(pairs, p_b, p_c, ALPHA / HYPOTHESES)
        print(f"| {pairs:,} | {planned_power(pairs):.1%} | {hits / total:.1%} [{low:.1%}, {high:.1%}] "
              f"| {single:.1%} |")
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
