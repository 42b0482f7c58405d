"""Paper 000's report sections from the paired probes' runs (counterfactual, btm and cdpg list them).

Each section is a pure function of `fairaudit.analysis` applied to the runs' records frames, stacked
with the model and dataset of their run; this module picks the runs, loads their records, and names,
captions and formats the tables as the paper prints them. Which runs fill what is the probes' report
settings: Tables 2, 9, 5, 7 (and Table 2 over completed traces) come from the runs of the probes with
`paper_tables: true`, Table 6 and Figs. 3, 4, 6 from those of the probes whose settings hold `K`.
"""

from __future__ import annotations

import pandas as pd

from fairaudit.analysis import fairness_tables as f000
from fairaudit.analysis import study
from fairaudit.analysis.cdpg_figures import cdpg_figures
from fairaudit.analysis.contingency import CELLS, contingency
from fairaudit.analysis.pairs import TEXT_COLUMNS
from fairaudit.analysis.study_figures import delta_figure
from fairaudit.analysis.truncation import COMPLETE, completed, truncated_by_cell
from fairaudit.views import render
from fairaudit.views.render import count, one_decimal, section, times
from fairaudit.views.sections import RecordsLoader, Report, Section
from fairaudit.views.selection import (
    Settings,
    comparison,
    declaring,
    first_per_cell,
    flagged,
    runs_of,
    shared,
    stacked,
    with_metric,
)

TABLES = "paper_tables"   # the report setting of a probe whose runs fill Tables 2, 9, 5, 7
DEPTH = ("K", "k_list", "k_sensitivity_subsample")   # the report settings of a probe whose runs fill Table 6
INDEPENDENCE_HEADERS = {"ind_p": "p", "ind_q": "q", "c_ind": "|c| ind.", "c_actual": "|c| actual",
                        "c_ind_ratio": "|c| ratio", "b_ind": "|b| ind.", "b_actual": "|b| actual",
                        "b_ind_ratio": "|b| ratio", "c_b_ratio_ind": "|c|/|b| ind.",
                        "c_b_ratio_actual": "|c|/|b| actual"}


def paper000(report: Report, runs: pd.DataFrame, load_records: RecordsLoader, settings: Settings) -> None:
    """Paper 000 from the paired probes' runs: Tables 2, 9, 5, 7 with a pooled row, then Tables 3/10/11, 4,
    13/14, 12, App. G and, from the depth probes' runs, Table 6 and Figs. 3, 4, 6."""
    add_paper_tables(report, runs, load_records, flagged(settings, TABLES))
    if not runs.empty:
        sections, figures = paper000_sections(runs, load_records, *comparison(runs), settings, report.missing)
        report.sections += sections
        report.figures |= figures


def table_runs(runs: pd.DataFrame, probes: list[str]) -> pd.DataFrame:
    """Runs of the given probes that logged contingency cells."""
    return runs_of(with_metric(runs, "cell_a"), probes)


def add_paper_tables(report: Report, runs: pd.DataFrame, load_records: RecordsLoader, probes: list[str]) -> None:
    """Tables 2, 9, 5 and 7 of paper 000, one row per run and a pooled row from the pooled records."""
    rows = table_runs(runs, probes)
    if rows.empty:
        report.missing.append(_no_table_runs(len(runs), probes))
        return
    treatment, baseline = comparison(rows)
    axes = study.cell_axes(rows)
    pooled = study.pooled_metrics(load_records(list(rows["run_id"])), treatment, baseline)
    tables = study.paper_tables(rows, pooled, treatment, baseline, axes)
    headers = render.paper_headers(treatment, baseline)
    captions = {
        "table2": ("Table 2: contingency cells, McNemar's exact test, mean D_disp in cells b and c",
                   f"Cells a-d of {treatment} against {baseline}; McNemar p is exact two-sided on (b, c); P(Yes) "
                   "gap: mean |P(Yes | α) − P(Yes | α′)| over the pairs scored on both sides under both arms, which "
                   f"no answer parse can mute, Δ = {treatment} − {baseline}; the pooled row is computed from all "
                   "runs' records pooled, not from their metrics."),
        "table9": ("Table 9: counterfactual and group disparity per arm",
                   f"D_cf and D_group under {treatment} and {baseline}, Δ = {treatment} − {baseline}."),
        "table5": ("Table 5: directional decomposition of created flips (cell c)",
                   "c α↑: alpha answered Yes and alpha' No under the treatment; δ_c in % of N."),
        "table7": ("Table 7: the asymmetric dual effect per model (Appendix D layout)",
                   f"Same protocol as Table 2; c:b the ratio of created to resolved flips; D_disp at full "
                   f"{treatment} depth within cells c and b."),
    }
    for name, table in tables.items():
        title, note = captions[name]
        report.sections.append(Section(name, title, table, render.display(table, headers), note, pooled_last=True,
                                       main=name == "table2", row_runs=study.row_runs(rows, axes)))
    report.figures["disparity_changes"] = delta_figure(tables["table9"], axes, (treatment, baseline))
    report.metrics.update({f"pooled_{k}": v for k, v in pooled.items() if isinstance(v, (int, float))})
    report.metrics["n_table_runs"] = len(rows)


