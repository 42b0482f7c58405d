"""Where runs are tracked, checked before anything opens: a sqlite file this process can write (or a readable
database already there), a tracking server that answers within seconds, an experiment name MLflow takes. Each
problem is a short phrase naming the key; `validate_tracking` raises them as one AuditError."""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from fairaudit.errors import AuditError
from fairaudit.errors.damage import damaged_error, is_damaged, store_way_back, tracking_way_back
from fairaudit.errors.locks import LOCK_WAIT_S, is_locked, locked_error
from fairaudit.errors.rules import port_problem, text
from fairaudit.errors.secrets import unencoded_problem
from fairaudit.tracking.database import server_problem

REACH_TIMEOUT_S = 3.0          # a tracking server must answer within this
EXPERIMENT_NAME = 500          # the longest experiment name MLflow takes
SQL_SERVER_SCHEMES = ("postgresql", "mysql", "mssql")   # SQLAlchemy URLs MLflow and the store accept as they are


def writable_location(key: str, path: Path) -> str | None:
    """`path` is (or can be created as) a file in a folder this process can write: tried, not inferred
    from permission bits (root passes those everywhere, /proc included)."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if path.exists() and not path.is_file():
        return f"{key}: {path} is not a file"
    try:
        if path.exists():
            open(path, "ab").close()
        else:
            tempfile.TemporaryFile(dir=folder).close()
    except OSError as error:
        return f"{key}: cannot write {path} ({error.strerror or error} in {folder})"
    return None


def sqlite_problem(key: str, path: Path) -> str | None:
    """A writable location holding nothing or a readable sqlite database."""
    problem = writable_location(key, path)
    if problem or not path.exists() or path.stat().st_size == 0:
        return problem
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=LOCK_WAIT_S)) as db:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as error:
        if is_locked(error):
            return str(locked_error(path, key, "nothing was run"))
        if is_damaged(error):
            way_back = store_way_back(path) if key.startswith("store") else tracking_way_back(path)
            return str(damaged_error(path, key, str(error), way_back))
        return f"{key}: {path} is not a readable sqlite database ({error}); move it away or choose another path"
    return None


def tracking_problem(uri: str) -> str | None:
    """tracking.uri: a local sqlite file we can write, or a server that answers within a few seconds (an MLflow
    server, or a database server that accepts the login)."""
    parsed = urlparse(uri)
    scheme = parsed.scheme.split("+")[0]
    if scheme in ("http", "https", *SQL_SERVER_SCHEMES) and port_problem("tracking.uri", uri):
        return port_problem("tracking.uri", uri)
    if scheme == "sqlite":
        path = uri.split(":///", 1)[1] if ":///" in uri else ""
        return sqlite_problem("tracking.uri", Path(path)) if path and path != ":memory:" else (
            f"tracking.uri={uri!r} must name a database file: sqlite:////absolute/path.db")
    if scheme in ("", "file"):  # on the command line a folder becomes its sqlite file (overrides.tracking_database)
        folder = Path(parsed.path if scheme == "file" else uri).expanduser().absolute()
        return (f"tracking.uri={uri!r} is a folder, and MLflow 3 keeps no runs in folders: write "
                f"tracking.uri=sqlite:///{folder}/mlflow.db (what a folder on the command line means)")
    if scheme in ("http", "https") and (parsed.query or parsed.fragment):
        return (f"tracking.uri={uri!r}: MLflow adds its API's path to this address, so a query or fragment "
                f"('?{parsed.query}') cannot ride on it: give the server's address alone "
                f"({scheme}://{parsed.netloc}{parsed.path.rstrip('/')}) and a token as MLFLOW_TRACKING_TOKEN in the "
                "environment (a login as MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD)")
    if scheme in ("http", "https"):
        return reach_problem(uri, parsed.hostname, parsed.port or (443 if scheme == "https" else 80))
    if scheme in SQL_SERVER_SCHEMES:
        return server_problem(uri)
    if scheme == "databricks":
        return None
    return (f"tracking.uri={uri!r}: unsupported scheme {parsed.scheme!r}; use sqlite:////path/mlflow.db, "
            "a folder (its mlflow.db), http(s)://host:port or an SQLAlchemy database URL")


def reach_problem(uri: str, host: str | None, port: int) -> str | None:
    """A TCP connection to the tracking server opens within REACH_TIMEOUT_S."""
    if not host:
        return f"tracking.uri={uri!r} names no host"
    try:
        socket.create_connection((host, port), timeout=REACH_TIMEOUT_S).close()
    except OSError as error:
        return f"tracking.uri={uri!r}: no tracking server answers at {host}:{port} ({error.strerror or error})"
    return None


def validate_tracking(uri: Any, experiment: Any) -> None:
    """The tracking location alone (a sweep checks it before opening its parent run)."""
    rules = (("tracking.uri", uri, text()), ("tracking.experiment", experiment, text(longest=EXPERIMENT_NAME)))
    problems = [f"{key}={value!r} {p}" for key, value, check in rules for p in [check(value)] if p]
    problems += [p for p in [None if problems else unencoded_problem("tracking.uri", uri) or tracking_problem(uri)]
                 if p]
    if problems:
        raise AuditError("; ".join(problems))
