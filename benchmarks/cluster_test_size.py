"""Size and power of the before/after-CCP tests beside paper 001's truncation intervention, by simulation.

    python benchmarks/cluster_test_size.py [--studies 10000] [--power-studies 2000] [--flips 2000] [--seed 0]

A simulated study has the paper's design (§5.3): 200 questions, each cut at CCP - 0.15, - 0.05, + 0.05 and
+ 0.15 with 3 continuations per cut; a continuation changes its answer with probability
expit(question + cut + effect * after). Questions differ (question ~ logit 0.25 + N(0, 1)), and so do the cuts
of one question (cut ~ N(0, 0.5), shared by its 3 continuations: they resample one prefix). 40% of the
questions commit late (CCP > 0.85) and change more often (+1 on the logit scale); in the *unbalanced* design
they lose their CCP + 0.15 cut, which falls beyond the text's end (6 continuations before, 3 after), as in
the paper, where mean CCP is ~0.75; in the *balanced* design every question keeps all four cuts.

Three tests of "the change rate is the same before and after CCP", each at alpha 0.05 and 0.01:
- chi-square: the paper's (Yates, 2x2), every continuation independent (`analysis.position.ccp_chi_square`);
- pooled relabeling: the test fairaudit shipped before issue 27: before and after swapped in whole questions,
  statistic the pooled after-minus-before rate, whose weights move when an unbalanced question is swapped;
- sign flip: fairaudit's (`analysis.position.ccp_cluster_test`): each question's own after-minus-before rate,
  sign-flipped; every question weighs the same whatever its counts.
Printed: the share of studies each test rejects (the size under effect 0, the power under effect < 0, the
on the logit scale: -0.3 takes a 25% change rate to 20%) with its Monte Carlo standard error.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import pandas as pd
from scipy.special import expit, logit

from fairaudit.analysis.position_truncation import OFFSETS, ccp_chi_square, ccp_cluster_test

SCENARIOS = {  # name: (late questions lose their last cut, effect of "after" on the logit scale)
    "null, unbalanced": (True, 0.0),
    "null, balanced": (False, 0.0),
    "effect -0.15, balanced": (False, -0.15),
    "effect -0.3, balanced": (False, -0.3),
    "effect -0.3, unbalanced": (True, -0.3),
}
ALPHAS = (0.05, 0.01)
TESTS = ("chi-square", "pooled relabeling", "sign flip")


def simulate(rng: np.random.Generator, unbalanced: bool, effect: float, n_questions: int = 200,
             late_share: float = 0.4, samples: int = 3) -> pd.DataFrame:
    """One study's continuations. # -> question_id, offset, changed"""
    late = np.arange(n_questions) < round(late_share * n_questions)
    question = logit(0.25) + 1.0 * late + rng.normal(0.0, 1.0, n_questions)
    rows = []
    for offset in OFFSETS:
        kept = ~late if unbalanced and offset == max(OFFSETS) else np.ones(n_questions, dtype=bool)
        cut = rng.normal(0.0, 0.5, n_questions)
        p = expit(question + cut + effect * (offset > 0))
        changed = rng.random((samples, n_questions)) < p
        for sample in range(samples):
            rows.append(pd.DataFrame({"question_id": np.flatnonzero(kept), "offset": offset,
                                      "changed": changed[sample, kept]}))
    return pd.concat(rows, ignore_index=True)


def pooled_relabeling_p(rows: pd.DataFrame, flips: int, seed: int) -> float:
    """The test shipped before issue 27: whole questions relabeled, statistic the pooled difference of rates."""
    after = (rows["offset"] > 0).to_numpy()
    ids, index = np.unique(rows["question_id"].to_numpy(), return_inverse=True)
    changed = rows["changed"].to_numpy(float)
    n = [np.bincount(index[after == side], minlength=len(ids)).astype(float) for side in (False, True)]
    s = [np.bincount(index[after == side], changed[after == side], minlength=len(ids)) for side in (False, True)]
    swap = np.random.default_rng(seed).integers(0, 2, size=(flips, len(ids)), dtype=np.int8).astype(float)
    keep = 1.0 - swap
    with np.errstate(invalid="ignore", divide="ignore"):
        after_rate = (keep @ s[1] + swap @ s[0]) / (keep @ n[1] + swap @ n[0])
        diffs = after_rate - (keep @ s[0] + swap @ s[1]) / (keep @ n[0] + swap @ n[1])
    observed = s[1].sum() / n[1].sum() - s[0].sum() / n[0].sum()
    return (1 + int((np.abs(diffs[np.isfinite(diffs)]) >= abs(observed) - 1e-12).sum())) / (1 + flips)


def study_p_values(rows: pd.DataFrame, flips: int, seed: int) -> dict[str, float]:
    return {"chi-square": ccp_chi_square(rows)[1], "pooled relabeling": pooled_relabeling_p(rows, flips, seed),
            "sign flip": ccp_cluster_test(rows, flips, seed)["trunc_ccp_perm_p"]}


def rejection_rates(studies: int, flips: int, seed: int, scenarios=SCENARIOS, power_studies: int | None = None
                    ) -> pd.DataFrame:
    """One row per scenario x test x alpha: the share of simulated studies rejected (`studies` of each null,
    `power_studies` of each effect; default `studies`), and its SE."""
    out = []
    for number, (name, (unbalanced, effect)) in enumerate(scenarios.items()):
        rng = np.random.default_rng([seed, number])
        count = studies if effect == 0.0 or power_studies is None else power_studies
        p = pd.DataFrame([study_p_values(simulate(rng, unbalanced, effect), flips, seed + i) for i in range(count)])
        for test in TESTS:
            for alpha in ALPHAS:
                rate = float((p[test] <= alpha).mean())
                out.append({"scenario": name, "test": test, "alpha": alpha, "rejected": rate,
                            "se": math.sqrt(rate * (1 - rate) / count), "studies": count})
    return pd.DataFrame(out)


def markdown(rates: pd.DataFrame) -> str:
    """The rates as docs/probes.md shows them: a row per scenario, a column per test and alpha."""
    wide = rates.pivot_table(index="scenario", columns=["test", "alpha"], values="rejected", sort=False)
    header = "| scenario | " + " | ".join(f"{test} at {alpha:g}" for test, alpha in wide.columns) + " |"
    lines = [header, "|" + "---|" * (len(wide.columns) + 1)]
    lines += [f"| {name} | " + " | ".join(f"{v:.3f}" for v in row) + " |" for name, row in wide.iterrows()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=10000, help="simulated studies per null scenario")
    parser.add_argument("--power-studies", type=int, default=2000, help="simulated studies per effect scenario")
    parser.add_argument("--flips", type=int, default=2000, help="relabelings / sign flips per test")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    rates = rejection_rates(args.studies, args.flips, args.seed, power_studies=args.power_studies)
    print(f"{args.studies} simulated studies per null, {args.power_studies} per effect, {args.flips} relabelings "
          f"per test, seed {args.seed}; Monte Carlo SE of a size of 0.05: {math.sqrt(0.05 * 0.95 / args.studies):.4f}")
    print(markdown(rates))
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
