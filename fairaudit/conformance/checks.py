"""The checks of the backend contract, each a function of a built backend and its tolerance that raises an
AssertionError (or the AuditError it expected not to see) saying what broke. tests/test_conformance.py and
`fairaudit check` run the same functions."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

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
from fairaudit.store.client import CachingClient
from fairaudit.store.results import Store


def prompts(backend: Backend) -> list[tuple[int, ...]]:
    """Three prompts of different lengths, rendered by the backend's own tokenizer."""
    texts = ["Is the sky blue?", "Name a prime number larger than ten, please.", "Yes or no: does ice float on water?"]
    return [tuple(backend.tokenizer.encode(t, add_special_tokens=False)) for t in texts]


def choices(backend: Backend) -> list[list[int]]:
    """Two answer choices, the first spelt by two tokens (pooled)."""
    encode = lambda text: backend.tokenizer.encode(text, add_special_tokens=False)[0]  # noqa: E731
    return [[encode(" Yes"), encode("Yes")], [encode(" No")]]


def choice_rows_are_distributions_over_the_choices_in_their_order(backend: Backend, tolerance: float) -> None:
    if not backend.capabilities.scores:
        return
    probs = backend.choice_probs(prompts(backend), choices(backend))
    assert probs.shape == (3, 2) and probs.dtype == np.float64 and (probs >= 0).all(), probs
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-9)
    swapped = backend.choice_probs(prompts(backend), choices(backend)[::-1])
    np.testing.assert_allclose(swapped, probs[:, ::-1], atol=tolerance)


def results_come_back_in_request_order(backend: Backend, tolerance: float) -> None:
    requests = [GenerationRequest(p, 6) for p in prompts(backend)]
    forward, backward = backend.generate(requests), backend.generate(requests[::-1])
    assert [c.token_ids for c in forward] == [c.token_ids for c in backward[::-1]], "generations reordered"
    alone = [backend.generate([r])[0] for r in requests]
    assert [c.token_ids for c in alone] == [c.token_ids for c in forward], "a batched generation differs from alone"
    if backend.capabilities.scores:
        batched = backend.choice_probs(prompts(backend), choices(backend))
        singles = np.vstack([backend.choice_probs([p], choices(backend)) for p in prompts(backend)])
        np.testing.assert_allclose(batched, singles, atol=tolerance)


def a_completion_is_cut_at_a_stop_id_or_its_budget(backend: Backend, tolerance: float) -> None:
    for completion in backend.generate([GenerationRequest(p, 5) for p in prompts(backend)]):
        assert completion.finish_reason in ("stop", "length") and len(completion.token_ids) <= 5, completion
        assert completion.finish_reason == "stop" or len(completion.token_ids) == 5, completion
        assert completion.text == backend.tokenizer.decode(list(completion.token_ids), skip_special_tokens=False)
        assert completion.key == "", "keys are the client's to set"


def sampled_requests_with_the_same_seed_repeat(backend: Backend, tolerance: float) -> None:
    first = GenerationRequest(prompts(backend)[0], 8, temperature=0.9, top_p=0.95, seed=7)
    again = backend.generate([first])[0]
    batched = backend.generate([GenerationRequest(p, 8, temperature=0.9, top_p=0.95, seed=3) for p in prompts(backend)]
                               + [first])[-1]
    assert backend.generate([first])[0].token_ids == again.token_ids == batched.token_ids, "a seed did not repeat"


def depth_reads_equal_the_refed_prefixes(backend: Backend, tolerance: float) -> None:
    if not backend.capabilities.depth_reads:
        return
    prompt, trace, suffix = prompts(backend)
    request = DepthRequest(prompt, trace, suffix[:3], cuts=(0, 2, 5, len(trace)))
    (depth,) = backend.depth_choice_probs([request], choices(backend))
    refed = backend.choice_probs([prompt + trace[:cut] + suffix[:3] for cut in request.cuts], choices(backend))
    assert depth.shape == (4, 2), depth.shape
    np.testing.assert_allclose(depth, refed, atol=tolerance)


def calls(backend: Backend) -> dict[str, Callable]:
    """One minimal call per capability a probe may need, through `target` (the backend or its client)."""
    ids = prompts(backend)[0]
    blocks = (Block(ids), Block(ids[:2], "A", "private"), Block(ids[:3], "B", "public"))
    return {"scores": lambda target: target.choice_probs([ids], choices(backend)),
            "depth_reads": lambda target: target.depth_choice_probs([DepthRequest(ids, ids, (), (1,))],
                                                                    choices(backend)),
            "target_nll": lambda target: target.target_nll([NLLRequest(blocks, (2,))]),
            "attention_graphs": lambda target: target.generate([GraphGenerationRequest(blocks, ((), (0,), (0,)), 2)])}


def a_missing_capability_is_one_audit_error(backend: Backend, tolerance: float) -> None:
    lacking = [c for c in NEEDABLE if not backend.capabilities.has(c)]
    with tempfile.TemporaryDirectory(prefix="fairaudit-check-") as tmp:
        store = Path(tmp) / "store.sqlite"
        client = CachingClient(backend, Store(store))
        for capability in lacking:
            for target in (backend, client):
                try:
                    calls(backend)[capability](target)
                except AuditError as error:
                    assert f"backend={backend.name} cannot" in str(error) and f"(capability '{capability}')" in \
                        str(error), str(error)
                else:
                    raise AssertionError(f"a call needing {capability!r} was not refused")
        assert client.model_calls == 0 and Store(store).count() == 0, "a refused call reached the model or store"


CHECKS = [choice_rows_are_distributions_over_the_choices_in_their_order, results_come_back_in_request_order,
          a_completion_is_cut_at_a_stop_id_or_its_budget, sampled_requests_with_the_same_seed_repeat,
          depth_reads_equal_the_refed_prefixes, a_missing_capability_is_one_audit_error]
