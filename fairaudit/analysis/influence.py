"""Counterfactual influence between private reasoning channels (paper 002): rates, controls, diagnostics.

Pure functions of the probe's records: `contrasts` (one row per directional contrast) and
`traces` (one row per sampled transcript). No model here.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from fairaudit.analysis.flags import as_flags
from fairaudit.analysis.numbers import cancelled_mean
from fairaudit.analysis.ranges import COUNT, FREE, POSITIVE, SHARE
from fairaudit.analysis.stats import FEW, interval_size, wilson_interval

DIRECTIONS = ("a_to_b", "b_to_a")
THRESHOLDS = (0.0, 0.05)  # inclusive and substantive influence (paper 002 §9)
RATE_NAMES = {0.0: "influence", 0.05: "substantive"}
RATE = "(influence|substantive|rate_gt[^_]+)"  # a threshold's name (RATE_NAMES, else rate_gt<threshold>)
RANGES = {  # every metric of `influence` (analysis.ranges); a direction, condition or block follows the name
    f"{RATE}_rate": SHARE, f"{RATE}_k": COUNT, "n_contrasts": COUNT, "mean_delta": FREE, "n_traces": COUNT,
    "n_valid": COUNT, "validity_rate": SHARE, "truncated_rate": SHARE, "bridge_share": SHARE,
    "ngram_(raw|corrected)_[kn]": COUNT, "ngram_(raw|corrected)_(rate|mean)": SHARE, "canary_[kn]": COUNT,
    "canary_rate": SHARE, "skipped": COUNT, "control_(n|zero_count|differs_k)": COUNT,
    "control_(zero|differs)_rate": SHARE, "control_mean_delta": FREE, "control_nll_(min|max|mean|sd)": POSITIVE,
}
SKIP_REASONS = ("no_donor", "identical", "truncated")  # why a contrast has no donor (probes.influence.donor)
BLOCKS = ("a_private", "a_public", "b_private", "b_public", "a2_private", "a2_public")


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
    """One row per direction x threshold: n, k (Delta > threshold), rate, Wilson 95% ci_low, ci_high, mean_delta,
    few (n below FEW: a rate over so few contrasts is flagged).

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
                         "ci_low": low, "ci_high": high, "mean_delta": cancelled_mean(delta), "few": n < FEW})
    return pd.DataFrame(rows,
                        columns=["direction", "threshold", "n", "k", "rate", "ci_low", "ci_high", "mean_delta", "few"])


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
                     "zero_rate": zeros / len(group), "mean_delta": cancelled_mean(cf - nat),
                     "nll_min": float(nat.min()), "nll_max": float(nat.max())})
    return pd.DataFrame(rows, columns=["condition", "direction", "n", "zero_count", "zero_rate", "mean_delta",
                                       "nll_min", "nll_max"])


def _rate_metrics(rates: pd.DataFrame, condition: str) -> dict[str, float]:
    metrics = {}
    for row in rates.itertuples(index=False):
        name = f"{RATE_NAMES.get(row.threshold, f'rate_gt{row.threshold:g}')}_rate_{row.direction}_{condition}"
        metrics.update({name: row.rate, f"{name}_ci_low": row.ci_low, f"{name}_ci_high": row.ci_high,
                        **interval_size(name, row.n), f"{name.replace('_rate_', '_k_', 1)}": row.k})
        metrics[f"n_contrasts_{row.direction}_{condition}"] = row.n
        metrics[f"mean_delta_{row.direction}_{condition}"] = row.mean_delta
    return metrics


def _pooled_metrics(scored: pd.DataFrame, condition: str, thresholds: Sequence[float]) -> dict[str, float]:
    """Both directions pooled: the 'overall influence rate' of paper 002 Tables 1-2."""
    delta = scored["delta"].to_numpy(float)
    metrics = {f"n_contrasts_{condition}": len(delta),
               f"mean_delta_{condition}": cancelled_mean(delta)}
    for threshold in thresholds:
        k, name = int((delta > threshold).sum()), RATE_NAMES.get(threshold, f"rate_gt{threshold:g}")
        metrics[f"{name}_k_{condition}"] = k
        metrics[f"{name}_rate_{condition}"] = k / len(delta) if len(delta) else math.nan
    return metrics


