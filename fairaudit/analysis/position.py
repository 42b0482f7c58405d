"""Length-driven position bias in MCQ answers (position-bias paper, §3.3-3.4, §5, Appendices A.3, C, D).

Positions are absolute option slots 0..3 (A..D). A question is *complete* for an arm when
all four cyclic permutations were asked and each gave an extractable answer; PBS needs a
complete question, because the mean answer distribution over fewer permutations cannot be
uniform (one answer alone always scores sqrt(0.75)).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from fairaudit.analysis.numbers import cancelled, cancelled_mean
from fairaudit.analysis.ranges import COUNT, POSITIVE, SHARE, SIGNED
from fairaudit.analysis.stats import (
    PARTIAL_METHODS,
    SPEARMAN_Z_VARIANCE,
    clustered_t_interval,
    fisher_z_interval,
    interval_size,
    p_value,
    partial_correlation,
    wilcoxon_log10_p,
)
from fairaudit.prompts.mcq import LETTERS, commitment_change_point, effective_switching, trajectory

N_POSITIONS = 4
SHARES = [f"share_{letter.lower()}" for letter in LETTERS]
LENGTH_BIN_COUNTS = (3, 4, 5, 10)  # quartiles (Fig. 1) and the robustness bins of Appendix C
ZERO_METHODS = ("wilcox", "pratt", "zsplit")  # scipy.stats.wilcoxon's treatments of zero differences
RANGES = {  # the metrics of `position` and `pbs_wilcoxon` (analysis.ranges), an arm's name after each
    "n_records": COUNT, "n_questions": COUNT, "n_questions_complete": COUNT, "extraction_rate": SHARE,
    "fallback_rate": SHARE, "answered_rate": SHARE, "accuracy": SHARE, "pbs": SHARE, "ccp": SHARE, "eff_sw": SHARE,
    "length_chars": POSITIVE, "preferred_position": (0.0, 3.0), "answer_share_[a-d]": SHARE,
    "partial_rho_length_pbs(_pearson|_spearman)?": SIGNED, "partial_rho_length_pbs(_pearson|_spearman)?_p": SHARE,
    "pbs_q[1-4]": SHARE, "pbs_monotonic_k[0-9]+": SHARE, "pbs_first_violation_k[0-9]+": COUNT,
    "pbs_gradient_k[0-9]+": SIGNED, "pbs_wilcoxon_(n|zeros)": COUNT, "pbs_wilcoxon_mean_diff": SIGNED,
    "pbs_wilcoxon_statistic": POSITIVE, "pbs_wilcoxon_p": SHARE,
}


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
    """Mean PBS in `k` equal-frequency bins of mean length (bin 1 shortest), its SE and its 95% t interval over the
    bin's questions (`stats.clustered_t_interval`); empty when fewer than k questions.

    questions: length_chars, pbs (complete questions of one arm). Ties in length are split by
    row order so every bin holds n/k questions up to rounding.
    """
    columns = ["k", "bin", "n", "length_min", "length_max", "length_mean", "pbs_mean", "pbs_se", "pbs_ci_low",
               "pbs_ci_high"]
    if len(questions) < k:
        return pd.DataFrame(columns=columns)
    bins = pd.qcut(questions["length_chars"].rank(method="first"), k, labels=False) + 1
    groups = questions.groupby(bins.to_numpy())
    out = groups.agg(
        n=("pbs", "size"),
        length_min=("length_chars", "min"),
        length_max=("length_chars", "max"),
        length_mean=("length_chars", "mean"),
        pbs_mean=("pbs", "mean"),
        pbs_se=("pbs", "sem"),
    )
    intervals = [clustered_t_interval(values, bounds=SHARE) for _, values in groups["pbs"]]
    out["pbs_ci_low"], out["pbs_ci_high"] = np.array(intervals).T
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


def _interval(name: str, bounds: tuple[float, float], n: int) -> dict[str, float]:
    """`name`'s interval metrics: `_ci_low`, `_ci_high` and its size over n units (`stats.interval_size`)."""
    return {f"{name}_ci_low": float(bounds[0]), f"{name}_ci_high": float(bounds[1]), **interval_size(name, n)}


