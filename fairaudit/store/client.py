"""The model as probes see it: every backend call answered from the result store first.

`CachingClient` wraps any backend (lm-eval's CachingLM, inspect's Model around a ModelAPI): a call
reaches the model only for what the store lacks, results are committed as they come, and every
call is refused with one AuditError line when the backend's capabilities do not cover it. Probes
talk to this client alone; they never import the store or compute keys (a Completion carries its key).
"""

from __future__ import annotations

import time
from dataclasses import asdict, fields, replace
from typing import Callable, Iterable, Sequence

import numpy as np

from fairaudit.backends import (
    Backend,
    Completion,
    DepthRequest,
    GenerationRequest,
    GraphGenerationRequest,
    NLLRequest,
    missing,
)
from fairaudit.backends.common import encode_texts, tokenizer_digest
from fairaudit.store.claims import Stalls, owner_name
from fairaudit.store.results import Store, call_key
from fairaudit.terminal.output import console, warn
from fairaudit.terminal.progress import progress


def array_json(values) -> list:
    """An array result (probabilities) as nested float lists for the store."""
    return np.asarray(values, dtype=float).tolist()


ENCODE_CHUNK = 256  # texts per tokenizer batch and store commit
READ_CHUNK = 1000   # stored values parsed at a time
POLL_S = (0.1, 2.0)  # first and longest pause between reads of calls another process is computing
CLAIM_AHEAD = 64     # calls claimed at a time (at least a chunk): a claim is a commit, a small chunk's too many
_INTS: list[int] = []  # one int object per token id seen, shared by every token tuple


def shared_ints(ids: Sequence[int]) -> tuple[int, ...]:
    """`tuple(ids)` whose ints are shared objects: CPython keeps each int above 256 in an object of its own,
    so thousands of 2,000-token lists would hold 36 bytes per token; shared, a tuple holds 8."""
    if not ids or min(ids) < 0:
        return tuple(ids)
    try:
        return tuple(map(_INTS.__getitem__, ids))
    except IndexError:
        _INTS.extend(range(len(_INTS), max(max(ids) + 1, 2 * len(_INTS))))
        return tuple(map(_INTS.__getitem__, ids))


def payload(request) -> dict:
    """A request as its store key reads it: `dataclasses.asdict`, without deep-copying a flat request's
    token tuples (GenerationRequest, DepthRequest: the same JSON, hence the same key)."""
    if isinstance(request, (GenerationRequest, DepthRequest)):
        return {f.name: getattr(request, f.name) for f in fields(request)}
    return asdict(request)


def generation_key(fingerprint: str, request: GenerationRequest | GraphGenerationRequest) -> str:
    """The store key of one generation of the model `fingerprint` names (the records' prompt_hash)."""
    return call_key("generate", fingerprint, payload(request))


def completion_json(completion: Completion) -> dict:
    """A completion as stored: text, token ids and finish reason (its key is the row's own)."""
    return {"text": completion.text, "token_ids": list(completion.token_ids), "finish_reason": completion.finish_reason}


