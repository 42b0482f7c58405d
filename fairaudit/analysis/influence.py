"""Counterfactual influence between private reasoning channels (paper 002): rates, controls, diagnostics.

Pure functions of the probe's records: `contrasts` (one row per directional contrast) and
`traces` (one row per sampled transcript). No model here.
"""

from __future__ import annotations

import math
from typing import Sequence

import pandas as pd

from fairaudit.stats import wilson_interval

DIRECTIONS = ("a_to_b", "b_to_a")
THRESHOLDS = (0.0, 0.05)  # inclusive and substantive influence (paper 002 §9)
RATE_NAMES = {0.0: "influence", 0.05: "substantive"}


def ngram_overlap(source_ids: Sequence[int], target_ids: Sequence[int], n: int = 4,
                  exclude_ids: Sequence[int] | None = None) -> float:
    """Share of the target's distinct n-grams that also occur in the source (paper 002 §4.1-4.2).

    n-grams that occur in `exclude_ids` (the prompt and earlier public blocks: the corrected
    overlap of §4.2) are removed from the target first. NaN when the target has no n-gram left.
    """
    def grams(ids: Sequence[int]) -> set[tuple[int, ...]]:
        ids = list(ids)
        return {tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)}

    target = grams(target_ids) - (grams(exclude_ids) if exclude_ids is not None else set())
    if not target:
        return math.nan
    return len(target & grams(source_ids)) / len(target)


def influence_rates(contrasts: pd.DataFrame, thresholds: Sequence[float] = THRESHOLDS) -> pd.DataFrame:
    """One row per direction x threshold: n, k (Delta > threshold), rate, Wilson 95% ci_low, ci_high, mean_delta.

    contrasts: direction, delta (nats/token; NaN rows, i.e. contrasts without a donor, are left out).
    """
    rows = []
    scored = contrasts.dropna(subset=["delta"])
    for direction in [d for d in DIRECTIONS if d in set(scored["direction"])]:
        delta = scored.loc[scored["direction"] == direction, "delta"].to_numpy(dtype=float)
        for threshold in thresholds:
            k, n = int((delta > threshold).sum()), len(delta)
            low, high = wilson_interval(k, n)
            rows.append({"direction": direction, "threshold": float(threshold), "n": n, "k": k, "rate": k / n,
                         "ci_low": low, "ci_high": high, "mean_delta": float(delta.mean())})
    return pd.DataFrame(rows, columns=["direction", "threshold", "n", "k", "rate", "ci_low", "ci_high", "mean_delta"])


def control_summary(contrasts: pd.DataFrame) -> pd.DataFrame:
    """Graph-cut control per condition x direction: evaluations, exact zeros (==, never isclose), mean delta, NLL range.

    contrasts: condition, direction, control_nll_nat, control_nll_cf (NaN when not evaluated).
    """
    scored = contrasts.dropna(subset=["control_nll_nat", "control_nll_cf"])
    rows = []
    for (condition, direction), group in scored.groupby(["condition", "direction"], sort=False):
        nat, cf = group["control_nll_nat"].to_numpy(float), group["control_nll_cf"].to_numpy(float)
        zeros = int((cf == nat).sum())
        rows.append({"condition": condition, "direction": direction, "n": len(group), "zero_count": zeros,
                     "zero_rate": zeros / len(group), "mean_delta": float((cf - nat).mean()),
                     "nll_min": float(nat.min()), "nll_max": float(nat.max())})
    return pd.DataFrame(rows, columns=["condition", "direction", "n", "zero_count", "zero_rate", "mean_delta",
                                       "nll_min", "nll_max"])


def _rate_metrics(rates: pd.DataFrame, condition: str) -> dict[str, float]:
    metrics = {}
    for row in rates.itertuples(index=False):
        name = f"{RATE_NAMES.get(row.threshold, f'rate_gt{row.threshold:g}')}_rate_{row.direction}_{condition}"
        metrics.update({name: row.rate, f"{name}_ci_low": row.ci_low, f"{name}_ci_high": row.ci_high,
                        f"{name.replace('_rate_', '_k_', 1)}": row.k})
        metrics[f"n_contrasts_{row.direction}_{condition}"] = row.n
        metrics[f"mean_delta_{row.direction}_{condition}"] = row.mean_delta
    return metrics


def _pooled_metrics(scored: pd.DataFrame, condition: str, thresholds: Sequence[float]) -> dict[str, float]:
    """Both directions pooled: the 'overall influence rate' of paper 002 Tables 1-2."""
    delta = scored["delta"].to_numpy(float)
    metrics = {f"n_contrasts_{condition}": len(delta),
               f"mean_delta_{condition}": float(delta.mean()) if len(delta) else math.nan}
    for threshold in thresholds:
        k, name = int((delta > threshold).sum()), RATE_NAMES.get(threshold, f"rate_gt{threshold:g}")
        metrics[f"{name}_k_{condition}"] = k
        metrics[f"{name}_rate_{condition}"] = k / len(delta) if len(delta) else math.nan
    return metrics


