"""Content-addressed store of every generation and score, and the caching backend wrapper.

A result is keyed by (call kind, model fingerprint, exact token ids, decoding parameters,
backend version) in one table, reached through an SQLAlchemy URL: a sqlite file (WAL mode) on
one machine, a PostgreSQL server when many nodes share it. Each value carries a checksum written
with it; a value that fails it, does not parse, or holds a probability row not summing to 1 is
reported, deleted and recomputed. Results are committed chunk by chunk (first writer wins), so
a killed run resumes where it stopped and concurrent jobs share work.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from fairaudit.backends import Backend, Completion, DepthRequest, GenerationRequest, NLLRequest
from fairaudit.console import progress, warn
from fairaudit.errors import AuditError

STORE_VERSION = 1
PROBABILITY_KINDS = ("choice_probs", "depth_choice_probs")  # values whose innermost rows are distributions
PROBABILITY_ATOL = 1e-4
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


def damage(key: str, kind: str, value: str, stored_checksum: str | None) -> str | None:
    """Why a stored row cannot be served, or None when it is sound."""
    if stored_checksum != checksum(key, value):
        return "fails its checksum"
    try:
        parsed = json.loads(value)
    except ValueError:
        return "does not parse"
    if kind in PROBABILITY_KINDS:
        for row in _probability_rows(parsed):
            if not abs(sum(row) - 1.0) <= PROBABILITY_ATOL:  # NaN fails too
                return f"has a probability row summing to {sum(row):.6g}"
    return None


class Store:
    """A key -> JSON value table behind an SQLAlchemy URL (or a sqlite file path)."""

    def __init__(self, location: str | Path):
        self.url = store_url(location)
        try:
            backend = sa.engine.make_url(self.url).get_backend_name()
            if backend not in INSERTS:
                raise AuditError(f"store.url {self.url!r}: only sqlite and postgresql stores are supported")
            self.engine = sa.create_engine(self.url, **_engine_options(backend))
        except (sa.exc.ArgumentError, ImportError) as error:
            raise AuditError(f"store.url {self.url!r} is not usable: {error}") from None
        self._insert = INSERTS[backend]
        if backend == "sqlite":
            sa.event.listen(self.engine, "connect", _sqlite_wal)
        try:
            self._create_table()
        except sa.exc.DBAPIError as error:
            raise AuditError(f"store.url {self.url!r} cannot be opened: {' '.join(str(error.orig).split())}") from None

    def _create_table(self) -> None:
        """The table, once (serialised across processes on PostgreSQL); a pre-checksum sqlite store gains the column."""
        with self.engine.begin() as conn:
            if self.engine.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext('fairaudit.results'))"))
            METADATA.create_all(conn)
            if "checksum" not in {c["name"] for c in sa.inspect(conn).get_columns("results")}:
                conn.execute(sa.text("ALTER TABLE results ADD COLUMN checksum VARCHAR(64)"))
                rows = conn.execute(sa.select(RESULTS.c.key, RESULTS.c.value)).all()
                if rows:
                    conn.execute(RESULTS.update().where(RESULTS.c.key == sa.bindparam("k")).values(checksum=sa.bindparam("c")),
                                 [{"k": k, "c": checksum(k, v)} for k, v in rows])

    def get_many(self, keys: Sequence[str]) -> dict[str, object]:
        """Sound stored values of those keys that exist; a damaged one is reported and deleted."""
        found: dict[str, object] = {}
        unique = list(dict.fromkeys(keys))
        with self.engine.connect() as conn:
            for start in range(0, len(unique), 500):
                query = sa.select(RESULTS).where(RESULTS.c.key.in_(unique[start:start + 500]))
                for row in conn.execute(query):
                    problem = damage(row.key, row.kind, row.value, row.checksum)
                    if problem:
                        self._discard(row, problem)
                    else:
                        found[row.key] = json.loads(row.value)
        return found

    def _discard(self, row, problem: str) -> None:
        warn(f"store value {row.key[:16]} ({row.kind}, {row.model}) {problem}; deleted, it will be recomputed")
        with self.engine.begin() as conn:
            conn.execute(RESULTS.delete().where(RESULTS.c.key == row.key, RESULTS.c.value == row.value))

    def put_many(self, kind: str, model: str, items: Sequence[tuple[str, object]]) -> None:
        """Insert results and commit at once; a key already stored keeps its first value."""
        now = time.time()
        rows = []
        for key, value in items:
            text = json.dumps(value)
            rows.append({"key": key, "kind": kind, "model": model, "value": text, "checksum": checksum(key, text), "created": now})
        self.put_rows(rows)

    def put_rows(self, rows: Sequence[dict]) -> int:
        """Insert whole rows (checksums included); returns how many keys were new."""
        if not rows:
            return 0
        with self.engine.begin() as conn:
            insert = self._insert(RESULTS).on_conflict_do_nothing(index_elements=["key"]).returning(RESULTS.c.key)
            return len(conn.execute(insert, list(rows)).all())

    def rows(self, batch: int = 1000) -> Iterator[sa.Row]:
        """Every stored row, in key order, a batch at a time."""
        last = ""
        while True:
            with self.engine.connect() as conn:
                page = conn.execute(sa.select(RESULTS).where(RESULTS.c.key > last).order_by(RESULTS.c.key).limit(batch)).all()
            yield from page
            if len(page) < batch:
                return
            last = page[-1].key

    def count(self, kind: str | None = None) -> int:
        """Number of stored results, of one kind or all."""
        query = sa.select(sa.func.count()).select_from(RESULTS)
        if kind is not None:
            query = query.where(RESULTS.c.kind == kind)
        with self.engine.connect() as conn:
            return conn.execute(query).scalar_one()

    def close(self) -> None:
        self.engine.dispose()


def _engine_options(backend: str) -> dict:
    if backend == "sqlite":
        return {"connect_args": {"timeout": 60.0}}
    return {"pool_pre_ping": True}


def _sqlite_wal(dbapi_connection, _record) -> None:
    dbapi_connection.execute("PRAGMA journal_mode=WAL")


def call_key(kind: str, fingerprint: str, payload: object) -> str:
    """The store key of one model call."""
    blob = json.dumps([STORE_VERSION, kind, fingerprint, payload], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def generation_key(fingerprint: str, request: GenerationRequest) -> str:
    """The store key of one generation (the records' prompt_hash)."""
    return call_key("generate", fingerprint, asdict(request))


def array_json(values) -> list:
    """An array result (probabilities) as nested float lists for the store."""
    return np.asarray(values, dtype=float).tolist()


class CachedBackend:
    """Wraps a backend with the store: only calls missing from the store reach the model.

    A batch backend gets the missing calls in chunks of `chunk_size`. A backend that streams
    results (`streams_results`: its calls take `on_result(i, result)`, e.g. a server pool that
    bounds its own in-flight requests) gets them all at once. Either way results are committed
    every `chunk_size` arrivals and, when a call fails, before the failure propagates, so a
    re-run resumes. Before each batch the store is read again, so what another job committed
    meanwhile is served, not recomputed. `model_calls` counts the results the model produced.
    """

    def __init__(self, inner: Backend, store: Store, chunk_size: int = 8):
        self.inner = inner
        self.fingerprint = inner.fingerprint
        self.tokenizer = inner.tokenizer
        self.store = store
        self.chunk_size = max(1, chunk_size)
        self.streams = getattr(inner, "streams_results", False)
        self.model_calls = 0

    def _cached(self, kind: str, payloads: Sequence[object], label: str, method: Callable, items: Sequence,
                extra: tuple = (), to_json: Callable = array_json) -> list:
        """Results of method(items, *extra), read from the store where present, stored as to_json(result)."""
        keys = [call_key(kind, self.fingerprint, p) for p in payloads]
        found = self.store.get_many(keys)
        missing = [i for i, k in enumerate(keys) if k not in found]
        first_of_key: dict[str, int] = {}
        todo = [i for i in missing if first_of_key.setdefault(keys[i], i) == i]
        pending: list[tuple[str, object]] = []

        def commit() -> None:
            if pending:
                self.store.put_many(kind, self.fingerprint, pending)
                pending.clear()

        with progress(label, total=len(todo), done_before=len(keys) - len(missing)) as advance:
            def receive(i: int, result: object) -> None:
                found[keys[i]] = to_json(result)
                pending.append((keys[i], found[keys[i]]))
                self.model_calls += 1
                advance(1)
                if len(pending) >= self.chunk_size:
                    commit()

            step = max(len(todo), 1) if self.streams else self.chunk_size
            try:
                for start in range(0, len(todo), step):
                    idx = todo[start:start + step]
                    if start:  # another job may have committed some of these meanwhile
                        found.update(self.store.get_many([keys[i] for i in idx]))
                        advance(sum(keys[i] in found for i in idx))
                        idx = [i for i in idx if keys[i] not in found]
                    batch = [items[i] for i in idx]
                    if not batch:
                        continue
                    if self.streams:
                        method(batch, *extra, on_result=lambda j, result, idx=idx: receive(idx[j], result))
                    else:
                        for i, result in zip(idx, method(batch, *extra)):
                            receive(i, result)
            finally:
                commit()
        return [found[k] for k in keys]

    def generate(self, requests: Sequence[GenerationRequest], label: str = "generate") -> list[Completion]:
        """Completions for the requests, from the store where present."""
        payloads = [asdict(r) for r in requests]
        rows = self._cached("generate", payloads, label, self.inner.generate, requests, to_json=asdict)
        return [Completion(text=r["text"], token_ids=tuple(r["token_ids"]), finish_reason=r["finish_reason"]) for r in rows]

    def choice_probs(self, prefixes: Sequence[Sequence[int]], choices: Sequence[Sequence[int]], label: str = "score") -> np.ndarray:
        """Choice probabilities per prefix, from the store where present."""
        choice_lists = [list(c) for c in choices]
        payloads = [{"prefix": list(p), "choices": choice_lists} for p in prefixes]
        rows = self._cached("choice_probs", payloads, label, self.inner.choice_probs, prefixes, (choice_lists,))
        return np.array(rows, dtype=float).reshape(len(prefixes), len(choices))

    def depth_choice_probs(self, requests: Sequence[DepthRequest], choices: Sequence[Sequence[int]], label: str = "depth") -> list[np.ndarray]:
        """Choice probabilities at every cut of each trace, from the store where present."""
        choice_lists = [list(c) for c in choices]
        payloads = [{**asdict(r), "choices": choice_lists} for r in requests]
        rows = self._cached("depth_choice_probs", payloads, label, self.inner.depth_choice_probs, requests, (choice_lists,))
        return [np.array(r, dtype=float) for r in rows]

    def target_nll(self, requests: Sequence[NLLRequest], label: str = "target nll") -> np.ndarray:
        """Target NLL (nats/token) per request, from the store where present; keyed by blocks, target and graph."""
        payloads = [asdict(r) for r in requests]
        return np.array(self._cached("target_nll", payloads, label, self.inner.target_nll, requests), dtype=float)
