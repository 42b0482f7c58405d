"""Bias transition matrices from a baseline arm to a treatment arm (paper 000 §3.4, §4.4, App. G-I).

`transitions(records, treatment="think", baseline="nothink")` returns {"metrics": ..., "tables": ...}.
Answers abbreviate to Y / N; a pair's state is NN, YY or M (mixed: a counterfactual flip), split
into YN (alpha Yes, alpha' No) and NY. Every transition runs from the baseline answer or state
(i, "from") to the treatment one (j, "to"). All populations but the marginal T are the pairs that
parse on both sides of both arms (the paper's main tables).

Metrics (flat snake_case floats; s in alpha, alpha_prime; i, j in y, n):
  n_pairs                      pairs parsing on both sides of both arms
  t_{s}_{i}{j}                 group-level T^A = P(treatment = j | baseline = i, side s); t_alpha_ny = P(Y|N)
  dp_yes_{s}                   Yes-rate shift P(Y)_treatment - P(Y)_baseline on side s
  delta_t_{i}{j}, delta_dp_yes T^alpha - T^alpha', entry by entry, and the gap in Yes-rate shift
  delta_t_max_abs              max(|delta_t_yy|, |delta_t_ny|), the bound quoted in §4.4 and App. G
  t_marginal_{i}{j}, dp_yes_marginal, n_marginal
                               T pooled over both sides under the per-side parse filter of App. G:
                               an instance counts when its own two arms parse, whatever its partner's
  tpair_{i}_{j}                T^pair, i, j in nn, yy, m (Table 4)
  tpair_split_{i}_{j}          T^pair, i, j in nn, yy, yn, ny (Tables 13, 14)
  n_{arm}_{state}              pairs in each state (nn, yy, m, yn, ny) under each arm, e.g. n_nothink_m = |M|_nt
  ind_p, ind_q                 p = P(Y|N), q = P(N|Y), each averaged over T^alpha and T^alpha'
  c_ind, b_ind                 expected |c|, |b| if the two sides moved independently (§4.4, `independence_bound`)
  c_actual, b_actual           cells c and b of the contingency table
  c_ind_ratio, b_ind_ratio     independence over actual (Table 12's "ratio": c_ind / c_actual, b_ind / b_actual)
  c_b_ratio_ind, c_b_ratio_actual   |c| / |b| under independence and in the data

Tables (DataFrames):
  t_alpha, t_alpha_prime, t_marginal   `transition_table` layout over Y, N (App. G's 2x2 with counts)
  t_group                      Table 3 layout: rows alpha, alpha_prime, delta; columns p_y_given_y, p_y_given_n, dp_yes
  tpair, tpair_split           `transition_table` layout over NN, YY, M and NN, YY, YN, NY (Tables 4, 13)
  independence                 Table 12 layout, one row: ind_p, ind_q and the c_*, b_*, c_b_* metrics above
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fairaudit.analysis.contingency import cell_labels
from fairaudit.analysis.pairs import ALPHA, ALPHA_PRIME, SIDES, complete_instances, complete_pairs, flips
from fairaudit.analysis.ranges import COUNT, POSITIVE, SHARE, SIGNED

RANGES = {  # the metrics above (analysis.ranges)
    "n_pairs": COUNT, "n_marginal": COUNT, "n_[a-z0-9]+_(nn|yy|m|yn|ny)": COUNT,
    "t_(alpha|alpha_prime|marginal)_(yy|yn|ny|nn)": SHARE, "tpair(_split)?_[a-z]+_[a-z]+": SHARE,
    "dp_yes_(alpha|alpha_prime|marginal)": SIGNED, "delta_t_(yy|yn|ny|nn)": SIGNED, "delta_t_max_abs": SHARE,
    "delta_dp_yes": (-2.0, 2.0), "ind_[pq]": SHARE, "[bc]_actual": COUNT, "[bc]_ind": POSITIVE,
    "[bc]_ind_ratio": POSITIVE, "c_b_ratio_(ind|actual)": POSITIVE,
}
ANSWER_STATES = ("Y", "N")
PAIR_STATES = ("NN", "YY", "M")
SPLIT_STATES = ("NN", "YY", "YN", "NY")
AGREE = ("NN", "YY")
POOLED = ("pooled", "pooled")
TABLE_STATES = {"tpair": PAIR_STATES, "tpair_split": SPLIT_STATES, "t_marginal": ANSWER_STATES}


def transition_table(moves: pd.DataFrame, states: Sequence[str]) -> pd.DataFrame:
    """Row i: P(to = j | from = i) for each state j and the row count n; a last `total` row of column counts.

    moves: before, after (one row per instance or pair). Index "from" (states, then "total"),
    columns the states then "n" (the layout of Tables 4 and 13). A row with n = 0 holds NaN.
    """
    counts = pd.crosstab(moves["before"], moves["after"]).reindex(index=states, columns=states, fill_value=0)
    n = counts.sum(axis=1)
    table = counts.div(n, axis=0)
    table["n"] = n
    table.loc["total"] = [*counts.sum(axis=0), n.sum()]
    table.index.name, table.columns.name = "from", "to"
    return table


def answer_moves(frame: pd.DataFrame, before: str, after: str) -> pd.DataFrame:
    """Per row, the answer (Y / N) in column `before` and in column `after`."""
    # frame: <before>, <after> ("Yes"/"No")
    return pd.DataFrame({"before": frame[before].str[0], "after": frame[after].str[0]})


def pair_states(pairs: pd.DataFrame, arm: str, split: bool = False) -> pd.Series:
    """NN, YY or the mixed state per pair under `arm`: M, or when split YN (alpha Yes) / NY (alpha' Yes)."""
    # pairs: {arm}_alpha, {arm}_alpha_prime ("Yes"/"No")
    joint = pairs[f"{arm}_{ALPHA}"].str[0] + pairs[f"{arm}_{ALPHA_PRIME}"].str[0]
    return joint if split else joint.mask(flips(pairs, arm), "M")


def pair_state_moves(pairs: pd.DataFrame, treatment: str, baseline: str, split: bool = False) -> pd.DataFrame:
    """Per pair, its state under the baseline (before) and under the treatment (after)."""
    return pd.DataFrame({"before": pair_states(pairs, baseline, split), "after": pair_states(pairs, treatment, split)})


def yes_rate_shift(moves: pd.DataFrame) -> float:
    """P(Y) after minus P(Y) before."""
    # moves: before, after (Y / N)
    return float((moves["after"] == "Y").mean() - (moves["before"] == "Y").mean())


def independence_bound(p: float, q: float, nn: float, yy: float, m: float) -> tuple[float, float]:
    """Expected (|c|, |b|) if the two sides of a pair moved independently (§4.4, App. H).

    p = P(Y|N), q = P(N|Y); nn, yy, m are the baseline pair-state populations:
    E|c| = 2p(1-p)|NN| + 2q(1-q)|YY|,  E|b| = [p(1-q) + q(1-p)] |M|.
    """
    return 2 * p * (1 - p) * nn + 2 * q * (1 - q) * yy, (p * (1 - q) + q * (1 - p)) * m


def independence_table(p: float, q: float, nn: float, yy: float, m: float, c_actual: float,
                       b_actual: float) -> pd.DataFrame:
    """Table 12's row: |c| and |b| under independence and in the data, their ratios, and both c/b ratios."""
    c_ind, b_ind = independence_bound(p, q, nn, yy, m)
    counts = pd.DataFrame({"c": [c_ind, c_actual], "b": [b_ind, b_actual]}, index=["ind", "actual"], dtype=float)
    ind_over_actual = counts.loc["ind"] / counts.loc["actual"]  # Series division: x / 0 -> inf, 0 / 0 -> NaN
    c_over_b = counts["c"] / counts["b"]
    row = {
        "ind_p": p,
        "ind_q": q,
        "c_ind": c_ind,
        "c_actual": c_actual,
        "c_ind_ratio": ind_over_actual["c"],
        "b_ind": b_ind,
        "b_actual": b_actual,
        "b_ind_ratio": ind_over_actual["b"],
        "c_b_ratio_ind": c_over_b["ind"],
        "c_b_ratio_actual": c_over_b["actual"],
    }
    return pd.DataFrame([row], dtype=float)


def _table_moves(records: pd.DataFrame, pairs: pd.DataFrame, treatment: str, baseline: str) -> dict[str, pd.DataFrame]:
    """The (before, after) rows behind tpair, tpair_split (complete pairs) and t_marginal (per-side filter)."""
    instances = complete_instances(records, treatment, baseline)
    return {
        "tpair": pair_state_moves(pairs, treatment, baseline),
        "tpair_split": pair_state_moves(pairs, treatment, baseline, split=True),
        "t_marginal": answer_moves(instances, baseline, treatment),
    }


def _flatten(table: pd.DataFrame, prefix: str, states: Sequence[str], sep: str = "") -> dict[str, float]:
    """Metric per transition probability: f"{prefix}_{from}{sep}{to}", lower case."""
    return {f"{prefix}_{i.lower()}{sep}{j.lower()}": float(table.at[i, j]) for i in states for j in states}


def _group_level(pairs: pd.DataFrame, treatment: str,
                 baseline: str) -> tuple[dict[str, float], dict[str, pd.DataFrame]]:
    """T^A per side, the Yes-rate shifts, T^alpha - T^alpha' and the Table 3 summary."""
    metrics: dict[str, float] = {}
    tables: dict[str, pd.DataFrame] = {}
    for side in SIDES:
        moves = answer_moves(pairs, f"{baseline}_{side}", f"{treatment}_{side}")
        tables[f"t_{side}"] = transition_table(moves, ANSWER_STATES)
        metrics |= _flatten(tables[f"t_{side}"], f"t_{side}", ANSWER_STATES)
        metrics[f"dp_yes_{side}"] = yes_rate_shift(moves)
    for key in ("yy", "yn", "ny", "nn"):
        metrics[f"delta_t_{key}"] = metrics[f"t_{ALPHA}_{key}"] - metrics[f"t_{ALPHA_PRIME}_{key}"]
    metrics["delta_dp_yes"] = metrics[f"dp_yes_{ALPHA}"] - metrics[f"dp_yes_{ALPHA_PRIME}"]
    metrics["delta_t_max_abs"] = float(np.fmax(abs(metrics["delta_t_yy"]), abs(metrics["delta_t_ny"])))
    rows = {side: (f"t_{side}", f"dp_yes_{side}") for side in SIDES} | {"delta": ("delta_t", "delta_dp_yes")}
    tables["t_group"] = pd.DataFrame.from_dict(
        {label: [metrics[f"{t}_yy"], metrics[f"{t}_ny"], metrics[dp]] for label, (t, dp) in rows.items()},
        orient="index",
        columns=["p_y_given_y", "p_y_given_n", "dp_yes"],
    )
    return metrics, tables


def _pair_populations(tpair: pd.DataFrame, tpair_split: pd.DataFrame, treatment: str,
                      baseline: str) -> dict[str, float]:
    """Pairs per state under the baseline (row counts) and under the treatment (column totals)."""
    out: dict[str, float] = {}
    for table in (tpair, tpair_split):
        states = [s for s in table.columns if s != "n"]
        out |= {f"n_{baseline}_{s.lower()}": float(table.at[s, "n"]) for s in states}
        out |= {f"n_{treatment}_{s.lower()}": float(table.at["total", s]) for s in states}
    return out


def _check_cells(moves: pd.DataFrame, cells: pd.Series) -> None:
    """The {NN,YY}->M mass of T^pair is cell c and its M->{NN,YY} mass is cell b (§3.4)."""
    created = moves["before"].isin(AGREE) & (moves["after"] == "M")
    resolved = (moves["before"] == "M") & moves["after"].isin(AGREE)
    assert created.sum() == (cells == "c").sum(), "T^pair {NN,YY}->M mass differs from cell c"
    assert resolved.sum() == (cells == "b").sum(), "T^pair M->{NN,YY} mass differs from cell b"


def transitions(records: pd.DataFrame, treatment: str = "think", baseline: str = "nothink") -> dict:
    """Bias transition matrices of `treatment` against `baseline`: {"metrics": {...}, "tables": {...}}.

    records: the long records frame of docs/architecture.md (pair_id, side, arm, answer, p_yes, ...).
    Metric and table names are listed in this module's docstring.
    """
    pairs = complete_pairs(records, treatment, baseline)
    metrics, tables = _group_level(pairs, treatment, baseline)
    moves = _table_moves(records, pairs, treatment, baseline)
    tables |= {name: transition_table(rows, TABLE_STATES[name]) for name, rows in moves.items()}

    metrics["n_pairs"] = float(len(pairs))
    metrics |= _flatten(tables["t_marginal"], "t_marginal", ANSWER_STATES)
    metrics["dp_yes_marginal"] = yes_rate_shift(moves["t_marginal"])
    metrics["n_marginal"] = float(len(moves["t_marginal"]))
    metrics |= _flatten(tables["tpair"], "tpair", PAIR_STATES, sep="_")
    metrics |= _flatten(tables["tpair_split"], "tpair_split", SPLIT_STATES, sep="_")
    metrics |= _pair_populations(tables["tpair"], tables["tpair_split"], treatment, baseline)

    cells = cell_labels(pairs, treatment, baseline)
    _check_cells(moves["tpair"], cells)
    p = (metrics[f"t_{ALPHA}_ny"] + metrics[f"t_{ALPHA_PRIME}_ny"]) / 2
    q = (metrics[f"t_{ALPHA}_yn"] + metrics[f"t_{ALPHA_PRIME}_yn"]) / 2
    nn, yy, m = (tables["tpair"].at[state, "n"] for state in PAIR_STATES)
    tables["independence"] = independence_table(p, q, nn, yy, m, (cells == "c").sum(), (cells == "b").sum())
    metrics |= {name: float(value) for name, value in tables["independence"].iloc[0].items()}
    return {"metrics": metrics, "tables": tables}


def pooled_transitions(
    records: pd.DataFrame, treatment: str = "think", baseline: str = "nothink"
) -> dict[str, pd.DataFrame]:
    """tpair, tpair_split and t_marginal per (model, dataset) cell and pooled over the cells.

    records: model, dataset and the records columns, several runs stacked; pair_id need only be
    unique within a cell. Each table has the `transition_table` layout indexed by (model, dataset,
    from); the pooled rows sit under model = dataset = "pooled" (counts summed over cells).
    """
    by_cell = {
        cell: _table_moves(runs, complete_pairs(runs, treatment, baseline), treatment, baseline)
        for cell, runs in records.groupby(["model", "dataset"])
    }
    out = {}
    for name, states in TABLE_STATES.items():
        moves = {cell: tables[name] for cell, tables in by_cell.items()}
        per_cell = {cell: transition_table(rows, states) for cell, rows in moves.items()}
        per_cell[POOLED] = transition_table(pd.concat(list(moves.values())), states)
        out[name] = pd.concat(per_cell, names=["model", "dataset"])
    return out
