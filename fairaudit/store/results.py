"""Content-addressed store of every generation and score (`fairaudit.store.client` puts it in front of a backend).

A result is keyed by (call kind, model fingerprint, exact token ids, decoding parameters,
backend version) in one table, reached through an SQLAlchemy URL: a sqlite file (WAL mode) on
one machine, a PostgreSQL server when many nodes share it. Each value carries a checksum written
with it; a value that fails it, does not parse, or holds a probability row not summing to 1 is
reported, deleted and recomputed. Results are committed chunk by chunk (first writer wins), so
a killed run resumes where it stopped; a process claims the calls it is about to compute (`claims`),
so concurrent jobs never compute the same call twice.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Iterator, Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from fairaudit.errors import AuditError
from fairaudit.errors.damage import damaged_error, quick_check, store_way_back
from fairaudit.errors.disk import full_error, is_full, megabytes
from fairaudit.errors.locks import LOCK_WAIT_S
from fairaudit.errors.rules import port_problem
from fairaudit.errors.secrets import redact
from fairaudit.store.claims import CLAIM_BYTES, CLAIMS_METADATA, Claims
from fairaudit.store.faults import StoreGuard, server_options
from fairaudit.terminal.output import warn

STORE_VERSION = 1
PROBABILITY_KINDS = ("choice_probs", "depth_choice_probs")  # values whose innermost rows are distributions
PROBABILITY_ATOL = 1e-4
CONNECT_TIMEOUT_S = 10  # seconds a PostgreSQL server gets to accept a connection
INSERTS = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}

METADATA = sa.MetaData()
RESULTS = sa.Table(
    "results", METADATA,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("checksum", sa.String(64)),
    sa.Column("created", sa.Float, nullable=False),
)


def store_url(location: str | Path) -> str:
    """An SQLAlchemy URL as is; a plain path is a sqlite file (its folder is created)."""
    text = str(location)
    if "://" in text:
        return text
    path = Path(text).expanduser().resolve()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise AuditError(f"store.url {text}: cannot create its folder ({error.strerror})") from None
    return f"sqlite:///{path}"


def checksum(key: str, value: str) -> str:
    """The checksum written with a value: binds the exact stored text to its key."""
    return hashlib.sha256(f"{key}\0{value}".encode()).hexdigest()


def _probability_rows(value) -> Iterator[list]:
    """The innermost lists of a nested list of numbers."""
    if value and isinstance(value[0], list):
        for item in value:
            yield from _probability_rows(item)
    else:
        yield value


def examine(key: str, kind: str, value: str, stored_checksum: str | None) -> tuple[str | None, object]:
    """(why a stored row cannot be served or None when it is sound, its parsed value), parsing it once."""
    if stored_checksum != checksum(key, value):
        return "fails its checksum", None
    try:
        parsed = json.loads(value)
    except ValueError:
        return "does not parse", None
    if kind in PROBABILITY_KINDS:
        for row in _probability_rows(parsed):
            if not abs(sum(row) - 1.0) <= PROBABILITY_ATOL:  # NaN fails too
                return f"has a probability row summing to {sum(row):.6g}", None
    return None, parsed


def damage(key: str, kind: str, value: str, stored_checksum: str | None) -> str | None:
    """Why a stored row cannot be served, or None when it is sound."""
    return examine(key, kind, value, stored_checksum)[0]


class Store:
    """A key -> JSON value table behind an SQLAlchemy URL (or a sqlite file path)."""

    def __init__(self, location: str | Path):
        self.url = store_url(location)
        problem = port_problem("store.url", self.url)
        if problem:
            raise AuditError(problem)
        try:
            backend = sa.engine.make_url(self.url).get_backend_name()
            if backend not in INSERTS:
                raise AuditError(f"store.url {redact(self.url)!r}: only sqlite and postgresql stores are "
                             "supported")
            self.engine = sa.create_engine(self.url, **_engine_options(backend))
        except (sa.exc.ArgumentError, ImportError) as error:
            raise AuditError(f"store.url {redact(self.url)!r} is not usable: {error}") from None
        self._insert = INSERTS[backend]
        self.claims = Claims(self.engine, self._insert)
        if backend == "sqlite" and self.engine.url.database:
            _refuse_damaged(Path(self.engine.url.database))
            sa.event.listen(self.engine, "connect", _sqlite_wal)
        self.guard = StoreGuard(self.engine, self.url)
        try:
            self._create_table()
        except sa.exc.DBAPIError as error:
            raise AuditError(f"store.url {redact(self.url)!r} cannot be opened: "
                             f"{' '.join(str(error.orig).split())}") from None
        self.guard.opened = True

    def fault(self, error: BaseException) -> AuditError | None:
        """The one line for an error of this store mid-run (a server stopped, frozen or restarting past its wait, a
        file locked or damaged: `faults.StoreGuard`), else None."""
        return self.guard.fault(error)

    def _create_table(self) -> None:
        """The tables, once, serialised across processes (sqlite: a write lock taken before looking, since its driver
        runs DDL outside a transaction; PostgreSQL: an advisory lock); a pre-checksum store gains the column, an older
        store the claims table."""
        with self.engine.begin() as conn:
            if self.engine.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext('fairaudit.results'))"))
            else:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            METADATA.create_all(conn)
            CLAIMS_METADATA.create_all(conn)
            if "checksum" not in {c["name"] for c in sa.inspect(conn).get_columns("results")}:
                conn.execute(sa.text("ALTER TABLE results ADD COLUMN checksum VARCHAR(64)"))
                rows = conn.execute(sa.select(RESULTS.c.key, RESULTS.c.value)).all()
                if rows:
                    conn.execute(RESULTS.update().where(RESULTS.c.key == sa.bindparam("k"))
                                 .values(checksum=sa.bindparam("c")),
                                 [{"k": k, "c": checksum(k, v)} for k, v in rows])

    def get_many(self, keys: Sequence[str]) -> dict[str, object]:
        """Sound stored values of those keys that exist; a damaged one is reported and deleted."""
        return self.guard.again_after_a_restart(lambda: self._get_many(keys))

    def _get_many(self, keys: Sequence[str]) -> dict[str, object]:
        found: dict[str, object] = {}
        unique = list(dict.fromkeys(keys))
        with self.engine.connect() as conn:
            for start in range(0, len(unique), 500):
                query = sa.select(RESULTS).where(RESULTS.c.key.in_(unique[start:start + 500]))
                for row in conn.execute(query):
                    problem, parsed = examine(row.key, row.kind, row.value, row.checksum)
                    if problem:
                        self._discard(row, problem)
                    else:
                        found[row.key] = parsed
        return found

    def _discard(self, row, problem: str) -> None:
        warn(f"store value {row.key[:16]} ({row.kind}, {row.model}) {problem}; deleted, it will be recomputed")
        with self.engine.begin() as conn:
            conn.execute(RESULTS.delete().where(RESULTS.c.key == row.key, RESULTS.c.value == row.value))

    def put_many(self, kind: str, model: str, items: Sequence[tuple[str, object]], left: int = 0) -> int:
        """Insert results and commit at once; a key already stored keeps its first value; returns how many keys were
        new. `left`: how many more the caller has to compute (named with the space they need, should the disk be
        full)."""
        now = time.time()
        rows = []
        for key, value in items:
            text = json.dumps(value, separators=(",", ":"))
            rows.append({"key": key, "kind": kind, "model": model, "value": text, "checksum": checksum(key, text),
                         "created": now})
        return self.put_rows(rows, left)

    def put_rows(self, rows: Sequence[dict], left: int = 0) -> int:
        """Insert whole rows (checksums included) and give up this process's claims on them in the same commit;
        returns how many keys were new."""
        if not rows:
            return 0
        return self.guard.again_after_a_restart(lambda: self._put_rows(rows, left))

    def _put_rows(self, rows: Sequence[dict], left: int) -> int:
        try:
            with self.engine.begin() as conn:
                insert = self._insert(RESULTS).on_conflict_do_nothing(index_elements=["key"]).returning(RESULTS.c.key)
                added = len(conn.execute(insert, sorted(rows, key=lambda row: row["key"])).all())  # one lock order
                self.claims.release([row["key"] for row in rows], conn)
                return added
        except sa.exc.DBAPIError as error:
            if not is_full(error):
                raise
            raise self._full(commit_need(rows, left)) from None

    def claim(self, keys: Sequence[str], look_first: bool = False) -> set[str]:
        """Claim calls before computing them (`Claims.take`); a disk too full for the claims is one line."""
        try:
            return self.guard.again_after_a_restart(lambda: self.claims.take(keys, look_first))
        except sa.exc.DBAPIError as error:
            if not is_full(error):
                raise
            raise self._full(f"about {megabytes(2 * CLAIM_BYTES * len(keys))} needed to claim the next "
                             f"{len(keys):,} calls") from None

    def _full(self, need: str) -> AuditError:
        """The one line for a write refused for want of space: the store's folder, what the write needed (`need`),
        and how many results are kept."""
        kept = f"the {self.count() - self.count('encode'):,} model results committed so far are kept"
        url = sa.engine.make_url(self.url)
        if url.get_backend_name() != "sqlite":
            return AuditError(f"the store's database server is out of space (store.url {redact(self.url)!r}); "
                              f"{kept}: free space on the server and run the same command to resume")
        return full_error(Path(url.database).parent, "the store, store.url", need, kept)

    def rows(self, batch: int = 1000) -> Iterator[sa.Row]:
        """Every stored row, in key order, a batch at a time."""
        last = ""
        while True:
            with self.engine.connect() as conn:
                page = conn.execute(sa.select(RESULTS).where(RESULTS.c.key > last).order_by(RESULTS.c.key)
                                    .limit(batch)).all()
            yield from page
            if len(page) < batch:
                return
            last = page[-1].key

    def count(self, kind: str | None = None, model: str | None = None) -> int:
        """Number of stored results, of one kind or all, of one model's fingerprint or any."""
        query = sa.select(sa.func.count()).select_from(RESULTS)
        if kind is not None:
            query = query.where(RESULTS.c.kind == kind)
        if model is not None:
            query = query.where(RESULTS.c.model == model)
        with self.engine.connect() as conn:
            return conn.execute(query).scalar_one()

    def close(self, release: bool = True) -> None:
        """Release this process's claims (unless `release` is False: after a failure, whose cause may be this very
        store, they are taken over at once on this host and lapse elsewhere) and close every connection."""
        if release:
            self.claims.release_all()
        self.engine.dispose()


