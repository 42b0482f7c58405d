"""The content-addressed store: zero-call re-runs, resume after an interrupted run, exact keys."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict

import numpy as np
import pytest

from fairaudit.backends import Backend, Completion, GenerationRequest
from fairaudit.errors import AuditError
from fairaudit.store import cli as store_cli
from fairaudit.store.client import CachingClient
from fairaudit.store.results import Store, call_key, checksum, damage


class ScriptedBackend(Backend):
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
    first = CachingClient(ScriptedBackend(), store, chunk_size=3)
    out1 = first.generate(requests(10))
    probs1 = first.choice_probs([(1, 2), (3, 4)], [[1], [2]])
    assert first.model_calls == 12
    second = CachingClient(ScriptedBackend(), Store(tmp_path / "s.sqlite"), chunk_size=3)
    assert second.generate(requests(10)) == out1
    np.testing.assert_array_equal(second.choice_probs([(1, 2), (3, 4)], [[1], [2]]), probs1)
    assert second.model_calls == 0 and second.backend.seen == []


def test_interrupted_run_resumes_and_loses_nothing(tmp_path):
    clean = CachingClient(ScriptedBackend(), Store(tmp_path / "clean.sqlite"), chunk_size=4).generate(requests(10))
    killed = CachingClient(ScriptedBackend(fail_after=6), Store(tmp_path / "s.sqlite"), chunk_size=4)
    with pytest.raises(KeyboardInterrupt):
        killed.generate(requests(10))
    assert Store(tmp_path / "s.sqlite").count("generate") == 4  # the first whole chunk was committed
    resumed = CachingClient(ScriptedBackend(), Store(tmp_path / "s.sqlite"), chunk_size=4)
    assert resumed.generate(requests(10)) == clean
    assert resumed.model_calls == 6 and resumed.backend.seen == [r.prompt_ids for r in requests(10)[4:]]


def test_duplicate_requests_are_computed_once(tmp_path):
    cached = CachingClient(ScriptedBackend(), Store(tmp_path / "s.sqlite"))
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
    a = CachingClient(ScriptedBackend("model-a"), store).generate(requests(3))
    b = CachingClient(ScriptedBackend("model-b"), store)
    b.generate(requests(3))
    assert b.model_calls == 3 and store.count() == 6 and len(a) == 3


def damage_value(path, kind: str, edit) -> str:
    """Rewrite one stored value of `kind` in place (as a disk fault or a hand edit would); returns its key."""
    db = sqlite3.connect(path)
    key, value = db.execute("SELECT key, value FROM results WHERE kind = ? ORDER BY key LIMIT 1", (kind,)).fetchone()
    db.execute("UPDATE results SET value = ? WHERE key = ?", (edit(value), key))
    db.commit()
    db.close()
    return key


def fill(path) -> tuple[list, np.ndarray]:
    cached = CachingClient(ScriptedBackend(), Store(path), chunk_size=3)
    return cached.generate(requests(4)), cached.choice_probs([(1, 2), (3, 4), (5, 7)], [[1], [2]])


@pytest.mark.parametrize("kind, edit, problem", [
    ("choice_probs", lambda v: v.replace("0.", "0.1", 1), "fails its checksum"),
    ("generate", lambda v: v[:-3], "fails its checksum"),
])
def test_damaged_value_is_reported_deleted_and_recomputed(tmp_path, capfd, kind, edit, problem):
    path = tmp_path / "s.sqlite"
    outputs, probs = fill(path)
    key = damage_value(path, kind, edit)
    again = CachingClient(ScriptedBackend(), Store(path))
    assert again.generate(requests(4)) == outputs
    np.testing.assert_array_equal(again.choice_probs([(1, 2), (3, 4), (5, 7)], [[1], [2]]), probs)
    assert again.model_calls == 1
    warnings = [line for line in capfd.readouterr().err.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and key[:16] in warnings[0] and problem in warnings[0]
    assert Store(path).count() == 7
    assert store_cli.verify(Store(path)) == {}


def test_checks_beyond_the_checksum(tmp_path):
    """A value stored with a matching checksum is still refused when it does not parse or a row is not a
    distribution."""
    assert damage("k", "generate", '{"text": 1', checksum("k", '{"text": 1')) == "does not parse"
    bad_row = "[[0.5, 0.5], [0.9, 0.547]]"
    assert damage("k", "depth_choice_probs", bad_row, checksum("k", bad_row)).startswith(
        "has a probability row summing to 1.447")
    assert damage("k", "choice_probs", "[NaN, 0.5]", checksum("k", "[NaN, 0.5]")) == (
        "has a probability row summing to nan")
    assert damage("k", "choice_probs", "[0.25, 0.75]", checksum("k", "[0.25, 0.75]")) is None
    assert damage("k", "choice_probs", "[0.25, 0.75]", checksum("other", "[0.25, 0.75]")) == "fails its checksum"


def test_verify_reports_every_damaged_value(tmp_path, capsys):
    path = tmp_path / "s.sqlite"
    fill(path)
    damage_value(path, "generate", lambda v: v.replace("stop", "stap"))
    damage_value(path, "choice_probs", lambda v: "[0.5, 0.6")
    assert store_cli.main(["verify", "--store", str(path)]) == 1
    out = capsys.readouterr()
    assert out.err.count("warning:") == 2
    assert "generate: 3 sound, 1 damaged" in out.out and "choice_probs: 2 sound, 1 damaged" in out.out


def test_export_import_round_trip_between_sqlite_files(tmp_path, capsys):
    source = tmp_path / "cluster.sqlite"
    outputs, probs = fill(source)
    assert store_cli.main(["export", str(tmp_path / "moved.sqlite"), "--store", str(source)]) == 0
    assert store_cli.main(["import", str(tmp_path / "moved.sqlite"), "--store", str(tmp_path / "laptop.sqlite")]) == 0
    laptop = CachingClient(ScriptedBackend(), Store(tmp_path / "laptop.sqlite"))
    assert laptop.generate(requests(4)) == outputs
    np.testing.assert_array_equal(laptop.choice_probs([(1, 2), (3, 4), (5, 7)], [[1], [2]]), probs)
    assert laptop.model_calls == 0
    capsys.readouterr()
    assert store_cli.main(["import", str(tmp_path / "moved.sqlite"), "--store", str(tmp_path / "laptop.sqlite")]) == 0
    assert capsys.readouterr().out.startswith("0 copied, 7 already present, 0 damaged")
    assert Store(tmp_path / "laptop.sqlite").count() == 7


def test_store_written_before_checksums_gains_them(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE results (key TEXT PRIMARY KEY, kind TEXT NOT NULL, model TEXT NOT NULL, "
               "value TEXT NOT NULL, created REAL NOT NULL)")
    request = requests(1)[0]
    value = json.dumps({"text": "0 1", "token_ids": [0, 1], "finish_reason": "stop"})
    db.execute("INSERT INTO results VALUES (?, 'generate', 'scripted', ?, 0)",
               (call_key("generate", "scripted", asdict(request)), value))
    db.commit()
    cached = CachingClient(ScriptedBackend(), Store(path))
    assert cached.generate([request])[0].text == "0 1" and cached.model_calls == 0


def test_unusable_store_is_one_error(tmp_path):
    (tmp_path / "noise.sqlite").write_bytes(bytes(range(256)) * 20)
    for location, message in [("mysql://nobody@127.0.0.1/none", "only sqlite and postgresql stores are supported"),
                              ("/proc/x/s.sqlite", "cannot create its folder"),
                              (tmp_path / "noise.sqlite", "cannot be opened: file is not a database")]:
        with pytest.raises(AuditError, match=message):
            Store(location)
