"""Packed depth reads (one pass, tree mask) against the naive re-feed, on both real architectures."""

from types import SimpleNamespace

import numpy as np
import pytest

from conftest import SMOLLM2
from fairaudit.analysis.cdpg import segment_cuts
from fairaudit.backends import DepthRequest
from fairaudit.models.locate import embedded_model_dir, tiny_qwen3_dir

K = 5
PROMPT = (
    "Profile: age 38, works in sales, 40 hours a week. "
    "Question: does this person earn more than $50K? Answer Yes or No."
)
TRACES = [
    "The person works full time in sales, which often pays well, but age and hours alone do not settle it; "
    "the education level is missing, so I should lean on occupation and weekly hours.",
    "Sales at 40 hours is a typical salary.",
    "Hmm.",  # fewer tokens than K: cuts repeat
]
SUFFIX = "</think>\nAnswer:"


@pytest.fixture(scope="module", params=[SMOLLM2, "tiny_qwen3"])
def model_dir(request):
    return {"smollm2": embedded_model_dir, "tiny_qwen3": tiny_qwen3_dir}[request.param]()


def encode(tokenizer, text):
    return tuple(tokenizer.encode(text, add_special_tokens=False))


def yes_no(tokenizer):
    return [list(encode(tokenizer, word) + encode(tokenizer, " " + word)) for word in ("Yes", "No")]


def depth_requests(tokenizer):
    prompt, suffix = encode(tokenizer, PROMPT), encode(tokenizer, SUFFIX)
    traces = [encode(tokenizer, text) for text in TRACES]
    assert len(traces[2]) < K < len(traces[0])
    return [DepthRequest(prompt, trace, suffix, tuple(segment_cuts(len(trace), K))) for trace in traces]


@pytest.mark.slow
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_packed_equals_naive_for_traces_of_different_lengths_in_one_batch(model_dir, attn_implementation):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fairaudit.backends.packing import (
        naive_depth_probs,
        packed_depth_probs,
    )

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=attn_implementation).eval()
    requests, choices = depth_requests(tokenizer), yes_no(tokenizer)
    naive = naive_depth_probs(model, requests, choices, pad_id=tokenizer.pad_token_id or 0)
    packed = packed_depth_probs(model, requests, choices, pad_id=tokenizer.pad_token_id or 0)
    assert [p.shape for p in packed] == [(K, 2)] * 3
    for n, p in zip(naive, packed):
        np.testing.assert_allclose(p, n, atol=1e-4, rtol=0)
        np.testing.assert_allclose(p.sum(axis=1), 1.0)
    # the short trace repeats cuts, and equal cuts read the same answer
    cuts = requests[2].cuts
    for i in range(1, K):
        if cuts[i] == cuts[i - 1]:
            np.testing.assert_allclose(packed[2][i], packed[2][i - 1], atol=1e-5)


@pytest.mark.slow
def test_naive_reads_equal_one_unpadded_forward_per_prefix():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fairaudit.backends.packing import (
        naive_depth_probs,
    )
    from fairaudit.backends.tensors import pooled_choice_probs

    model_dir = tiny_qwen3_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    requests, choices = depth_requests(tokenizer), yes_no(tokenizer)
    naive = naive_depth_probs(model, requests, choices, pad_id=tokenizer.pad_token_id, batch_size=4)
    for request, probs in zip(requests, naive):
        for cut, row in zip(request.cuts, probs):
            ids = torch.tensor([request.prompt_ids + request.trace_ids[:cut] + request.suffix_ids])
            with torch.inference_mode():
                alone = pooled_choice_probs(model(input_ids=ids).logits[:, -1], choices)[0]
            np.testing.assert_allclose(row, alone, atol=1e-5)


