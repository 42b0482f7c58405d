"""Size and power of the before/after-CCP tests beside paper 001's truncation intervention, by simulation, over
designs chosen to break them.

    python benchmarks/cluster_test_size.py [--studies 10000] [--power-studies 2000] [--seed 0] [--designs NAME ...]

A simulated study cuts each question's trajectory at `before` cuts before its CCP and `after` after it and resamples
`samples` continuations per cut; a continuation changes its answer with probability expit(logit(rate) + question +
cut + effect * after): questions differ (question ~ N(0, question_sd)) and so do the cuts of one question (cut ~
N(0, cut_sd), shared by its continuations: they resample one prefix). `late` questions commit late: +1 on the logit
scale and one after-cut fewer (their CCP + 0.15 falls past the text's end, as in the paper); `skew` draws each
question's cut counts from 1..before and 1..after; `kept_before` / `kept_after` drop each continuation whose answer
would not be extracted with that chance (the probe drops them), so the sides can keep different shares.

Five tests of "the change rate is the same before and after CCP":
- chi-square: the paper's (Yates, 2x2), every continuation independent (`ccp_chi_square`);
- sign flip: fairaudit's before issue 38, each question's own after-minus-before rate, signs flipped whole
  (all 2^Q sign vectors up to 16 questions, else `--flips` draws), which takes that difference to be symmetric
  under the null; it is not when a question's two sides differ in size and changes are rare;
- stratified, continuations: `permutation.stratified_exact_test` with every continuation a unit (the hypergeometric
  Mantel-Haenszel form), exact when a question's continuations are exchangeable, which shared prefixes break;
- stratified, cut counts: the same with a cut's continuations moving together, a cut holding its count of
  changes (fairaudit's before the extraction designs): a cut that kept fewer continuations weighs less, which
  breaks it when the sides keep different shares;
- stratified, cut rates: fairaudit's (`ccp_cluster_test`), a cut holding its change rate; where every cut keeps as
  many continuations it is the count test, p for p.
Printed: the share of studies each test rejects at 0.05 and 0.01 with its 95% Clopper-Pearson interval: the size
under effect 0, where `holds` says whether the interval reaches down to alpha; the power under an effect (on the
logit scale: -0.3 takes a 25% change rate to 20%).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import zlib
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy.special import expit, logit

from fairaudit.analysis.permutation import stratified_exact_test
from fairaudit.analysis.position_truncation import ccp_chi_square, ccp_cluster_test
from fairaudit.analysis.stats import clopper_pearson


@dataclass(frozen=True)
class Design:
    """A simulated study's layout and change probabilities."""

    questions: int = 200
    before: int = 2            # cuts before the CCP per question ...
    after: int = 2             # ... and after it
    samples: int = 3           # continuations per cut (they share its prefix)
    rate: float = 0.25         # the change probability at question = cut = 0
    question_sd: float = 1.0
    cut_sd: float = 0.5
    late: float = 0.0          # share of questions that change more (+1 logit) and lose one after-cut
    skew: bool = False         # each question's cut counts drawn from 1..before and 1..after
    effect: float = 0.0        # "after" on the logit scale
    kept_before: float = 1.0   # the chance a continuation's answer is extracted before the CCP ...
    kept_after: float = 1.0    # ... and after it (the others are dropped, as the probe drops them)


