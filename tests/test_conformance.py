"""Every backend holds to the one contract of `fairaudit.backends` (real model forward passes where it has one).

A backend joins the suite with one `Subject` in SUBJECTS: its name, a context manager that yields it on a
model folder, and the tolerance of its reads. Every backend the registry ships (conf/backend/) needs one;
test-only backends (`scripted`) may have one too. The module whose BACKEND_VERSION names the backend's
version is the built backend's own. An entry whose backend runs on an optional engine (`Backend.requires`)
carries a mark of its name and is skipped where the engine is absent, to run where it is (`make test-vllm`,
`make test-llamacpp`). llama.cpp reads GGUF files only: its entry writes the folder it is given as a float32
GGUF (once per fingerprint), so it runs the same tiny model as the others.
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

from fairaudit.backends import (
    NEEDABLE,
    Backend,
    Block,
    DepthRequest,
    GenerationRequest,
    GraphGenerationRequest,
    NLLRequest,
)
from fairaudit.client import CachingClient
from fairaudit.errors import AuditError
from fairaudit.models import embedded_model_dir, tiny_qwen3_dir
from fairaudit.registry import backend_classes, names
from fairaudit.store import Store
from model_server import ModelServer
from scripted import ScriptedModel

Factory = Callable[[Path], contextlib.AbstractContextManager[Backend]]


@dataclass(frozen=True)
class Subject:
    """One backend in the suite.

    name: its `backend=` choice (the backend's `name`); factory: a context manager yielding it built on a model
    folder; tolerance: how far its batched reads may lie from the same reads sent alone, and its depth reads
    from the re-fed prefixes (0 for exact arithmetic; a float32 model's reordered sums need about 1e-6).
    """

    name: str = ""
    factory: Factory | None = None
    tolerance: float | None = None

    def __post_init__(self):
        omitted = [field for field in ("name", "factory", "tolerance") if getattr(self, field) in (None, "")]
        if omitted:
            raise TypeError(f"conformance entry {self.name or '(unnamed)'!r} omits {' and '.join(omitted)}: a Subject "
                            "takes name (its backend= choice), factory (a context manager yielding it on a model "
                            "folder) and tolerance (batched vs alone, depth vs re-fed prefix)")

    @property
    def backend_class(self) -> type[Backend] | None:
        """The registry's class of this name; None for a test-only backend."""
        return backend_classes().get(self.name)

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


@contextlib.contextmanager
def hf(model_dir: Path) -> Iterator[Backend]:
    from fairaudit.backends.hf import HFBackend

    yield HFBackend(model_dir, device="cpu", batch_size=4)


@contextlib.contextmanager
def openai(model_dir: Path) -> Iterator[Backend]:
    """backend=openai against a loopback server that answers from the hf backend on the same folder."""
    from fairaudit.backends.hf import HFBackend
    from fairaudit.backends.openai import OpenAIBackend

    server = ModelServer(HFBackend(model_dir, device="cpu", batch_size=4))
    try:
        yield OpenAIBackend(model_dir, base_url=server.url, max_concurrency=4)
    finally:
        server.stop()


@contextlib.contextmanager
def vllm(model_dir: Path) -> Iterator[Backend]:
    """vLLM's CPU attention has no kernel for the tiny Qwen3's head_dim of 16 ("Unsupported CPU attention
    configuration"): where the suite runs on that model, this entry runs on the embedded SmolLM2 (head_dim
    64); a copied folder (the fingerprint test, which starts no engine) is used as given."""
    from fairaudit.backends.vllm import VLLMBackend, free_engine

    folder = embedded_model_dir() if model_dir == tiny_qwen3_dir() else model_dir
    try:
        yield VLLMBackend(folder, batch_size=8, max_model_len=1024, kv_cache_space_gib=1, block_size=32)
    finally:
        free_engine()


@contextlib.contextmanager
def llamacpp(model_dir: Path) -> Iterator[Backend]:
    from fairaudit.backends.gguf import qwen3_gguf_dir
    from fairaudit.backends.llamacpp import LlamaCppBackend, free_engine

    try:
        yield LlamaCppBackend(qwen3_gguf_dir(model_dir), n_ctx=2048, n_seq_max=8, n_threads=1)
    finally:
        free_engine()


@contextlib.contextmanager
def scripted(model_dir: Path) -> Iterator[Backend]:
    yield ScriptedModel(model_dir)


@contextlib.contextmanager
def mock(model_dir: Path) -> Iterator[Backend]:
    from fairaudit.backends.mock import MockBackend

    yield MockBackend(model_dir, trace_tokens={"median": 40, "sigma": 0.5})


SUBJECTS = [
    Subject("hf", hf, tolerance=1e-6),
    Subject("openai", openai, tolerance=1e-6),
    Subject("scripted", scripted, tolerance=1e-12),
    Subject("mock", mock, tolerance=1e-12),
    Subject("vllm", vllm, tolerance=2e-4),
    Subject("llamacpp", llamacpp, tolerance=1e-6),
]
PARAMS = [subject.param() for subject in SUBJECTS]


def test_every_shipped_backend_has_an_entry():
    missing = sorted(set(names("backend")) - {subject.name for subject in SUBJECTS})
    assert not missing, f"backends without a conformance entry (a Subject in SUBJECTS): {missing}"


def test_an_entry_that_omits_something_says_what():
    with pytest.raises(TypeError, match="^conformance entry 'echo' omits tolerance: a Subject takes name"):
        Subject("echo", hf)
    with pytest.raises(TypeError, match="^conformance entry 'echo' omits factory and tolerance: "):
        Subject("echo")


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