@pytest.mark.slow
def test_token_budget_splits_batches_without_changing_reads():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fairaudit.backends.packing import (
        packed_depth_probs,
    )

    model_dir = tiny_qwen3_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    requests, choices = depth_requests(tokenizer), yes_no(tokenizer)
    one_batch = packed_depth_probs(model, requests, choices, pad_id=tokenizer.pad_token_id)
    one_per_batch = packed_depth_probs(model, requests, choices, pad_id=tokenizer.pad_token_id, token_budget=1)
    for a, b in zip(one_batch, one_per_batch):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_requests_without_cuts_read_nothing():
    from transformers import AutoModelForCausalLM

    from fairaudit.backends.packing import (
        naive_depth_probs,
        packed_depth_probs,
    )

    model_dir = tiny_qwen3_dir()
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    requests = [DepthRequest((5, 6, 7), (8, 9), (10,), ()), DepthRequest((5, 6), (8, 9, 11), (10,), (1, 3))]
    packed = packed_depth_probs(model, requests, [[1], [2]])
    naive = naive_depth_probs(model, requests, [[1], [2]])
    assert packed[0].shape == naive[0].shape == (0, 2)
    np.testing.assert_allclose(packed[1], naive[1], atol=1e-5)


def test_tree_mask_layout_by_hand():
    # prompt (p0 p1), trace (t0 t1 t2), suffix (s0 s1), cuts (1, 3)
    import torch

    from fairaudit.backends.packing import (
        pack_request,
        tree_mask,
    )

    row = pack_request(DepthRequest((100, 101), (200, 201, 202), (300, 301), (1, 3)))
    assert row.ids == [100, 101, 200, 201, 202, 300, 301, 300, 301]
    assert row.positions == [0, 1, 2, 3, 4, 3, 4, 5, 6]  # copy k starts at len(prompt) + cut_k
    assert row.reads == [6, 8]
    expected = torch.tensor([
        # p0 p1 t0 t1 t2 a0 a1 b0 b1
        [1, 0, 0, 0, 0, 0, 0, 0, 0],  # p0
        [1, 1, 0, 0, 0, 0, 0, 0, 0],  # p1
        [1, 1, 1, 0, 0, 0, 0, 0, 0],  # t0
        [1, 1, 1, 1, 0, 0, 0, 0, 0],  # t1
        [1, 1, 1, 1, 1, 0, 0, 0, 0],  # t2
        [1, 1, 1, 0, 0, 1, 0, 0, 0],  # copy a (cut 1) sees p0 p1 t0
        [1, 1, 1, 0, 0, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 1, 0],  # copy b (cut 3) sees the whole trace
        [1, 1, 1, 1, 1, 0, 0, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(tree_mask(row), expected)


def test_empty_suffix_reads_the_last_prefix_token_each_copy_sees():
    from fairaudit.backends.packing import (
        pack_request,
    )

    row = pack_request(DepthRequest((100, 101), (200, 201, 202), (), (0, 2, 3)))
    assert row.ids == [100, 101, 200, 201, 202] and row.reads == [1, 3, 4]


def test_cuts_outside_the_trace_are_rejected():
    from fairaudit.backends.packing import (
        pack_request,
    )

    with pytest.raises(ValueError, match=r"cuts \[4\] fall outside the trace of 3 tokens"):
        pack_request(DepthRequest((1,), (2, 3, 4), (5,), (1, 4)))


def test_attention_that_ignores_a_custom_mask_is_refused():
    from fairaudit.backends.packing import (
        check_packable,
    )

    def model_with(**config):
        return SimpleNamespace(config=SimpleNamespace(**config))

    with pytest.raises(ValueError, match="attn_implementation in \\('eager', 'sdpa'\\)"):
        check_packable(model_with(_attn_implementation="flash_attention_2"))
    with pytest.raises(ValueError, match="full attention in every layer"):
        check_packable(model_with(_attn_implementation="sdpa", layer_types=["full_attention", "sliding_attention"]))
    with pytest.raises(ValueError, match="sliding_window=4096"):
        check_packable(model_with(_attn_implementation="sdpa", sliding_window=4096))  # mistral-style: no layer_types
    check_packable(model_with(_attn_implementation="eager", layer_types=["full_attention"], sliding_window=None))
