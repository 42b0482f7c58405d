"""Paper 000's cross-cell tables and figures from stacked records (Tables 3/10/11, 4/13/14, 6, 12, App. G;
Figs. 3, 4, 6).

Every function takes the records of several (model, dataset) cells stacked into one frame:
model, dataset and the records columns of docs/architecture.md (pair_id, side, arm, answer, p_yes);
pair_id need only be unique within a cell. Cells keep their order of first appearance.
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import pandas as pd

from fairaudit.analysis.cdpg import cdpg
from fairaudit.analysis.transitions import pooled_transitions, transitions

CELL = ["model", "dataset"]
SIDE_LABELS = {"alpha": "α", "alpha_prime": "α′", "delta": "Δ = T^α − T^α′"}
GROUP_COLUMNS = ("p_y_given_y", "p_y_given_n", "dp_yes")


def cells(records: pd.DataFrame) -> Iterator[tuple[tuple[str, str], pd.DataFrame]]:
    """(model, dataset) and that cell's records, in order of first appearance."""
    yield from records.groupby(CELL, sort=False)


def group_transitions(records: pd.DataFrame, treatment: str = "think", baseline: str = "nothink") -> pd.DataFrame:
    """Tables 3, 10, 11: T^A per protected value, one row per (model, A), a column block per dataset.

    Rows A = alpha, alpha_prime and delta (T^alpha - T^alpha'); columns
    {dataset}_p_y_given_y, {dataset}_p_y_given_n, {dataset}_dp_yes (P(Y|Y), P(Y|N), ΔP(Y)).
    """
    long = []
    for (model, dataset), frame in cells(records):
        t_group = transitions(frame, treatment, baseline)["tables"]["t_group"]
        long.append(t_group.rename_axis("A").reset_index().assign(model=model, dataset=dataset))
    long = pd.concat(long, ignore_index=True)
    datasets = list(dict.fromkeys(long["dataset"]))
    wide = long.pivot_table(index=["model", "A"], columns="dataset", values=list(GROUP_COLUMNS), sort=False)
    wide.columns = [f"{dataset}_{value}" for value, dataset in wide.columns]
    ordered = [f"{d}_{v}" for d in datasets for v in GROUP_COLUMNS]
    wide = wide.reindex(columns=ordered).reset_index()
    order = {side: i for i, side in enumerate(SIDE_LABELS)}
    models = {m: i for i, m in enumerate(dict.fromkeys(long["model"]))}
    return wide.sort_values(["model", "A"], key=lambda s: s.map(models if s.name == "model" else order),
                            ignore_index=True)


def pair_state_transitions(records: pd.DataFrame, treatment: str = "think", baseline: str = "nothink",
                           split: bool = False) -> pd.DataFrame:
    """Tables 4 (NN, YY, M) and, with `split`, 13 and 14 (M split into YN and NY): T^pair per cell and pooled.

    One row per (model, dataset, from state) and a `total` row of column counts per cell;
    columns the states (P(to | from)) and n (the row's pairs). Pooled rows: model = dataset = "pooled".
    """
    table = pooled_transitions(records, treatment, baseline)["tpair_split" if split else "tpair"]
    return table.reset_index()


def independence_check(records: pd.DataFrame, treatment: str = "think", baseline: str = "nothink") -> pd.DataFrame:
    """Table 12: |c| and |b| under within-pair independence against the data, per (model, dataset).

    Columns model, dataset, ind_p, ind_q, c_ind, c_actual, c_ind_ratio, b_ind, b_actual,
    b_ind_ratio, c_b_ratio_ind, c_b_ratio_actual (see `transitions`).
    """
    rows = [transitions(frame, treatment, baseline)["tables"]["independence"].assign(model=model, dataset=dataset)
            for (model, dataset), frame in cells(records)]
    table = pd.concat(rows, ignore_index=True)
    return table[CELL + [c for c in table.columns if c not in CELL]]


def marginal_transition(records: pd.DataFrame, treatment: str = "think", baseline: str = "nothink") -> pd.DataFrame:
    """Appendix G's pooled marginal T = E_A[T^A] under the per-side parse filter, with counts.

    Rows baseline = Y, N; columns count and P for treatment = Y and N, and the row total.
    """
    table = pooled_transitions(records, treatment, baseline)["t_marginal"].sort_index().loc[("pooled", "pooled")]
    rows = []
    for state in ("Y", "N"):
        n = table.at[state, "n"]
        counts = {to: round(table.at[state, to] * n) if n else 0 for to in ("Y", "N")}  # no row: P is NaN, counts 0
        rows.append({baseline: state, "n_to_y": counts["Y"], "p_to_y": table.at[state, "Y"],
                     "n_to_n": counts["N"], "p_to_n": table.at[state, "N"], "n": n})
    return pd.DataFrame(rows)


def pooled_cdpg(depth_records: pd.DataFrame, records: pd.DataFrame, treatment: str = "think",
                baseline: str = "nothink", K: int = 10, k_list: Sequence[int] = (5, 10, 20),
                k_sensitivity_subsample: int | None = None) -> dict:
    """`cdpg` over every cell at once: its tables hold pooled rows (Figs. 3, 4, 6) and one block per cell.

    depth_records: model, dataset, pair_id, side, K, k, p_yes_k [, arm]. The final-depth
    identity was checked when each run was made, so it is not re-checked here.
    """
    return cdpg(depth_records, records, treatment, baseline, k_list=k_list, K=K,
                identity_atol=math.inf, k_sensitivity_subsample=k_sensitivity_subsample)


def k_sensitivity(cdpg_tables: dict[str, pd.DataFrame], cell: str = "c") -> pd.DataFrame:
    """Table 6: the propagation slope of `cell` per (model, dataset) at each K, and the cell's pair count.

    cdpg_tables: `pooled_cdpg(...)["tables"]`. Columns model, dataset, n_{cell} and slope_k{K}.
    """
    table = cdpg_tables["cdpg_k_sensitivity"]
    rows = table[(table["cell"] == cell) & (table["model"] != "pooled")].reset_index(drop=True)
    n_columns = [c for c in rows.columns if c.startswith("n_k")]
    slopes = [c for c in rows.columns if c.startswith("slope_k")]
    out = rows[CELL].copy()
    out[f"n_{cell}"] = rows[n_columns].max(axis=1).astype(int) if n_columns else 0
    return pd.concat([out, rows[slopes]], axis=1)
