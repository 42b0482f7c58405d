"""CDPG, the Counterfactual Depth Probability Gap (paper 000 §3.3, §4.3, Appendices B and C).

Each thinking trace is cut into K equal-token segments; at depth k the model answers from
prompt + the first k segments + the answer suffix, giving P^A_k = P(Yes) for each side A.
CDPG_k = P^alpha_k - P^alpha'_k per pair, k = 1..K; k = 0 is the baseline arm's P(Yes).
At k = K, |CDPG_K| is the treatment arm's per-pair disparity D_disp.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from fairaudit.analysis.contingency import CELLS, cell_labels
from fairaudit.analysis.numbers import cancelled, cancelled_mean
from fairaudit.analysis.pairs import ALPHA, ALPHA_PRIME, SIDES, complete_pairs
from fairaudit.analysis.ranges import COUNT, FREE
from fairaudit.analysis.stats import FEW, interval_size, t_interval
from fairaudit.errors import AuditError

RANGES = {"cdpg_n_([abcd]|pairs)": COUNT, "cdpg_slope_[abcd]": FREE}  # a slope of CDPG_k per segment: any sign

GROUP_COLUMNS = ("model", "dataset")
POOLED = "pooled"
DEPTH_COLUMNS = ("pair_id", "side", "K", "k", "p_yes_k")
DISCORDANT_CELLS = ("b", "c")


def segment_cuts(n_tokens: int, K: int) -> list[int]:
    """Token cut points of K equal-token segments: cut_k = ceil(k * n_tokens / K), so cut_K = n_tokens.

    Segment lengths differ by at most one token. A trace shorter than K repeats cuts
    (n_tokens=3, K=5 gives [1, 2, 2, 3, 3]); no cut is 0 unless the trace is empty (all 0).
    """
    if K < 1 or n_tokens < 0:
        raise ValueError(f"segment_cuts needs K >= 1 and n_tokens >= 0, got K={K}, n_tokens={n_tokens}")
    return [-(-k * n_tokens // K) for k in range(1, K + 1)]


def _check_depth_records(depth_records: pd.DataFrame, records: pd.DataFrame, Ks: list[int]) -> None:
    missing = [c for c in DEPTH_COLUMNS if c not in depth_records]
    missing += [c for c in GROUP_COLUMNS if c in records and c not in depth_records]
    if missing:
        raise AuditError(f"depth records lack column(s) {missing}; they have {sorted(depth_records.columns)}")
    present = sorted(int(K) for K in depth_records["K"].unique())
    absent = [K for K in Ks if K not in present]
    if absent:
        raise AuditError(f"depth records hold no trajectories for K={absent}; K values present: {present}")


def _depth_by_side(depth: pd.DataFrame, Ks: list[int]) -> pd.DataFrame:
    """P(Yes) per (pair_id, K, k) with one column per side, only (pair, K) with every k = 1..K on both sides."""
    depth = depth[depth["K"].isin(Ks)]
    wide = depth.pivot_table(index=["pair_id", "K", "k"], columns="side", values="p_yes_k", aggfunc="first")
    wide = wide.reindex(columns=list(SIDES)).dropna()
    wide.columns.name = None
    k = wide.index.get_level_values("k")
    wide = wide[(k >= 1) & (k <= wide.index.get_level_values("K"))]
    n_depths = wide.groupby(level=["pair_id", "K"])[ALPHA].transform("size")
    return wide[n_depths.to_numpy() == wide.index.get_level_values("K")]


def _anchors(pairs: pd.DataFrame, cells: pd.Series, treatment: str, baseline: str) -> pd.DataFrame:
    """In cells b and c, the anchor side keeps its baseline answer under treatment (the other is the mover)."""
    keeps_alpha = pairs[f"{treatment}_{ALPHA}"] == pairs[f"{baseline}_{ALPHA}"]
    anchor = pd.Series(np.where(keeps_alpha, ALPHA, ALPHA_PRIME), index=pairs.index)
    kept = np.where(keeps_alpha, pairs[f"{treatment}_{ALPHA}"], pairs[f"{treatment}_{ALPHA_PRIME}"])
    answer = pd.Series(kept, index=pairs.index)
    discordant = cells.isin(DISCORDANT_CELLS)
    return pd.DataFrame({"anchor": anchor.where(discordant), "anchor_answer": answer.where(discordant)})


def _group_trajectories(
    depth: pd.DataFrame, records: pd.DataFrame, treatment: str, baseline: str, Ks: list[int], atol: float
) -> pd.DataFrame:
    """Trajectories of the pairs of one (model, dataset) group; columns as in `trajectories`."""
    pairs = complete_pairs(records, treatment, baseline)
    cells = cell_labels(pairs, treatment, baseline)
    if "arm" in depth:
        depth = depth[depth["arm"] == treatment]
    by_side = _depth_by_side(depth[depth["pair_id"].isin(pairs.index)], Ks).reset_index()
    start = by_side.loc[by_side["k"] == 1, ["pair_id", "K"]].assign(k=0)
    start[ALPHA] = start["pair_id"].map(pairs[f"p_{baseline}_{ALPHA}"]).to_numpy()
    start[ALPHA_PRIME] = start["pair_id"].map(pairs[f"p_{baseline}_{ALPHA_PRIME}"]).to_numpy()
    traj = pd.concat([start, by_side], ignore_index=True)
    traj = traj.rename(columns={ALPHA: "p_alpha", ALPHA_PRIME: "p_alpha_prime"})
    traj = traj.join(pd.DataFrame({"cell": cells}).join(_anchors(pairs, cells, treatment, baseline)), on="pair_id")
    traj["K"] = traj["K"].astype(int)
    traj["k"] = traj["k"].astype(int)
    traj["depth"] = traj["k"] / traj["K"]
    traj["cdpg"] = traj["p_alpha"] - traj["p_alpha_prime"]
    traj["abs_cdpg"] = traj["cdpg"].abs()
    _check_final_gap(traj, pairs, treatment, atol)
    return traj.sort_values(["K", "pair_id", "k"], ignore_index=True)


def _check_final_gap(traj: pd.DataFrame, pairs: pd.DataFrame, treatment: str, atol: float) -> None:
    """Raise unless |CDPG_K| equals the treatment arm's D_disp = |p_yes_alpha - p_yes_alpha'| (to atol), every pair."""
    final = traj[traj["k"] == traj["K"]]
    d_disp = (pairs[f"p_{treatment}_{ALPHA}"] - pairs[f"p_{treatment}_{ALPHA_PRIME}"]).abs()
    gap = (final["abs_cdpg"] - final["pair_id"].map(d_disp).to_numpy()).abs()
    bad = final[~(gap <= atol)]
    if len(bad):
        worst = gap.loc[bad.index].idxmax()
        pair_id, K = final.loc[worst, ["pair_id", "K"]].tolist()
        raise AuditError(
            f"|CDPG_K| differs from the {treatment} arm's D_disp on {len(bad)} of {len(final)} (pair, K) trajectories "
            f"(largest {gap[worst]:.3g} at pair_id={pair_id!r}, K={K}); "
            f"the depth read at k=K must score the same full trace as the {treatment} records' p_yes "
            f"(tolerance {atol:g})"
        )


def trajectories(
    depth_records: pd.DataFrame,
    records: pd.DataFrame,
    treatment: str = "think",
    baseline: str = "nothink",
    Ks: Sequence[int] = (10,),
    atol: float = 1e-9,
) -> pd.DataFrame:
    """Per pair, K and depth k = 0..K: each side's P(Yes), CDPG_k, the pair's cell and anchor side.

    depth_records: pair_id, side, K, k, p_yes_k [, arm, model, dataset]; records: the long records.
    Pairs are those of `complete_pairs` with every k = 1..K scored on both sides; k = 0 is
    the baseline arm. Raises AuditError if |CDPG_K| departs from D_disp of the treatment arm by more than atol.
    # -> [model, dataset,] pair_id, K, k, depth, p_alpha, p_alpha_prime, cdpg, abs_cdpg, cell, anchor, anchor_answer
    """
    Ks = sorted(set(int(K) for K in Ks))
    _check_depth_records(depth_records, records, Ks)
    group_cols = [c for c in GROUP_COLUMNS if c in records]
    if not group_cols:
        return _group_trajectories(depth_records, records, treatment, baseline, Ks, atol)
    parts = []
    for key, group in records.groupby(group_cols, sort=True):
        in_group = (depth_records[group_cols] == pd.Series(key, index=group_cols)).all(axis=1)
        part = _group_trajectories(depth_records[in_group], group, treatment, baseline, Ks, atol)
        parts.append(part.assign(**dict(zip(group_cols, key))))
    traj = pd.concat(parts, ignore_index=True)
    return traj[group_cols + [c for c in traj.columns if c not in group_cols]]


def _with_scopes(frame: pd.DataFrame, group_cols: list[str], summarise) -> pd.DataFrame:
    """summarise(frame) over all pairs and, when group columns exist, per (model, dataset); pooled rows say "pooled"."""
    if not group_cols:
        return summarise(frame)
    parts = [summarise(frame).assign(**{c: POOLED for c in group_cols})]
    for key, part in frame.groupby(group_cols, sort=True):
        parts.append(summarise(part).assign(**dict(zip(group_cols, key))))
    table = pd.concat(parts, ignore_index=True)
    return table[group_cols + [c for c in table.columns if c not in group_cols]]


def _cell_trajectories(traj: pd.DataFrame) -> pd.DataFrame:
    """Mean |CDPG_k| per (K, cell, k).  # -> K, cell, k, depth, n, mean_abs_cdpg"""
    grouped = traj.groupby(["K", "cell", "k"])
    means = grouped.agg(depth=("depth", "first"), n=("pair_id", "size"), mean_abs_cdpg=("abs_cdpg", "mean"))
    return means.reset_index()