def _diagnostic_metrics(traces: pd.DataFrame, condition: str) -> dict[str, float]:
    """§4 on valid traces: share with a raw / corrected 4-gram overlap (k of n), mean overlaps, canary reproduction."""
    metrics = {}
    valid = traces[as_flags(traces["valid"], "valid")]
    for kind in ("raw", "corrected"):
        overlap = valid[f"ngram_{kind}"].dropna().to_numpy(float)
        k, n = int((overlap > 0).sum()), len(overlap)
        metrics.update({f"ngram_{kind}_k_{condition}": k, f"ngram_{kind}_n_{condition}": n,
                        f"ngram_{kind}_rate_{condition}": k / n if n else math.nan,
                        f"ngram_{kind}_mean_{condition}": float(overlap.mean()) if n else math.nan})
    canary = as_flags(valid["canary_reproduced"].dropna(), "canary_reproduced")
    metrics.update({f"canary_k_{condition}": int(canary.sum()), f"canary_n_{condition}": len(canary),
                    f"canary_rate_{condition}": float(canary.mean()) if len(canary) else math.nan})
    return metrics


def _skip_metrics(mine: pd.DataFrame, condition: str) -> dict[str, int]:
    """Contrasts without a donor per direction: in all (skipped_<d>) and per reason (skipped_<reason>_<d>).

    mine: direction, delta, skip_reason (absent in records written before reasons were kept: counted as no_donor).
    """
    metrics = {}
    reasons = mine["skip_reason"] if "skip_reason" in mine else pd.Series("no_donor", index=mine.index)
    for direction in DIRECTIONS:
        skipped = (mine["direction"] == direction) & mine["delta"].isna()
        metrics[f"skipped_{direction}_{condition}"] = int(skipped.sum())
        for reason in SKIP_REASONS:
            metrics[f"skipped_{reason}_{direction}_{condition}"] = int(
                (skipped & (reasons.fillna("no_donor") == reason)).sum())
    return metrics


def _truncation_metrics(traces: pd.DataFrame, condition: str) -> dict[str, float]:
    """Share of generated blocks cut by the block budget (and force-closed), in all and per block, over all traces.

    traces: <block>_truncated for the blocks of BLOCKS it has.
    """
    columns = [f"{b}_truncated" for b in BLOCKS if f"{b}_truncated" in traces]
    cut = {c: as_flags(traces[c], c).to_numpy(float) for c in columns}
    flags = np.concatenate(list(cut.values())) if cut else np.array([])
    metrics = {f"truncated_rate_{condition}": float(flags.mean()) if flags.size else math.nan}
    metrics.update({f"truncated_rate_{c.removesuffix('_truncated')}_{condition}": float(cut[c].mean())
                    if len(traces) else math.nan for c in columns})
    return metrics


def _reverse_split(scored: pd.DataFrame, condition: str, thresholds: Sequence[float]) -> dict[str, float]:
    """B->A split by the origin of its target (§6.2): `natural` next A turns and the synthetic `bridge` ones.

    scored: direction, delta, bridge_used (contrasts with a donor). Names: n_contrasts_b_to_a_<origin>_<c>,
    <rate>_k_b_to_a_<origin>_<c>, <rate>_rate_b_to_a_<origin>_<c>, mean_delta_b_to_a_<origin>_<c>.
    """
    reverse = scored[scored["direction"] == "b_to_a"]
    bridged = as_flags(reverse["bridge_used"], "bridge_used")
    metrics = {f"bridge_share_{condition}": float(bridged.mean()) if len(reverse) else math.nan}
    for origin, part in (("natural", reverse[~bridged]), ("bridge", reverse[bridged])):
        delta = part["delta"].to_numpy(float)
        metrics[f"n_contrasts_b_to_a_{origin}_{condition}"] = len(delta)
        metrics[f"mean_delta_b_to_a_{origin}_{condition}"] = cancelled_mean(delta)
        for threshold in thresholds:
            name, k = RATE_NAMES.get(threshold, f"rate_gt{threshold:g}"), int((delta > threshold).sum())
            metrics[f"{name}_k_b_to_a_{origin}_{condition}"] = k
            metrics[f"{name}_rate_b_to_a_{origin}_{condition}"] = k / len(delta) if len(delta) else math.nan
    return metrics


