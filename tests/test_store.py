"""The content-addressed store: zero-call re-runs, resume after an interrupted run, exact keys."""

from __future__ import annotations

import numpy as np
import pytest

from fairaudit.backends import Completion, GenerationRequest
from fairaudit.store import CachedBackend, Store, call_key


class ScriptedBackend:
    """Deterministic stand-in model: echoes prompt ids; can fail after `fail_after` calls."""

    tokenizer = None

    def __init__(self, fingerprint: str = "scripted", fail_after: int | None = None):
        self.fingerprint = fingerprint
        self.fail_after = fail_after
        self.seen: list[tuple[int, ...]] = []

    def _tick(self, key):
        if self.fail_after is not None and len(self.seen) >= self.fail_after:
            raise KeyboardInterrupt("killed")
        self.seen.append(key)

    def generate(self, requests):
        out = []
        for r in requests:
            self._tick(r.prompt_ids)
            out.append(Completion(text=" ".join(map(str, r.prompt_ids)), token_ids=r.prompt_ids, finish_reason="stop"))
        return out

    def choice_probs(self, prefixes, choices):
        for p in prefixes:
            self._tick(tuple(p))
        return np.array([[(sum(p) % 10) / 10, 1 - (sum(p) % 10) / 10] for p in prefixes])


def requests(n: int) -> list[GenerationRequest]:
    return [GenerationRequest(prompt_ids=(i, i + 1), max_new_tokens=8) for i in range(n)]


def test_second_identical_run_makes_zero_model_calls(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    first = CachedBackend(ScriptedBackend(), store, chunk_size=3)
    out1 = first.generate(requests(10))
    probs1 = first.choice_probs([(1, 2), (3, 4)], [[1], [2]])
    assert first.model_calls == 12
    second = CachedBackend(ScriptedBackend(), Store(tmp_path / "s.sqlite"), chunk_size=3)
    assert second.generate(requests(10)) == out1
    np.testing.assert_array_equal(second.choice_probs([(1, 2), (3, 4)], [[1], [2]]), probs1)
    assert second.model_calls == 0 and second.inner.seen == []


def test_interrupted_run_resumes_and_loses_nothing(tmp_path):
    clean = CachedBackend(ScriptedBackend(), Store(tmp_path / "clean.sqlite"), chunk_size=4).generate(requests(10))
    killed = CachedBackend(ScriptedBackend(fail_after=6), Store(tmp_path / "s.sqlite"), chunk_size=4)
    with pytest.raises(KeyboardInterrupt):
        killed.generate(requests(10))
    assert Store(tmp_path / "s.sqlite").count("generate") == 4  # the first whole chunk was committed
    resumed = CachedBackend(ScriptedBackend(), Store(tmp_path / "s.sqlite"), chunk_size=4)
    assert resumed.generate(requests(10)) == clean
    assert resumed.model_calls == 6 and resumed.inner.seen == [r.prompt_ids for r in requests(10)[4:]]


def test_duplicate_requests_are_computed_once(tmp_path):
    cached = CachedBackend(ScriptedBackend(), Store(tmp_path / "s.sqlite"))
    out = cached.generate(requests(2) * 3)
    assert cached.model_calls == 2 and len(out) == 6 and out[0] == out[2] == out[4]


def test_key_depends_on_model_ids_and_decoding():
    base = call_key("generate", "m1", {"prompt_ids": [1, 2], "temperature": 0.0})
    assert base == call_key("generate", "m1", {"temperature": 0.0, "prompt_ids": [1, 2]})
    assert base != call_key("generate", "m2", {"prompt_ids": [1, 2], "temperature": 0.0})
    assert base != call_key("generate", "m1", {"prompt_ids": [1, 3], "temperature": 0.0})
    assert base != call_key("generate", "m1", {"prompt_ids": [1, 2], "temperature": 0.7})
    assert base != call_key("choice_probs", "m1", {"prompt_ids": [1, 2], "temperature": 0.0})


def test_two_models_share_a_store_without_collisions(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    a = CachedBackend(ScriptedBackend("model-a"), store).generate(requests(3))
    b = CachedBackend(ScriptedBackend("model-b"), store)
    b.generate(requests(3))
    assert b.model_calls == 3 and store.count() == 6 and len(a) == 3
