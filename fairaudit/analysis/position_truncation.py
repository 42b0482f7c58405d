"""The truncation intervention of the position-bias paper (§3.4, §5.3): trajectories cut around their commitment
change point (CCP), continuations resampled, and whether the answer changes more after the CCP than before it."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy import stats

from fairaudit.analysis.flags import as_flags
from fairaudit.analysis.numbers import cancelled_mean, format_p
from fairaudit.analysis.permutation import stratified_exact_test
from fairaudit.analysis.ranges import COUNT, POSITIVE, SHARE, SIGNED
from fairaudit.analysis.stats import p_value

MAX_SCALE = 2 ** 40  # a cut's rate scaled to a whole number; past it, rounded onto this many steps
OFFSETS = (-0.15, -0.05, 0.05, 0.15)  # truncation points relative to CCP (§3.4)
POSITION_BUCKETS = (0.0, 0.3, 0.5, 0.7, 0.9, 1.0)  # absolute trajectory position (Fig. 3)
RANGES = {  # the metrics of `truncation` (analysis.ranges), an arm's name after each
    "trunc_n(_questions|_continuations)?": COUNT, "trunc_extraction_rate": SHARE, "trunc_change_rate": SHARE,
    "trunc_directional_shift": SHARE, "trunc_ccp_chi2": POSITIVE, "trunc_ccp_chi2_p": SHARE,
    "trunc_ccp_(rate|question|mh)_diff": SIGNED, "trunc_ccp_perm_p": SHARE,
    "trunc_ccp_perm_n_(questions|one_sided)": COUNT, "trunc_ccp_perm_exact": SHARE,
    "trunc_extraction_diff_p": SHARE,
}


class Cut(NamedTuple):
    """Where a trajectory is truncated before its continuation is resampled."""

    offset: float  # relative to CCP
    position: float  # CCP + offset, a fraction of the text
    char: int  # the prefix is text[:char]


def truncation_trajectories(records: pd.DataFrame, n_questions: int | None = 200, permutation: int | None = 0,
                            include_ccp_bounds: bool = False) -> pd.DataFrame:
    """§3.4 / §5.3: the trajectories the intervention cuts, one per question with a detectable CCP.

    records: question_id, permutation, ccp (in the questions' sampled order). Keeps the
    `permutation` asked (None: every permutation) whose CCP is detectable, strictly inside
    (0, 1) unless `include_ccp_bounds`: CCP = 0 (committed from the first mention) and CCP = 1
    (the last mention is not the answer) mark no change point to cut around, and would
    contribute only after- or only before-CCP cuts. Then the first `n_questions` such
    questions (None: all); the paper cut 200.
    """
    rows = records if permutation is None else records[records["permutation"] == permutation]
    ccp = rows["ccp"].astype(float)
    rows = rows[ccp.notna() & (((ccp > 0) & (ccp < 1)) | include_ccp_bounds)]
    if n_questions is not None:
        rows = rows[rows["question_id"].isin(list(dict.fromkeys(rows["question_id"]))[:n_questions])]
    return rows


def truncation_cuts(text: str, ccp: float, offsets=OFFSETS) -> list[Cut]:
    """Cut points at CCP + offset (§3.4); none for a NaN CCP, and none that fall outside (0, 1)."""
    if math.isnan(ccp):
        return []
    positions = [(offset, round(ccp + offset, 10)) for offset in offsets]
    return [Cut(offset, at, round(at * len(text))) for offset, at in positions if 0.0 < at < 1.0]


def _changes(continuations: pd.DataFrame) -> pd.DataFrame:
    """Continuations with an extracted new answer, flagged `changed` and `toward` (changed to the preferred position).

    continuations: answer_position, new_answer_position, preferred_position
    """
    answers = {column: pd.to_numeric(continuations[column], errors="coerce")
               for column in ("answer_position", "new_answer_position", "preferred_position")}
    rows = continuations.assign(**answers)[answers["new_answer_position"].notna()]
    changed = rows["new_answer_position"] != rows["answer_position"]
    return rows.assign(changed=changed, toward=changed & (rows["new_answer_position"] == rows["preferred_position"]))


def _change_summary(rows: pd.DataFrame, key) -> pd.DataFrame:
    """n, n_changed, change_rate, n_toward_preferred, directional_shift per value of `key`.

    rows: changed, toward (from _changes)
    """
    out = rows.groupby(key, observed=False).agg(
        n=("changed", "size"), n_changed=("changed", "sum"), n_toward_preferred=("toward", "sum")
    )
    out["change_rate"] = out["n_changed"] / out["n"].where(out["n"] > 0)
    out["directional_shift"] = out["n_toward_preferred"] / out["n_changed"].where(out["n_changed"] > 0)
    return out.reset_index()


def ccp_chi_square(rows: pd.DataFrame) -> tuple[float, float, float]:
    """Chi-square (Yates-corrected, scipy's 2x2 default) of changed vs unchanged before vs after CCP: chi2, p, log10 p.

    rows: offset, changed (bool, 0/1 or nullable Int64 / boolean without missing values); one row per
    continuation, before = negative offset, after = positive. Cuts that would fall at or beyond an end of the
    text were never made, so a trajectory with CCP = 0 adds after-CCP continuations only and one with CCP = 1
    before-CCP ones only (`truncation_trajectories` leaves both out by default). p is from log10 p, computed
    in log space (NaN below the smallest double); NaN throughout when a row or column of the 2x2 table is empty.
    """
    rows = rows[rows["offset"] != 0]
    after, changed = (rows["offset"] > 0).to_numpy(), as_flags(rows["changed"], "changed").to_numpy()
    table = np.array([[(side & changed).sum(), (side & ~changed).sum()] for side in (~after, after)])
    if (table.sum(axis=0) == 0).any() or (table.sum(axis=1) == 0).any():
        return math.nan, math.nan, math.nan
    chi2 = float(stats.chi2_contingency(table)[0])
    log10_p = min(0.0, float(stats.chi2.logsf(chi2, 1)) / math.log(10.0))
    return chi2, p_value(log10_p), log10_p


def ccp_cluster_test(rows: pd.DataFrame, relabelings: int = 10000, seed: int = 0) -> dict[str, float]:
    """The before/after-CCP comparison within questions (`permutation.stratified_exact_test`): each question's cuts
    relabeled before/after at random, keeping how many it has on each side; a cut is one unit (its continuations
    resample one prefix) holding its change *rate*, the changes over its continuations with an extracted answer, and
    the statistic is the rates summed after the CCP. Its null law is exact whatever the counts per question, the
    change rates and the share of its continuations each cut kept: a cut that kept 3 weighs as much as one that kept
    6 (a count would not, and the sides often keep different shares: a truncated trace is harder to parse). With
    every cut keeping the same number, the rates are the counts scaled, and the test is the count test.

    rows: question_id, offset, changed (as in `ccp_chi_square`; extracted continuations only) and, when present,
    permutation and run_id (a cut is one run's trajectory at one offset; a question's cuts in several runs are one
    stratum). Returns trunc_ccp_rate_diff (pooled after - before rate), trunc_ccp_question_diff (the mean of the
    questions' own after - before rates, every question weighing the same), trunc_ccp_mh_diff (the Mantel-Haenszel
    after - before difference of the cuts' rates, the test's own effect), trunc_ccp_perm_p, trunc_ccp_perm_log10_p
    (two-sided), trunc_ccp_perm_n_questions (the test's strata: questions cut on both sides),
    trunc_ccp_perm_n_one_sided (those left out) and trunc_ccp_perm_exact (0.0 where `relabelings` seeded draws stood
    in for the exact law of a very large study)."""
    rows = rows[rows["offset"] != 0]
    after, changed = rows["offset"] > 0, as_flags(rows["changed"], "changed")
    cuts, scale = cut_rates(rows, changed)
    test = stratified_exact_test(cuts["question_id"], cuts["after"], cuts["value"], None, relabelings, seed)
    pooled = changed[after].mean() - changed[~after].mean() if after.any() and (~after).any() else math.nan
    return {"trunc_ccp_rate_diff": float(pooled), "trunc_ccp_question_diff": question_diff(rows, after, changed),
            "trunc_ccp_mh_diff": test["mh_diff"] / scale, "trunc_ccp_perm_p": test["p"],
            "trunc_ccp_perm_log10_p": test["log10_p"], "trunc_ccp_perm_n_questions": test["n_strata"],
            "trunc_ccp_perm_n_one_sided": test["n_one_sided"], "trunc_ccp_perm_exact": test["exact"]}


def cut_keys(rows: pd.DataFrame) -> pd.Series:
    """Which cut each continuation was resampled from: its offset, and its permutation and run where given.

    rows: offset[, permutation, run_id]"""
    cut = rows["offset"].astype(str)
    for part in ("permutation", "run_id"):  # a cut is one run's trajectory (one permutation) at one offset
        cut = cut + "@" + rows[part].astype(str) if part in rows else cut
    return cut


def cut_rates(rows: pd.DataFrame, changed: pd.Series) -> tuple[pd.DataFrame, int]:
    """One row per cut: question_id, after, value (its change rate times `scale`, a whole number), and `scale`
    (the least common multiple of the cuts' continuation counts, divided by the values' common factor; past
    MAX_SCALE the rates are rounded onto a grid of MAX_SCALE steps).

    rows: question_id, offset[, permutation, run_id]; changed: bool per row"""
    frame = pd.DataFrame({"question_id": rows["question_id"].to_numpy(), "cut": cut_keys(rows).to_numpy(),
                          "after": (rows["offset"] > 0).to_numpy(), "changed": changed.to_numpy(int)})
    cuts = frame.groupby(["question_id", "cut"], sort=False).agg(
        after=("after", "first"), n=("changed", "size"), k=("changed", "sum")).reset_index()
    scale = math.lcm(*(int(n) for n in cuts["n"].unique()))
    if scale > MAX_SCALE:
        scale, values = MAX_SCALE, (cuts["k"] * MAX_SCALE / cuts["n"]).round().astype(np.int64)
    else:
        values = cuts["k"].astype(np.int64) * scale // cuts["n"]
    common = math.gcd(*(int(v) for v in values.unique())) or 1
    return cuts.assign(value=values // common), scale // common


def extraction_by_side(continuations: pd.DataFrame, relabelings: int = 10000, seed: int = 0) -> dict[str, float]:
    """The share of continuations whose answer was extracted before and after the CCP, and the same within-question
    exact test of whether it differs (cuts as units, the statistic the extracted count after the CCP).

    continuations: question_id, offset, new_answer_position[, permutation, run_id]. Returns
    trunc_extraction_rate_before_ccp, trunc_extraction_rate_after_ccp, trunc_extraction_diff_p and _log10_p."""
    rows = continuations[continuations["offset"] != 0]
    extracted = pd.to_numeric(rows["new_answer_position"], errors="coerce").notna()
    after = (rows["offset"] > 0).to_numpy()
    test = stratified_exact_test(rows["question_id"], after, extracted.astype(int), cut_keys(rows), relabelings, seed)
    rates = [float(extracted[side].mean()) if side.any() else math.nan for side in (~after, after)]
    return {"trunc_extraction_rate_before_ccp": rates[0], "trunc_extraction_rate_after_ccp": rates[1],
            "trunc_extraction_diff_p": test["p"], "trunc_extraction_diff_log10_p": test["log10_p"]}


def extraction_warning(metrics: dict, alpha: float = 0.05) -> str | None:
    """One line when the sides kept different shares of their continuations (the within-question test at `alpha`):
    the pooled rates and the chi-square then weigh the side that kept more, the exact test does not; else None.

    metrics: `truncation`'s"""
    log10_p = metrics.get("trunc_extraction_diff_log10_p", math.nan)
    if not log10_p <= math.log10(alpha):
        return None
    return (f"truncation: answers were extracted from {metrics['trunc_extraction_rate_before_ccp']:.1%} of the "
            f"continuations before the CCP and {metrics['trunc_extraction_rate_after_ccp']:.1%} after (exact p = "
            f"{format_p(log10_p)}): the pooled change rates and the chi-square weigh the side that kept more; read the "
            "exact test, which weighs every cut by its rate")


def question_diff(rows: pd.DataFrame, after: pd.Series, changed: pd.Series) -> float:
    """The mean of the questions' own after-CCP minus before-CCP change rates, over those cut on both sides.

    rows: question_id; after, changed: bool per row"""
    index = pd.factorize(rows["question_id"])[0]
    on, y = after.to_numpy(bool), changed.to_numpy(float)
    n = [np.bincount(index[on == side], minlength=index.max(initial=-1) + 1) for side in (False, True)]
    k = [np.bincount(index[on == side], y[on == side], minlength=len(n[0])) for side in (False, True)]
    both = (n[0] > 0) & (n[1] > 0)
    return cancelled_mean(k[1][both] / n[1][both] - k[0][both] / n[0][both]) if both.any() else math.nan


def truncation(continuations: pd.DataFrame, buckets=POSITION_BUCKETS, relabelings: int = 10000, seed: int = 0) -> dict:
    """Truncation-intervention metrics (§3.4, §5.3, Fig. 3).

    continuations: one row per resampled continuation with question_id, permutation, offset,
    position (CCP + offset), sample, answer_position (the original trajectory's answer),
    new_answer_position (None if not extractable), preferred_position. Continuations without
    an extracted answer are excluded. Metrics: trunc_n_questions, trunc_n_continuations, trunc_extraction_rate,
    trunc_n, trunc_change_rate, trunc_directional_shift (share of changes that land on the
    preferred position), trunc_change_rate_before_ccp / _after_ccp (offset < 0 / > 0),
    trunc_ccp_chi2, trunc_ccp_chi2_p, trunc_ccp_chi2_log10_p (the paper's test, continuations as independent)
    and, next to it, `ccp_cluster_test`'s (questions as the units; `relabelings`, `seed`), and `extraction_by_side`'s.
    Tables:
    truncation_by_position (buckets of absolute position, [low, high)) and truncation_by_offset.
    """
    rows = _changes(continuations)
    edges = list(buckets)
    labels = [f"{low:g}-{high:g}" for low, high in zip(edges, edges[1:])]
    bucket = pd.cut(rows["position"], bins=edges, labels=labels, right=False)
    by_position = _change_summary(rows, bucket.rename("bucket"))
    by_position.insert(1, "position_low", edges[:-1])
    by_position.insert(2, "position_high", edges[1:])
    before, after = rows[rows["offset"] < 0], rows[rows["offset"] > 0]
    chi2, p, log10_p = ccp_chi_square(rows)
    n_changed = int(rows["changed"].sum())
    metrics = {
        "trunc_n_questions": int(continuations["question_id"].nunique()),
        "trunc_n_continuations": len(continuations),
        "trunc_extraction_rate": len(rows) / len(continuations) if len(continuations) else math.nan,
        "trunc_n": len(rows),
        "trunc_change_rate": float(rows["changed"].mean()) if len(rows) else math.nan,
        "trunc_directional_shift": float(rows["toward"].sum() / n_changed) if n_changed else math.nan,
        "trunc_change_rate_before_ccp": float(before["changed"].mean()) if len(before) else math.nan,
        "trunc_change_rate_after_ccp": float(after["changed"].mean()) if len(after) else math.nan,
        "trunc_ccp_chi2": chi2,
        "trunc_ccp_chi2_p": p,
        "trunc_ccp_chi2_log10_p": log10_p,
        **ccp_cluster_test(rows, relabelings, seed),
        **extraction_by_side(continuations, relabelings, seed),
    }
    tables = {"truncation_by_position": by_position, "truncation_by_offset": _change_summary(rows, "offset")}
    return {"metrics": metrics, "tables": tables}
