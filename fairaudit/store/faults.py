"""A store that fails mid-run, as one line in a bounded time (`StoreGuard`, on the store's engine).

A PostgreSQL server: no round trip waits longer than STALL_S (a frozen server's connection is cut by a watchdog,
since a stopped process's kernel still acknowledges every packet), no statement longer than STATEMENT_S (the server's
`statement_timeout`: a lock another session holds), and a server that refuses connections mid-run (restarting) is
waited for RESTART_WAIT_S, a line saying so. A sqlite file: its lock waits LOCK_WAIT_S, a damaged page is named. Once
the store has failed, every later use of it fails at once, so the clean-up after the failure waits for nothing."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Callable, TypeVar

import sqlalchemy as sa

from fairaudit.errors import AuditError
from fairaudit.errors.damage import damaged_error, is_damaged, store_way_back
from fairaudit.errors.disk import chain_of, failure_text
from fairaudit.errors.interrupt import command_line
from fairaudit.errors.locks import is_locked, locked_error
from fairaudit.errors.secrets import redact
from fairaudit.terminal.output import warn

STALL_S = 30.0  # the longest a PostgreSQL store may take to answer one round trip before its connection is cut
STATEMENT_S = 25  # the server's statement_timeout: a statement waiting on another session's lock past it is ended
RESTART_WAIT_S = 30.0  # how long a server that refuses connections mid-run is waited for
KEEPALIVE = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
             "tcp_user_timeout": int(STALL_S * 1000)}  # a peer gone from the network, found by the kernel
REFUSED = ("connection refused", "the database system is starting up", "the database system is shutting down",
           "the database system is not yet accepting connections", "the database system is in recovery mode",
           "server closed the connection unexpectedly", "terminating connection due to administrator command",
           "no such file or directory")  # a server stopped or restarting: worth a wait mid-run
STATEMENT_ENDED = "canceling statement due to statement timeout"
T = TypeVar("T")
LOCKED, DAMAGED = "stayed locked", "is damaged: "  # a sqlite store's failures, worded by `locks` and `damage`


def server_options() -> dict:
    """libpq's settings for a PostgreSQL store's connections: keepalives and the statement timeout."""
    return {**KEEPALIVE, "options": f"-c statement_timeout={STATEMENT_S * 1000}"}


class StoreGuard:
    """Bounds every wait on one store's engine and words the failure that ended it (`fault`)."""

    def __init__(self, engine: sa.Engine, url: str):
        self.engine, self.url = engine, url
        self.server = engine.dialect.name == "postgresql"
        self.failure: str | None = None  # why the store failed; from then on it refuses at once
        self.lost: str | None = None  # a connection the server dropped mid-statement (a restart, a crash)
        self.opened = False  # set once the store is open: only a server failing mid-run is waited for
        self._busy: dict[int, tuple[float, object]] = {}  # id(dbapi connection) -> (its deadline, it)
        self._lock = threading.Lock()
        self._watching = False
        self._waited = False
        self._fresh: set[int] = set()  # connections not used yet: no ping needed
        sa.event.listen(engine, "do_connect", self._connect)
        sa.event.listen(engine, "handle_error", self._on_error)
        sa.event.listen(engine, "checkout", self._checkout)
        if self.server:
            sa.event.listen(engine, "connect", lambda dbapi, _record: self._fresh.add(id(dbapi)))
            sa.event.listen(engine, "checkin", self._idle)
            sa.event.listen(engine, "before_cursor_execute", self._round_trip)
            sa.event.listen(engine, "commit", self._round_trip)

    def fault(self, error: BaseException) -> AuditError | None:
        """The one line for the store's failure (seen on its own engine) when there was one, else None; `error` is
        what ended the run."""
        if not (self.failure or (self.lost and any(isinstance(e, sa.exc.DBAPIError) for e in chain_of(error)))):
            return None
        kept = "the results committed so far are kept"
        path = Path(self.url[len("sqlite:///"):]) if self.url.startswith("sqlite:///") else None
        if path is not None and self.failure == LOCKED:
            return locked_error(path, "the store, store.url", kept)
        if path is not None and self.failure.startswith(DAMAGED):
            return damaged_error(path, "the store, store.url", self.failure[len(DAMAGED):], store_way_back(path))
        return AuditError(f"store.url {redact(self.url)!r} {self.failure or self.lost}; {kept}: once it answers "
                          f"again, the same command resumes: {command_line()}")

    def again_after_a_restart(self, action: Callable[[], T]) -> T:
        """action(), once more when the server dropped its connection mid-statement (a restart, a crash): its
        transaction was rolled back, and the reconnection waits RESTART_WAIT_S for the server to come back."""
        try:
            return action()
        except sa.exc.DBAPIError as error:
            if not (self.server and error.connection_invalidated and not self.failure):
                raise
            done = action()
            self.lost = None  # the server came back
            return done

    def _fail(self, why: str) -> None:
        if self.failure is None:
            self.failure = why

    def _on_error(self, context) -> None:
        """Any error of the store's database: a lock, damage, a lost or cut connection, an ended statement."""
        error = context.original_exception
        text = failure_text(error)
        if is_locked(error):
            self._fail(LOCKED)
        elif is_damaged(error):
            self._fail(DAMAGED + " ".join(str(error).split()))
        elif STATEMENT_ENDED in text:
            self._fail(f"ended a statement that waited past {STATEMENT_S} s (a lock another session holds, or an "
                       "overloaded server)")
        elif self.server and context.is_disconnect:
            self.lost = f"lost its connection mid-run ({_first_line(error)})"

    def _connect(self, dialect, _record, cargs, cparams):
        """A new connection; mid-run, a server that refuses (stopped, restarting) is retried for RESTART_WAIT_S."""
        if self.failure:
            raise dialect.loaded_dbapi.OperationalError(self.failure)
        deadline = time.monotonic() + RESTART_WAIT_S
        while True:
            try:
                return dialect.connect(*cargs, **cparams)
            except dialect.loaded_dbapi.OperationalError as error:
                if not (self.opened and self.server) or not any(p in failure_text(error) for p in REFUSED):
                    raise
                if time.monotonic() > deadline:
                    self._fail(f"stopped answering mid-run and did not come back within {RESTART_WAIT_S:.0f} s "
                               f"({_first_line(error)})")
                    raise
                self._say_waiting(error)
                time.sleep(1.0)

    def _say_waiting(self, error: BaseException) -> None:
        if not self._waited:
            self._waited = True
            warn(f"store.url {redact(self.url)!r} refuses connections ({_first_line(error)}); waiting up to "
                 f"{RESTART_WAIT_S:.0f} s for it to come back (a restart)")

    def _checkout(self, dbapi_connection, _record, _proxy) -> None:
        """A pooled connection handed out: refused once the store failed; a server's watched from now, and pinged
        unless new (a dead one is replaced, through `_connect`)."""
        if self.failure:
            raise sa.exc.DisconnectionError(self.failure)
        if not self.server:
            return
        self._round_trip(dbapi_connection)
        if id(dbapi_connection) in self._fresh:
            self._fresh.discard(id(dbapi_connection))
            return
        try:
            with dbapi_connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        except Exception as error:
            self._idle(dbapi_connection)
            raise sa.exc.DisconnectionError(str(error)) from error

    def _round_trip(self, conn, *_args) -> None:
        """The connection (an SQLAlchemy one, or its DBAPI connection) may wait STALL_S from now."""
        dbapi = getattr(conn, "connection", conn)
        dbapi = getattr(dbapi, "dbapi_connection", dbapi)
        with self._lock:
            self._busy[id(dbapi)] = (time.monotonic() + STALL_S, dbapi)
            start, self._watching = not self._watching, True
        if start:
            threading.Thread(target=self._watch, name="fairaudit-store-watchdog", daemon=True).start()

    def _idle(self, dbapi_connection, *_args) -> None:
        with self._lock:
            self._busy.pop(id(dbapi_connection), None)

    def _watch(self) -> None:
        """Cut the connection of a round trip past its deadline (the server froze): its wait ends in an error."""
        while True:
            time.sleep(0.5)
            now = time.monotonic()
            with self._lock:
                late = [conn for deadline, conn in self._busy.values() if deadline < now]
            for conn in late:
                self._fail(f"gave no answer for {STALL_S:.0f} s mid-run (a server stopped or unreachable)")
                self._idle(conn)
                _cut(conn)


def _cut(dbapi_connection) -> None:
    """Shut a psycopg connection's socket down, so a read waiting on it returns at once."""
    try:
        fd = os.dup(dbapi_connection.pgconn.socket)
    except Exception:
        return
    with socket.socket(fileno=fd) as sock:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(getattr(error, "orig", None) or error).splitlines() if line.strip()]
    return " ".join(lines[0].split())[:200] if lines else type(error).__name__
