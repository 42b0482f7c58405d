"""How study tables read: paper-style headers and number formats, as Markdown and as rich tables."""

from __future__ import annotations

import math
import re
from typing import Callable

import pandas as pd
from rich.table import Table

from fairaudit.analysis.numbers import format_p, log10_sibling
from fairaudit.analysis.study import AXES
from fairaudit.views.sections import Section

NA = "n/a"
COUNT_COLUMNS = re.compile(r"^(n|n_.+|cell_[abcd](_.+)?|[cd]_alpha(_prime)?_up|successes|ties|model_calls|"
                           r"influence_k_.+|.+_count(_.+)?|.+_ci_n|skipped_.+)$")  # whole numbers, shown as such



def _fixed(digits: int, signed: bool = False, scale: float = 1.0) -> Callable[[float], str]:
    def fmt(value: float) -> str:
        return f"{value * scale:{'+' if signed else ''}.{digits}f}"
    return fmt


def number_format(column: str) -> Callable[[float], str]:
    """The display format of a metric column (counts, p from log10, signed deltas, delta_c in %)."""
    if COUNT_COLUMNS.match(column):
        return lambda v: f"{int(round(v))}"
    if column.endswith("log10_p"):
        return format_p
    if column == "delta_c":
        return _fixed(2, signed=True, scale=100.0)
    if column.startswith("delta_"):
        return _fixed(3, signed=True)
    return _fixed(3)


def _cell(value, fmt: Callable[[float], str]) -> str:
    if isinstance(value, str):
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NA
    return fmt(float(value))


def display(table: pd.DataFrame, headers: dict[str, str] | None = None,
            formats: dict[str, Callable[[float], str]] | None = None) -> pd.DataFrame:
    """`table` as strings: each numeric column in its metric's format, columns renamed by `headers`. A p column
    with its log10 twin in the table (`trunc_ccp_chi2_p`, `trunc_ccp_chi2_log10_p`) shows the twin, by `format_p`,
    so a p below the smallest double reads as 10^-485.6; the twin is not shown again."""
    headers, formats = headers or {}, formats or {}
    twins = {column: log10_sibling(column) for column in table.columns if log10_sibling(column) in table.columns}
    out = pd.DataFrame(index=table.index)
    for column in table.columns:
        if column in twins.values():
            continue
        if column in AXES:
            out[headers.get(column, column)] = table[column].astype(str)
            continue
        if column in twins:
            source, fmt = twins[column], format_p
        else:
            source, fmt = column, formats.get(column) or number_format(column)
        out[headers.get(column, column)] = [_cell(v, fmt) for v in table[source]]
    return out


def section(name: str, title: str, table: pd.DataFrame, headers: dict[str, str], note: str = "",
            formats: dict | None = None, shown: pd.DataFrame | None = None) -> Section:
    """A report section: `table` numeric in its CSV, `shown` (default: `table` formatted) in report.md."""
    return Section(name, title, table, display(table if shown is None else shown, headers, formats), note)


def count(value: float) -> str:
    """A count with thousands separators: 12,345."""
    return f"{int(round(value)):,}"


def one_decimal(value: float) -> str:
    return f"{value:.1f}" if math.isfinite(value) else NA


def times(value: float) -> str:
    """A ratio as a factor: 1.25×."""
    return f"{value:.2f}×" if math.isfinite(value) else NA


def paper_headers(treatment: str, baseline: str) -> dict[str, str]:
    """Column titles of paper 000's Tables 2 (with the P(Yes) gaps beside it), 9 and 5."""
    return {
        "n_pairs": "N", "cell_a": "a", "cell_b": "b", "cell_c": "c", "cell_d": "d", "mcnemar_log10_p": "McNemar p",
        f"d_disp_b_{baseline}": f"D_disp b {baseline}", f"d_disp_b_{treatment}": f"D_disp b {treatment}",
        f"d_disp_c_{baseline}": f"D_disp c {baseline}", f"d_disp_c_{treatment}": f"D_disp c {treatment}",
        f"d_cf_{treatment}": f"D_cf {treatment}", f"d_group_{treatment}": f"D_group {treatment}",
        f"d_cf_{baseline}": f"D_cf {baseline}", f"d_group_{baseline}": f"D_group {baseline}",
        "delta_d_cf": "ΔD_cf", "delta_d_group": "ΔD_group",
        "c_alpha_up": "c α↑", "c_alpha_prime_up": "c α′↑", "asym_c": "asym(c)", "delta_c": "δ_c (%)",
        "c_b_ratio": "c:b",
        f"p_gap_{baseline}": f"P(Yes) gap {baseline}", f"p_gap_{treatment}": f"P(Yes) gap {treatment}",
        "delta_p_gap": "ΔP(Yes) gap",
    }


def seed_display(summary: pd.DataFrame, axes: list[str]) -> pd.DataFrame:
    """Seed summary rows as cell | metric | n | mean | SD | 95% interval: n the seeds with a finite value, "of" all
    where some were infinite or missing; a p-value's mean the seeds' combined p (`study.seed_summary`)."""
    def g(v: float) -> str:
        return NA if not math.isfinite(v) else f"{v:.4g}"
    out = summary[[*axes, "metric"]].astype(str).copy()
    total = summary["n"] + summary["n_infinite"] + summary["n_missing"]
    out["n"] = [f"{n} of {all_}" if n < all_ else str(n) for n, all_ in zip(summary["n"], total)]
    out["mean"] = [f"combined p {format_p(log10_p)}" if math.isfinite(log10_p) else g(mean)
                   for mean, log10_p in zip(summary["mean"], summary["log10_p_combined"])]
    out["SD"] = summary["sd"].map(g)
    bounds = zip(summary["ci_low"], summary["ci_high"])
    out["CI"] = [f"[{g(lo)}, {g(hi)}]" if math.isfinite(lo) else NA for lo, hi in bounds]
    return out


def markdown(frame: pd.DataFrame) -> str:
    """A string frame as a GitHub Markdown table (numbers right-aligned)."""
    def esc(text: object) -> str:
        return str(text).replace("|", "\\|")
    columns = list(frame.columns)
    numeric = [all(_looks_numeric(v) for v in frame[c]) for c in columns]
    lines = ["| " + " | ".join(esc(c) for c in columns) + " |",
             "| " + " | ".join("---:" if num else ":---" for num in numeric) + " |"]
    lines += ["| " + " | ".join(esc(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def _looks_numeric(value: object) -> bool:
    text = str(value).strip()
    return text in ("", NA) or bool(re.match(r"^[+\-−]?[\d.]+(e[+\-]?\d+)?%?$", text)) or text.startswith("[")


def rich_table(frame: pd.DataFrame, title: str, last_is_total: bool = False) -> Table:
    """A string frame as a rich table; a pooled last row set apart in bold."""
    table = Table(title=title)
    for column in frame.columns:
        table.add_column(str(column), justify="right" if all(_looks_numeric(v) for v in frame[column]) else "left")
    rows = list(frame.itertuples(index=False))
    for i, row in enumerate(rows):
        total = last_is_total and i == len(rows) - 1
        before_total = last_is_total and i == len(rows) - 2
        table.add_row(*[str(v) for v in row], style="bold" if total else None, end_section=before_total)
    return table
