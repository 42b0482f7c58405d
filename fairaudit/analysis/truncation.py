"""Traces the token budget cut: which pairs hold one, how many per contingency cell, and the records without them.

A capped trace is not an answer the model reached, yet under `answer_source: forced` it is scored
like one. Every paired probe therefore reports its metrics twice: over all pairs, and under
`<name>_complete` over the pairs whose every trace (both sides, both arms) completed.
"""

from __future__ import annotations

import math
from typing import Callable

import pandas as pd

from fairaudit.analysis.contingency import CELLS, cell_labels
from fairaudit.analysis.flags import as_flags
from fairaudit.analysis.pairs import complete_pairs
from fairaudit.analysis.ranges import COUNT, SHARE

COMPLETE = "_complete"  # suffix of a metric computed on the pairs without a truncated trace
RANGES = {"n_pairs_truncated": COUNT, "cell_[abcd]_truncated": COUNT,
          "truncated_rate": SHARE}  # the share of an arm's records the budget cut, logged by the probes


def truncated_pairs(records: pd.DataFrame) -> pd.Index:
    """pair_ids with at least one record whose generation hit the token budget. # records: pair_id, truncated"""
    if "truncated" not in records:
        return pd.Index([], name="pair_id")
    cut = as_flags(records["truncated"], "truncated", missing=False)  # null: a record that generated nothing
    return pd.Index(records.loc[cut, "pair_id"].unique(), name="pair_id")


def completed(records: pd.DataFrame) -> pd.DataFrame:
    """The records of the pairs none of whose traces was cut by the token budget, in any arm."""
    return records[~records["pair_id"].isin(truncated_pairs(records))]


def truncated_by_cell(records: pd.DataFrame, treatment: str, baseline: str) -> dict[str, float]:
    """n_pairs_truncated: pairs with a truncated trace; cell_{a..d}_truncated: those among the pairs of each
    contingency cell (pairs whose answers parse on both sides of both arms, as `contingency` counts them).

    records: pair_id, side, arm, answer, p_yes, truncated.
    """
    cut = truncated_pairs(records)
    cells = cell_labels(complete_pairs(records, treatment, baseline), treatment, baseline)
    counts = {f"cell_{cell}_truncated": int(cells[cells.index.isin(cut)].eq(cell).sum()) for cell in CELLS}
    return {"n_pairs_truncated": len(cut), **counts}


def with_complete(metrics_of: Callable[[pd.DataFrame], dict[str, float]], records: pd.DataFrame,
                  metrics: dict[str, float] | None = None) -> dict[str, float]:
    """metrics_of(records) (or `metrics`, when already computed) and, each under `<name>_complete`, metrics_of
    the `completed` records (the same values when no trace was cut; NaN when every pair holds one)."""
    metrics = metrics_of(records) if metrics is None else metrics
    kept = completed(records)
    if len(kept) == len(records):
        complete = metrics
    elif kept.empty:
        complete = {name: math.nan for name in metrics}
    else:
        complete = metrics_of(kept)
    return metrics | {f"{name}{COMPLETE}": value for name, value in complete.items()}