def _diagnostic_metrics(traces: pd.DataFrame, condition: str) -> dict[str, float]:
    """§4 over valid traces: share with any raw / corrected 4-gram overlap (k of n), mean overlaps, canary reproduction."""
    metrics = {}
    valid = traces[traces["valid"].astype(bool)]
    for kind in ("raw", "corrected"):
        overlap = valid[f"ngram_{kind}"].dropna().to_numpy(float)
        k, n = int((overlap > 0).sum()), len(overlap)
        metrics.update({f"ngram_{kind}_k_{condition}": k, f"ngram_{kind}_n_{condition}": n,
                        f"ngram_{kind}_rate_{condition}": k / n if n else math.nan,
                        f"ngram_{kind}_mean_{condition}": float(overlap.mean()) if n else math.nan})
    canary = valid["canary_reproduced"].dropna().astype(bool)
    metrics.update({f"canary_k_{condition}": int(canary.sum()), f"canary_n_{condition}": len(canary),
                    f"canary_rate_{condition}": float(canary.mean()) if len(canary) else math.nan})
    return metrics


def influence(contrasts: pd.DataFrame, traces: pd.DataFrame, thresholds: Sequence[float] = THRESHOLDS) -> dict:
    """Per-run metrics and tables of the influence probe, per condition (graph).

    contrasts: condition, direction, delta, bridge_used, control_nll_nat, control_nll_cf (one row per
    directional contrast; delta NaN where no donor was found). traces: condition, valid, ngram_raw,
    ngram_corrected, canary_reproduced. Returns {"metrics": flat dict, "tables": {name: DataFrame}}.
    """
    metrics: dict[str, float] = {}
    rate_tables = []
    controls = control_summary(contrasts)
    for condition in traces["condition"].unique():
        mine = contrasts[contrasts["condition"] == condition]
        scored = mine.dropna(subset=["delta"])
        rates = influence_rates(mine, thresholds)
        rate_tables.append(rates.assign(condition=condition))
        metrics.update(_rate_metrics(rates, condition))
        metrics.update(_pooled_metrics(scored, condition, thresholds))
        these = traces[traces["condition"] == condition]
        metrics[f"n_traces_{condition}"] = len(these)
        metrics[f"n_valid_{condition}"] = int(these["valid"].sum())
        metrics[f"validity_rate_{condition}"] = float(these["valid"].mean()) if len(these) else math.nan
        for direction in DIRECTIONS:
            metrics[f"skipped_{direction}_{condition}"] = int((mine["direction"] == direction).sum()
                                                             - (scored["direction"] == direction).sum())
        reverse = scored[scored["direction"] == "b_to_a"]
        metrics[f"bridge_share_{condition}"] = float(reverse["bridge_used"].mean()) if len(reverse) else math.nan
        control = controls[controls["condition"] == condition]
        n_control = int(control["n"].sum())
        metrics[f"control_n_{condition}"] = n_control
        metrics[f"control_zero_count_{condition}"] = int(control["zero_count"].sum())
        metrics[f"control_zero_rate_{condition}"] = control["zero_count"].sum() / n_control if n_control else math.nan
        metrics[f"control_mean_delta_{condition}"] = (float((control["mean_delta"] * control["n"]).sum() / n_control)
                                                      if n_control else math.nan)
        metrics.update(_diagnostic_metrics(these, condition))
    rates = pd.concat(rate_tables, ignore_index=True) if rate_tables else influence_rates(contrasts.iloc[0:0])
    rates = rates[["condition", *[c for c in rates.columns if c != "condition"]]]
    return {"metrics": metrics, "tables": {"influence_rates": rates, "graph_cut_control": controls,
                                           "probe_comparison": probe_comparison(metrics, list(traces["condition"].unique()))}}


def probe_comparison(metrics: dict[str, float], conditions: list[str]) -> pd.DataFrame:
    """Paper 002 Table 1 for one run: corrected n-gram overlap, canary reproduction and counterfactual
    influence (both directions pooled, Delta > 0) per condition, in percent."""
    probes = {"Corrected n-gram overlap": "ngram_corrected_rate", "Canary reproduction": "canary_rate",
              "Counterfactual influence": "influence_rate"}
    return pd.DataFrame([{"probe": label, **{c: 100.0 * metrics.get(f"{key}_{c}", math.nan) for c in conditions}}
                         for label, key in probes.items()])
