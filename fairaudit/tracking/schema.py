"""A local sqlite tracking database made ready: created under a lock as a copy of an empty one built once per MLflow
schema in the user cache (an older one holding runs is migrated), refused in one line when damaged, and a reserve of
space kept beside it (`mlflow.db.reserve`), given up when its disk fills so that the failing run can still be
closed FAILED."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from pathlib import Path

from fairaudit.errors.damage import damaged_error, quick_check, tracking_way_back
from fairaudit.errors.locks import LOCK_WAIT_S

RESERVE_BYTES = 1 << 20  # room for sqlite's journal and a run's closing tags on a full disk
WHAT = "MLflow's database, tracking.uri"


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



def prepare_database(path: Path, root: Path) -> None:
    """The local sqlite tracking database at `path` made ready: refused in one line when damaged, its reserve kept
    beside it, created (its Default experiment's artifacts under `root`) or migrated once, under a file lock, in a
    copy renamed into place.

    Concurrent first starts wait for the one that builds it; a kill at any moment leaves either
    no database or a complete one (a database an older version left half-built is rebuilt).
    """
    from fairaudit.models.cache import exclusive

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
            _new_database(head, building, root)
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



def reserve_of(path: Path) -> Path:
    """The reserve of space kept beside the database at `path`."""
    return path.with_name(path.name + ".reserve")


def keep_reserve(path: Path) -> None:
    """RESERVE_BYTES of zeros beside the database, written once (best effort: a full disk leaves it out)."""
    reserve = reserve_of(path)
    if reserve.exists() and reserve.stat().st_size == RESERVE_BYTES:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = reserve.with_name(f".{reserve.name}.{os.getpid()}")
        partial.write_bytes(bytes(RESERVE_BYTES))
        os.replace(partial, reserve)
