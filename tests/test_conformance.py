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
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest
from hydra.utils import get_method

from conftest import ENGINE_BACKENDS
from fairaudit.backends import (
    NEEDABLE,
    Backend,
    Block,
    DepthRequest,
    GenerationRequest,
    GraphGenerationRequest,
    NLLRequest,
)
from fairaudit.errors import AuditError
from fairaudit.job import registry
from fairaudit.models.locate import embedded_model_dir, tiny_qwen3_dir
from fairaudit.store.client import CachingClient
from fairaudit.store.results import Store
from model_server import ModelServer
from scripted import ScriptedModel

Factory = Callable[[Path], contextlib.AbstractContextManager[Backend]]
MODELS = {"tiny_qwen3": tiny_qwen3_dir, "smollm2": embedded_model_dir}  # what a declaration's `model` may name
DECLARED = {"tolerance", "settings", "model", "folder", "serve"}


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
    def engine_class(self) -> type[Backend] | None:
        """Its backend's class when that runs on an optional engine (conftest.ENGINE_BACKENDS), else None: read at
        collection without importing the other backends' classes (the hf backend's imports torch)."""
        return ENGINE_BACKENDS.get(self.name)

    def runs_here(self) -> bool:
        """Whether its backend's optional engine, if it names one, is installed here."""
        return self.engine_class is None or self.engine_class.available()

    def param(self):
        """The entry as a pytest parameter: skipped where its engine is absent, marked with its name if it has one."""
        cls = self.engine_class
        if cls is None:
            return pytest.param(self, id=self.name)
        absent = pytest.mark.skipif(not cls.available(), reason=f"{cls.requires.label} is not installed here")
        return pytest.param(self, id=self.name, marks=[absent, getattr(pytest.mark, self.name)])

    @contextlib.contextmanager
    def build(self, model_dir: Path) -> Iterator[Backend]:
        with self.factory(model_dir) as built:
            assert built.name == self.name, f"conformance entry {self.name!r} built backend {built.name!r}"
            yield built


def declaration(name: str) -> dict:
    """conf/backend/<name>.yaml's `conformance:` node, checked."""
    node = registry.meta("backend", name, "conformance")
    assert isinstance(node, dict) and "tolerance" in node and set(node) <= DECLARED, (
        f"{registry.config_file('backend', name)} declares no conformance: {{tolerance, settings, model, folder, "
        f"serve}} (docs/adding.md), found {node!r}")
    return node


def declared(name: str) -> Subject:
    """The suite's entry for a registered backend, built as its config's `conformance:` node says: on the suite's
    model folder (or the embedded one its `model` names in place of the tiny Qwen3), turned into the backend's own
    folder by its `folder` function, served behind an OpenAI-compatible loopback server when it says
    `serve: openai` (its `base_url`), with its `settings`; closed (`Backend.close`) when the test is done."""
    node = declaration(name)

    @contextlib.contextmanager
    def factory(model_dir: Path) -> Iterator[Backend]:
        folder = MODELS[node.get("model", "tiny_qwen3")]() if model_dir == tiny_qwen3_dir() else model_dir
        folder = get_method(node["folder"])(folder) if node.get("folder") else folder
        server = serve(folder) if node.get("serve") == "openai" else None
        built = registry.target("backend", name)(folder, **node.get("settings", {}),
                                                 **({"base_url": server.url} if server else {}))
        try:
            yield built
        finally:
            built.close()
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


def prompts(backend: Backend) -> list[tuple[int, ...]]:
    """Three prompts of different lengths, rendered by the backend's own tokenizer."""
    texts = ["Is the sky blue?", "Name a prime number larger than ten, please.", "Yes or no: does ice float on water?"]
    return [tuple(backend.tokenizer.encode(t, add_special_tokens=False)) for t in texts]


def choices(backend: Backend) -> list[list[int]]:
    """Two answer choices, the first spelt by two tokens (pooled)."""
    encode = lambda text: backend.tokenizer.encode(text, add_special_tokens=False)[0]  # noqa: E731
    return [[encode(" Yes"), encode("Yes")], [encode(" No")]]


