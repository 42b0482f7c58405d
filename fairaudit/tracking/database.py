"""A local sqlite tracking database: created under a lock as a copy of an empty one built once per MLflow schema in
the user cache (an older one holding runs is migrated), its artifacts kept beside it (`mlartifacts/`), whatever
folder a command runs from, and a reserve of space beside it (`mlflow.db.reserve`), given up when its disk fills so
that the failing run can still be closed FAILED; and MLflow's look-then-insert races between parallel jobs
(`logged_despite_a_race`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Callable

from fairaudit.errors import AuditError
from fairaudit.errors.damage import damaged_error, is_damaged, quick_check, tracking_way_back
from fairaudit.errors.locks import LOCK_WAIT_S, is_locked, locked_error

RESERVE_BYTES = 1 << 20  # room for sqlite's journal and a run's closing tags on a full disk
CONNECT_TIMEOUT_S = 10  # a tracking database server must accept a login within this (libpq's PGCONNECT_TIMEOUT too)
SQL_SERVERS = ("postgresql", "mysql", "mssql")  # SQLAlchemy URLs MLflow keeps its runs in
WHAT = "MLflow's database, tracking.uri"


def sqlite_path(uri: str) -> Path | None:
    """The file of a local sqlite tracking URI, else None."""
    return Path(uri.split(":///", 1)[1]) if uri.startswith("sqlite:///") else None


def _schema_head() -> str:
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    return ScriptDirectory.from_config(_get_alembic_config("sqlite://")).get_current_head()


def _revision(path: Path) -> str | None:
    """The schema revision of the database at `path`: a read-only look, None when there is none to read."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=LOCK_WAIT_S)
        try:
            return db.execute("SELECT version_num FROM alembic_version").fetchone()[0]
        finally:
            db.close()
    except (sqlite3.Error, TypeError):
        return None


def _holds_runs(path: Path) -> bool:
    """The database at `path` holds runs (read-write, so a journal left by a killed writer is rolled back first)."""
    if not path.exists() or path.stat().st_size == 0:
        return False
    db = sqlite3.connect(path, timeout=LOCK_WAIT_S)
    try:
        return db.execute("SELECT count(*) FROM runs").fetchone()[0] > 0
    except sqlite3.OperationalError as error:
        if "no such table" in str(error):
            return False
        raise
    finally:
        db.close()


def _build_schema(path: Path) -> None:
    """MLflow's tables created (or migrated to head) in the sqlite file at `path`."""
    from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.utils.uri import resolve_uri_if_local

    store = SqlAlchemyStore(f"sqlite:///{path}", resolve_uri_if_local(DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH))
    store.engine.dispose()


def prepare_tracking(uri: str) -> None:
    """Create or migrate a local sqlite tracking database once, under a file lock, in a copy renamed into place.

    Concurrent first starts wait for the one that builds it; a kill at any moment leaves either
    no database or a complete one (a database an older version left half-built is rebuilt).
    """
    from fairaudit.models.cache import exclusive

    path = sqlite_path(uri)
    if path is None:
        return
    problem = quick_check(path)  # a damaged database: one line before any model work
    if problem:
        raise damaged_error(path, WHAT, problem, tracking_way_back(path))
    keep_reserve(path)
    head = _schema_head()
    if _revision(path) == head:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(path.with_name(path.name + ".lock")):
        holds_runs = _holds_runs(path)  # first, as it rolls back a journal that a killed writer left
        if _revision(path) == head:
            return
        building = _building(path)
        if holds_runs:
            shutil.copyfile(path, building)  # an older schema holding runs: migrate a copy
            _build_schema(building)
        else:
            _new_database(head, building, artifact_root(uri))
        os.replace(building, path)


def _new_database(head: str, building: Path, root: Path) -> None:
    """An empty database at `building`: a copy of the user cache's empty one, or built there when the cache cannot
    be written; MLflow's Default experiment keeps its artifacts under `root`."""
    try:
        shutil.copyfile(_empty_database(head), building)
    except OSError:
        _build_schema(building)
    _place_default_experiment(building, root)


def _building(path: Path) -> Path:
    """Where the database at `path` is built before it is renamed into place (under its lock): copies a killed
    builder left are removed."""
    for leftover in path.parent.glob(f".{path.name}.building-*"):
        leftover.unlink()
    return path.with_name(f".{path.name}.building-{os.getpid()}")


def _empty_database(head: str) -> Path:
    """An empty tracking database at schema `head`, built once per MLflow schema in the user cache and copied for
    each new database: MLflow's migrations take seconds, a copy milliseconds."""
    from fairaudit.models.cache import exclusive
    from fairaudit.places import cache_root

    empty = cache_root() / "mlflow-schemas" / f"{head}.db"
    if _revision(empty) == head:
        return empty
    with exclusive(empty.with_name(empty.name + ".lock")):
        if _revision(empty) != head:
            building = _building(empty)
            _build_schema(building)
            os.replace(building, empty)
    return empty


def _place_default_experiment(copy: Path, root: Path) -> None:
    """MLflow's Default experiment in a copy of the empty database keeps its artifacts under `root`, as fairaudit's
    own experiments do (the empty database recorded the folder it was built from)."""
    db = sqlite3.connect(copy)
    try:
        with db:
            db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                       (f"{root.as_uri()}/0",))
    finally:
        db.close()


def artifact_root(uri: str) -> Path | None:
    """Where a local sqlite tracking database keeps its runs' artifacts: `mlartifacts/` beside it (as
    `mlflow server` does), whatever folder the command runs from; None for a server, which keeps its own."""
    path = sqlite_path(uri)
    return None if path is None else path.resolve().parent / "mlartifacts"


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


def _reserve(path: Path) -> Path:
    return path.with_name(path.name + ".reserve")


def keep_reserve(path: Path) -> None:
    """RESERVE_BYTES of zeros beside the database, written once (best effort: a full disk leaves it out)."""
    reserve = _reserve(path)
    if reserve.exists() and reserve.stat().st_size == RESERVE_BYTES:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = reserve.with_name(f".{reserve.name}.{os.getpid()}")
        partial.write_bytes(bytes(RESERVE_BYTES))
        os.replace(partial, reserve)


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
        if path is None or not is_full(error) or not _reserve(path).exists():
            return False
        _reserve(path).unlink()
        try:
            close()
            return True
        except Exception:
            return False


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
