"""Results on stdout: a verdict's lines (its warnings in yellow) and metrics as tables, numbers as people read them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from fairaudit.analysis.degenerate import WARNING
from fairaudit.analysis.numbers import format_number, format_p, log10_sibling
from fairaudit.analysis.undefined import footnotes, why_undefined
from fairaudit.terminal.output import out

if TYPE_CHECKING:  # pandas is imported where a frame is shown: the hf backend needs torch and transformers alone
    import pandas as pd


class NotedTable(Table):
    """A table with lines printed under it, each kept on one line (a caption would wrap at the table's width):
    why an n/a is undefined, which warnings qualify a row."""

    def __init__(self, *args, notes: list[str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.notes = list(notes or [])


def print_result(table: Table) -> None:
    """A results table on stdout, at its natural width when stdout is a file or pipe (never squeezed to 80 columns),
    then its notes (`NotedTable`), warnings in yellow."""
    if not out.is_terminal:  # rich clamps print(width=...) to the console's width, so widen the console itself
        out.width = max(out.width, out.measure(table, options=out.options.update_width(1000)).maximum)
    out.print(table)
    print_verdict(getattr(table, "notes", []))


def print_verdict(lines: list[str]) -> None:
    """A probe's verdict on stdout: its sentences, then its warnings in yellow. Off a terminal each line
    stays one line (grep finds it); on one it wraps at the terminal's width."""
    for line in lines:
        warning = line.startswith(WARNING)
        text = f"[bold yellow]warning:[/bold yellow] {escape(line[len(WARNING):])}" if warning else escape(line)
        out.print(text, highlight=False, soft_wrap=not out.is_terminal)


def summary_table(title: str, metrics: dict[str, float], names: list[str]) -> Table:
    """The headline metrics as a two-column table; a p-value (`<name>_p`) from its `<name>_log10_p`, so one
    below the smallest double still reads as what it is (10^-485.6); under it, why each n/a is undefined."""
    shown = [name for name in names if name in metrics]
    table = NotedTable(title=title, notes=footnotes(why_undefined(metrics, shown)))
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name in shown:
        table.add_row(name, format_metric(name, metrics))
    return table


def format_metric(name: str, metrics: dict[str, Any]) -> str:
    """metrics[name] as `format_number` shows it; a p-value with its log10 beside it (mcnemar_p and mcnemar_log10_p,
    trunc_ccp_chi2_p_cot and trunc_ccp_chi2_log10_p_cot) as `numbers.format_p` of that log10."""
    log10_name = log10_sibling(name)
    if log10_name in metrics:
        return format_p(float(metrics[log10_name]))
    return format_number(metrics[name])


def summary_frame_table(title: str, frame: pd.DataFrame, notes: list[str] | None = None) -> Table:
    """A DataFrame as a table, numbers formatted by `format_number`, `notes` printed under it."""
    import pandas as pd

    table = NotedTable(title=title, notes=notes)
    for column in frame.columns:
        numeric = pd.api.types.is_numeric_dtype(frame[column])
        table.add_column(str(column), justify="right" if numeric else "left")
    for row in frame.itertuples(index=False):
        table.add_row(*(format_number(value) for value in row))
    return table