def _side_trajectories(traj: pd.DataFrame) -> pd.DataFrame:
    """Mean P(Yes) of anchor and mover sides in cells b and c.  # -> K, cell, anchor_answer, role, k, depth, n, p_yes"""
    rows = traj[traj["cell"].isin(DISCORDANT_CELLS)]
    roles = {side: np.where(rows["anchor"] == side, "anchor", "mover") for side in SIDES}
    sides = pd.concat([rows.assign(p_yes=rows[f"p_{side}"], role=roles[side]) for side in SIDES], ignore_index=True)
    grouped = sides.groupby(["K", "cell", "anchor_answer", "role", "k"])
    return grouped.agg(depth=("depth", "first"), n=("pair_id", "size"), p_yes=("p_yes", "mean")).reset_index()


def pair_slopes(traj: pd.DataFrame, first_k: int = 1) -> pd.DataFrame:
    """OLS slope of |CDPG_k| on k/K over k = first_k..K, per pair and K (NaN with fewer than two depths).

    first_k = 1 fits the trace's depths only; first_k = 0 also the baseline arm at k = 0 (the
    paper leaves open which it fitted). Every pair of a K shares the same depths, so a cell's
    mean of these slopes equals the slope of the cell's mean trajectory. A flat trajectory's slope is 0, not the
    rounding of its centred sum (-5.3e-18): `numbers.cancelled` at the scale of its |CDPG| over its depth span.
    # -> [model, dataset,] pair_id, K, cell, slope
    """
    keys = [c for c in GROUP_COLUMNS if c in traj] + ["pair_id", "K", "cell"]
    rows = traj[traj["k"] >= first_k]
    by_pair = rows.groupby(keys)
    centred = rows["depth"] - by_pair["depth"].transform("mean")
    covariance = (centred * rows["abs_cdpg"]).groupby([rows[c] for c in keys]).sum()
    variance = (centred**2).groupby([rows[c] for c in keys]).sum()
    slope = covariance / variance.where(variance > 0)
    scale = (by_pair["abs_cdpg"].max() / (by_pair["depth"].max() - by_pair["depth"].min())).reindex(slope.index)
    return pd.Series(cancelled(slope.to_numpy(), scale.to_numpy()), index=slope.index, name="slope").reset_index()


