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
from fairaudit.analysis.stats import FEW, sign_test_log10_p, wilson_interval

# Probe settings that change the numbers: Tables 3-5 keep runs apart that differ in any of them. A run logged
# before a setting existed gets the behaviour it had then (targets with their tags, greedy blocks).
SETTINGS = {"probe.target": "with_tags", "probe.length_match": "exact", "probe.max_block_tokens": None,
            "probe.sampling.temperature": "0", "probe.sampling.top_p": "1", "probe.bridge": None,
            "probe.system_prompt": None, "probe.tags.open": None, "probe.tags.close": None}
SPELLINGS = {"True": "exact", "False": "off"}  # probe.length_match before it took a mode


def _setting(value, default):
    """A logged setting as one spelling: numbers as floats print, booleans of length_match as its modes."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        value = default
    if value is None:
        return "(not logged)"
    try:
        return f"{float(value):g}"
    except ValueError:
        return SPELLINGS.get(str(value), str(value))


def influence_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that logged contrast counts, their SETTINGS in one spelling each."""
    counted = [c for c in runs.columns if c.startswith("n_contrasts_")]
    if not counted:
        return runs.iloc[0:0]
    chosen = runs[runs[counted].notna().any(axis=1)].copy()
    for name, default in SETTINGS.items():
        values = chosen[name] if name in chosen else pd.Series(None, index=chosen.index, dtype=object)
        chosen[name] = [_setting(v, default) for v in values]
    return chosen


def varying_settings(runs: pd.DataFrame) -> list[str]:
    """The SETTINGS that differ across the influence runs."""
    return [name for name in SETTINGS if name in runs and runs[name].nunique() > 1]


def setting_values(runs: pd.DataFrame, name: str) -> str:
    """The values a setting takes across the runs, e.g. 'content' or 'content, with_tags'."""
    return ", ".join(dict.fromkeys(runs[name])) if name in runs else "(not logged)"


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
    """Table 1: probe comparison per condition, in %: raw and corrected 4-gram overlap, canary reproduction, and
    counterfactual influence (both directions pooled) at Δ > 0 and at Δ > 0.05; then the pooled mean Δ."""
    probes = (("Raw n-gram overlap", "ngram_raw_k", "ngram_raw_n"),
              ("Corrected n-gram overlap", "ngram_corrected_k", "ngram_corrected_n"),
              ("Canary reproduction", "canary_k", "canary_n"),
              ("Counterfactual influence (Δ > 0)", "influence_k", "n_contrasts"),
              ("Counterfactual influence (Δ > 0.05)", "substantive_k", "n_contrasts"))
    rows = [{"probe": label, **{c: 100 * _ratio(runs, f"{k}_{c}", f"{n}_{c}") for c in conditions}}
            for label, k, n in probes]
    rows.append({"probe": "Mean Delta (nats/token)",
                 **{c: _weighted(runs, f"mean_delta_{c}", f"n_contrasts_{c}") for c in conditions}})
    return pd.DataFrame(rows)


def _rate_row(runs: pd.DataFrame, label: str, k: str, n: str) -> dict:
    """A Table 2 row of a pooled count: value (%), k, n, the Wilson 95% interval (%) and `few` (n < FEW, n = 0 too:
    no interval at all, as `stats.interval_size` flags it)."""
    total_k, total_n = _total(runs, k), _total(runs, n)
    low, high = (wilson_interval(int(total_k), int(total_n)) if total_n > 0 and math.isfinite(total_k)
                 else (math.nan,) * 2)
    return {"metric": label, "value": 100 * total_k / total_n if total_n else math.nan, "k": total_k, "n": total_n,
            "ci_low": 100 * low, "ci_high": 100 * high, "few": bool(not total_n >= FEW)}


def table2(runs: pd.DataFrame, condition: str = "masked") -> pd.DataFrame:
    """Table 2: hardened (length-matched) validation on one condition, pooled over runs, every rate at both
    thresholds with its counts and Wilson interval. Columns metric, value, k, n, ci_low, ci_high (rates in %), few
    (a rate over fewer than FEW contrasts, where its interval is rough)."""
    c = condition
    rows = [{"metric": "Valid traces", "value": _total(runs, f"n_valid_{c}")},
            {"metric": "Sampled traces", "value": _total(runs, f"n_traces_{c}")}]
    for label, d in (("Overall", ""), ("A-to-B", "_a_to_b"), ("B-to-A", "_b_to_a")):
        for name, threshold in (("influence", "> 0"), ("substantive", "> 0.05")):
            rows.append(_rate_row(runs, f"{label} influence rate, Δ {threshold} (%)", f"{name}_k{d}_{c}",
                                  f"n_contrasts{d}_{c}"))
        if d:
            rows.append({"metric": f"{label} mean delta (nats/token)",
                         "value": _weighted(runs, f"mean_delta{d}_{c}", f"n_contrasts{d}_{c}")})
    rows.append(_rate_row(runs, "Diagnostic n-gram overlap (%)", f"ngram_corrected_k_{c}", f"ngram_corrected_n_{c}"))
    return pd.DataFrame(rows, columns=["metric", "value", "k", "n", "ci_low", "ci_high", "few"])


def row_axes(runs: pd.DataFrame) -> list[str]:
    """The axes that name a row of Tables 3-5: model, dataset, every varying axis but the seed (e.g. checkpoint)
    and every probe setting in SETTINGS that differs across the runs (pooling those would mix numbers)."""
    return study.cell_axes(runs, drop=("seed",)) + varying_settings(runs)


def _groups(runs: pd.DataFrame):
    axes = row_axes(runs)
    return axes, list(study.sort_runs(runs, axes).groupby(axes, sort=False)) if axes else [((), runs)]


