"""Progress bars for long work: count, rate and time left, with what came from the store said beside them."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from fairaudit.terminal.output import console


class RateColumn(ProgressColumn):
    """Items per second (or seconds per item) since the bar started: steady under batched, bursty progress."""

    def render(self, task) -> Text:
        rate = task.completed / task.elapsed if task.elapsed and task.completed else None
        text = "-/s" if rate is None else f"{rate:.2f}/s" if rate >= 1 else f"{1 / rate:.1f} s/item"
        return Text(text, style="progress.data.speed")


class EtaColumn(ProgressColumn):
    """Time left at the average rate so far."""

    def render(self, task) -> Text:
        if task.finished or not task.completed or not task.elapsed:
            return Text("eta -" if not task.finished else "", style="progress.remaining")
        left = (task.total - task.completed) * task.elapsed / task.completed
        return Text(f"eta {int(left // 60)}:{int(left % 60):02d}", style="progress.remaining")


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
        RateColumn(), TimeElapsedColumn(), EtaColumn(),
    ]
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)