def commit_need(rows: Sequence[dict], left: int) -> str:
    """What a commit of `rows` and the `left` results still to come need (rows written twice: to the write-ahead
    log, then into the database; at the commit's bytes per row)."""
    per_row = 2 * sum(len(r["value"]) + 200 for r in rows) / len(rows)
    need = f"about {megabytes(int(per_row * len(rows)))} needed for the commit of {len(rows)} results"
    if left:
        need += f", {megabytes(int(per_row * (len(rows) + left)))} with the {left:,} more this step computes"
    return need


def _engine_options(backend: str) -> dict:
    """sqlite waits LOCK_WAIT_S for a lock another process holds; a PostgreSQL server gets CONNECT_TIMEOUT_S to
    accept a connection (an unreachable host would otherwise hang for the system's TCP timeout, minutes), and its
    statements and idle connections are bounded (`faults.server_options`; the pool's ping is `StoreGuard`'s)."""
    if backend == "sqlite":
        return {"connect_args": {"timeout": float(LOCK_WAIT_S)}}
    return {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S, **server_options()}}


def _refuse_damaged(path: Path) -> None:
    """A damaged sqlite store is one line before any model work (`damage.quick_check`, bounded)."""
    problem = quick_check(path)
    if problem:
        raise damaged_error(path, "the store, store.url", problem, store_way_back(path))


def _sqlite_wal(dbapi_connection, _record) -> None:
    """WAL mode; synchronous=NORMAL, WAL's recommended setting: a commit survives the process being killed
    (what resuming relies on), only a power loss may drop the last commits, never corrupt the file."""
    dbapi_connection.execute("PRAGMA journal_mode=WAL")
    dbapi_connection.execute("PRAGMA synchronous=NORMAL")


def call_key(kind: str, fingerprint: str, payload: object) -> str:
    """The store key of one model call."""
    blob = json.dumps([STORE_VERSION, kind, fingerprint, payload], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


