"""Rich console output: progress bars for long work and the end-of-run summary."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.table import Table
from rich.text import Text

console = Console(stderr=True)


def run_or_exit(job: Callable[[Any], object], cfg: Any) -> None:
    """Run a Hydra task; an AuditError becomes one `error:` line and exit code 2."""
    from fairaudit.errors import AuditError

    try:
        job(cfg)
    except AuditError as error:
        console.print(f"[bold red]error:[/bold red] {escape(str(error))}", highlight=False, soft_wrap=True)  # e.g. '.[vllm]' stays
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


def summary_table(title: str, metrics: dict[str, float], names: list[str]) -> Table:
    """The headline metrics as a two-column table."""
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name in names:
        if name in metrics:
            value = metrics[name]
            table.add_row(name, f"{value:.4g}" if isinstance(value, float) else str(value))
    return table
