"""The report's section on traces the token budget cut: Table 2 again over the pairs whose every trace completed,
beside the pairs of each cell that hold a cut trace, one row per run and a pooled row (registered by the paired probes)."""

from __future__ import annotations

import pandas as pd

from fairaudit.analysis import study
from fairaudit.analysis.contingency import CELLS, contingency
from fairaudit.analysis.pairs import TEXT_COLUMNS
from fairaudit.analysis.truncation import COMPLETE, completed, truncated_by_cell
from fairaudit.report import render
from fairaudit.report.papers import comparison, table_runs
from fairaudit.report.sections import RecordsLoader, Report, Section


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


def completed_traces(report: Report, runs: pd.DataFrame, load_records: RecordsLoader, cfg) -> None:
    """Table 2 over completed traces, with the truncated pairs per cell, when the paired runs logged them."""
    rows = table_runs(runs, list(cfg.tables.probes))
    if rows.empty or "n_pairs_truncated" not in rows or rows["n_pairs_truncated"].isna().all():
        return
    treatment, baseline = comparison(rows)
    axes = study.cell_axes(rows)
    columns = truncation_columns(treatment, baseline)
    pooled = pooled_truncation(study.pool_records(load_records(list(rows["run_id"]))), treatment, baseline)
    table = study.study_table(rows, columns, axes, pooled)
    paper = render.paper_headers(treatment, baseline)
    headers = {"n_pairs_truncated": "N cut"} | {f"cell_{c}_truncated": f"{c} cut" for c in CELLS}
    headers |= {f"{name}{COMPLETE}": f"{paper.get(name, name)} (complete)" for name in study.table2_columns(treatment, baseline)}
    formats = {name: render.number_format(name.removesuffix(COMPLETE)) for name in columns[5:]}
    formats |= {name: render.number_format("n") for name in columns[:5]}
    note = (f"N cut: pairs with a trace the token budget cut (any side, either arm); a-d cut: those among each cell's "
            f"pairs (a cut trace still counts as an answer under answer_source=forced). The (complete) columns are Table 2 "
            f"over the pairs whose every trace completed; the pooled row pools the records of {len(rows)} runs.")
    report.sections.append(Section("table2_complete", "Table 2 over completed traces, and the traces the budget cut",
                                   table, render.display(table, headers, formats), note, pooled_last=True))
    report.metrics.update({f"pooled_{k}": v for k, v in pooled.items() if isinstance(v, (int, float))})
