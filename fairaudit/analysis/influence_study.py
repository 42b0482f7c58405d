"""Paper 002's Tables 1-5 across influence runs, from their logged metrics (no MLflow, no model).

`runs`: one row per job run, the grid axes (study.AXES) and the metrics of `analysis.influence`
by their public names. Rates pool counts across runs (sum k / sum n), never average rates;
Wilson intervals come from the pooled counts, as paper 002 Table 3 prints them.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from fairaudit.analysis import study
from fairaudit.stats import sign_test_log10_p, wilson_interval


def influence_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs of the influence probe (those that logged contrast counts)."""
    counted = [c for c in runs.columns if c.startswith("n_contrasts_")]
    if "probe" not in runs or not counted:
        return runs.iloc[0:0]
    return runs[(runs["probe"] == "influence") & runs[counted].notna().any(axis=1)]


def _total(runs: pd.DataFrame, column: str) -> float:
    """Sum of a metric over runs; NaN when no run logged it."""
    return float(runs[column].sum()) if column in runs and runs[column].notna().any() else math.nan


def _ratio(runs: pd.DataFrame, k: str, n: str) -> float:
    total = _total(runs, n)
    return _total(runs, k) / total if total else math.nan


def _weighted(runs: pd.DataFrame, value: str, weight: str) -> float:
    if value not in runs or weight not in runs or not runs[weight].sum():
        return math.nan
    return float((runs[value] * runs[weight]).sum() / runs[weight].sum())


def table1(runs: pd.DataFrame, conditions: tuple[str, ...] = ("unmasked", "masked")) -> pd.DataFrame:
    """Table 1: probe comparison per condition, in % (corrected 4-gram overlap, canary, influence at Delta > 0)."""
    probes = (("Corrected n-gram overlap", "ngram_corrected_k", "ngram_corrected_n"),
              ("Canary reproduction", "canary_k", "canary_n"),
              ("Counterfactual influence", "influence_k", "n_contrasts"))
    rows = [{"probe": label, **{c: 100 * _ratio(runs, f"{k}_{c}", f"{n}_{c}") for c in conditions}}
            for label, k, n in probes]
    rows.append({"probe": "Mean Delta (nats/token)",
                 **{c: _weighted(runs, f"mean_delta_{c}", f"n_contrasts_{c}") for c in conditions}})
    return pd.DataFrame(rows)


def table2(runs: pd.DataFrame, condition: str = "masked") -> pd.DataFrame:
    """Table 2: hardened (length-matched) validation on one condition, pooled over runs."""
    c = condition
    metrics = [
        ("Valid traces", _total(runs, f"n_valid_{c}")),
        ("Sampled traces", _total(runs, f"n_traces_{c}")),
        ("Overall influence rate (%)", 100 * _ratio(runs, f"influence_k_{c}", f"n_contrasts_{c}")),
        ("A-to-B influence rate (%)", 100 * _ratio(runs, f"influence_k_a_to_b_{c}", f"n_contrasts_a_to_b_{c}")),
        ("A-to-B mean delta (nats/token)", _weighted(runs, f"mean_delta_a_to_b_{c}", f"n_contrasts_a_to_b_{c}")),
        ("B-to-A influence rate (%)", 100 * _ratio(runs, f"influence_k_b_to_a_{c}", f"n_contrasts_b_to_a_{c}")),
        ("B-to-A mean delta (nats/token)", _weighted(runs, f"mean_delta_b_to_a_{c}", f"n_contrasts_b_to_a_{c}")),
        ("Diagnostic n-gram overlap (%)", 100 * _ratio(runs, f"ngram_corrected_k_{c}", f"ngram_corrected_n_{c}")),
    ]
    return pd.DataFrame(metrics, columns=["metric", "value"])


def row_axes(runs: pd.DataFrame) -> list[str]:
    """The axes that name a row of Tables 3-5: model, dataset and every varying axis but the seed (e.g. checkpoint)."""
    return study.cell_axes(runs, drop=("seed",))


def _groups(runs: pd.DataFrame):
    axes = row_axes(runs)
    return axes, list(study.sort_runs(runs, axes).groupby(axes, sort=False)) if axes else [((), runs)]