def _cell_slopes(slopes: pd.DataFrame) -> pd.DataFrame:
    """Cell slope (mean of pair slopes) per (K, cell) with its Student t 95% interval over the cell's pairs
    (`stats.t_interval`; none for one pair); `few` flags a cell of fewer than FEW pairs.

    # -> K, cell, n, slope, ci_low, ci_high, few
    """
    rows = []
    for (K, cell), part in slopes.groupby(["K", "cell"]):
        values = part["slope"].to_numpy(float)
        scale = np.abs(values).max() if len(values) else 0.0  # pair slopes of either sign that cancel leave rounding
        _, _, low, high = t_interval(values)
        rows.append({"K": K, "cell": cell, "n": len(values), "slope": cancelled_mean(values),
                     "ci_low": cancelled(low, scale), "ci_high": cancelled(high, scale), "few": len(values) < FEW})
    return pd.DataFrame(rows, columns=["K", "cell", "n", "slope", "ci_low", "ci_high", "few"])


def _k_sensitivity(slopes_table: pd.DataFrame, k_list: Sequence[int], group_cols: list[str]) -> pd.DataFrame:
    """Appendix C, Table 6: one row per ([model, dataset,] cell), columns n_k{K} and slope_k{K} for K in k_list."""
    rows = slopes_table[slopes_table["K"].isin(list(k_list))]
    wide = rows.pivot_table(index=group_cols + ["cell"], columns="K", values=["n", "slope"], aggfunc="first",
                            sort=False)
    wide.columns = [f"{value}_k{K}" for value, K in wide.columns]
    ordered = [f"{value}_k{K}" for K in sorted(set(k_list)) for value in ("n", "slope")]
    return wide.reindex(columns=ordered).reset_index()


