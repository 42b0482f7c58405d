"""The plan's client (`fairaudit plan`): every call a probe makes counted and sized, none sent to a model.

`CensusClient` stands where `CachingClient` stands in a run, so a probe makes exactly the calls it makes in a run.
Each call is looked up in what the plan has met already (another job of the same study asked it: the store would
serve it), then in the result store under the real model's fingerprint (read only: a stored result is used as it
is, so a pilot's real traces shape what follows them); what neither holds is answered by a stand-in backend (the
mock, instantly) and counted as work: calls, tokens the model reads, tokens it generates.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from fairaudit.backends import Backend, DepthRequest, GenerationRequest, GraphGenerationRequest, NLLRequest
from fairaudit.backends.common import encode_texts
from fairaudit.store.client import CachingClient, array_json, shared_ints
from fairaudit.store.results import Store


@dataclass
class Tally:
    """A job's calls by kind: how many it asks, how many another job of the plan asked first (`shared`), how many of
    the rest the store holds (`stored`; the rest are new), and the tokens of those rest (its own calls, stored or
    new: read = prompt and prefix tokens a model reads, generated = new tokens; cuts = answers read along traces)."""

    asked: Counter = field(default_factory=Counter)
    shared: Counter = field(default_factory=Counter)
    stored: Counter = field(default_factory=Counter)
    read_tokens: Counter = field(default_factory=Counter)
    generated_tokens: Counter = field(default_factory=Counter)
    budget_tokens: Counter = field(default_factory=Counter)  # the max_new_tokens of the generations
    cuts: Counter = field(default_factory=Counter)

    def own(self, kind: str) -> int:
        """The calls of `kind` no earlier job asked: stored or new."""
        return self.asked[kind] - self.shared[kind]


def read_tokens(request) -> int:
    """Tokens a model reads for one request: its prompt, prefix or blocks (a depth request: the trace once and the
    suffix after each cut, as the backends pack it)."""
    if isinstance(request, GenerationRequest):
        return len(request.prompt_ids)
    if isinstance(request, DepthRequest):
        return len(request.prompt_ids) + len(request.trace_ids) + len(request.cuts) * len(request.suffix_ids)
    if isinstance(request, (GraphGenerationRequest, NLLRequest)):
        return sum(len(block.ids) for block in request.blocks)
    return len(request)  # a choice read's prefix


class CensusClient(CachingClient):
    """A probe's client that asks no model (see the module docstring). fingerprint: the real model's, or one of the
    plan's own when its files are not here (`looks_up` False: nothing stored can then match); met: key -> result,
    encoded: (tokenizer, text) -> token ids, both shared by every job of a plan."""

    def __init__(self, stand_in: Backend, store: Store | None, fingerprint: str, met: dict, looks_up: bool = True,
                 encoded: dict | None = None):
        super().__init__(stand_in, store)
        self.fingerprint = fingerprint
        self.looks_up = store is not None and looks_up
        self.met, self.tally, self.encoded = met, Tally(), {} if encoded is None else encoded

    def encode(self, texts: Sequence[str], label: str = "tokenize") -> list[tuple[int, ...]]:
        """Token ids of each text, tokenized here once per plan (not a model call; nothing written to the store)."""
        keys = [(id(self.tokenizer), text) for text in texts]
        todo = list(dict.fromkeys(key for key in keys if key not in self.encoded))
        for key, ids in zip(todo, encode_texts(self.tokenizer, [text for _, text in todo])):
            self.encoded[key] = shared_ints(ids)
        return [self.encoded[key] for key in keys]

    def _cached(self, kind: str, payloads: Iterable[object], label: str, method: Callable, items: Sequence,
                extra: tuple = (), to_json: Callable = array_json,
                convert: Callable = lambda v: v) -> tuple[list[str], list]:
        """(keys, results): each call from the plan's earlier jobs, else the store, else the stand-in; tallied."""
        keys = [self.key(kind, p) for p in payloads]
        found = {k: self.met[k] for k in keys if k in self.met}
        stored = self._read([k for k in dict.fromkeys(keys) if k not in found], convert) if self.looks_up else {}
        first: dict[str, int] = {}
        own = [i for i, k in enumerate(keys) if k not in found and first.setdefault(k, i) == i]
        todo = [i for i in own if keys[i] not in stored]
        found.update(stored)
        for i, result in zip(todo, method([items[i] for i in todo], *extra) if todo else []):
            found[keys[i]] = convert(to_json(result))
        self.tally.asked[kind] += len(keys)
        self.tally.shared[kind] += len(keys) - len(own)
        self.tally.stored[kind] += len(own) - len(todo)
        for i in own:
            self.count(kind, items[i], found[keys[i]])
        self.met.update(found)
        return keys, [found[k] for k in keys]

    def count(self, kind: str, request, result) -> None:
        """Add one of the job's own calls' tokens to the tally."""
        self.tally.read_tokens[kind] += read_tokens(request)
        self.tally.generated_tokens[kind] += work_tokens(kind, request, result) - read_tokens(request)
        self.tally.budget_tokens[kind] += getattr(request, "max_new_tokens", 0)
        if isinstance(request, DepthRequest):
            self.tally.cuts[kind] += len(request.cuts)


class TimedClient(CachingClient):
    """A run's client (`CachingClient`) that also times the model calls it makes, by kind, with the tokens each
    kind's new calls read and generate: what a pilot measures of this machine's speed."""

    def __init__(self, backend: Backend, store: Store, chunk_size: int = 8):
        super().__init__(backend, store, chunk_size)
        self.seconds: Counter = Counter()
        self.work: Counter = Counter()  # tokens read plus tokens generated, by kind
        self.generated = 0  # tokens the new generations wrote, and their budgets' sum (max_new_tokens)
        self.budget = 0

    def _cached(self, kind: str, payloads: Iterable[object], label: str, method: Callable, items: Sequence,
                extra: tuple = (), to_json: Callable = array_json,
                convert: Callable = lambda v: v) -> tuple[list[str], list]:
        def timed(batch: Sequence, *args, **kwargs):
            start = time.perf_counter()
            results = method(batch, *args, **kwargs)
            self.seconds[kind] += time.perf_counter() - start
            done = [] if results is None else results  # a streaming backend hands its results to on_result
            self.work[kind] += sum(work_tokens(kind, request, result) for request, result in zip(batch, done))
            if kind == "generate":
                self.generated += sum(len(result.token_ids) for result in done)
                self.budget += sum(request.max_new_tokens for request in batch[:len(done)])
            return results
        return super()._cached(kind, payloads, label, timed, items, extra, to_json, convert)


def work_tokens(kind: str, request, result) -> int:
    """Tokens one call reads plus those it generates."""
    return read_tokens(request) + (len(result.token_ids) if kind == "generate" else 0)
