"""The pipeline calibrated on planted effects: the real probes and analyses over many seeded studies on
backend=mock, against the truth the mock plants (benchmarks/calibration_truth.py, exact) and what
fairaudit/analysis/power.py predicts (not a timed test; docs/calibration.md shows its tables).

    python benchmarks/calibration.py [--probes counterfactual influence cdpg position] [--studies 500] [--pairs 50]
        [--n-boot 2000] [--influence-studies 300] [--items 25] [--cdpg-studies 150] [--cdpg-pairs 80]
        [--position-studies 300] [--growth-studies 40=600] [--questions 60] [--seed 0] [--workers 1] [--rows PATH]
    python benchmarks/calibration.py --pool PATH-position.csv ...   # the tables of several runs' studies together

Counterfactual (think against nothink): per planted thinking gap (0, the null, and three effects) one mock
(`side_sd` 1, `effect` 0.5, `base_sd` 2, `trace_sd` 0, traces of a fixed 40 tokens, its own seed) answers
studies x pairs distinct Adult pairs through the probe's own records (`decisions.paired_records` on a
`CachingClient` over a temporary store); each study's `pairs` pairs get the probe's own metrics
(`counterfactual.counterfactual_metrics`: contingency, McNemar, the P(Yes) gap, their paired bootstrap intervals
with n_boot resamples). Measured: the share of studies whose exact McNemar p <= 0.05, against
`power.mcnemar_power` at the planted p_b and p_c (at the null that is the exact test's own size, below 0.05); the
share whose delta_p_gap interval excludes 0, against `power.paired_gap_power` at its planted mean and SD (the
t-test's power, an approximation for the probe's bootstrap interval; the SD from a simulation); and
the share of studies whose interval of each metric holds its planted value (nominal 0.95), each with its 95%
Clopper-Pearson interval. Studies are independent: no two pairs share a text, and the mock draws every pair's
logits from its text and the mock's seed.

Influence: benchmarks/calibration_influence.py (Wilson coverage and width at a planted NLL shift). CDPG:
benchmarks/calibration_cdpg.py (each cell's slope interval at a gap planted to grow along the trace). Position:
benchmarks/calibration_position.py (the length test's power at a preference for position A planted to grow with
the trace).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.calibration_common import (  # noqa: E402
    BLOCK,
    TRACE,
    adult_pairs,
    covers,
    mock_backend,
    pct,
    percent_interval,
    quietly,
    share,
)
from benchmarks.calibration_truth import Plant, counterfactual_truth, gap_difference_sd  # noqa: E402
from benchmarks.exact_coverage import ratio_study_coverage  # noqa: E402
from fairaudit.analysis.power import mcnemar_power, paired_gap_power  # noqa: E402

ALPHA, NOMINAL = 0.05, 0.95
THINKING_GAPS = (0.0, 1.5, 2.0, 2.5)
INTERVALS = ("p_gap_think", "p_gap_nothink", "delta_p_gap", "delta_d_cf", "c_b_ratio", "c_b_ratio_exact")


@quietly
def counterfactual_records(plant: Plant, pairs: pd.DataFrame, seed: int, folder: Path) -> pd.DataFrame:
    """The counterfactual probe's records (think against nothink, text columns dropped) of `pairs` on the mock."""
    from fairaudit.probes import AuditContext, ModelSpec
    from fairaudit.probes.decisions import analysed, paired_records
    from fairaudit.prompts.yesno import Arm, Thinking
    from fairaudit.store.client import CachingClient
    from fairaudit.store.results import Store

    backend = mock_backend(plant, seed)
    client = CachingClient(backend, Store(folder / f"calibration-{seed}.sqlite"))
    spec = ModelSpec("tiny_qwen3", Thinking(style="native"), {"enable_thinking": True})
    think, nothink = Arm("think", True, TRACE + 24), Arm("nothink", False, 16)
    ids = pairs["pair_id"].unique()
    out = []
    for start in range(0, len(ids), BLOCK):
        block = pairs[pairs["pair_id"].isin(set(ids[start:start + BLOCK]))]
        data = SimpleNamespace(name="adult", pairs=lambda block=block: block)
        out.append(analysed(paired_records(AuditContext(client, backend.tokenizer, spec, data, think), nothink)))
    return pd.concat(out, ignore_index=True)


