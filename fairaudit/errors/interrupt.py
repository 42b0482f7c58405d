"""Ctrl-C: the first one stops a run cleanly (its results stay in the store, its MLflow runs end KILLED,
exit code 130) and says how to resume; a second one stops at once."""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from pathlib import Path

EXIT_CODE = 130  # 128 + SIGINT, as shells report it


class Interrupted(KeyboardInterrupt):
    """Ctrl-C inside a run, carrying how many results that run had computed (all committed to the store)."""

    def __init__(self, kept: int):
        super().__init__(kept)
        self.kept = kept


def arm() -> None:
    """The first SIGINT raises KeyboardInterrupt (as Python's default does) and arms the second to exit at once."""
    if threading.current_thread() is not threading.main_thread():
        return

    def at_once(signum, frame) -> None:
        os.write(2, b"\ninterrupted again: stopping now\n")
        os._exit(EXIT_CODE)

    def first(signum, frame) -> None:
        signal.signal(signal.SIGINT, at_once)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, first)


def command_line() -> str:
    """The audit command this process runs, as a user retypes it: `fairaudit ...` or `<python> -m fairaudit ...`."""
    if Path(sys.argv[0]).name == "fairaudit":
        head = "fairaudit"
    else:
        python = os.path.relpath(sys.executable)
        head = f"{sys.executable if python.startswith('..') else python} -m fairaudit"
    from fairaudit.errors.secrets import scrub

    return scrub(" ".join([head, *map(shlex.quote, sys.argv[1:])]))


def message(kept: int | None, job: int | None = None) -> str:
    """The one line printed on Ctrl-C; `job`: the sweep job that was running (finished ones are in the store too)."""
    if kept is None:  # not known here: whatever was computed was committed as it came
        return ("interrupted: every result computed so far is kept in the store; the same command resumes: "
                f"{command_line()}")
    where = f" in job {job}" if job is not None else ""
    others = " (and finished jobs' results)" if job is not None else ""
    if not kept:
        return f"interrupted{where} before it computed any result{others and '; finished jobs are kept'}; " \
               f"start it again with: {command_line()}"
    return (f"interrupted{where}: its {kept} results{others} are kept in the store; the same command resumes from "
            f"them: {command_line()}")
