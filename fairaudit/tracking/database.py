"""The tracking database opened for a command (`open_tracking`: a server that answers, a local sqlite file made ready,
the experiment), its artifacts kept beside a local one (`mlartifacts/`) whatever folder a command runs from; and how
its failures read: a server gone, a database locked, damaged or full, each one line."""

from __future__ import annotations

import os
from pathlib import Path

from fairaudit.errors import AuditError
from fairaudit.errors.damage import damaged_error, is_damaged, quick_check, tracking_way_back
from fairaudit.errors.interrupt import command_line
from fairaudit.errors.locks import is_locked, locked_error
from fairaudit.errors.secrets import redact
from fairaudit.tracking.http import bound_requests
from fairaudit.tracking.schema import WHAT, prepare_database, reserve_of

CONNECT_TIMEOUT_S = 10  # a tracking database server must accept a login within this (libpq's PGCONNECT_TIMEOUT too)
SQL_SERVERS = ("postgresql", "mysql", "mssql")  # SQLAlchemy URLs MLflow keeps its runs in


def sqlite_path(uri: str) -> Path | None:
    """The file of a local sqlite tracking URI, else None."""
    return Path(uri.split(":///", 1)[1]) if uri.startswith("sqlite:///") else None


def artifact_root(uri: str) -> Path | None:
    """Where a local sqlite tracking database keeps its runs' artifacts: `mlartifacts/` beside it (as
    `mlflow server` does), whatever folder the command runs from; None for a server, which keeps its own."""
    path = sqlite_path(uri)
    return None if path is None else path.resolve().parent / "mlartifacts"


def prepare_tracking(uri: str) -> None:
    """A local sqlite tracking database made ready (`schema.prepare_database`); nothing for a server."""
    path, root = sqlite_path(uri), artifact_root(uri)
    if path is not None:
        prepare_database(path, root)


def open_tracking(uri: str, experiment: str):
    """A client on a ready tracking store and the experiment's id; a server that is down or a local database kept
    locked is one AuditError line."""
    import mlflow
    from mlflow.tracking import MlflowClient

    problem = server_problem(uri)  # a server that is down: one line in seconds, not MLflow's minutes of retries
    if problem:
        raise AuditError(problem)
    bound_requests(uri)  # an HTTP server's requests: seconds each, not MLflow's minutes of retries
    try:
        prepare_tracking(uri)
        mlflow.set_tracking_uri(uri)
        client = MlflowClient(uri)
        return client, experiment_id(client, experiment)
    except Exception as error:
        fault = None if isinstance(error, AuditError) else tracking_fault(error, uri, mlflow_only=False)
        if fault is None:
            raise
        raise fault from None


def experiment_id(client, name: str) -> str:
    """The id of experiment `name`, created if missing (a concurrent creator may win the race)."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return create_experiment(client, name)
        except Exception:
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if experiment.lifecycle_stage == "deleted":
        raise AuditError(f"tracking.experiment {name!r} is deleted in {client.tracking_uri}; "
                         "restore it (mlflow experiments restore) or choose another name")
    return experiment.experiment_id


def create_experiment(client, name: str) -> str:
    """A new experiment; on a local sqlite database its artifacts go to artifact_root(uri)/<experiment id>."""
    root = artifact_root(client.tracking_uri)
    if root is None:
        return client.create_experiment(name)
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore(client.tracking_uri, root.as_uri())
    try:
        return store.create_experiment(name)
    finally:
        store.engine.dispose()


def close_on_a_full_disk(uri: str, close) -> bool:
    """close() (the run's closing tags and status); when it fails on a full disk, again once the reserve beside a
    sqlite database is given up. Best effort: a failing run's database may itself be the failure. Returns whether
    the run was closed."""
    from fairaudit.errors.disk import is_full

    try:
        close()
        return True
    except Exception as error:
        path = sqlite_path(uri)
        if path is None or not is_full(error) or not reserve_of(path).exists():
            return False
        reserve_of(path).unlink()
        try:
            close()
            return True
        except Exception:
            return False


def failure_of(error: BaseException, uri: str) -> AuditError | None:
    """The one-line error for a tracking server or database that failed mid-run (gone, locked, damaged, full), or
    None for any other error."""
    return tracking_failure(error, uri) or database_full(error, uri) or tracking_fault(error, uri)


def tracking_failure(error: BaseException, uri: str) -> AuditError | None:
    """The one-line error for a tracking server that stopped answering mid-run, or None for other errors."""
    from mlflow.exceptions import MlflowException

    if isinstance(error, MlflowException) and uri.startswith(("http://", "https://")):
        first_line = str(error).strip().splitlines()[0][:300]
        return AuditError(f"tracking.uri {redact(uri)} failed mid-run ({first_line}); the results computed so "
                          f"far are in the store, once the server answers the same command logs them without model "
                          f"calls: {command_line()}")
    return None


def database_full(error: BaseException, uri: str):
    """The one-line AuditError for a local tracking database whose disk filled mid-run, or None."""
    from fairaudit.errors.disk import failure_text, full_error, is_full

    path = sqlite_path(uri)
    if path is None or not is_full(error) or "database or disk is full" not in failure_text(error):
        return None
    return full_error(path.parent, "MLflow's database, tracking.uri", "room needed for this run's params, tags and "
                      "metrics", "the results are in the store, runs logged before are intact")


def server_problem(uri: str) -> str | None:
    """A tracking database server (an SQLAlchemy URL of SQL_SERVERS) that refuses a login or gives none within
    CONNECT_TIMEOUT_S: its one line (MLflow itself would retry for minutes); None when it answers, or for any other
    URI. libpq's connections (MLflow's too) give up after CONNECT_TIMEOUT_S from here on."""
    import sqlalchemy as sa

    if uri.split("://", 1)[0].split("+", 1)[0] not in SQL_SERVERS:
        return None
    os.environ.setdefault("PGCONNECT_TIMEOUT", str(CONNECT_TIMEOUT_S))
    try:
        engine = sa.create_engine(uri)
    except (sa.exc.ArgumentError, ImportError, ValueError) as error:
        return f"tracking.uri {uri!r} is not usable: {error}"
    try:
        with engine.connect():
            return None
    except sa.exc.DBAPIError as error:
        return (f"tracking.uri {uri!r} cannot be opened: {' '.join(str(error.orig).split())} (a server gets "
                f"{CONNECT_TIMEOUT_S} s to answer): start it (or correct the URL), then run the same command again")
    finally:
        engine.dispose()


def tracking_fault(error: BaseException, uri: str, mlflow_only: bool = True) -> AuditError | None:
    """The one-line AuditError for a local tracking database another process kept locked past its wait (sqlite's
    busy timeout: MLflow's 20 s, fairaudit's own LOCK_WAIT_S) or found damaged, or for a database server that no
    longer answers; None for any other error. `mlflow_only`: only an error MLflow raised is the tracking database's
    (mid-run, the store may be the one locked)."""
    from fairaudit.errors.disk import chain_of

    if mlflow_only and not any(type(e).__name__ == "MlflowException" for e in chain_of(error)):
        return None
    path = sqlite_path(uri)
    if path is not None and is_damaged(error):
        return damaged_error(path, WHAT, (quick_check(path) or str(chain_of(error)[-1])), tracking_way_back(path))
    if path is not None:
        return locked_error(path, WHAT, "the results computed so far are in the store") if is_locked(error) else None
    problem = server_problem(uri)
    return AuditError(problem) if problem else None
