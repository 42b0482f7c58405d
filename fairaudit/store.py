"""Content-addressed sqlite store of every generation and score, and the caching backend wrapper.

A result is keyed by (call kind, model fingerprint, exact token ids, decoding parameters,
backend version). Results are committed chunk by chunk, so a killed run resumes where it
stopped; WAL mode lets concurrent sweep jobs share one file.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from fairaudit.backends import Backend, Completion, DepthRequest, GenerationRequest
from fairaudit.console import progress

STORE_VERSION = 1


class Store:
    """A key -> JSON value table in one sqlite file."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser().resolve()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=60.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, kind TEXT NOT NULL, "
            "model TEXT NOT NULL, value TEXT NOT NULL, created REAL NOT NULL)"
        )
        self._db.commit()

    def get_many(self, keys: Sequence[str]) -> dict[str, object]:
        """Stored values of those keys that exist."""
        found: dict[str, object] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), 500):
            chunk = unique[start:start + 500]
            marks = ",".join("?" * len(chunk))
            for key, value in self._db.execute(f"SELECT key, value FROM results WHERE key IN ({marks})", chunk):
                found[key] = json.loads(value)
        return found

    def put_many(self, kind: str, model: str, items: Sequence[tuple[str, object]]) -> None:
        """Insert results and commit at once."""
        now = time.time()
        self._db.executemany(
            "INSERT OR REPLACE INTO results (key, kind, model, value, created) VALUES (?, ?, ?, ?, ?)",
            [(key, kind, model, json.dumps(value), now) for key, value in items],
        )
        self._db.commit()

    def count(self, kind: str | None = None) -> int:
        """Number of stored results, of one kind or all."""
        if kind is None:
            return self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        return self._db.execute("SELECT COUNT(*) FROM results WHERE kind = ?", (kind,)).fetchone()[0]

    def close(self) -> None:
        self._db.close()


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
    re-run resumes. `model_calls` counts the results the model produced.
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
                    batch = [items[i] for i in idx]
                    if self.streams:
                        method(batch, *extra, on_result=lambda j, result: receive(idx[j], result))
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
