"""Rich console output: progress bars for long work and the end-of-run summary."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterator

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from fairaudit.numbers import format_p, log10_sibling
from fairaudit.redact import scrub, scrub_hydra_files

WARNING = "warning: "  # the prefix of a verdict line that flags a degenerate result

if TYPE_CHECKING:  # pandas is imported where a frame is shown: the hf backend needs torch and transformers alone
    import pandas as pd

console = Console(stderr=True)  # logs and progress
out = Console()  # results: tables


def quiet_libraries() -> None:
    """Silence MLflow's and alembic's INFO lines and transformers' weight-loading bars; warnings still show.
    Through the libraries' own environment variables (a user's own values kept), read as they are imported: bad
    input is then one line without importing them at all. A library already imported is quieted directly."""
    import logging

    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    # fairaudit prints where a run is itself; MLflow's own "View run at" lines would repeat the server's URL on stdout
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "warning")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' weight-loading bars follow the hub's
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # its database errors are raised to fairaudit, which makes them one line; its own log of them holds a traceback
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_warning()
        hf_logging.disable_progress_bar()


def run_or_exit(job: Callable[[Any], object], cfg: Any) -> None:
    """Run a Hydra task; bad input (an AuditError, also inside Hydra's instantiate) becomes one
    `error:` line and exit code 2; Ctrl-C one line saying what is kept and how to resume, exit code 130.
    Anything else is a bug and keeps its traceback."""
    from fairaudit import interrupt
    from fairaudit.errors import input_error_line

    quiet_libraries()
    try:
        scrub_hydra_files(cfg)
        job(cfg)
    except KeyboardInterrupt as stop:
        console.print(interrupt.message(getattr(stop, "kept", 0)), highlight=False, soft_wrap=True)
        sys.exit(interrupt.EXIT_CODE)
    except Exception as error:
        line = input_error_line(error)
        if line is None:
            raise
        print_error(line)
        discard_output_dir()
        sys.exit(2)


def discard_output_dir() -> None:
    """A rejected run's Hydra output folder removed when it holds only Hydra's own files (.hydra/, the job's log),
    with the dated folders above it that this leaves empty, up to the working folder: a typo leaves nothing."""
    import os
    import shutil
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.get()
    folder, cwd = Path(hydra_cfg.runtime.output_dir), Path(os.getcwd())
    own = {".hydra", f"{hydra_cfg.job.name}.log"}
    if folder == cwd or not folder.is_dir() or any(p.name not in own for p in folder.iterdir()):
        return
    shutil.rmtree(folder)
    for parent in folder.parents:
        if parent == cwd or not parent.is_relative_to(cwd) or any(parent.iterdir()):
            break
        parent.rmdir()


def print_error(line: str) -> None:
    """One `error:` line; the text is escaped, so `pip install '.[vllm]'` keeps its brackets."""
    console.print(f"[bold red]error:[/bold red] {escape(scrub(line))}", highlight=False, soft_wrap=True)


def warn(message: str) -> None:
    """One `warning:` line: something was wrong and has been dealt with."""
    console.print(f"[bold yellow]warning:[/bold yellow] {escape(scrub(message))}", highlight=False, soft_wrap=True)


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


def print_result(table: Table) -> None:
    """A results table on stdout, at its natural width when stdout is a file or pipe (never squeezed to 80 columns)."""
    if not out.is_terminal:  # rich clamps print(width=...) to the console's width, so widen the console itself
        out.width = max(out.width, out.measure(table, options=out.options.update_width(1000)).maximum)
    out.print(table)


def print_verdict(lines: list[str]) -> None:
    """A probe's verdict on stdout: its sentences, then its warnings in yellow. Off a terminal each line
    stays one line (grep finds it); on one it wraps at the terminal's width."""
    for line in lines:
        warning = line.startswith(WARNING)
        text = f"[bold yellow]warning:[/bold yellow] {escape(line[len(WARNING):])}" if warning else escape(line)
        out.print(text, highlight=False, soft_wrap=not out.is_terminal)


def format_number(value: Any) -> str:
    """A number as people read it: 4 significant digits, 2.2e-46 as 2.2e-46, NaN as n/a (float noise is made 0
    where it arises: `numbers.cancelled`)."""
    if isinstance(value, (bool, int)) or not isinstance(value, float):
        return str(value)
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    if 1e-4 <= abs(value) < 1e6:
        return f"{value:.4g}"
    return f"{value:.3g}"


def summary_table(title: str, metrics: dict[str, float], names: list[str]) -> Table:
    """The headline metrics as a two-column table; a p-value (`<name>_p`) from its `<name>_log10_p`, so one
    below the smallest double still reads as what it is (10^-485.6)."""
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name in names:
        if name in metrics:
            table.add_row(name, format_metric(name, metrics))
    return table


def format_metric(name: str, metrics: dict[str, Any]) -> str:
    """metrics[name] as `format_number` shows it; a p-value with its log10 beside it (mcnemar_p and mcnemar_log10_p,
    trunc_ccp_chi2_p_cot and trunc_ccp_chi2_log10_p_cot) as `numbers.format_p` of that log10."""
    log10_name = log10_sibling(name)
    if log10_name in metrics:
        return format_p(float(metrics[log10_name]))
    return format_number(metrics[name])


def summary_frame_table(title: str, frame: pd.DataFrame) -> Table:
    """A DataFrame as a table, numbers formatted by `format_number`."""
    import pandas as pd

    table = Table(title=title)
    for column in frame.columns:
        numeric = pd.api.types.is_numeric_dtype(frame[column])
        table.add_column(str(column), justify="right" if numeric else "left")
    for row in frame.itertuples(index=False):
        table.add_row(*(format_number(value) for value in row))
    return table