class CachingClient:
    """A backend behind the store.

    A batch backend gets the missing calls in chunks of its `capabilities.chunk_size` (else
    `chunk_size`, the model's batch size). A streaming backend (`capabilities.streaming`: its calls
    take `on_result(i, result)`, e.g. a server pool that bounds its own in-flight requests) gets
    them all at once. Either way results are committed every chunk of arrivals and, when a call
    fails, before the failure propagates, so a re-run resumes. Before each batch its calls are
    claimed in the store and read again: what another job committed meanwhile is served, and what
    another job is computing is read when it lands, never computed twice (`Calls`) unless a claim
    lapsed or was taken over. `model_calls` counts the results the model produced here; `twice`, those
    of them another process had stored meanwhile (metric `model_calls_twice`, logged when not 0).
    """

    def __init__(self, backend: Backend, store: Store, chunk_size: int = 8):
        self.backend = backend
        self.store = store
        self.capabilities = backend.capabilities
        self.fingerprint = backend.fingerprint
        self.tokenizer = backend.tokenizer
        self.chunk_size = max(1, self.capabilities.chunk_size or chunk_size)
        self.model_calls = 0
        self.twice = 0
        self._tokenizer_digest: str | None = None

    def require(self, capability: str) -> None:
        """Refuse a call the backend's capabilities do not cover: one line naming it and the backends that have it."""
        if not self.capabilities.has(capability):
            raise missing(self.backend, capability)

    def key(self, kind: str, payload: object) -> str:
        """The store key of one call of this client's backend."""
        return call_key(kind, self.fingerprint, payload)

    def generate(self, requests: Sequence[GenerationRequest | GraphGenerationRequest],
                 label: str = "generate") -> list[Completion]:
        """Completions for the requests, from the store where present, each carrying its store key."""
        if any(isinstance(r, GraphGenerationRequest) for r in requests):
            self.require("attention_graphs")
        payloads = [payload(r) for r in requests]  # generation_key's payload
        keys, rows = self._cached("generate", payloads, label, self.backend.generate, requests, to_json=completion_json,
                                  convert=lambda r: Completion(r["text"], shared_ints(r["token_ids"]),
                                                               r["finish_reason"]))
        return [replace(completion, key=key) for key, completion in zip(keys, rows)]

    def choice_probs(self, prefixes: Sequence[Sequence[int]], choices: Sequence[Sequence[int]],
                     label: str = "score") -> np.ndarray:
        """Choice probabilities per prefix (rows in prefix order), from the store where present."""
        self.require("scores")
        choice_lists = [list(c) for c in choices]
        payloads = ({"prefix": list(p), "choices": choice_lists} for p in prefixes)  # one at a time: keys only
        _, rows = self._cached("choice_probs", payloads, label, self.backend.choice_probs, prefixes, (choice_lists,))
        return np.array(rows, dtype=float).reshape(len(prefixes), len(choices))

    def depth_choice_probs(self, requests: Sequence[DepthRequest], choices: Sequence[Sequence[int]],
                           label: str = "depth") -> list[np.ndarray]:
        """Choice probabilities at every cut of each trace, from the store where present."""
        self.require("depth_reads")
        choice_lists = [list(c) for c in choices]
        payloads = ({**payload(r), "choices": choice_lists} for r in requests)
        _, rows = self._cached("depth_choice_probs", payloads, label, self.backend.depth_choice_probs, requests,
                               (choice_lists,))
        return [np.array(r, dtype=float) for r in rows]

    def target_nll(self, requests: Sequence[NLLRequest], label: str = "target nll") -> np.ndarray:
        """Target NLL (nats/token) per request, from the store where present; keyed by blocks, target and graph."""
        self.require("target_nll")
        if any(r.visibility is not None for r in requests):
            self.require("attention_graphs")
        payloads = [asdict(r) for r in requests]
        _, rows = self._cached("target_nll", payloads, label, self.backend.target_nll, requests)
        return np.array(rows, dtype=float)

    def encode(self, texts: Sequence[str], label: str = "tokenize") -> list[tuple[int, ...]]:
        """Token ids of each text (no special tokens added), from the store where present.

        Tokenizing is not a model call (model_calls does not count it), but at paper scale it costs more
        than the store does (thousands of 2,000-token traces, a regex pre-tokenizer at ~0.3M tokens/s per
        core), so its results are kept beside the model's, keyed by the text and the tokenizer's digest.
        """
        if self._tokenizer_digest is None:
            self._tokenizer_digest = tokenizer_digest(self.tokenizer)
        unique = list(dict.fromkeys(texts))
        keys = {t: call_key("encode", self._tokenizer_digest, t) for t in unique}
        found = self._read(list(keys.values()), shared_ints)
        todo = [t for t in unique if keys[t] not in found]
        with progress(label, total=len(todo), done_before=len(unique) - len(todo)) as advance:
            for start in range(0, len(todo), ENCODE_CHUNK):
                chunk = todo[start:start + ENCODE_CHUNK]
                items = [(keys[t], ids) for t, ids in zip(chunk, encode_texts(self.tokenizer, chunk))]
                self.store.put_many("encode", self._tokenizer_digest, items)
                found.update((key, shared_ints(ids)) for key, ids in items)
                advance(len(chunk))
        return [found[keys[t]] for t in texts]

    def metrics(self) -> dict[str, float]:
        """Model calls made through this client (those computed twice when there were any), and the backend's own
        figures."""
        twice = {"model_calls_twice": self.twice} if self.twice else {}
        return {"model_calls": self.model_calls, **twice, **self.backend.metrics()}

    def _read(self, keys: Sequence[str], convert: Callable) -> dict:
        """convert(value) of each key the store holds, read a chunk at a time (so parsed JSON never piles up)."""
        found = {}
        for start in range(0, len(keys), READ_CHUNK):
            found.update((k, convert(v)) for k, v in self.store.get_many(keys[start:start + READ_CHUNK]).items())
        return found

    def _cached(self, kind: str, payloads: Iterable[object], label: str, method: Callable, items: Sequence,
                extra: tuple = (), to_json: Callable = array_json,
                convert: Callable = lambda v: v) -> tuple[list[str], list]:
        """(keys, results) of method(items, *extra), read from the store where present, stored as to_json(result),
        each kept as convert(stored value); a call another process is computing is read when it lands."""
        keys = [self.key(kind, p) for p in payloads]
        calls = Calls(self, kind, keys, items, method, extra, to_json, convert)
        return keys, calls.run(label)


