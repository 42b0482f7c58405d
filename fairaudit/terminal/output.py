"""The terminal's two streams (logs and progress on stderr, results on stdout) and its one-line messages."""

from __future__ import annotations

import contextlib
import os
import sys

from rich.console import Console
from rich.markup import escape

from fairaudit.errors.secrets import redact

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


def print_line(line: str) -> None:
    """A line on stderr as it is (no markup), secrets hidden; nothing when stderr is gone (a closed terminal's
    SIGHUP)."""
    with contextlib.suppress(OSError):
        console.print(escape(redact(line)), highlight=False, soft_wrap=True)


def print_traceback(error: BaseException) -> None:
    """An unexpected error's traceback on stderr, secrets hidden (its message may hold a URL)."""
    import traceback

    with contextlib.suppress(OSError):
        sys.stderr.write(redact("".join(traceback.format_exception(error))))
        sys.stderr.flush()


def print_error(line: str) -> None:
    """One `error:` line; the text is escaped, so `pip install '.[vllm]'` keeps its brackets."""
    console.print(f"[bold red]error:[/bold red] {escape(redact(line))}", highlight=False, soft_wrap=True)


def print_failure(error: BaseException) -> int:
    """An error that ends a command, as `errors` words it: bad input its one `error:` line (exit code 2), anything
    else (a bug) its traceback, then its line (exit code 1); returns the exit code."""
    from fairaudit.errors import failure_line, input_error_line

    line = input_error_line(error)
    if line is None:
        print_traceback(error)
    print_error(line or failure_line(error))
    return 2 if line else 1


def warn(message: str) -> None:
    """One `warning:` line: something was wrong and has been dealt with."""
    console.print(f"[bold yellow]warning:[/bold yellow] {escape(redact(message))}", highlight=False, soft_wrap=True)