def test_choice_rows_are_distributions_over_the_choices_in_their_order(backend, subject):
    if not backend.capabilities.scores:
        pytest.skip("no scores (test_a_missing_capability_is_one_audit_error covers it)")
    probs = backend.choice_probs(prompts(backend), choices(backend))
    assert probs.shape == (3, 2) and probs.dtype == np.float64 and (probs >= 0).all()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-9)
    swapped = backend.choice_probs(prompts(backend), choices(backend)[::-1])
    np.testing.assert_allclose(swapped, probs[:, ::-1], atol=subject.tolerance)


def test_results_come_back_in_request_order(backend, subject):
    requests = [GenerationRequest(p, 6) for p in prompts(backend)]
    forward, backward = backend.generate(requests), backend.generate(requests[::-1])
    assert [c.token_ids for c in forward] == [c.token_ids for c in backward[::-1]]
    alone = [backend.generate([r])[0] for r in requests]
    assert [c.token_ids for c in alone] == [c.token_ids for c in forward]
    if backend.capabilities.scores:
        batched = backend.choice_probs(prompts(backend), choices(backend))
        singles = np.vstack([backend.choice_probs([p], choices(backend)) for p in prompts(backend)])
        np.testing.assert_allclose(batched, singles, atol=subject.tolerance)


def test_a_completion_is_cut_at_a_stop_id_or_its_budget(backend):
    for completion in backend.generate([GenerationRequest(p, 5) for p in prompts(backend)]):
        assert completion.finish_reason in ("stop", "length") and len(completion.token_ids) <= 5
        assert completion.finish_reason == "stop" or len(completion.token_ids) == 5
        assert completion.text == backend.tokenizer.decode(list(completion.token_ids), skip_special_tokens=False)
        assert completion.key == ""  # keys are the client's to set


def test_sampled_requests_with_the_same_seed_repeat(backend):
    first = GenerationRequest(prompts(backend)[0], 8, temperature=0.9, top_p=0.95, seed=7)
    again = backend.generate([first])[0]
    batched = backend.generate([GenerationRequest(p, 8, temperature=0.9, top_p=0.95, seed=3) for p in prompts(backend)]
                               + [first])[-1]
    assert backend.generate([first])[0].token_ids == again.token_ids == batched.token_ids


def test_depth_reads_equal_the_refed_prefixes(backend, subject):
    if not backend.capabilities.depth_reads:
        pytest.skip("no depth reads")
    prompt, trace, suffix = prompts(backend)
    request = DepthRequest(prompt, trace, suffix[:3], cuts=(0, 2, 5, len(trace)))
    (depth,) = backend.depth_choice_probs([request], choices(backend))
    refed = backend.choice_probs([prompt + trace[:cut] + suffix[:3] for cut in request.cuts], choices(backend))
    assert depth.shape == (4, 2)
    np.testing.assert_allclose(depth, refed, atol=subject.tolerance)


def calls(backend: Backend) -> dict[str, Callable]:
    """One minimal call per capability a probe may need, through `target` (the backend or its client)."""
    ids = prompts(backend)[0]
    blocks = (Block(ids), Block(ids[:2], "A", "private"), Block(ids[:3], "B", "public"))
    return {"scores": lambda target: target.choice_probs([ids], choices(backend)),
            "depth_reads": lambda target: target.depth_choice_probs([DepthRequest(ids, ids, (), (1,))],
                                                                    choices(backend)),
            "target_nll": lambda target: target.target_nll([NLLRequest(blocks, (2,))]),
            "attention_graphs": lambda target: target.generate([GraphGenerationRequest(blocks, ((), (0,), (0,)), 2)])}


def test_a_missing_capability_is_one_audit_error(backend, tmp_path):
    lacking = [c for c in NEEDABLE if not backend.capabilities.has(c)]
    client = CachingClient(backend, Store(tmp_path / "store.sqlite"))
    for capability in lacking:
        for target in (backend, client):
            with pytest.raises(AuditError, match=f"backend={backend.name} cannot .* \\(capability '{capability}'\\)"):
                calls(backend)[capability](target)
    assert client.model_calls == 0 and Store(tmp_path / "store.sqlite").count() == 0


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


def test_fingerprints_of_different_backends_never_coincide():
    fingerprints = {}
    for subject in SUBJECTS:
        if not subject.runs_here():
            continue
        with subject.build(tiny_qwen3_dir()) as built:
            fingerprints[built.name] = built.fingerprint
    assert len(set(fingerprints.values())) == len(fingerprints) >= 3, fingerprints