def _pooled_lookup(table: pd.DataFrame, group_cols: list[str]):
    """value(K, cell, column) from a slopes table's pooled rows; NaN where the cell is absent."""
    for c in group_cols:
        table = table[table[c] == POOLED]
    by_key = table.set_index(["K", "cell"])

    def value(segments: int, cell: str, column: str) -> float:
        return float(by_key.at[(segments, cell), column]) if (segments, cell) in by_key.index else math.nan

    return value


def _slope_metrics(slopes: pd.DataFrame, from0: pd.DataFrame, sensitivity: pd.DataFrame, K: int,
                   k_list: Sequence[int], group_cols: list[str]) -> dict:
    """Pooled metrics at the headline K, from k = 0, and per K in k_list (names in `cdpg`)."""
    value, value0, value_k = (_pooled_lookup(t, group_cols) for t in (slopes, from0, sensitivity))
    m: dict = {}
    for cell in CELLS:
        n = value(K, cell, "n")
        m[f"cdpg_n_{cell}"] = 0 if math.isnan(n) else int(n)
        for suffix, lookup in (("", value), ("_from0", value0)):
            m[f"cdpg_slope_{cell}{suffix}"] = lookup(K, cell, "slope")
            m[f"cdpg_slope_{cell}{suffix}_ci_low"] = lookup(K, cell, "ci_low")
            m[f"cdpg_slope_{cell}{suffix}_ci_high"] = lookup(K, cell, "ci_high")
            m |= interval_size(f"cdpg_slope_{cell}{suffix}", m[f"cdpg_n_{cell}"])  # the cell's pairs
        for segments in sorted(set(k_list)):
            m[f"cdpg_slope_{cell}_k{segments}"] = value_k(segments, cell, "slope")
    m["cdpg_n_pairs"] = sum(m[f"cdpg_n_{cell}"] for cell in CELLS)
    return m


def subsample_pairs(traj: pd.DataFrame, n: int | None, seed: int = 0) -> pd.DataFrame:
    """The trajectories of `n` pairs drawn without replacement (seeded) per (model, dataset); all when n is None.

    Appendix C's "rerun subsample": the K-sensitivity of Table 6 was refitted on a subsample.
    """
    if n is None:
        return traj
    group_cols = [c for c in GROUP_COLUMNS if c in traj]
    keys = traj[group_cols + ["pair_id"]].drop_duplicates()
    groups = keys.groupby(group_cols, sort=True) if group_cols else [((), keys)]
    chosen = pd.concat([g.sample(n=min(n, len(g)), random_state=seed) for _, g in groups])
    return traj.merge(chosen, on=group_cols + ["pair_id"])


