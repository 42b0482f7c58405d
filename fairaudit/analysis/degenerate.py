"""Degenerate results, found in the records: each check returns one line per problem (empty when none).

A run whose model says Yes to everyone, or never closes its think block, still yields metrics; these
lines say why those metrics cannot show what they are meant to.
"""

from __future__ import annotations

import pandas as pd

from fairaudit.analysis.flags import as_flags

WARNING = "warning: "  # the prefix of a verdict line that flags a degenerate result


def thinking_arms(records: pd.DataFrame) -> list[str]:
    """Arms whose rows carry a think trace: `compliant` is null under thinking arms (probes.decisions.decide).

    records: arm[, compliant]
    """
    if "compliant" not in records:
        return []
    return [arm for arm, rows in records.groupby("arm", sort=False) if rows["compliant"].isna().all()]


def same_answer(records: pd.DataFrame) -> str | None:
    """Every answer, under every arm and on both sides, is the same. records: arm, answer"""
    answers = records["answer"].dropna()
    if len(answers) < 2 or answers.nunique() != 1:
        return None
    arms = " and ".join(records["arm"].unique())
    return (f"every answer ({len(answers)} of {len(records)}, {arms}) is {answers.iloc[0]}: the model answers the same "
            "whoever the person is, so no counterfactual flip can show; read the P(Yes) gap instead")


def trace_problems(records: pd.DataFrame, arm: str) -> list[str]:
    """A thinking arm's traces: all empty (or whitespace), or never closed, each by its cause: the token budget cut
    them (raise it) or the model stopped on its own without closing its think block (a budget would not help).

    records: arm, trace_tokens, think_closed, answer, parsed_answer[, truncated]
    """
    rows = records[records["arm"] == arm]
    if rows.empty:
        return []
    cut = as_flags(rows["truncated"], "truncated") if "truncated" in rows else pd.Series(False, index=rows.index)
    if (rows["trace_tokens"] == 0).all():
        spent = f"; {int(cut.sum())} of them spent the whole token budget on whitespace" if cut.any() else ""
        return [f"every {arm} trace is empty (0 tokens once whitespace is stripped){spent}: thinking had nothing "
                "to change"]
    unclosed = ~as_flags(rows["think_closed"], "think_closed")
    if not unclosed.any():
        return []
    forced = int((rows["answer"].notna() & rows["parsed_answer"].isna()).sum())
    fate = (f"{forced} of those answers were forced from P(Yes) at the trace's end (model.answer_source=forced)"
            if forced else "their answers are dropped")
    causes = []
    budget, stopped = rows[unclosed & cut], rows[unclosed & ~cut]
    if len(budget):
        causes.append(f"{len(budget)} hit the token budget before closing it (mean {budget['trace_tokens'].mean():.1f} "
                      "tokens): raise model.max_think_tokens")
    if len(stopped):
        causes.append(f"{len(stopped)} ended on their own (end of sequence) without closing it (mean "
                      f"{stopped['trace_tokens'].mean():.1f} tokens): the model does not keep to the think format, "
                      "which a larger budget will not change; use a model that closes its think block")
    return [f"{int(unclosed.sum())} of {len(rows)} {arm} traces never closed their think block: "
            f"{'; '.join(causes)}; {fate}"]


def parse_problems(records: pd.DataFrame, arm: str) -> list[str]:
    """No output of the arm parsed to Yes or No. records: arm, answer, parsed_answer"""
    rows = records[records["arm"] == arm]
    column = "parsed_answer" if "parsed_answer" in rows else "answer"
    if rows.empty or rows[column].notna().any():
        return []
    kept = "every answer was forced from P(Yes)" if rows["answer"].notna().all() else "no pair can count"
    return [f"no {arm} output parsed to Yes or No (parse_rate_{arm} 0): {kept}"]


def decision_warnings(records: pd.DataFrame, arms: tuple[str, ...]) -> list[str]:
    """Every check above for paired Yes/No records under `arms`, plus pairs that all fell out.

    records: pair_id, side, arm, answer, parsed_answer, compliant, trace_tokens, think_closed
    """
    lines = [line for line in [same_answer(records)] if line]
    thinking = thinking_arms(records)
    for arm in arms:
        traces = trace_problems(records, arm) if arm in thinking else []
        lines += traces or parse_problems(records, arm)  # unclosed traces are why nothing parsed
    return lines


def depth_warnings(depth: pd.DataFrame, K: int | None = None) -> list[str]:
    """Depth reads that cannot move: every cut at token 0, or traces shorter than their segment count, at the
    headline `K` (the one the verdict names; default the finest read), else at the finest K of the K-sensitivity.

    depth: pair_id, side, K, k, cut
    """
    if depth.empty:
        return ["no depth reads: no trace was cut"]
    if (depth["cut"] == 0).all():
        return ["every depth cut is at token 0 (the traces are empty): CDPG reads the same P(Yes) at every depth"]
    finest = int(depth["K"].max())
    headline = finest if K is None or K not in set(depth["K"]) else int(K)
    if all_repeat(depth, headline):
        return [f"every trace is shorter than K={headline} tokens: depths repeat the same cut"]
    if finest > headline and all_repeat(depth, finest):
        return [f"every trace is shorter than K={finest} tokens, the finest of the K-sensitivity (probe.k_list): "
                f"its depths repeat the same cut (the headline K={headline} does not)"]
    return []


def all_repeat(depth: pd.DataFrame, K: int) -> bool:
    """Every trace's K cuts hold a repeated cut (a trace shorter than K tokens)."""
    rows = depth[depth["K"] == K]
    return bool((rows.groupby(["pair_id", "side"])["cut"].nunique() < K).all())


def mcq_warnings(records: pd.DataFrame) -> list[str]:
    """MCQ answers that cannot show position bias: none extracted, or one letter for everything.

    records: answer_position, truncated
    """
    answered = records["answer_position"].dropna()
    lines = []
    if answered.empty:
        lines.append("no answer letter was found in any output: every position metric is undefined")
    elif len(answered) > 1 and answered.nunique() == 1:
        lines.append(f"every answer is option {'ABCD'[int(answered.iloc[0])]}, whatever the permutation: "
                     "the model ignores the question")
    truncated = float(records["truncated"].mean()) if "truncated" in records and len(records) else 0.0
    if truncated >= 0.5:
        lines.append(f"{truncated:.0%} of outputs hit the token budget: raise arm.max_new_tokens")
    return lines