PAPER = Design(late=0.4)
ISSUE = Design(questions=20, before=9, after=1, samples=1, rate=0.03, question_sd=0.0, cut_sd=0.0)
DESIGNS = {
    "paper: 200 q, late lose a cut": PAPER,
    "paper, balanced": replace(PAPER, late=0.0),
    "1 after vs 9 before, 3%, 20 q": ISSUE,
    "1 after vs 9 before, 3%, 200 q": replace(ISSUE, questions=200),
    "9 after vs 1 before, 3%, 20 q": replace(ISSUE, before=1, after=9),
    "1 vs 9, 1%, strong questions": replace(ISSUE, questions=100, rate=0.01, question_sd=2.0),
    "skewed counts, 5%": Design(before=8, after=4, samples=1, rate=0.05, skew=True),
    "skewed counts, 3 per cut, 10%": Design(before=6, after=3, rate=0.10, skew=True, cut_sd=1.0),
    "common changes 90%, late": replace(PAPER, rate=0.9),
    "strong questions (SD 3), late": replace(PAPER, question_sd=3.0),
    "strong cut effects, 6 per cut": Design(samples=6, cut_sd=1.5, late=0.4),
    "few questions: 5, late": replace(PAPER, questions=5),
    "few questions: 8, 1 vs 9, 10%": replace(ISSUE, questions=8, rate=0.10, question_sd=1.0),
}
POWER = {
    "paper, effect -0.3": replace(PAPER, effect=-0.3),
    "paper, balanced, effect -0.3": replace(PAPER, late=0.0, effect=-0.3),
    "1 after vs 9 before, 3%, 200 q, effect +1": replace(ISSUE, questions=200, effect=1.0),
    "skewed counts, 3 per cut, 10%, effect -0.5": Design(before=6, after=3, rate=0.10, skew=True, cut_sd=1.0,
                                                         effect=-0.5),
}
EXTRACTION = Design(questions=100, question_sd=0.0, cut_sd=0.0, kept_before=0.95, kept_after=0.80)
DESIGNS |= {
    "extraction 95% before, 80% after": EXTRACTION,
    "extraction 100% before, 60% after": replace(EXTRACTION, kept_before=1.0, kept_after=0.6),
    "paper, late, extraction 90% vs 50%": replace(PAPER, kept_before=0.9, kept_after=0.5),
    "strong cut effects, 6 per cut, extraction 40% vs 100%": Design(samples=6, cut_sd=1.5, kept_before=0.4),
}
POWER |= {"extraction 95% vs 80%, effect -0.3": replace(EXTRACTION, effect=-0.3)}
ALPHAS = (0.05, 0.01)
TESTS = ("chi-square", "sign flip", "stratified, continuations", "stratified, cut counts", "stratified, cut rates")


def simulate(rng: np.random.Generator, design: Design) -> pd.DataFrame:
    """One study's continuations. # -> question_id, offset, changed"""
    d, n = design, design.questions
    late = np.arange(n) < round(d.late * n)
    before = rng.integers(1, d.before + 1, n) if d.skew else np.full(n, d.before)
    after = rng.integers(1, d.after + 1, n) if d.skew else np.full(n, d.after) - (late & (d.after > 1))
    cuts = before + after
    question = np.repeat(np.arange(n), cuts)
    within = np.arange(cuts.sum()) - np.repeat(np.cumsum(cuts) - cuts, cuts)  # 0.. per question, before cuts first
    is_after = within >= before[question]
    offset = np.where(is_after, 0.01 * (within - before[question] + 1), -0.01 * (within + 1))
    logits = logit(d.rate) + 1.0 * late + rng.normal(0.0, d.question_sd, n) if d.question_sd else \
        np.full(n, logit(d.rate)) + 1.0 * late
    p = expit(logits[question] + rng.normal(0.0, d.cut_sd, len(question)) + d.effect * is_after)
    changed = rng.random((len(question), d.samples)) < p[:, None]
    kept = rng.random(changed.shape) < np.where(is_after, d.kept_after, d.kept_before)[:, None]
    rows = pd.DataFrame({"question_id": np.repeat(question, d.samples), "offset": np.repeat(offset, d.samples),
                         "changed": changed.ravel()})
    return rows[kept.ravel()].reset_index(drop=True)


def sign_flip_p(rows: pd.DataFrame, flips: int, seed: int) -> float:
    """The test fairaudit shipped before issue 38: the mean over questions of their own after-minus-before rate,
    two-sided against every sign vector (up to 16 questions) or `flips` seeded ones."""
    ids, index = np.unique(rows["question_id"].to_numpy(), return_inverse=True)
    after, changed = (rows["offset"] > 0).to_numpy(), rows["changed"].to_numpy(float)
    n = [np.bincount(index[after == side], minlength=len(ids)) for side in (False, True)]
    hits = [np.bincount(index[after == side], changed[after == side], minlength=len(ids)) for side in (False, True)]
    both = (n[0] > 0) & (n[1] > 0)
    if not both.any():
        return math.nan
    d = hits[1][both] / n[1][both] - hits[0][both] / n[0][both]
    if len(d) <= 16:
        signs = (np.arange(2 ** len(d))[:, None] >> np.arange(len(d))[None, :]) & 1
    else:
        signs = np.random.default_rng(seed).integers(0, 2, size=(flips, len(d)), dtype=np.int8)
    means = (d.sum() - 2.0 * (signs.astype(float) @ d)) / len(d)
    extreme = int((np.abs(means) >= abs(d.mean()) - 1e-12 * np.abs(d).mean()).sum())
    return extreme / len(means) if len(d) <= 16 else (1 + extreme) / (1 + flips)