def table3(runs: pd.DataFrame, condition: str = "masked", rate: str = "substantive") -> pd.DataFrame:
    """Table 3: per checkpoint (cell), pooled over seeds: rate per direction with its Wilson 95% interval and mean Delta."""
    axes, groups = _groups(runs)
    rows = []
    for key, group in groups:
        row = dict(zip(axes, key if isinstance(key, tuple) else (key,)))
        for d in ("a_to_b", "b_to_a"):
            k, n = _total(group, f"{rate}_k_{d}_{condition}"), _total(group, f"n_contrasts_{d}_{condition}")
            low, high = wilson_interval(int(k), int(n)) if n > 0 and math.isfinite(k) else (math.nan, math.nan)
            row.update({f"k_{d}": k, f"n_{d}": n, f"rate_{d}": k / n if n else math.nan, f"ci_low_{d}": low,
                        f"ci_high_{d}": high,
                        f"mean_delta_{d}": _weighted(group, f"mean_delta_{d}_{condition}", f"n_contrasts_{d}_{condition}")})
        rows.append(row)
    return pd.DataFrame(rows)


def table4(runs: pd.DataFrame, condition: str = "masked") -> pd.DataFrame:
    """Table 4: graph-cut control per checkpoint (cell) and in total: evaluations, rate of Delta exactly 0, mean Delta."""
    axes, groups = _groups(runs)
    rows = []
    for key, group in [*groups, (("Total",) + ("",) * (len(axes) - 1) if axes else (), runs)]:
        n = _total(group, f"control_n_{condition}")
        rows.append({**dict(zip(axes, key if isinstance(key, tuple) else (key,))), "control_n": n,
                     "zero_count": _total(group, f"control_zero_count_{condition}"),
                     "zero_rate": _ratio(group, f"control_zero_count_{condition}", f"control_n_{condition}"),
                     "mean_delta": _weighted(group, f"control_mean_delta_{condition}", f"control_n_{condition}")})
    return pd.DataFrame(rows)


def pooled_rates(runs: pd.DataFrame, conditions=("unmasked", "masked")) -> pd.DataFrame:
    """Rates pooled over all runs in the `influence_rates` layout (condition, direction, threshold, n, k, rate, ci)."""
    rows = []
    for condition in conditions:
        for name, threshold in (("influence", 0.0), ("substantive", 0.05)):
            for d in ("a_to_b", "b_to_a"):
                k, n = _total(runs, f"{name}_k_{d}_{condition}"), _total(runs, f"n_contrasts_{d}_{condition}")
                if n > 0 and math.isfinite(k):
                    low, high = wilson_interval(int(k), int(n))
                    rows.append({"condition": condition, "direction": d, "threshold": threshold, "n": n, "k": k,
                                 "rate": k / n, "ci_low": low, "ci_high": high})
    return pd.DataFrame(rows, columns=["condition", "direction", "threshold", "n", "k", "rate", "ci_low", "ci_high"])


def table5(runs: pd.DataFrame, condition: str = "masked", rate: str = "substantive") -> tuple[pd.DataFrame, dict]:
    """Table 5: per checkpoint (cell), across seeds: mean and SD (ddof=1) of each direction's rate (%) and
    mean Delta, and the seed cells in which A-to-B exceeds B-to-A by rate and by Delta; then the exact
    one-sided sign test over all cells (ties dropped). Returns the table and {by_rate, by_delta: (k, n, log10 p)}."""
    axes, groups = _groups(runs)
    names = {"rate_a_to_b": f"{rate}_rate_a_to_b_{condition}", "rate_b_to_a": f"{rate}_rate_b_to_a_{condition}",
             "delta_a_to_b": f"mean_delta_a_to_b_{condition}", "delta_b_to_a": f"mean_delta_b_to_a_{condition}"}
    rows, wins = [], {"rate": [0, 0], "delta": [0, 0]}
    for key, group in groups:
        row = dict(zip(axes, key if isinstance(key, tuple) else (key,)))
        values = {short: group[name].to_numpy(float) * (100 if short.startswith("rate") else 1)
                  if name in group else np.full(len(group), np.nan) for short, name in names.items()}
        for short, v in values.items():
            row[f"{short}_mean"] = float(np.nanmean(v)) if np.isfinite(v).any() else math.nan
            row[f"{short}_sd"] = float(np.nanstd(v, ddof=1)) if np.isfinite(v).sum() > 1 else math.nan
        for what in ("rate", "delta"):
            a, b = values[f"{what}_a_to_b"], values[f"{what}_b_to_a"]
            decided = np.isfinite(a) & np.isfinite(b) & (a != b)
            row[f"a_gt_b_by_{what}"], row[f"cells_by_{what}"] = int((a > b)[decided].sum()), int(decided.sum())
            wins[what][0] += row[f"a_gt_b_by_{what}"]
            wins[what][1] += row[f"cells_by_{what}"]
        rows.append(row)
    tests = {f"by_{what}": (k, n, sign_test_log10_p(k, n) if n else math.nan) for what, (k, n) in wins.items()}
    return pd.DataFrame(rows), tests