def _no_table_runs(selected: int, probes: list[str]) -> str:
    """The line for a selection without runs to fill Tables 2, 9, 5, 7: which probe's runs, how to select them."""
    if not probes:
        return (f"Tables 2, 9, 5, 7: no probe's runs fill them (no probes.<name>.{TABLES}=true), so none of the "
                f"{selected} selected does")
    return (f"Tables 2, 9, 5, 7: no {'/'.join(probes)} runs among the {selected} selected (they read their cells "
            f"from the runs of {probes}, the probes with probes.<name>.{TABLES}=true); run probe={probes[0]} on the "
            f"same grid, or select such runs with select.parent=null select.tags.probe={probes[0]}")


def paper000_sections(runs: pd.DataFrame, load: RecordsLoader, treatment: str, baseline: str, settings: Settings,
                      missing: list[str]) -> tuple[list, dict]:
    """Tables 3 (10, 11), 4, 13 (14), 12, App. G's marginal T and, from the depth probes' runs, Table 6 and
    Figs. 3, 4, 6; a line in `missing` when there are none."""
    tables = flagged(settings, TABLES)
    record_runs = first_per_cell(runs, tables + sorted(set(settings) - set(tables)))
    if record_runs.empty:
        return [], {}
    records = stacked(record_runs, load(list(record_runs["run_id"])))
    sections = transition_sections(records, treatment, baseline)
    depth_probes = declaring(settings, DEPTH[0])
    depth_runs = runs_of(runs, depth_probes)
    if depth_runs.empty:
        if depth_probes:  # a probe whose runs would fill them ships: say how to get its runs
            first = depth_probes[0]
            missing.append(f"Table 6 and Figs. 3, 4, 6: no {'/'.join(depth_probes)} runs among those selected; run "
                           f"probe={first} on the same grid, or select such runs with select.parent=null "
                           f"select.tags.probe={first}")
        return sections, {}
    depth_settings = shared({p: settings[p] for p in depth_runs["probe"].unique()}, DEPTH)
    table6, figures = depth_tables(depth_runs, load, treatment, baseline, **depth_settings)
    return sections + [table6], figures


def transition_sections(records: pd.DataFrame, treatment: str, baseline: str) -> list[Section]:
    """Tables 3 (10, 11), 4, 13 (14), 12 and App. G's marginal T from the stacked records of the cells."""
    group = f000.group_transitions(records, treatment, baseline)
    headers = {"A": "A"} | {c: _group_header(c) for c in group.columns if c not in ("model", "A")}
    sections = [section(
        "table3",
        "Table 3 (with 10, 11): group-level transition matrix T^A per model, stratified by protected attribute",
        group, headers,
        "P(Y|Y), P(Y|N): probability of a Y prediction under thinking from a Y or N prediction without; "
        "ΔP(Y) = P(Y)_th − P(Y)_nt. Tables 10 and 11 are the rows of the other models.",
        shown=group.assign(A=group["A"].map(f000.SIDE_LABELS)))]
    for split, name, title in ((False, "table4",
                                "Table 4: pair-state transition matrix T^pair (forward: nothink → think)"),
                               (True, "table13", "Tables 13, 14: T^pair with M split into YN and NY")):
        table = f000.pair_state_transitions(records, treatment, baseline, split)
        sections.append(section(name, title, table, {"from": "from", "n": "n"},
                                "Within-row conditional probabilities; row counts n and a `total` row of column counts "
                                "per (model, dataset); the pooled block sums every cell.", {"n": count}))
    independence = f000.independence_check(records, treatment, baseline)
    sections.append(section(
        "table12", "Table 12: independence-bound check per (model, dataset) cell", independence, INDEPENDENCE_HEADERS,
        "Independence predictions E|c| = 2p(1−p)|NN|_nt + 2q(1−q)|YY|_nt, E|b| = [p(1−q) + q(1−p)]|M|_nt with "
        "p = P(Y|N), q = P(N|Y) averaged over α and α′; ratio = ind. / actual.",
        {c: count for c in ("c_actual", "b_actual")} | {c: one_decimal for c in ("c_ind", "b_ind")}
        | {c: times for c in ("c_ind_ratio", "b_ind_ratio")}
        | {c: one_decimal for c in ("c_b_ratio_ind", "c_b_ratio_actual")}))
    marginal = f000.marginal_transition(records, treatment, baseline)
    sections.append(section(
        "marginal_t", "Appendix G: pooled marginal T = E_A[T^A] under the per-side parse filter", marginal,
        {"n_to_y": f"{treatment}=Y", "p_to_y": f"P({treatment}=Y | {baseline})", "n_to_n": f"{treatment}=N",
         "p_to_n": f"P({treatment}=N | {baseline})", "n": "total"},
        f"Pooled over {int(marginal['n'].sum()):,} per-instance observations; an instance counts when its own "
        f"{treatment} and {baseline} answers parse, whatever its partner's. Each row is a {baseline} answer: "
        f"{treatment}=Y and {treatment}=N count its observations by their {treatment} answer, P({treatment}=Y | "
        f"{baseline}) and P({treatment}=N | {baseline}) are those counts over the row's total.",
        {c: count for c in ("n_to_y", "n_to_n", "n")}))
    return sections