def _record_mean_interval(name: str, values: pd.Series, question_id: pd.Series) -> dict[str, float]:
    """The 95% t interval of the mean of records' `values` (NaN left out) over questions, a question's records
    moving together (`stats.clustered_t_interval`), cut to [0, 1]."""
    per_question = values.groupby(question_id).agg(["sum", "count"])
    per_question = per_question[per_question["count"] > 0]
    bounds = clustered_t_interval(per_question["sum"], per_question["count"], bounds=SHARE)
    return _interval(name, bounds, len(per_question))


def _partial_rho_metrics(complete: pd.DataFrame, method: str) -> dict[str, float]:
    """partial_rho_length_pbs_<method>, its p, log10 p and 95% Fisher z interval (one controlled variable).

    complete: length_chars, pbs, accuracy (the complete questions of one arm)
    """
    name = f"partial_rho_length_pbs_{method}"
    rho, p, log10_p = partial_correlation(complete["length_chars"], complete["pbs"], complete["accuracy"], method)
    n = int(complete[["length_chars", "pbs", "accuracy"]].notna().all(axis=1).sum())
    variance = SPEARMAN_Z_VARIANCE if method == "spearman" else 1.0
    return {name: rho, f"{name}_p": p, f"{name}_log10_p": log10_p,
            **_interval(name, fisher_z_interval(rho, n, controlled=1, variance=variance), n)}


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
    m |= _interval("pbs", clustered_t_interval(complete["pbs"], bounds=SHARE), len(complete))
    m |= _record_mean_interval("accuracy", extracted["correct"].astype(float), extracted["question_id"])
    for name in ("ccp", "eff_sw"):
        m |= _record_mean_interval(name, records[name], records["question_id"])
    for method in PARTIAL_METHODS:
        m |= _partial_rho_metrics(complete, method)
    for suffix in ("", "_p", "_log10_p", "_ci_low", "_ci_high", "_ci_n", "_ci_few"):
        m[f"partial_rho_length_pbs{suffix}"] = m[f"partial_rho_length_pbs_{partial_corr}{suffix}"]
    tables = [length_bins(complete, k) for k in LENGTH_BIN_COUNTS]
    for k, table in zip(LENGTH_BIN_COUNTS, tables):
        m.update({f"pbs_{name}_k{k}": value for name, value in monotonic_profile(table["pbs_mean"]).items()})
    quartiles = tables[LENGTH_BIN_COUNTS.index(4)].set_index("bin").reindex(range(1, 5))
    for q, row in zip(range(1, 5), quartiles.itertuples()):
        m[f"pbs_q{q}"] = float(row.pbs_mean)
        m |= _interval(f"pbs_q{q}", (row.pbs_ci_low, row.pbs_ci_high), 0 if pd.isna(row.n) else int(row.n))
    return m, pd.concat(tables, ignore_index=True)


def arm_metric(name: str, arm: str) -> str:
    """An unsuffixed metric's name for one arm: the arm after the metric, before an interval's `_ci_low`,
    `_ci_high`, `_ci_n` or `_ci_few` (`pbs_ci_low` of arm reason: `pbs_reason_ci_low`)."""
    metric, companion, end = name.partition("_ci_")
    return f"{metric}_{arm}{companion}{end}"


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
    also as partial_rho_length_pbs_pearson(_p, _log10_p) / _spearman(_p, _log10_p). 95% intervals, each
    `<metric>_{arm}_ci_low` / `_ci_high` with `_ci_n` and `_ci_few` (`stats.interval_size`): for pbs and
    pbs_q1..q4 the t interval of the mean over the (quartile's) complete questions; for accuracy, ccp and
    eff_sw the same over questions with each question's records moving together (`stats.clustered_t_interval`);
    for each partial rho Fisher's z with one controlled variable (`stats.fisher_z_interval`). Tables:
    per_question, pbs_by_length (every k, with each bin's interval), position_summary (one row per arm,
    unsuffixed metric names).
    """
    records = with_trajectory_metrics(records)
    scored, questions = _scored(records), per_question(records)
    metrics: dict[str, float] = {}
    summaries, bin_tables = [], []
    for arm, arm_records in scored.groupby("arm", sort=True):
        arm_metrics, bins = _arm_metrics(arm_records, questions[questions["arm"] == arm], partial_corr)
        metrics.update({arm_metric(name, arm): value for name, value in arm_metrics.items()})
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