def cdpg(
    depth_records: pd.DataFrame,
    records: pd.DataFrame,
    treatment: str = "think",
    baseline: str = "nothink",
    k_list: Sequence[int] = (5, 10, 20),
    seed: int = 0,
    K: int = 10,
    identity_atol: float = 1e-9,
    k_sensitivity_subsample: int | None = None,
) -> dict[str, dict]:
    """CDPG trajectories, per-cell propagation slopes and their sensitivity to K.

    depth_records: pair_id, side, K, k, p_yes_k [, arm, model, dataset], the treatment arm's
    traces scored at k = 1..K for the headline K and every K in k_list; records: the long
    records with both arms. With model/dataset columns, tables hold pooled rows (labelled
    "pooled") and one block per (model, dataset); metrics are pooled.

    Returns {"metrics": {...}, "tables": {...}}. Metrics, at the headline K:
    cdpg_n_pairs, cdpg_n_{cell}; cdpg_slope_{cell} (OLS slope of the cell's mean |CDPG_k|
    on k/K over k = 1..K) with cdpg_slope_{cell}_ci_low/_ci_high (the Student t 95% interval of the mean
    of the cell's pair slopes, NaN for one pair; benchmarks/calibration_cdpg.py measures its coverage at the
    7 to 50 pairs a cell holds; cdpg_slope_{cell}_ci_n = cdpg_n_{cell} is its n and cdpg_slope_{cell}_ci_few is
    1.0 below FEW = 10 pairs); cdpg_slope_{cell}_from0 (and its interval, n and flag), the same fit over
    k = 0..K, the baseline arm included; and cdpg_slope_{cell}_k{K'} for each K' in k_list,
    fitted on `k_sensitivity_subsample` pairs per (model, dataset) when set (all pairs when None).
    Tables: cdpg_by_cell (K, cell, k, depth, n, mean_abs_cdpg; Figs. 3 and 6), cdpg_sides
    (K, cell, anchor_answer, role, k, depth, n, p_yes; Fig. 4), cdpg_slopes (K, cell, n,
    slope, ci_low, ci_high, few), cdpg_slopes_from0 (the same from k = 0) and cdpg_k_sensitivity
    (cell, n_k{K'}, slope_k{K'}; Table 6, on the subsample);
    their k = 0 rows are the baseline arm. Raises AuditError when a K is missing from the
    depth records or |CDPG_K| departs from the treatment arm's D_disp by more than
    `identity_atol` (exact for the same forward pass; the packed depth pass and the plain
    answer read agree to about 1e-6 in fp32, less closely in half precision).
    """
    traj = trajectories(depth_records, records, treatment, baseline, Ks=[K, *k_list], atol=identity_atol)
    group_cols = [c for c in GROUP_COLUMNS if c in traj]
    def cell_slopes(frame: pd.DataFrame, first_k: int = 1) -> pd.DataFrame:
        return _with_scopes(pair_slopes(frame, first_k), group_cols, _cell_slopes)

    slopes, from0 = cell_slopes(traj), cell_slopes(traj, first_k=0)
    sampled = subsample_pairs(traj[traj["K"].isin(list(k_list))], k_sensitivity_subsample, seed)
    sensitivity = slopes if k_sensitivity_subsample is None else cell_slopes(sampled)
    tables = {
        "cdpg_by_cell": _with_scopes(traj, group_cols, _cell_trajectories),
        "cdpg_sides": _with_scopes(traj, group_cols, _side_trajectories),
        "cdpg_slopes": slopes,
        "cdpg_slopes_from0": from0,
        "cdpg_k_sensitivity": _k_sensitivity(sensitivity, k_list, group_cols),
    }
    return {"metrics": _slope_metrics(slopes, from0, sensitivity, K, k_list, group_cols), "tables": tables}