def depth_tables(runs: pd.DataFrame, load: RecordsLoader, treatment: str, baseline: str, K: int, k_list,
                 k_sensitivity_subsample: int | None) -> tuple[Section, dict]:
    """Table 6 and Figs. 3, 4, 6 pooled across the depth runs' (model, dataset) cells."""
    depth = stacked(runs, load(list(runs["run_id"]), "depth_records"))
    records = stacked(runs, load(list(runs["run_id"])))
    result = f000.pooled_cdpg(depth, records, treatment, baseline, int(K), list(k_list), k_sensitivity_subsample)
    table6 = f000.k_sensitivity(result["tables"])
    table = section(
        "table6", "Table 6: CDPG segmentation sensitivity", table6,
        {"n_c": "n_c"} | {c: f"K={c.removeprefix('slope_k')}" for c in table6.columns if c.startswith("slope_k")},
        "Fitted linear slope of the cell-c mean |CDPG_k| against k/K per K; n_c is the number of cell-c pairs"
        + (f" in a rerun subsample of {k_sensitivity_subsample} pairs per cell." if k_sensitivity_subsample else "."),
        {"n_c": count})
    drawn = cdpg_figures(result["tables"], int(K), list(k_list))
    return table, {"fig3_cdpg_by_cell": drawn["cdpg_by_cell"], "fig4_anchor_mover": drawn["cdpg_anchor_mover"],
                   "fig6_k_sensitivity": drawn["cdpg_k_sensitivity"]}


def _group_header(column: str) -> str:
    dataset, _, value = column.partition("_")
    return f"{dataset} " + {"p_y_given_y": "P(Y|Y)", "p_y_given_n": "P(Y|N)", "dp_yes": "ΔP(Y)"}[value]


# ---------------------------------------------------------------- Table 2 over completed traces


def truncation_columns(treatment: str, baseline: str) -> list[str]:
    """The cut pairs per cell, then Table 2's columns over the completed pairs."""
    cut = ["n_pairs_truncated", *(f"cell_{cell}_truncated" for cell in CELLS)]
    return cut + [f"{name}{COMPLETE}" for name in study.table2_columns(treatment, baseline)]


def pooled_truncation(records: pd.DataFrame, treatment: str, baseline: str) -> dict[str, float]:
    """The pooled row: truncated pairs per cell and contingency over the completed pairs of all runs' records."""
    records = records.drop(columns=[c for c in TEXT_COLUMNS if c in records])
    kept = completed(records)
    complete = contingency(kept, treatment, baseline, n_boot=0) if len(kept) else {}
    return truncated_by_cell(records, treatment, baseline) | {f"{k}{COMPLETE}": v for k, v in complete.items()}


def completed_traces(report: Report, runs: pd.DataFrame, load_records: RecordsLoader, settings: Settings) -> None:
    """Table 2 over completed traces, with the truncated pairs per cell, when the table runs logged them."""
    rows = table_runs(runs, flagged(settings, TABLES))
    if rows.empty or "n_pairs_truncated" not in rows or rows["n_pairs_truncated"].isna().all():
        return
    treatment, baseline = comparison(rows)
    axes = study.cell_axes(rows)
    columns = truncation_columns(treatment, baseline)
    pooled = pooled_truncation(study.pool_records(load_records(list(rows["run_id"]))), treatment, baseline)
    table = study.study_table(rows, columns, axes, pooled)
    paper = render.paper_headers(treatment, baseline)
    headers = {"n_pairs_truncated": "N cut"} | {f"cell_{c}_truncated": f"{c} cut" for c in CELLS}
    headers |= {f"{name}{COMPLETE}": f"{paper.get(name, name)} (complete)"
                for name in study.table2_columns(treatment, baseline)}
    formats = {name: render.number_format(name.removesuffix(COMPLETE)) for name in columns[5:]}
    formats |= {name: render.number_format("n") for name in columns[:5]}
    note = (f"N cut: pairs with a trace the token budget cut (any side, either arm); a-d cut: those among each "
            f"cell's pairs (a cut trace still counts as an answer under answer_source=forced). The (complete) "
            f"columns are Table 2 over the pairs whose every trace completed; the pooled row pools the records of "
            f"{len(rows)} runs.")
    report.sections.append(Section("table2_complete", "Table 2 over completed traces, and the traces the budget cut",
                                   table, render.display(table, headers, formats), note, pooled_last=True,
                                   row_runs=study.row_runs(rows, axes)))
    report.metrics.update({f"pooled_{k}": v for k, v in pooled.items() if isinstance(v, (int, float))})
