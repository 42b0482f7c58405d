"""Shared reshaping of long counterfactual records into one row per pair or per instance."""

from __future__ import annotations

import math

import pandas as pd

from fairaudit.analysis.flags import as_flags
from fairaudit.analysis.ranges import COUNT, SHARE

ALPHA, ALPHA_PRIME = "alpha", "alpha_prime"
RANGES = {"parse_rate": SHARE, "compliance_rate": SHARE, "n_dropped_(truncated|noncompliant)": COUNT}  # accounting
SIDES = (ALPHA, ALPHA_PRIME)
TEXT_COLUMNS = ("prompt", "trace", "text")  # provenance records keep and no analysis reads


def wide_pairs(records: pd.DataFrame, arms: tuple[str, ...], value: str) -> pd.DataFrame:
    """One row per pair_id, one column per (arm, side) holding `value`.

    records: pair_id, side, arm, <value>; columns come back named f"{arm}_{side}".
    """
    rows = records[records["arm"].isin(arms)].drop_duplicates(["pair_id", "arm", "side"])  # the first row of each
    wide = rows.set_index(["pair_id", "arm", "side"])[value].unstack(["arm", "side"])  # pivot_table's, 2x faster
    wide.columns = [f"{arm}_{side}" for arm, side in wide.columns]
    wanted = [f"{arm}_{side}" for arm in arms for side in SIDES]
    return wide.reindex(columns=wanted)


def _require_arms(records: pd.DataFrame, arms: tuple[str, ...]) -> tuple[str, ...]:
    """`arms`, once checked that records hold rows for each of them."""
    missing = set(arms) - set(records["arm"].unique())
    if missing:
        raise ValueError(f"records hold no rows for arm(s) {sorted(missing)}; "
                         f"arms present: {sorted(records['arm'].unique())}")
    return arms


def complete_pairs(records: pd.DataFrame, treatment: str, baseline: str) -> pd.DataFrame:
    """Pairs whose answer parses on both sides of both arms, with answers and P(Yes) side by side.

    Returns columns {arm}_{side} (answer, "Yes"/"No") and p_{arm}_{side} (P(Yes)), indexed by pair_id.
    """
    arms = _require_arms(records, (treatment, baseline))
    answers = wide_pairs(records, arms, "answer").dropna()
    probs = wide_pairs(records, arms, "p_yes").add_prefix("p_")
    return answers.join(probs, how="left")


def flips(pairs: pd.DataFrame, arm: str) -> pd.Series:
    """True where the two sides of a pair disagree under `arm`."""
    return pairs[f"{arm}_{ALPHA}"] != pairs[f"{arm}_{ALPHA_PRIME}"]


def complete_instances(records: pd.DataFrame, treatment: str, baseline: str) -> pd.DataFrame:
    """Instances whose answer parses under both arms, whether or not their partner's does.

    records: pair_id, side, arm, answer; returns columns {treatment}, {baseline} ("Yes"/"No"),
    indexed by (side, pair_id).
    """
    arms = _require_arms(records, (treatment, baseline))
    answers = wide_pairs(records, arms, "answer")
    per_side = {side: answers[[f"{arm}_{side}" for arm in arms]].set_axis(list(arms), axis=1).dropna()
                for side in SIDES}
    return pd.concat(per_side, names=["side"])


def answer_accounting(records: pd.DataFrame, treatment: str, baseline: str) -> dict[str, float]:
    """Why pairs leave the analysis, per arm: parse and compliance rates, and the pairs dropped per cause.

    records: pair_id, side, arm, answer[, parsed_answer, compliant, truncated]. Per arm:
    parse_rate_{arm} (and per side) is the share of rows whose output parsed (parsed_answer);
    compliance_rate_{arm}, for arms that do not think (`compliant` is null under thinking arms),
    the share of completions that respected the empty think block; n_dropped_truncated_{arm} and
    n_dropped_noncompliant_{arm} count the pairs left out of `complete_pairs` with a side whose output
    under that arm was cut by the token budget, or broke the no-think instruction.
    """
    kept = set(complete_pairs(records, treatment, baseline).index)
    dropped = records[~records["pair_id"].isin(kept)]
    parsed_col = "parsed_answer" if "parsed_answer" in records else "answer"
    out: dict[str, float] = {}
    for arm in (treatment, baseline):
        rows = records[records["arm"] == arm]
        out[f"parse_rate_{arm}"] = float(rows[parsed_col].notna().mean()) if len(rows) else math.nan
        for side in SIDES:
            side_rows = rows[rows["side"] == side]
            out[f"parse_rate_{arm}_{side}"] = (float(side_rows[parsed_col].notna().mean()) if len(side_rows)
                                               else math.nan)
        lost = dropped[dropped["arm"] == arm]
        if "truncated" in records:
            out[f"n_dropped_truncated_{arm}"] = int(lost.loc[as_flags(lost["truncated"], "truncated", missing=False),
                                                             "pair_id"].nunique())
        judged = rows["compliant"].dropna() if "compliant" in rows else pd.Series(dtype=object)
        if len(judged):  # arms that do not think; null for thinking arms
            out[f"compliance_rate_{arm}"] = float(as_flags(judged, "compliant").mean())
            noncompliant = ~as_flags(lost["compliant"], "compliant", missing=True)  # null: not judged (thinking arms)
            out[f"n_dropped_noncompliant_{arm}"] = int(lost.loc[noncompliant, "pair_id"].nunique())
    return out