class Calls:
    """One batch of calls through the store (`CachingClient._cached`). The calls the store lacks are claimed
    CLAIM_AHEAD at a time (`store.claims`), computed a chunk at a time and committed every chunk of results, at the
    end of each claimed group (so nothing computed here waits uncommitted while this process waits on another's)
    and, when a call fails, before the failure propagates; those another process claimed first are read as they
    land, or claimed and computed here once that process's claim is free (released without results, lapsed, its
    process gone) or its process made no progress for a lease."""

    def __init__(self, client: CachingClient, kind: str, keys: list[str], items: Sequence, method: Callable,
                 extra: tuple, to_json: Callable, convert: Callable):
        self.client, self.store, self.kind, self.keys, self.items = client, client.store, kind, keys, items
        self.method, self.extra, self.to_json, self.convert = method, extra, to_json, convert
        self.found = client._read(keys, convert)
        self.pending: list[tuple[str, object]] = []
        self.todo: list[int] = []
        self.computed = 0
        self.twice = 0
        self.step = client.chunk_size
        self.advance: Callable[[int], None] = lambda n: None

    def run(self, label: str) -> list:
        """Every call's result, in order."""
        absent = [i for i, k in enumerate(self.keys) if k not in self.found]
        first_of_key: dict[str, int] = {}
        self.todo = [i for i in absent if first_of_key.setdefault(self.keys[i], i) == i]
        if self.client.capabilities.streaming:  # its calls all at once: the backend bounds what is in flight
            self.step = max(len(self.todo), 1)
        with progress(label, total=len(self.todo), done_before=len(self.keys) - len(absent)) as self.advance:
            try:
                others, ahead = [], max(self.step, CLAIM_AHEAD)
                for start in range(0, len(self.todo), ahead):
                    others += self.claim_and_compute(self.todo[start:start + ahead])
                self.wait_for(others, label)
            finally:
                self.commit()
                self.store.claims.release_all()  # those not computed, should a call have failed
        if self.twice:
            warn(f"{label}: {self.twice} of the calls computed here had been stored by another process meanwhile "
                 "(computed twice: this process's claims lapsed or were taken over while it was paused or stuck); "
                 "the first result stored is kept")
        return [self.found[k] for k in self.keys]

    def claim_and_compute(self, idx: list[int], look_first: bool = False) -> list[int]:
        """Claim the calls `idx`, compute a chunk at a time those the store still lacks once claimed (a result
        committed before its claim was released is read instead) and commit them all; returns those another
        process holds (those taken from this process meanwhile included)."""
        held = self.store.claim([self.keys[i] for i in idx], look_first)
        mine = [i for i in idx if self.keys[i] in held]
        landed = self.land(mine)
        self.store.claims.release(landed)
        missing = [i for i in mine if self.keys[i] not in self.found]
        lost: list[int] = []
        for start in range(0, len(missing), self.step):
            lost += self.compute_held(missing[start:start + self.step])
        self.commit()  # before this process waits on any other
        return [i for i in idx if self.keys[i] not in held] + lost

    def compute_held(self, idx: list[int]) -> list[int]:
        """Compute the calls `idx` this process claimed, less those another process took meanwhile (this process
        paused past its lease); returns those."""
        lost = self.store.claims.lost([self.keys[i] for i in idx])
        self.compute([i for i in idx if self.keys[i] not in lost])
        return [i for i in idx if self.keys[i] in lost]

    def land(self, idx: list[int]) -> list[str]:
        """Read the calls `idx` from the store; returns the keys that were there (their progress advanced)."""
        stored = self.client._read([self.keys[i] for i in idx], self.convert)
        self.found.update(stored)
        self.advance(len(stored))
        return list(stored)

    def wait_for(self, idx: list[int], label: str) -> None:
        """The calls `idx` another process claimed: read as they land, polled less often while none does; claimed
        and computed here as soon as a claim is free."""
        if idx:
            holders = self.store.claims.holders([self.keys[i] for i in idx]).values()
            owners = sorted({owner_name(owner) for owner, _ in holders})
            shown = f" ({', '.join(owners)})" if owners else ""
            console.print(f"[dim]{label}: another process is computing {len(idx)} of these calls{shown}; reading "
                          "them as they land[/dim]", highlight=False)
        delay, stalls = POLL_S[0], Stalls(self.store.claims)
        while idx:
            self.land(idx)
            waiting = [i for i in idx if self.keys[i] not in self.found]
            idx = self.claim_and_compute(waiting, look_first=True) if waiting else []
            if idx and len(idx) == len(waiting) and not self.take_over(idx, stalls, label):
                time.sleep(delay)
                delay = min(2 * delay, POLL_S[1])
            else:
                delay = POLL_S[0]

    def take_over(self, idx: list[int], stalls: Stalls, label: str) -> bool:
        """Claim those of the calls `idx` whose holders made no progress for a lease, though they renew it (one dim
        line); whether any was taken (they are computed on the next round of `wait_for`)."""
        keys = [self.keys[i] for i in idx]
        stuck = stalls.stuck(keys)
        taken = self.store.claims.take_over(keys, stuck) if stuck else set()
        if taken:
            owners = ", ".join(sorted(owner_name(owner) for owner in stuck))
            console.print(f"[dim]{label}: {owners} renewed its claims on {len(taken)} of these calls but made no "
                          f"progress for {self.store.claims.lease_s:g} s; computing them here[/dim]", highlight=False)
        return bool(taken)

    def compute(self, idx: list[int]) -> None:
        """One backend call on the items `idx` (a streaming backend's results arrive one by one)."""
        if not idx:
            return
        batch = [self.items[i] for i in idx]
        if self.client.capabilities.streaming:
            self.method(batch, *self.extra, on_result=lambda j, result: self.receive(idx[j], result))
        else:
            for i, result in zip(idx, self.method(batch, *self.extra)):
                self.receive(i, result)

    def receive(self, i: int, result: object) -> None:
        value = self.to_json(result)
        self.pending.append((self.keys[i], value))
        self.found[self.keys[i]] = self.convert(value)
        self.client.model_calls += 1
        self.computed += 1
        self.advance(1)
        if len(self.pending) >= self.client.chunk_size:
            self.commit()

    def commit(self) -> None:
        """Commit the results computed since the last commit (`left`: those of the batch not computed yet)."""
        if self.pending:
            added = self.store.put_many(self.kind, self.client.fingerprint, self.pending,
                                        left=len(self.todo) - self.computed)
            self.twice += len(self.pending) - added
            self.client.twice += len(self.pending) - added
            self.pending.clear()
