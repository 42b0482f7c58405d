"""Every backend holds to the one contract of `fairaudit.backends` (real model forward passes where it has one).

A backend joins the suite by declaring it in its own config: `conformance:` in conf/backend/<name>.yaml (the
tolerance of its reads, the settings it is built with on the suite's tiny model, and how that model reaches it),
so a new backend is new files only. Test-only backends (`scripted`) join with a `Subject` of their own. The
module whose BACKEND_VERSION names the backend's version is the built backend's own. A backend that runs on an
optional engine (`Backend.requires`) is skipped where the engine is absent and marked with its name, to run where
it is (`make test-vllm`, `make test-llamacpp`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest
from hydra.utils import get_method

from fairaudit.backends import Backend
from fairaudit.catalog import registry
from fairaudit.conformance import checks, command
from fairaudit.conformance.command import MODELS, declaration
from fairaudit.models.locate import tiny_qwen3_dir
from model_server import ModelServer
from scripted import ScriptedModel
from warm import run_python

Factory = Callable[[Path], contextlib.AbstractContextManager[Backend]]


@dataclass(frozen=True)
class Subject:
    """One backend in the suite.

    name: its `backend=` choice (the backend's `name`); factory: a context manager yielding it built on a model
    folder; tolerance: how far its batched reads may lie from the same reads sent alone, and its depth reads
    from the re-fed prefixes (0 for exact arithmetic; a float32 model's reordered sums need about 1e-6).
    """

    name: str
    factory: Factory
    tolerance: float

    @property
    def backend_class(self) -> type[Backend] | None:
        """The registry's class of this name; None for a test-only backend."""
        return registry.backend_classes().get(self.name)

    def runs_here(self) -> bool:
        """Whether its backend's optional engine, if it names one, is installed here."""
        return self.backend_class is None or self.backend_class.available()

    def param(self):
        """The entry as a pytest parameter: skipped where its engine is absent, marked with its name if it has one."""
        cls = self.backend_class
        if cls is None or cls.requires is None:
            return pytest.param(self, id=self.name)
        absent = pytest.mark.skipif(not cls.available(), reason=f"{cls.requires.label} is not installed here")
        return pytest.param(self, id=self.name, marks=[absent, getattr(pytest.mark, self.name)])

    @contextlib.contextmanager
    def build(self, model_dir: Path) -> Iterator[Backend]:
        with self.factory(model_dir) as built:
            assert built.name == self.name, f"conformance entry {self.name!r} built backend {built.name!r}"
            yield built


def declared(name: str) -> Subject:
    """The suite's entry for a registered backend, built as its config's `conformance:` node says
    (`fairaudit.conformance.command.built`), served behind an OpenAI-compatible loopback server when it says
    `serve: openai` (its `base_url`)."""
    node = declaration(name)

    @contextlib.contextmanager
    def factory(model_dir: Path) -> Iterator[Backend]:
        folder = MODELS[node.get("model", "tiny_qwen3")]() if model_dir == tiny_qwen3_dir() else model_dir
        server = serve(get_method(node["folder"])(folder) if node.get("folder") else folder) \
            if node.get("serve") == "openai" else None
        try:
            with command.built(name, model_dir, server.url if server else None) as backend:
                yield backend
        finally:
            if server:
                server.stop()
    return Subject(name, factory, float(node["tolerance"]))


def serve(folder: Path) -> ModelServer:
    """An OpenAI-compatible server on loopback answering from the hf backend on `folder`."""
    from fairaudit.backends.hf import HFBackend

    return ModelServer(HFBackend(folder, device="cpu", batch_size=4))


@contextlib.contextmanager
def scripted(model_dir: Path) -> Iterator[Backend]:
    yield ScriptedModel(model_dir)


SUBJECTS = [declared(name) for name in registry.names("backend") if registry.meta("backend", name, "conformance")]
SUBJECTS += [Subject("scripted", scripted, 1e-12)]
PARAMS = [subject.param() for subject in SUBJECTS]


def test_every_backend_declares_its_conformance():
    for name in registry.names("backend"):
        declaration(name)


@pytest.fixture(scope="module", params=PARAMS)
def subject(request) -> Subject:
    return request.param


@pytest.fixture(scope="module")
def backend(subject) -> Iterator[Backend]:
    with subject.build(tiny_qwen3_dir()) as built:
        yield built


@pytest.mark.slow
def test_choice_rows_are_distributions_over_the_choices_in_their_order(backend, subject):
    checks.choice_rows_are_distributions_over_the_choices_in_their_order(backend, subject.tolerance)


def test_results_come_back_in_request_order(backend, subject):
    checks.results_come_back_in_request_order(backend, subject.tolerance)


def test_a_completion_is_cut_at_a_stop_id_or_its_budget(backend, subject):
    checks.a_completion_is_cut_at_a_stop_id_or_its_budget(backend, subject.tolerance)


@pytest.mark.slow
def test_sampled_requests_with_the_same_seed_repeat(backend, subject):
    checks.sampled_requests_with_the_same_seed_repeat(backend, subject.tolerance)


def test_depth_reads_equal_the_refed_prefixes(backend, subject):
    checks.depth_reads_equal_the_refed_prefixes(backend, subject.tolerance)


def test_a_missing_capability_is_one_audit_error(backend, subject):
    checks.a_missing_capability_is_one_audit_error(backend, subject.tolerance)


def test_fairaudit_check_holds_an_installed_backend_to_the_same_checks():
    done = run_python([sys.executable, "-m", "fairaudit", "check", "backend=mock"], env=dict(os.environ), timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [f"ok      {check.__name__}" for check in checks.CHECKS] + [
        f"backend=mock: {len(checks.CHECKS)} of {len(checks.CHECKS)} checks hold"]
    refused = run_python([sys.executable, "-m", "fairaudit", "check", "backend=mock", "extra"], env=dict(os.environ),
                         timeout=600)
    assert refused.returncode == 2 and refused.stderr.startswith("error: fairaudit check takes one backend=NAME")


def test_the_command_runs_every_check_this_suite_runs():
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    assert {check.__name__ for check in checks.CHECKS} <= tested


@pytest.mark.slow  # each backend built three times: 24 s in all
@pytest.mark.parametrize("entry", PARAMS)
def test_the_fingerprint_changes_with_the_backend_version_and_the_model_files(entry, tmp_path, monkeypatch):
    folder = shutil.copytree(tiny_qwen3_dir(), tmp_path / "model")
    with entry.build(folder) as built:
        original, module, loads_weights = built.fingerprint, type(built).__module__, built.capabilities.loads_weights
    assert hasattr(importlib.import_module(module), "BACKEND_VERSION"), (
        f"{module}, backend {entry.name!r}'s module, has no BACKEND_VERSION (the version its fingerprint names)")
    monkeypatch.setattr(importlib.import_module(module), "BACKEND_VERSION", "next-version")
    with entry.build(folder) as built:
        assert built.fingerprint != original
    monkeypatch.undo()
    if loads_weights:  # one bit of the last weight
        weights = next(folder.glob("*.safetensors"))
        changed = bytearray(weights.read_bytes())
        changed[-1] ^= 1
        weights.write_bytes(bytes(changed))
    else:  # a served model is named by its config
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "fairaudit_revision": 2}))
    with entry.build(folder) as built:
        assert built.fingerprint != original


@pytest.mark.slow
def test_fingerprints_of_different_backends_never_coincide():
    fingerprints = {}
    for subject in SUBJECTS:
        if not subject.runs_here():
            continue
        with subject.build(tiny_qwen3_dir()) as built:
            fingerprints[built.name] = built.fingerprint
    assert len(set(fingerprints.values())) == len(fingerprints) >= 3, fingerprints
