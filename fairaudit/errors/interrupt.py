"""Ctrl-C, and SIGTERM or SIGHUP (a scheduler's preemption, a closed terminal) alike: the first one stops a run
cleanly (its results stay in the store, its MLflow runs end KILLED, exit code 128 + the signal's number: 130 for
Ctrl-C, 143 for SIGTERM, 129 for SIGHUP) and says how to resume; a second one stops at once. A sweep whose jobs run
in processes of their own hooks its jobs' stop in (`on_stop`)."""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Callable

NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}  # the signals that stop a run
_received: list[int] = []  # the signal that stopped this process, once one came
_hooks: list[tuple[Callable[[int], None], Callable[[], None]]] = []  # (on the first signal, on the next)
_last: list[Callable[[], None]] = []  # once a stop reached the command's top


class Interrupted(KeyboardInterrupt):
    """A stop inside a run, carrying how many results that run had computed (all committed to the store)."""

    def __init__(self, kept: int):
        super().__init__(kept)
        self.kept = kept


def on_stop(first: Callable[[int], None], again: Callable[[], None], last: Callable[[], None] = lambda: None) -> None:
    """`first(signum)` runs when the first signal comes, before its KeyboardInterrupt is raised (a sweep's parent
    stops its jobs and waits for them); `again()` when a second one comes, before the process exits at once; `last()`
    once the stop reached the command's top (`settle`: what is left of the sweep ended, its runs closed)."""
    _hooks.append((first, again))
    _last.append(last)


def settle() -> None:
    """The `last` of every `on_stop`: called by the command once a stop reached its top."""
    for last in _last:
        last()


def arm(again_exits: bool = True) -> None:
    """The first of SIGINT, SIGTERM or SIGHUP raises KeyboardInterrupt (as Python's default does for SIGINT) and
    arms the next to exit at once; with `again_exits=False` (a sweep job in a process of its own, which its
    terminal and its sweep's parent may both signal) the next ones are ignored: the parent kills it if need be."""
    if threading.current_thread() is not threading.main_thread():
        return

    def at_once(signum, frame) -> None:
        os.write(2, b"\ninterrupted again: stopping now\n")
        for _, again in _hooks:
            again()
        os._exit(exit_code())

    def first(signum, frame) -> None:
        stop_now(signum, at_once if again_exits else signal.SIG_IGN)

    for number in NAMES:
        signal.signal(number, first)


def stop_now(signum: int, next_one=signal.SIG_IGN) -> None:
    """Stop as the signal `signum` does: recorded as the cause, the next signal handled by `next_one`, the hooks
    run, then KeyboardInterrupt. A sweep job that finds its sweep stopping calls it with its parent's signal."""
    _received.append(signum)
    for number in NAMES:
        signal.signal(number, next_one)
    for hook, _ in _hooks:
        hook(signum)
    raise KeyboardInterrupt


def cause() -> str:
    """What stopped the run, as its error tag says it: "Ctrl-C", "SIGTERM" or "SIGHUP"."""
    return NAMES.get(_received[0], "Ctrl-C") if _received else "Ctrl-C"


def exit_code() -> int:
    """128 + the number of the signal that stopped the process (130 when it was Ctrl-C, or no signal)."""
    return 128 + (_received[0] if _received else signal.SIGINT)


def command_line() -> str:
    """The audit command this process runs, as a user retypes it: `fairaudit ...` or `<python> -m fairaudit ...`."""
    if Path(sys.argv[0]).name == "fairaudit":
        head = "fairaudit"
    else:
        python = os.path.relpath(sys.executable)
        head = f"{sys.executable if python.startswith('..') else python} -m fairaudit"
    from fairaudit.errors.secrets import redact

    return " ".join([head, *(shlex.quote(redact(arg)) for arg in sys.argv[1:])])


def environment_note(command: str | None = None) -> str:
    """For a command (this process's, or `command`) that reads a credential from the environment
    (`store.url=${oc.env:FAIRAUDIT_STORE_URL}`, as one typed on the command line is kept): which variables a new
    shell must export before it runs."""
    from fairaudit.errors.secrets import environment_read

    names = environment_read(sys.argv[1:] if command is None else [command])
    return f" (with {' and '.join(names)} exported: the values typed before; docs/scale.md, Passwords)" if names \
        else ""


def job_message(kept: int, job: int) -> str:
    """The line a sweep job in a process of its own prints on a stop (its sweep's parent prints how to resume)."""
    return f"{stopped_by()} in job {job}: its {kept} results are kept in the store"


def stopped_by() -> str:
    """"interrupted", or "interrupted by SIGTERM" (SIGHUP) when a signal other than Ctrl-C stopped the process."""
    return "interrupted" if cause() == "Ctrl-C" else f"interrupted by {cause()}"


def message(kept: int | None, job: int | None = None) -> str:
    """The one line printed on a stop; `job`: the sweep job that was running (finished ones are in the store too)."""
    stopped = stopped_by()
    note = environment_note()
    if kept is None:  # not known here: whatever was computed was committed as it came
        return (f"{stopped}: every result computed so far is kept in the store; the same command resumes{note}: "
                f"{command_line()}")
    where = f" in job {job}" if job is not None else ""
    others = " (and finished jobs' results)" if job is not None else ""
    if not kept:
        return f"{stopped}{where} before it computed any result{others and '; finished jobs are kept'}; " \
               f"start it again{note} with: {command_line()}"
    return (f"{stopped}{where}: its {kept} results{others} are kept in the store; the same command resumes from "
            f"them{note}: {command_line()}")
