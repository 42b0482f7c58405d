"""The HF backend on real models: batching never changes results; choice probabilities are a softmax."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import SMOLLM2
from fairaudit.backends import GenerationRequest
from fairaudit.models.locate import embedded_model_dir, tiny_qwen3_dir
from fairaudit.prompts.yesno import choice_token_ids

PROMPTS = ["Is the sky blue? Answer Yes or No.", "Short?", "A considerably longer question about income " * 4]


@pytest.fixture(scope="module", params=["tiny_qwen3", SMOLLM2])
def backend(request):
    from fairaudit.backends.hf import HFBackend

    model_dir = tiny_qwen3_dir() if request.param == "tiny_qwen3" else embedded_model_dir()
    return HFBackend(model_dir, batch_size=3)


def prompt_ids(backend, text):
    chat = backend.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
    return tuple(backend.tokenizer.encode(chat, add_special_tokens=False))


@pytest.mark.slow
def test_batched_generation_equals_one_by_one(backend):
    reqs = [GenerationRequest(prompt_ids(backend, t), max_new_tokens=6) for t in PROMPTS]
    batched = backend.generate(reqs)
    assert batched == [backend.generate([r])[0] for r in reqs]
    for completion in batched:
        assert len(completion.token_ids) <= 6 and completion.finish_reason in {"stop", "length"}
        assert completion.finish_reason == "stop" or len(completion.token_ids) == 6


def test_per_request_budget_is_honoured_within_a_batch(backend):
    reqs = [GenerationRequest(prompt_ids(backend, PROMPTS[0]), max_new_tokens=n) for n in (2, 5)]
    short, long = backend.generate(reqs)
    assert len(short.token_ids) <= 2 and short.token_ids == long.token_ids[: len(short.token_ids)]


@pytest.mark.slow
def test_sampled_generation_is_fixed_by_its_seed_whatever_the_batch(backend):
    reqs = [GenerationRequest(prompt_ids(backend, t), max_new_tokens=8, temperature=0.7, top_p=0.95, seed=s)
            for s, t in enumerate(PROMPTS)]
    batched = backend.generate(reqs)
    assert batched == [backend.generate([r])[0] for r in reqs]
    reseeded = backend.generate([GenerationRequest(reqs[0].prompt_ids, 8, 0.7, 0.95, seed=99) for _ in range(4)])
    assert len({c.token_ids for c in reseeded}) == 1


def test_nucleus_probs_keep_the_smallest_set_reaching_top_p():
    import torch

    from fairaudit.backends.tensors import nucleus_probs

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.9, 0.05, 0.03, 0.02]]))
    probs = nucleus_probs(logits, torch.tensor([1.0, 1.0]), torch.tensor([0.8, 0.5]))
    np.testing.assert_allclose(probs.numpy(), [[0.625, 0.375, 0, 0], [1.0, 0, 0, 0]], atol=1e-6)
    hotter = nucleus_probs(logits, torch.tensor([2.0, 2.0]), torch.tensor([1.0, 1.0]))
    np.testing.assert_allclose(hotter[0].numpy(),
                               np.sqrt([0.5, 0.3, 0.15, 0.05]) / np.sqrt([0.5, 0.3, 0.15, 0.05]).sum(), atol=1e-6)


def test_choice_probs_batched_equal_single_and_sum_to_one(backend):
    prefixes = [prompt_ids(backend, t) for t in PROMPTS]
    choices = choice_token_ids(backend.tokenizer)
    batched = backend.choice_probs(prefixes, choices)
    single = np.vstack([backend.choice_probs([p], choices) for p in prefixes])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    np.testing.assert_allclose(batched.sum(axis=1), 1.0)


def test_choice_probs_equal_a_hand_softmax_over_the_yes_and_no_logits(backend):
    """single (the default, paper 000 §3.3): softmax over the two token logits; pooled: over logsumexps."""
    import torch

    prefix = prompt_ids(backend, PROMPTS[0])
    with torch.inference_mode():
        logits = backend.model(torch.tensor([prefix])).logits[0, -1].double()
    (yes,), (no,) = choice_token_ids(backend.tokenizer)
    expected = torch.softmax(logits[[yes, no]], 0).numpy()
    np.testing.assert_allclose(backend.choice_probs([prefix], [[yes], [no]])[0], expected, atol=1e-5)
    yes, no = choice_token_ids(backend.tokenizer, reading="pooled")
    pooled = torch.stack([torch.logsumexp(logits[yes], 0), torch.logsumexp(logits[no], 0)])
    np.testing.assert_allclose(backend.choice_probs([prefix], [yes, no])[0], torch.softmax(pooled, 0).numpy(),
                               atol=1e-5)


@pytest.mark.slow
def test_fingerprint_names_weights_and_numerics(backend):
    from fairaudit.backends.hf import HFBackend

    assert backend.fingerprint.endswith("/hf-1/float32/cpu")
    assert HFBackend(backend.model_dir, batch_size=1).fingerprint == backend.fingerprint


@pytest.mark.slow
def test_a_model_loads_once_and_only_one_is_held():
    from fairaudit.backends import hf
    from fairaudit.backends.hf import HFBackend

    first = HFBackend(tiny_qwen3_dir(), batch_size=1)
    assert first.model is HFBackend(tiny_qwen3_dir(), batch_size=2).model  # reused across jobs
    other = HFBackend(embedded_model_dir(), batch_size=1).model
    assert list(hf._LOADED.values()) == [other]


@pytest.mark.slow
def test_padding_share_counts_the_positions_a_batch_computes_for_no_token():
    from fairaudit.backends.hf import HFBackend

    backend = HFBackend(tiny_qwen3_dir(), batch_size=2)
    yes_no = [[backend.tokenizer.encode(" Yes")[0]], [backend.tokenizer.encode(" No")[0]]]
    backend.choice_probs([[1, 2, 3], [1, 2, 3, 4, 5], [7]], yes_no)  # batches by length: (5, 3), (1)
    assert backend.metrics() == pytest.approx({"padding_share_choice_reads": 1 - 9 / 11})  # 2 x 5 + 1 x 1 computed
    reqs = [GenerationRequest((1, 2, 3), max_new_tokens=4), GenerationRequest((1, 2, 3, 4, 5), max_new_tokens=2)]
    done = backend.generate(reqs)
    assert backend.metrics()["padding_share_prompt_prefill"] == pytest.approx(1 - 8 / 10)
    wrote = [len(c.token_ids) + (c.finish_reason == "stop") for c in done]  # the rows decode until the longest stops
    assert backend.metrics()["padding_share_generation"] == pytest.approx(1 - sum(wrote) / (2 * max(wrote)))
