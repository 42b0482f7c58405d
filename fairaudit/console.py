"""Rich console output: progress bars for long work and the end-of-run summary."""

from __future__ import annotations

import contextlib
import math
import sys
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.table import Table
from rich.text import Text

console = Console(stderr=True)  # logs and progress
out = Console()  # results: tables


def quiet_libraries() -> None:
    """Silence MLflow's and alembic's INFO lines and transformers' weight-loading bars; warnings still show."""
    import logging

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_warning()
    hf_logging.disable_progress_bar()


def run_or_exit(job: Callable[[Any], object], cfg: Any) -> None:
    """Run a Hydra task; an AuditError becomes one `error:` line and exit code 2."""
    from fairaudit.errors import AuditError

    quiet_libraries()
    try:
        job(cfg)
    except AuditError as error:
        console.print(f"[bold red]error:[/bold red] {error}", highlight=False, soft_wrap=True)
        sys.exit(2)


class RateColumn(ProgressColumn):
    """Items per second."""

    def render(self, task) -> Text:
        return Text(f"{task.speed:.2f}/s" if task.speed else "-/s", style="progress.data.speed")


@contextlib.contextmanager
def progress(label: str, total: int, done_before: int = 0) -> Iterator[Callable[[int], None]]:
    """A progress bar (count, rate, ETA) over `total` items of new work; `done_before` came from the store."""
    if total == 0:
        if done_before:
            console.print(f"[dim]{label}: {done_before} from the store, nothing to compute[/dim]")
        yield lambda n: None
        return
    suffix = f" ({done_before} from the store)" if done_before else ""
    columns = [
        TextColumn(f"{label}{suffix}"), BarColumn(), MofNCompleteColumn(),
        RateColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
    ]
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def format_number(value: Any) -> str:
    """A number as people read it: 4 significant digits, no float noise (-5.3e-18 is 0), NaN as n/a."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    if abs(value) < 1e-12:
        return "0"
    if 1e-4 <= abs(value) < 1e6:
        return f"{value:.4g}"
    return f"{value:.3g}"


def summary_table(title: str, metrics: dict[str, float], names: list[str]) -> Table:
    """The headline metrics as a two-column table."""
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name in names:
        if name in metrics:
            table.add_row(name, format_number(metrics[name]))
    return table


def summary_frame_table(title: str, frame) -> Table:
    """A DataFrame as a table, numbers formatted by `format_number`."""
    table = Table(title=title)
    for column in frame.columns:
        table.add_column(str(column), justify="left" if frame[column].dtype == object else "right")
    for row in frame.itertuples(index=False):
        table.add_row(*(format_number(value) for value in row))
    return table