def table3(runs: pd.DataFrame, condition: str = "masked", rate: str = "substantive") -> pd.DataFrame:
    """Table 3: per checkpoint (cell), pooled over seeds: rate per direction with its Wilson 95% interval and mean
    Delta; few_<d> flags a rate over fewer than FEW contrasts (or none)."""
    axes, groups = _groups(runs)
    rows = []
    for key, group in groups:
        row = dict(zip(axes, key if isinstance(key, tuple) else (key,)))
        for d in ("a_to_b", "b_to_a"):
            k, n = _total(group, f"{rate}_k_{d}_{condition}"), _total(group, f"n_contrasts_{d}_{condition}")
            low, high = wilson_interval(int(k), int(n)) if n > 0 and math.isfinite(k) else (math.nan, math.nan)
            row.update({f"k_{d}": k, f"n_{d}": n, f"rate_{d}": k / n if n else math.nan, f"ci_low_{d}": low,
                        f"ci_high_{d}": high, f"few_{d}": bool(n < FEW) if math.isfinite(n) else True,
                        f"mean_delta_{d}": _weighted(group, f"mean_delta_{d}_{condition}",
                                                     f"n_contrasts_{d}_{condition}")})
        rows.append(row)
    return pd.DataFrame(rows)


def table4(runs: pd.DataFrame, condition: str = "masked") -> pd.DataFrame:
    """Table 4: graph-cut control per checkpoint (cell) and in total: evaluations, rate of Delta == 0, mean Delta."""
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


def _pooled_sd(runs: pd.DataFrame, c: str) -> float:
    """SD (ddof=1) of the control's natural NLL over every evaluation of every run, from each run's n, mean and SD."""
    n, mean, sd = (runs[f"control_{m}_{c}"].to_numpy(float) if f"control_{m}_{c}" in runs
                   else np.full(len(runs), np.nan) for m in ("n", "nll_mean", "nll_sd"))
    keep = np.isfinite(n) & np.isfinite(mean) & (n > 0)
    n, mean, sd = n[keep], mean[keep], np.where(n[keep] > 1, np.nan_to_num(sd[keep]), 0.0)
    if n.sum() < 2:
        return math.nan
    grand = (n * mean).sum() / n.sum()
    return float(math.sqrt((((n - 1) * sd ** 2).sum() + (n * (mean - grand) ** 2).sum()) / (n.sum() - 1)))


def _extreme(runs: pd.DataFrame, column: str, how: str) -> float:
    if column not in runs or runs[column].isna().all():
        return math.nan
    return float(runs[column].min() if how == "min" else runs[column].max())


def diagnostics(runs: pd.DataFrame, conditions: tuple[str, ...] = ("unmasked", "masked")) -> pd.DataFrame:
    """What paper 002 reports beside its tables, pooled over the runs, per condition: §4's raw and corrected
    4-gram overlap and canary; §6.2's bridge share and B-to-A split by natural and bridged next A turns at
    both thresholds; §6.3's control NLL range, mean and SD and the share of control scores that differ from
    the primary natural score; the share of blocks cut by the budget; the contrasts skipped, by reason.
    Long format: metric, kind (pct: k/n in %, percent, value, count), then per condition its value, k and n."""
    items = [("Raw 4-gram overlap (%)", "pct", "ngram_raw_k", "ngram_raw_n"),
             ("Corrected 4-gram overlap (%)", "pct", "ngram_corrected_k", "ngram_corrected_n"),
             ("Canary reproduction (%)", "pct", "canary_k", "canary_n"),
             ("B-to-A on the bridge (%)", "pct", "n_contrasts_b_to_a_bridge", "n_contrasts_b_to_a")]
    for origin in ("natural", "bridge"):
        items += [(f"B-to-A {origin}, Δ {t} (%)", "pct", f"{name}_k_b_to_a_{origin}", f"n_contrasts_b_to_a_{origin}")
                  for name, t in (("influence", "> 0"), ("substantive", "> 0.05"))]
    items += [("Control evaluations differing from the primary natural NLL (%)", "pct", "control_differs_k",
               "control_n")]
    rows = []
    for label, kind, k, n in items:
        row = {"metric": label, "kind": kind}
        for c in conditions:
            total_k, total_n = _total(runs, f"{k}_{c}"), _total(runs, f"{n}_{c}")
            row.update({c: 100 * total_k / total_n if total_n else math.nan, f"k_{c}": total_k, f"n_{c}": total_n})
        rows.append(row)
    values = [("Control natural NLL, min", lambda c: _extreme(runs, f"control_nll_min_{c}", "min")),
              ("Control natural NLL, max", lambda c: _extreme(runs, f"control_nll_max_{c}", "max")),
              ("Control natural NLL, mean", lambda c: _weighted(runs, f"control_nll_mean_{c}", f"control_n_{c}")),
              ("Control natural NLL, SD", lambda c: _pooled_sd(runs, c)),
              ("Blocks cut by the budget (%)", lambda c: 100 * _weighted(runs, f"truncated_rate_{c}", f"n_traces_{c}"))]
    rows += [{"metric": label, "kind": "percent" if "%" in label else "value", **{c: value(c) for c in conditions}}
             for label, value in values]
    for reason, label in (("identical", "token-identical donors only"), ("no_donor", "no length-matched donor"),
                          ("truncated", "own block cut by the budget (length_match=complete)")):
        for d, direction in (("a_to_b", "A-to-B"), ("b_to_a", "B-to-A")):
            rows.append({"metric": f"{direction} skipped: {label}", "kind": "count",
                         **{c: _total(runs, f"skipped_{reason}_{d}_{c}") for c in conditions}})
    return pd.DataFrame(rows)
