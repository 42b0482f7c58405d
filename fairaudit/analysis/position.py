"""Length-driven position bias in MCQ answers (position-bias paper, §3.3-3.4, §5, Appendices A.3, C, D).

Positions are absolute option slots 0..3 (A..D). A question is *complete* for an arm when
all four cyclic permutations were asked and each gave an extractable answer; PBS needs a
complete question, because the mean answer distribution over fewer permutations cannot be
uniform (one answer alone always scores sqrt(0.75)).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy import stats

from fairaudit.analysis.flags import as_flags
from fairaudit.numbers import cancelled, cancelled_mean
from fairaudit.prompts.mcq import LETTERS, commitment_change_point, effective_switching, trajectory
from fairaudit.stats import PARTIAL_METHODS, cluster_difference_test, p_value, partial_correlation, wilcoxon_log10_p

N_POSITIONS = 4
SHARES = [f"share_{letter.lower()}" for letter in LETTERS]
LENGTH_BIN_COUNTS = (3, 4, 5, 10)  # quartiles (Fig. 1) and the robustness bins of Appendix C
OFFSETS = (-0.15, -0.05, 0.05, 0.15)  # truncation points relative to CCP (§3.4)
POSITION_BUCKETS = (0.0, 0.3, 0.5, 0.7, 0.9, 1.0)  # absolute trajectory position (Fig. 3)
ZERO_METHODS = ("wilcox", "pratt", "zsplit")  # scipy.stats.wilcoxon's treatments of zero differences


def pbs(distribution):
    """Eq. 1: L2 distance of an answer distribution over the four positions from uniform.

    A float for one distribution, an array for a 2-D input of one distribution per row. The
    maximum, all mass on one position, is sqrt(0.75) = 0.866; the paper's prose calls 0.75
    the maximum, which is the squared distance.
    """
    distance = np.linalg.norm(np.asarray(distribution, dtype=float) - 1.0 / N_POSITIONS, axis=-1)
    return float(distance) if distance.ndim == 0 else distance


def trajectory_metrics(text: str, answer_position: float, case: str = "insensitive") -> tuple[float, float]:
    """(CCP, Eff-Sw) of one generated text whose extracted answer sits at `answer_position` (NaN: none).

    case: how the A.3 mention patterns read letters (`fairaudit.prompts.mcq.trajectory`).
    """
    mentions = trajectory(text, case)
    final = None if pd.isna(answer_position) else LETTERS[int(answer_position)]
    return commitment_change_point(mentions, final), effective_switching(mentions)


def with_trajectory_metrics(records: pd.DataFrame, case: str = "insensitive") -> pd.DataFrame:
    """Records with `ccp` and `eff_sw`, computed from `text` where the columns are absent.

    records: text, answer_position[, ccp, eff_sw]
    """
    missing = [column for column in ("ccp", "eff_sw") if column not in records]
    if not missing:
        return records
    computed = pd.DataFrame(
        [trajectory_metrics(text, answer, case) for text, answer in zip(records["text"], records["answer_position"])],
        columns=["ccp", "eff_sw"], index=records.index)
    return records.assign(**{column: computed[column] for column in missing})


def _scored(records: pd.DataFrame) -> pd.DataFrame:
    """Records with numeric answers and extracted / correct / one-hot position flags added.

    records: gold_position, answer_position (0..3, None or NaN)
    """
    answer = pd.to_numeric(records["answer_position"], errors="coerce").astype(float)
    flags = {share: answer == position for position, share in enumerate(SHARES)}
    return records.assign(
        answer_position=answer, extracted=answer.notna(), correct=answer == records["gold_position"], **flags
    )


def per_question(records: pd.DataFrame) -> pd.DataFrame:
    """One row per (arm, question): answer shares by position, PBS, accuracy, mean CCP, Eff-Sw and length.

    records: arm, question_id, permutation, gold_position, answer_position, length_chars, ccp, eff_sw
    Accuracy and shares are over extracted answers; PBS is NaN unless the question is complete.
    """
    scored = _scored(records)
    grouped = scored.groupby(["arm", "question_id"], sort=True)
    out = grouped.agg(
        n_permutations=("permutation", "nunique"),
        n_extracted=("extracted", "sum"),
        n_correct=("correct", "sum"),
        length_chars=("length_chars", "mean"),
        ccp=("ccp", "mean"),
        eff_sw=("eff_sw", "mean"),
        **{share: (share, "sum") for share in SHARES},
    )
    extracted = out["n_extracted"].where(out["n_extracted"] > 0)
    out[SHARES] = out[SHARES].div(extracted, axis=0)
    out["accuracy"] = out.pop("n_correct") / extracted
    complete = (out["n_permutations"] == N_POSITIONS) & (out["n_extracted"] == N_POSITIONS)
    out["pbs"] = np.where(complete, pbs(out[SHARES].to_numpy(float)), np.nan)
    return out.reset_index()


def length_bins(questions: pd.DataFrame, k: int) -> pd.DataFrame:
    """Mean PBS in `k` equal-frequency bins of mean length (bin 1 shortest); empty when fewer than k questions.

    questions: length_chars, pbs (complete questions of one arm). Ties in length are split by
    row order so every bin holds n/k questions up to rounding.
    """
    columns = ["k", "bin", "n", "length_min", "length_max", "length_mean", "pbs_mean", "pbs_se"]
    if len(questions) < k:
        return pd.DataFrame(columns=columns)
    bins = pd.qcut(questions["length_chars"].rank(method="first"), k, labels=False) + 1
    out = questions.groupby(bins.to_numpy()).agg(
        n=("pbs", "size"),
        length_min=("length_chars", "min"),
        length_max=("length_chars", "max"),
        length_mean=("length_chars", "mean"),
        pbs_mean=("pbs", "mean"),
        pbs_se=("pbs", "sem"),
    )
    return out.rename_axis("bin").reset_index().assign(k=k)[columns]


def monotonic_profile(values) -> dict[str, float]:
    """Appendix C: strictly increasing (1.0 / 0.0), first violation, end-point gradient of bin means.

    first_violation is the 1-based bin that is not above its predecessor (0 when monotonic);
    gradient is last bin minus first bin.
    """
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return {"monotonic": math.nan, "first_violation": math.nan, "gradient": math.nan}
    not_rising = np.flatnonzero(np.diff(values) <= 0)
    return {
        "monotonic": float(not_rising.size == 0),
        "first_violation": float(not_rising[0] + 2) if not_rising.size else 0.0,
        "gradient": cancelled(values[-1] - values[0], max(abs(values[-1]), abs(values[0]))),
    }


def preferred_position(records: pd.DataFrame) -> int:
    """The absolute position the model answers most often (ties: the earliest).

    records: answer_position
    """
    counts = pd.to_numeric(records["answer_position"], errors="coerce").value_counts()
    return int(counts.reindex(range(N_POSITIONS), fill_value=0).to_numpy().argmax())


def _arm_metrics(records: pd.DataFrame, questions: pd.DataFrame,
                 partial_corr: str = "pearson") -> tuple[dict[str, float], pd.DataFrame]:
    """Unsuffixed metrics and the length-bin table of one arm.

    records: scored records of the arm; questions: its per_question rows; partial_corr: the method of
    partial_rho_length_pbs (both are kept under their own names too).
    """
    complete = questions.dropna(subset=["pbs"])
    extracted = records[records["extracted"]]
    source = records["answer_source"] if "answer_source" in records else records["extracted"].map({True: "cascade"})
    m: dict[str, float] = {
        "n_records": len(records),
        "n_questions": len(questions),
        "n_questions_complete": len(complete),
        "extraction_rate": float((source == "cascade").mean()),
        "fallback_rate": float((source == "fallback").mean()),
        "answered_rate": float(records["extracted"].mean()),
        "accuracy": float(extracted["correct"].mean()),
        "pbs": float(complete["pbs"].mean()),
        "ccp": float(records["ccp"].mean()),
        "eff_sw": float(records["eff_sw"].mean()),
        "length_chars": float(records["length_chars"].mean()),
        "preferred_position": preferred_position(extracted) if len(extracted) else math.nan,
    }
    m.update({f"answer_{share}": float(extracted[share].mean()) for share in SHARES})
    for method in PARTIAL_METHODS:
        name = f"partial_rho_length_pbs_{method}"
        m[name], m[f"{name}_p"], m[f"{name}_log10_p"] = partial_correlation(
            complete["length_chars"], complete["pbs"], complete["accuracy"], method)
    for suffix in ("", "_p", "_log10_p"):
        m[f"partial_rho_length_pbs{suffix}"] = m[f"partial_rho_length_pbs_{partial_corr}{suffix}"]
    tables = [length_bins(complete, k) for k in LENGTH_BIN_COUNTS]
    for k, table in zip(LENGTH_BIN_COUNTS, tables):
        m.update({f"pbs_{name}_k{k}": value for name, value in monotonic_profile(table["pbs_mean"]).items()})
    quartile_means = tables[LENGTH_BIN_COUNTS.index(4)]["pbs_mean"].reindex(range(4))
    m.update({f"pbs_q{q + 1}": float(mean) for q, mean in enumerate(quartile_means)})
    return m, pd.concat(tables, ignore_index=True)


def position(records: pd.DataFrame, partial_corr: str = "pearson") -> dict:
    """Position-bias metrics of MCQ records, per arm (position-bias paper, Table 2, Table 1, Fig. 1, Table 3).

    records: one row per question x permutation x arm with question_id, permutation,
    gold_position, answer_position (0..3 or None), length_chars, arm, and either text or
    precomputed ccp (and eff_sw); answer_source ("cascade", "fallback" or null) when the
    letter-frequency fallback may have answered (without it every answer counts as the cascade's).

    Returns {"metrics": {...}, "tables": {...}}. Metrics, each suffixed `_{arm}`:
    n_records, n_questions, n_questions_complete, extraction_rate (Appendix B: the share of
    records the A.2 cascade answers), fallback_rate (the share only the fallback answers),
    answered_rate (their sum: records with any answer, all used by the metrics), accuracy (over extracted
    answers), pbs (mean per-question Eq. 1 over complete questions; at most sqrt(0.75)),
    ccp, eff_sw, length_chars (means over records), answer_share_a..d, preferred_position,
    pbs_q1..pbs_q4 (length quartiles), pbs_monotonic_k{k}, pbs_first_violation_k{k},
    pbs_gradient_k{k} for k in 3, 4, 5, 10, and partial_rho_length_pbs(_p, _log10_p): rho(mean length,
    PBS | accuracy) over complete questions by `partial_corr` ("pearson" or "spearman"), each method
    also as partial_rho_length_pbs_pearson(_p, _log10_p) / _spearman(_p, _log10_p). Tables: per_question,
    pbs_by_length (every k), position_summary (one row per arm, unsuffixed metric names).
    """
    records = with_trajectory_metrics(records)
    scored, questions = _scored(records), per_question(records)
    metrics: dict[str, float] = {}
    summaries, bin_tables = [], []
    for arm, arm_records in scored.groupby("arm", sort=True):
        arm_metrics, bins = _arm_metrics(arm_records, questions[questions["arm"] == arm], partial_corr)
        metrics.update({f"{name}_{arm}": value for name, value in arm_metrics.items()})
        summaries.append({"arm": arm, **arm_metrics})
        bin_tables.append(bins.assign(arm=arm)[["arm", *bins.columns]])
    return {
        "metrics": metrics,
        "tables": {
            "per_question": questions,
            "pbs_by_length": pd.concat(bin_tables, ignore_index=True),
            "position_summary": pd.DataFrame(summaries),
        },
    }


def question_pbs(records: pd.DataFrame) -> pd.Series:
    """PBS of each complete question of a single-arm records frame, indexed by question_id."""
    arms = records["arm"].unique()
    if len(arms) != 1:
        raise ValueError(f"expected records of one arm, got arms {sorted(arms)}")
    questions = per_question(records.assign(ccp=math.nan, eff_sw=math.nan))  # PBS needs no trajectory
    return questions.set_index("question_id")["pbs"].dropna()


def pbs_wilcoxon(records_a: pd.DataFrame, records_b: pd.DataFrame, alternative: str = "greater",
                 zero_method: str = "wilcox") -> dict[str, float]:
    """Paired Wilcoxon signed-rank test of per-question PBS, a against b (Appendix D).

    Each frame holds one arm's MCQ records (e.g. R1 reasoning and Instruct-CoT); questions
    complete in both are paired by question_id. The default one-sided alternative is
    PBS(a) > PBS(b). zero_method is scipy's: "wilcox" drops zero differences (scipy's default,
    the paper does not say), "pratt" ranks them and then drops their ranks, "zsplit" splits their
    ranks between the signs. Returns pbs_wilcoxon_n, pbs_wilcoxon_zeros (zero differences),
    pbs_wilcoxon_mean_diff (a - b over all pairs), pbs_wilcoxon_statistic, pbs_wilcoxon_p and
    pbs_wilcoxon_log10_p (NaN when every difference is zero; p NaN where it is below the smallest double).
    """
    if zero_method not in ZERO_METHODS:
        raise ValueError(f"zero_method must be one of {list(ZERO_METHODS)}, got {zero_method!r}")
    paired = pd.concat({"a": question_pbs(records_a), "b": question_pbs(records_b)}, axis=1, join="inner")
    diff = (paired["a"] - paired["b"]).to_numpy()
    out = {"pbs_wilcoxon_n": len(diff), "pbs_wilcoxon_zeros": int((diff == 0).sum()),
           "pbs_wilcoxon_mean_diff": cancelled_mean(diff)}
    if not np.any(diff != 0):
        return {**out, "pbs_wilcoxon_statistic": math.nan, "pbs_wilcoxon_p": math.nan, "pbs_wilcoxon_log10_p": math.nan}
    result = stats.wilcoxon(diff, alternative=alternative, zero_method=zero_method)
    log10_p = wilcoxon_log10_p(diff, alternative, zero_method, float(result.pvalue))
    return {**out, "pbs_wilcoxon_statistic": float(result.statistic), "pbs_wilcoxon_p": p_value(log10_p),
            "pbs_wilcoxon_log10_p": log10_p}



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
    """The before/after-CCP comparison with questions as the units (`stats.cluster_difference_test`): each
    question's own after-minus-before change rate, sign-flipped, so a question that lost its late cuts weighs as
    much as one that kept them (the chi-square counts its up to 12 continuations as independent).

    rows: question_id, offset, changed (as in `ccp_chi_square`). Returns trunc_ccp_rate_diff (pooled after -
    before rate), trunc_ccp_question_diff (the statistic: the mean of the questions' own differences),
    trunc_ccp_perm_p, trunc_ccp_perm_log10_p (two-sided), trunc_ccp_perm_n_questions (the units: questions cut
    on both sides), trunc_ccp_perm_n_one_sided (those left out), trunc_ccp_perm_exact."""
    rows = rows[rows["offset"] != 0]
    after, changed = rows["offset"] > 0, as_flags(rows["changed"], "changed")
    test = cluster_difference_test(rows["question_id"], after, changed.astype(float), relabelings, seed)
    pooled = changed[after].mean() - changed[~after].mean() if after.any() and (~after).any() else math.nan
    return {"trunc_ccp_rate_diff": float(pooled), "trunc_ccp_question_diff": test["diff"],
            "trunc_ccp_perm_p": test["p"], "trunc_ccp_perm_log10_p": test["log10_p"],
            "trunc_ccp_perm_n_questions": test["n_clusters"], "trunc_ccp_perm_n_one_sided": test["n_one_sided"],
            "trunc_ccp_perm_exact": test["exact"]}


def truncation(continuations: pd.DataFrame, buckets=POSITION_BUCKETS, relabelings: int = 10000, seed: int = 0) -> dict:
    """Truncation-intervention metrics (§3.4, §5.3, Fig. 3).

    continuations: one row per resampled continuation with question_id, permutation, offset,
    position (CCP + offset), sample, answer_position (the original trajectory's answer),
    new_answer_position (None if not extractable), preferred_position. Continuations without
    an extracted answer are excluded. Metrics: trunc_n_questions, trunc_n_continuations, trunc_extraction_rate,
    trunc_n, trunc_change_rate, trunc_directional_shift (share of changes that land on the
    preferred position), trunc_change_rate_before_ccp / _after_ccp (offset < 0 / > 0),
    trunc_ccp_chi2, trunc_ccp_chi2_p, trunc_ccp_chi2_log10_p (the paper's test, continuations as independent)
    and, next to it, `ccp_cluster_test`'s (questions as the units; `relabelings`, `seed`). Tables:
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
    }
    tables = {"truncation_by_position": by_position, "truncation_by_offset": _change_summary(rows, "offset")}
    return {"metrics": metrics, "tables": tables}