def study_rows(records: pd.DataFrame, order: np.ndarray, pairs: int, n_boot: int) -> pd.DataFrame:
    """One row per study of `pairs` consecutive pairs of `order`: the probe's metrics with their intervals."""
    from fairaudit.probes.counterfactual import counterfactual_metrics

    study_of = pd.Series(np.arange(len(order)) // pairs, index=order)
    keep = ["n_pairs", "cell_b", "cell_c", "mcnemar_log10_p", *INTERVALS]
    keep += [f"{name}_ci_{end}" for name in INTERVALS for end in ("low", "high")]
    rows = []
    for study, chunk in records.groupby(records["pair_id"].map(study_of), sort=True):
        metrics = counterfactual_metrics(chunk, "think", "nothink", n_boot, 0)
        metrics["c_b_ratio_exact"] = metrics["c_b_ratio"]
        rows.append({"study": study, **{name: metrics[name] for name in keep}})
    return pd.DataFrame(rows)


def run_plant(thinking_gap: float, studies: int, pairs: int, n_boot: int, seed: int) -> pd.DataFrame:
    """Every study of one planted thinking gap (its mock seeded by `seed` and the gap)."""
    plant = replace(Plant(), thinking_gap=thinking_gap)
    mock_seed = seed * 1000 + round(thinking_gap * 100)
    chosen = adult_pairs(studies * pairs, mock_seed)
    with tempfile.TemporaryDirectory() as folder:
        records = counterfactual_records(plant, chosen, mock_seed, Path(folder))
    out = study_rows(records, chosen["pair_id"].unique(), pairs, n_boot)
    return out.assign(thinking_gap=thinking_gap, pairs=pairs)


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per planted gap: the predicted and measured McNemar rejection rate and every interval's coverage."""
    out = []
    for gap, group in rows.groupby("thinking_gap", sort=True):
        truth = counterfactual_truth(replace(Plant(), thinking_gap=gap))
        pairs, n = int(group["pairs"].iloc[0]), len(group)
        if "n_pairs" in group and (group["n_pairs"] != pairs).any():   # the prediction is for `pairs` pairs
            raise ValueError(f"gap {gap}: a study kept fewer than its {pairs} pairs (an unparsed or cut answer)")
        rejected = int((group["mcnemar_log10_p"] <= math.log10(ALPHA)).sum())
        row = {"thinking_gap": gap, "p_b": truth["p_b"], "p_c": truth["p_c"], "pairs": pairs, "studies": n,
               "predicted": mcnemar_power(pairs, truth["p_b"], truth["p_c"], ALPHA),
               **{f"rejected_{k}": v for k, v in share(rejected, n).items()}}
        excludes = int(((group["delta_p_gap_ci_low"] > 0) | (group["delta_p_gap_ci_high"] < 0)).sum())
        row |= {"gap_predicted": paired_gap_power(pairs, truth["delta_p_gap"], gap_difference_sd(
            replace(Plant(), thinking_gap=gap)), ALPHA), "gap_excludes": excludes / n}
        for name in INTERVALS:
            hits = sum(covers(lo, hi, truth[name]) for lo, hi in zip(group[f"{name}_ci_low"], group[f"{name}_ci_high"]))
            row |= {f"{name}_truth": truth[name], **{f"{name}_{k}": v for k, v in share(hits, n).items()}}
        row["c_b_ratio_exact_expected"] = ratio_study_coverage(pairs, truth["p_b"], truth["p_c"])
        out.append(row)
    return pd.DataFrame(out)


def pooled_coverage(rows: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Each interval's coverage over every study of every planted gap."""
    out = {}
    for name in INTERVALS:
        hits = 0
        for gap, group in rows.groupby("thinking_gap"):
            truth = counterfactual_truth(replace(Plant(), thinking_gap=gap))[name]
            hits += sum(covers(lo, hi, truth) for lo, hi in zip(group[f"{name}_ci_low"], group[f"{name}_ci_high"]))
        out[name] = share(hits, len(rows))
    return out


def markdown(table: pd.DataFrame, pooled: dict[str, dict[str, float]]) -> str:
    """Two tables: McNemar's power (size at gap 0) predicted and measured; each interval's coverage (%)."""
    lines = ["| thinking gap (logit) | p_b | p_c | pairs | studies | predicted (%) | measured (%) [95% CI] | "
             "measured - predicted (points) | delta_p_gap's interval excludes 0 (%) | paired t predicts (%) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.thinking_gap:g} | {r.p_b:.4f} | {r.p_c:.4f} | {r.pairs} | {r.studies} | "
                     f"{pct(r.predicted)} | {percent_interval(r.rejected_share, r.rejected_low, r.rejected_high)} | "
                     f"{100 * (r.rejected_share - r.predicted):+.1f} | {pct(r.gap_excludes)} | "
                     f"{pct(r.gap_predicted)} |")
    lines += ["", "| thinking gap (logit) | " + " | ".join(INTERVALS) + " |", "|---" * (len(INTERVALS) + 1) + "|"]
    for r in table.to_dict("records"):   # the exact c/b interval beside its exact coverage at these cells
        lines.append(f"| {r['thinking_gap']:g} | " + " | ".join(
            f"{pct(r[f'{name}_share'])} (truth {r[f'{name}_truth']:.4g}"
            + (f"; exact {pct(r['c_b_ratio_exact_expected'])})" if name == "c_b_ratio_exact" else ")")
            for name in INTERVALS) + " |")
    lines.append("| all | " + " | ".join(percent_interval(c["share"], c["low"], c["high"]) for c in pooled.values())
                 + " |")
    return "\n".join(lines)


def jobs(args) -> list[tuple]:
    """(function, arguments) of each planted effect's studies, the slowest first."""
    from benchmarks import calibration_cdpg as cdpg
    from benchmarks import calibration_influence as influence
    from benchmarks import calibration_position as position

    out = []
    if "counterfactual" in args.probes:
        out += [(run_plant, (gap, args.studies, args.pairs, args.n_boot, args.seed)) for gap in args.gaps]
    if "influence" in args.probes:
        out += [(influence.run_shift, (shift, args.influence_studies, args.items, args.seed))
                for shift in args.shifts]
    if "cdpg" in args.probes:
        out += [(cdpg.run_gap, (gap, args.cdpg_studies, args.cdpg_pairs, args.seed))
                for gap in args.cdpg_gaps]
    if "position" in args.probes:
        studies = dict(args.growth_studies)
        out += [(position.run_effect, (growth, studies.get(growth, args.position_studies), args.questions, args.seed))
                for growth in args.growths]
    return out


def growth_studies(text: str) -> tuple[float, int]:
    """`--growth-studies` GROWTH=STUDIES, e.g. 40=600: (40.0, 600)."""
    growth, sep, studies = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected GROWTH=STUDIES (e.g. 40=600), got {text!r}")
    return float(growth), int(studies)


def call(job: tuple) -> pd.DataFrame:
    function, arguments = job
    return function(*arguments)


def main() -> None:
    from benchmarks import calibration_cdpg as cdpg
    from benchmarks import calibration_influence as influence
    from benchmarks import calibration_position as position

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", nargs="*", default=["counterfactual", "influence", "cdpg", "position"])
    parser.add_argument("--studies", type=int, default=500, help="counterfactual studies per planted effect")
    parser.add_argument("--pairs", type=int, default=50, help="pairs per counterfactual study")
    parser.add_argument("--n-boot", type=int, default=2000, help="the counterfactual probe's bootstrap resamples")
    parser.add_argument("--gaps", type=float, nargs="*", default=THINKING_GAPS, help="planted thinking gaps (logit)")
    parser.add_argument("--influence-studies", type=int, default=300, help="influence studies per planted shift")
    parser.add_argument("--items", type=int, default=25, help="questions (contrasts per direction) per study")
    parser.add_argument("--shifts", type=float, nargs="*", default=influence.SHIFTS, help="planted NLL shifts")
    parser.add_argument("--cdpg-studies", type=int, default=150, help="cdpg studies per planted thinking gap")
    parser.add_argument("--cdpg-pairs", type=int, default=80, help="pairs per cdpg study")
    parser.add_argument("--cdpg-gaps", type=float, nargs="*", default=cdpg.THINKING_GAPS,
                        help="thinking gaps planted to grow along the trace (logit, over the whole trace)")
    parser.add_argument("--position-studies", type=int, default=300, help="position studies per planted growth")
    parser.add_argument("--questions", type=int, default=60, help="questions (x 4 permutations) per position study")
    parser.add_argument("--growths", type=float, nargs="*", default=position.EFFECTS,
                        help="planted growths of the preference for position A (logit per 1,000 trace tokens)")
    parser.add_argument("--growth-studies", type=growth_studies, nargs="*", default=[], metavar="GROWTH=STUDIES",
                        help="position studies at one planted growth, in place of --position-studies (e.g. 40=600)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--rows", type=Path, help="write every study's row here (CSV, one per probe: <name>-<probe>)")
    parser.add_argument("--pool", type=Path, nargs="*", default=[], metavar="ROWS",
                        help="run nothing: print the tables of the studies in these --rows files (<name>-<probe>.csv, "
                             "e.g. runs of several seeds) together")
    args = parser.parse_args()
    start = time.perf_counter()
    todo = [] if args.pool else jobs(args)
    with ProcessPoolExecutor(args.workers) as pool:
        parts = list(pool.map(call, todo))
    printed = (
        (run_plant, "counterfactual", lambda rows: markdown(summary(rows), pooled_coverage(rows)),
         f"counterfactual on backend=mock: {args.studies} studies x {args.pairs} pairs per planted thinking gap, "
         f"{args.n_boot} bootstrap resamples, seed {args.seed}; McNemar at {ALPHA}, intervals at {NOMINAL}"),
        (influence.run_shift, "influence", lambda rows: influence.markdown(influence.summary(rows)),
         f"\ninfluence on backend=mock (unmasked): {args.influence_studies} studies x {args.items} questions per "
         f"planted shift, seed {args.seed}; Wilson intervals at {NOMINAL}"),
        (cdpg.run_gap, "cdpg", lambda rows: cdpg.markdown(cdpg.summary(rows)),
         f"\ncdpg on backend=mock (K={cdpg.K}): {args.cdpg_studies} studies x {args.cdpg_pairs} pairs per planted "
         f"thinking gap, seed {args.seed}; Student t intervals at {NOMINAL}"),
        (position.run_effect, "position",
         lambda rows: position.markdown(position.summary(rows), position.pooled_coverage(rows)),
         f"\nposition on backend=mock (reason arm): {args.position_studies} studies x {args.questions} questions per "
         f"planted growth, seed {args.seed}; partial correlation's test at {position.ALPHA}, intervals at {NOMINAL}"))
    for runner, name, table, heading in printed:
        found = [part for (function, _), part in zip(todo, parts) if function is runner]
        found += [pd.read_csv(path) for path in args.pool if path.stem.endswith(f"-{name}")]
        if args.pool:
            heading = f"{name}: the {sum(map(len, found))} studies of {len(found)} files pooled"
        if found:
            rows = pd.concat(found, ignore_index=True)
            if args.rows:
                rows.to_csv(args.rows.with_name(f"{args.rows.stem}-{name}.csv"), index=False)
            print(heading)
            print(table(rows))
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
