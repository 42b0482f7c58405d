"""MLflow writes that lose a race between parallel jobs, made again: a look-then-insert another job won
(`logged_despite_a_race`), a write sqlite refused at once as "database is locked" (`despite_a_lock`)."""

from __future__ import annotations

from typing import Callable

from fairaudit.errors.locks import is_locked


def logged_despite_a_race(log: Callable[[], object]) -> None:
    """log(), once more if it lost a race: MLflow looks for a row (a data set, an experiment tag) and inserts it when
    absent, not atomically, so a parallel job of the same sweep inserting the same row between the two breaks the
    table's unique key (IntegrityError on sqlite, UniqueViolation on PostgreSQL, named in a server's message too);
    the second look finds that row."""
    try:
        log()
    except Exception as error:
        if "IntegrityError" not in str(error) and "UniqueViolation" not in str(error):
            raise
        log()


def despite_a_lock(write, tries: int = 5) -> None:
    """write(), again after a pause when sqlite refused it at once as "database is locked": two processes writing
    one MLflow database at the same instant (a stopped sweep's jobs closing their runs together) can each hold a
    read lock the other's write waits on, and sqlite then fails one of them without waiting its busy timeout."""
    import time

    for attempt in range(tries):
        try:
            write()
            return
        except Exception as error:
            if attempt == tries - 1 or not is_locked(error):
                raise
            time.sleep(0.2 * (attempt + 1))
