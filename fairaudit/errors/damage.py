"""A damaged sqlite database (the store's file, MLflow's `mlflow.db`) as one line naming the file and the way back:
found at open by a bounded `PRAGMA quick_check`, or by the error sqlite raises when a damaged page is read mid-run."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from fairaudit.errors import AuditError
from fairaudit.errors.disk import failure_text

CHECK_S = 5.0  # the most time the check at open takes (about 100 MB a second); a larger file is left unchecked
DAMAGED = ("database disk image is malformed", "malformed database schema", "database corruption")


def is_damaged(error: BaseException | None) -> bool:
    """The error, or one in its chain, is sqlite's word for a damaged file."""
    return any(phrase in failure_text(error) for phrase in DAMAGED)


def quick_check(path: Path) -> str | None:
    """What sqlite's `PRAGMA quick_check` finds wrong with the database at `path` (its first problem), or None when
    it is sound, absent, locked by a writer, or too large to check within CHECK_S."""
    if not Path(path).is_file() or Path(path).stat().st_size == 0:
        return None
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1, check_same_thread=False)
    except sqlite3.Error:
        return None
    bound = threading.Timer(CHECK_S, db.interrupt)
    bound.start()
    try:
        first = db.execute("PRAGMA quick_check(1)").fetchone()[0]
        return None if first == "ok" else first
    except sqlite3.DatabaseError as error:
        return str(error) if is_damaged(error) else None  # "interrupted" (past CHECK_S), "locked": unchecked
    finally:
        bound.cancel()
        db.close()


def damaged_error(path: Path, what: str, why: str, way_back: str) -> AuditError:
    """The one line for the damaged database of `what` (e.g. "the store, store.url") at `path`."""
    return AuditError(f"{path} ({what}) is damaged ({' '.join(why.split())[:200]}): {way_back}")


def store_way_back(path: Path) -> str:
    """How to get back to work from a damaged store file: salvage it, or start a new one (what is lost recomputed)."""
    return (f"salvage what it holds (sqlite3 {path} .recover | sqlite3 {path}.recovered), move it aside "
            f"(mv {path} {path}.damaged; fairaudit store import {path}.recovered --store {path}), or just move it "
            "aside; then run the same command again: what is missing is recomputed")


def tracking_way_back(path: Path) -> str:
    """How to get back to work from a damaged MLflow database: MLflow's runs salvaged or a fresh database; the
    store holds every result, so the re-run logs them without model calls."""
    return (f"salvage its runs (sqlite3 {path} .recover | sqlite3 {path}.recovered, then mv {path}.recovered {path}) "
            f"or move it aside for a fresh one (mv {path} {path}.damaged); then run the same command again: the "
            "store holds the results, so it makes no model calls for them")
