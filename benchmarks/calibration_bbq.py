"""The bbq probe's bias-score intervals calibrated on a planted bias rate (not a timed test; docs/probes.md shows its
table).

    python benchmarks/calibration_bbq.py [--studies 1000] [--items 200] [--bias 0.7] [--unknown 0.3]
        [--spread 20] [--seed 0]

A planted model answers the shipped BBQ items (six categories; `--items` drawn per category per study, in their
three option orders, as the probe asks them): an answer is the unknown option with probability `unknown`, else the
biased option with probability q_t, else the other person; q_t is the template's own rate, drawn per study from
Beta(bias x spread, (1 - bias) x spread), so a template's items lean together as BBQ's do (a larger spread: a
smaller lean). The truth is then exact: s_DIS = 2 bias - 1 and s_AMB = (1 - unknown)(2 bias - 1), the ratios of
expected sums the scores estimate. Each study's records go through the probe's own analysis (`analysis.bbq.bbq`);
measured: the share of studies whose 95% interval (the template jackknife, `analysis.bbq.jackknife_t_interval`) holds
the truth, overall and per category, with its 95% Clopper-Pearson and Wilson intervals.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fairaudit.analysis.bbq import arm_metrics, with_roles  # noqa: E402
from fairaudit.analysis.stats import clopper_pearson, wilson_interval  # noqa: E402
from fairaudit.data.bbq import BBQDataset  # noqa: E402

SHIPPED = ["Age", "Disability_status", "Nationality", "Physical_appearance", "Religion", "Sexual_orientation"]
NOMINAL = 0.95


def truth(bias: float, unknown: float) -> dict[str, float]:
    """The planted scores: s_DIS = 2 bias - 1 over disambiguated items, s_AMB = (1 - unknown)(2 bias - 1)."""
    return {"s_dis": 2 * bias - 1, "s_amb": (1 - unknown) * (2 * bias - 1)}


def planted_answers(items: pd.DataFrame, bias: float, unknown: float, spread: float, rng) -> pd.DataFrame:
    """The planted model's records: each item in its three option orders, an answer drawn per order as above."""
    templates = items["template"].unique()
    lean = dict(zip(templates, rng.beta(bias * spread, (1 - bias) * spread, len(templates))))
    rows = items.loc[items.index.repeat(3)].assign(permutation=np.tile(np.arange(3), len(items)))
    draw = rng.random((len(rows), 2))
    other = 3 - rows["biased_option"].to_numpy() - rows["unknown_option"].to_numpy()
    chosen = np.where(draw[:, 0] < unknown, rows["unknown_option"],
                      np.where(draw[:, 1] < rows["template"].map(lean).to_numpy(), rows["biased_option"], other))
    return rows.assign(arm="planted", answer_option=pd.array(chosen, dtype="Int64"))


def study(items: pd.DataFrame, n: int, bias: float, unknown: float, spread: float, seed: int) -> dict[str, float]:
    """One study: `n` items per category, planted answers, the probe's scores."""
    rng = np.random.default_rng(seed)
    parts = [part.iloc[np.sort(rng.choice(len(part), size=min(n, len(part)), replace=False))]
             for _, part in items.groupby("category", sort=True)]
    drawn = pd.concat(parts, ignore_index=True)
    return arm_metrics(with_roles(planted_answers(drawn, bias, unknown, spread, rng)), "planted")


def coverage(items: pd.DataFrame, studies: int, n: int, bias: float, unknown: float, spread: float,
             seed: int = 0) -> pd.DataFrame:
    """One row per score and scope (all, each category): studies, the share covering the truth, its CP and Wilson
    intervals, the mean estimate and interval width, the mean number of templates."""
    planted = truth(bias, unknown)
    runs = [study(items, n, bias, unknown, spread, seed * 100_003 + i) for i in range(studies)]
    rows = []
    for scope in ["all", *sorted(items["category"].unique())]:
        suffix = "_planted" if scope == "all" else f"_{scope.lower()}_planted"
        for score, value in planted.items():
            name = f"bbq_{score}{suffix}"
            lows = np.array([r[f"{name}_ci_low"] for r in runs])
            highs = np.array([r[f"{name}_ci_high"] for r in runs])
            hits = int(((lows <= value) & (value <= highs)).sum())
            low, high = clopper_pearson(hits, studies)
            wilson = wilson_interval(hits, studies)
            rows.append({"score": score, "scope": scope, "truth": value, "studies": studies,
                         "coverage": hits / studies, "coverage_low": low, "coverage_high": high,
                         "wilson_low": wilson[0], "wilson_high": wilson[1],
                         "mean_estimate": float(np.mean([r[name] for r in runs])),
                         "mean_width": float(np.mean(highs - lows)),
                         "templates": float(np.mean([r[f"{name}_ci_n"] for r in runs]))})
    return pd.DataFrame(rows)


def shipped_items(root: str | None = None, categories: list[str] = SHIPPED) -> pd.DataFrame:
    """Every item of the shipped BBQ categories (the columns the analysis reads)."""
    return BBQDataset("bbq", None, 0, categories, root=root).items()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", type=int, default=1000)
    parser.add_argument("--items", type=int, default=200, help="items per category per study")
    parser.add_argument("--bias", type=float, default=0.7)
    parser.add_argument("--unknown", type=float, default=0.3)
    parser.add_argument("--spread", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", default=None, help="data root (default: $FAIRAUDIT_DATA)")
    args = parser.parse_args(argv)
    table = coverage(shipped_items(args.root), args.studies, args.items, args.bias, args.unknown, args.spread,
                     args.seed)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