def study_p_values(rows: pd.DataFrame, flips: int, seed: int) -> dict[str, float]:
    """Each test's p on one study (NaN where a test has nothing to test: it does not reject)."""
    after = rows["offset"] > 0
    return {"chi-square": ccp_chi_square(rows)[1], "sign flip": sign_flip_p(rows, flips, seed),
            "stratified, continuations": stratified_exact_test(rows["question_id"], after, rows["changed"])["p"],
            "stratified, cut counts": stratified_exact_test(rows["question_id"], after, rows["changed"].astype(int),
                                                            rows["offset"])["p"],
            "stratified, cut rates": ccp_cluster_test(rows)["trunc_ccp_perm_p"]}


def rejection_rates(designs: dict[str, Design], studies: int, flips: int = 2000, seed: int = 0) -> pd.DataFrame:
    """One row per design x test x alpha: the share of `studies` simulated studies rejected, its 95%
    Clopper-Pearson interval and, under a null design, whether that interval reaches down to alpha."""
    out = []
    for name, design in designs.items():
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])  # a design's studies whatever else runs
        p = pd.DataFrame([study_p_values(simulate(rng, design), flips, seed + i) for i in range(studies)])
        for test in TESTS:
            for alpha in ALPHAS:
                hits = int((p[test] <= alpha).sum())
                low, high = clopper_pearson(hits, studies)
                out.append({"design": name, "test": test, "alpha": alpha, "rejected": hits / studies,
                            "ci_low": low, "ci_high": high, "studies": studies, "null": design.effect == 0.0,
                            "holds": low <= alpha if design.effect == 0.0 else math.nan})
        print(f"{name}: " + ", ".join(f"{r['test']} {r['rejected']:.4f}" for r in out[-len(TESTS) * len(ALPHAS):]
                                      if r["alpha"] == ALPHAS[0]), file=sys.stderr, flush=True)   # progress
    return pd.DataFrame(out)


def markdown(rates: pd.DataFrame) -> str:
    """The rates as docs/probes.md shows them: a row per design, a column per test at 0.05 and at 0.01, each the
    share rejected and its interval, a size whose interval lies above alpha in bold."""
    def cell(row) -> str:
        text = f"{row['rejected']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
        return f"**{text}**" if row["holds"] == 0.0 else text

    lines = []
    for alpha in ALPHAS:
        wide = rates[rates["alpha"] == alpha].assign(cell=lambda f: f.apply(cell, axis=1))
        wide = wide.pivot_table(index="design", columns="test", values="cell", aggfunc="first", sort=False)[list(TESTS)]
        lines += [f"| at {alpha:g} | " + " | ".join(TESTS) + " |", "|" + "---|" * (len(TESTS) + 1)]
        lines += [f"| {name} | " + " | ".join(row) + " |" for name, row in wide.iterrows()] + [""]
    return "\n".join(lines).rstrip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=10000, help="simulated studies per null design")
    parser.add_argument("--power-studies", type=int, default=2000, help="simulated studies per design with an effect")
    parser.add_argument("--flips", type=int, default=2000, help="sign vectors drawn by the sign flip past 16 questions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--designs", nargs="*", help="run only these designs (names as printed)")
    args = parser.parse_args()

    def pick(table: dict[str, Design]) -> dict[str, Design]:
        return {name: d for name, d in table.items() if not args.designs or name in args.designs}

    start = time.perf_counter()
    rates = pd.concat([rejection_rates(pick(DESIGNS), args.studies, args.flips, args.seed),
                       rejection_rates(pick(POWER), args.power_studies, args.flips, args.seed + 1)], ignore_index=True)
    print(f"{args.studies} simulated studies per null design, {args.power_studies} per design with an effect, "
          f"seed {args.seed}; rejected share [95% Clopper-Pearson interval], a size above alpha in bold")
    print(markdown(rates))
    held = rates[rates["null"]]
    print("sizes within their interval of alpha or below, by test: " + ", ".join(
        f"{test} {int(part['holds'].sum())}/{len(part)}" for test, part in held.groupby("test", sort=False)))
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