def _control_metrics(mine: pd.DataFrame, controls: pd.DataFrame, condition: str) -> dict[str, float]:
    """§6.3 per condition: evaluations, exact zeros, mean Delta, the natural control NLL's min, max, mean and
    SD (ddof=1), and how many control scores differ (!=) from the primary natural score."""
    control = controls[controls["condition"] == condition]
    n = int(control["n"].sum())
    evaluated = mine.dropna(subset=["control_nll_nat", "control_nll_cf"])
    nat = evaluated["control_nll_nat"].to_numpy(float)
    differs = int((evaluated["control_nll_nat"] != evaluated["nll_nat"]).sum())
    return {
        f"control_n_{condition}": n, f"control_zero_count_{condition}": int(control["zero_count"].sum()),
        f"control_zero_rate_{condition}": control["zero_count"].sum() / n if n else math.nan,
        f"control_mean_delta_{condition}": float((control["mean_delta"] * control["n"]).sum() / n) if n else math.nan,
        f"control_nll_min_{condition}": float(nat.min()) if n else math.nan,
        f"control_nll_max_{condition}": float(nat.max()) if n else math.nan,
        f"control_nll_mean_{condition}": float(nat.mean()) if n else math.nan,
        f"control_nll_sd_{condition}": float(nat.std(ddof=1)) if n > 1 else math.nan,
        f"control_differs_k_{condition}": differs,
        f"control_differs_rate_{condition}": differs / n if n else math.nan,
    }


def influence(contrasts: pd.DataFrame, traces: pd.DataFrame, thresholds: Sequence[float] = THRESHOLDS) -> dict:
    """Per-run metrics and tables of the influence probe, per condition (graph).

    contrasts: condition, direction, delta, nll_nat, bridge_used, skip_reason, control_nll_nat,
    control_nll_cf (one row per directional contrast; delta NaN where no donor was found). traces:
    condition, valid, ngram_raw, ngram_corrected, canary_reproduced, <block>_truncated.
    Returns {"metrics": flat dict, "tables": {name: DataFrame}}.
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
        metrics.update(_skip_metrics(mine, condition))
        metrics.update(_truncation_metrics(these, condition))
        metrics.update(_reverse_split(scored, condition, thresholds))
        metrics.update(_control_metrics(mine, controls, condition))
        metrics.update(_diagnostic_metrics(these, condition))
    rates = pd.concat(rate_tables, ignore_index=True) if rate_tables else influence_rates(contrasts.iloc[0:0])
    rates = rates[["condition", *[c for c in rates.columns if c != "condition"]]]
    return {"metrics": metrics,
            "tables": {"influence_rates": rates, "graph_cut_control": controls,
                       "probe_comparison": probe_comparison(metrics, list(traces["condition"].unique()))}}


def probe_comparison(metrics: dict[str, float], conditions: list[str]) -> pd.DataFrame:
    """Paper 002 Table 1 for one run: raw and corrected n-gram overlap, canary reproduction and counterfactual
    influence (both directions pooled) at Delta > 0 and at Delta > 0.05, per condition, in percent."""
    probes = {"Raw n-gram overlap": "ngram_raw_rate", "Corrected n-gram overlap": "ngram_corrected_rate",
              "Canary reproduction": "canary_rate", "Counterfactual influence (Δ > 0)": "influence_rate",
              "Counterfactual influence (Δ > 0.05)": "substantive_rate"}
    return pd.DataFrame([{"probe": label, **{c: 100.0 * metrics.get(f"{key}_{c}", math.nan) for c in conditions}}
                         for label, key in probes.items()])
