"""The vllm backend against the hf backend on SmolLM2 in fp32: the default audit's generations and
P(Yes), and depth reads served from the prefix cache against the re-fed prefixes. One engine for the module."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from fairaudit.analysis.cdpg import segment_cuts
from fairaudit.backends import GenerationRequest
from fairaudit.backends.hf import HFBackend
from fairaudit.backends.vllm import VLLMBackend, free_engine
from fairaudit.probes import AuditContext
from fairaudit.probes.decisions import answer_choices, answer_parts, decide, encode
from fairaudit.prompts.yesno import Arm
from fairaudit.store.client import CachingClient
from fairaudit.store.results import Store

P_YES_ATOL = 2e-3   # the bound between backends
DEPTH_ATOL = 1e-4   # a depth read served from the prefix cache vs the same prefix re-fed cold
NEAR_TIE = 1e-3     # nats between hf's top two tokens where greedy decoding may split across kernels
DEPTH_TRACES, DEPTH_K = 6, 5


@pytest.fixture(scope="module")
def vllm_backend(default_audit):
    from fairaudit.models.locate import embedded_model_dir

    # 32-token blocks: the prefix cache shares more of each read
    backend = VLLMBackend(embedded_model_dir(), "float32", batch_size=40, max_model_len=2048, enforce_eager=True,
                          kv_cache_space_gib=1, block_size=32)
    yield backend
    free_engine()


@pytest.fixture(scope="module")
def hf_backend():
    from fairaudit.models.locate import embedded_model_dir

    return HFBackend(embedded_model_dir(), "float32", batch_size=8)


def audit_records(backend, audit, store_path):
    """Records of both arms of the default audit, and the store-wrapped context that made them."""
    spec, dataset, arms = audit
    ctx = AuditContext(CachingClient(backend, Store(store_path), chunk_size=80), backend.tokenizer, spec, dataset,
                       arms[0])
    pairs = dataset.pairs()
    return ctx, {arm.name: decide(ctx, pairs, arm) for arm in arms}


@pytest.fixture(scope="module")
def both(default_audit, vllm_backend, hf_backend, tmp_path_factory):
    folder = tmp_path_factory.mktemp("agreement")
    return {name: audit_records(b, default_audit, folder / f"{name}.sqlite")
            for name, b in (("hf", hf_backend), ("vllm", vllm_backend))}


def completions(ctx, records, arm: Arm):
    """The stored completions behind each record (read back from the store, no model call)."""
    calls = ctx.client.model_calls
    requests = [GenerationRequest(encode(ctx.tokenizer, p), arm.max_new_tokens) for p in records["prompt"]]
    out = ctx.client.generate(requests)
    assert ctx.client.model_calls == calls
    return requests, out


def next_choice_logp(logp: torch.Tensor, completion, j: int, stop_ids: set[int]) -> float:
    """Log-probability, under hf, of what a completion did at new position j: its token there, or stopping."""
    if j < len(completion.token_ids):
        return float(logp[completion.token_ids[j]])
    assert completion.finish_reason == "stop"
    return float(torch.logsumexp(logp[sorted(stop_ids)], 0))


def test_greedy_generations_are_token_identical_or_split_at_a_near_tie(both, default_audit, hf_backend):
    identical, splits = 0, []
    (hf_ctx, hf_records), (vllm_ctx, vllm_records) = both["hf"], both["vllm"]
    for arm in default_audit[2]:
        requests, hf_out = completions(hf_ctx, hf_records[arm.name], arm)
        _, vllm_out = completions(vllm_ctx, vllm_records[arm.name], arm)
        for request, a, b in zip(requests, hf_out, vllm_out):
            if (a.token_ids, a.finish_reason) == (b.token_ids, b.finish_reason):  # their store keys differ
                identical += 1
                continue
            j = next(i for i, (x, y) in enumerate(zip(a.token_ids + (None,), b.token_ids + (None,))) if x != y)
            with torch.inference_mode():
                logits = hf_backend.model(torch.tensor([request.prompt_ids + a.token_ids[:j]])).logits[0, -1]
            logp = torch.log_softmax(logits.double(), -1)
            splits.append((arm.name, j, [next_choice_logp(logp, c, j, hf_backend.stop_ids) for c in (a, b)]))
    print(f"\n{identical} of 80 greedy generations token-identical; splits (arm, new-token position, hf log-probs "
          f"of hf's and vllm's choice there): {splits}")
    assert identical + len(splits) == 80
    for _, _, (hf_pick, vllm_pick) in splits:  # greedy under hf, so hf_pick >= vllm_pick: a near-tie only
        assert hf_pick - vllm_pick < NEAR_TIE, splits


def test_p_yes_of_every_record_within_2e_3_of_hf(both, default_audit):
    (hf_ctx, hf_records), (vllm_ctx, vllm_records) = both["hf"], both["vllm"]
    worst = 0.0
    for arm in default_audit[2]:
        hf, vl = hf_records[arm.name], vllm_records[arm.name]
        same = (hf["text"] == vl["text"]).to_numpy()
        np.testing.assert_allclose(vl["p_yes"][same], hf["p_yes"][same], atol=P_YES_ATOL)
        # every record, split ones included: vLLM reading hf's exact answer prefixes
        parts = [answer_parts(hf_ctx, p, t, arm) for p, t in zip(hf["prompt"], hf["trace"])]
        prefixes = [x.prompt_ids + x.trace_ids + x.suffix_ids for x in parts]
        p_yes = vllm_ctx.client.choice_probs(prefixes, answer_choices(vllm_ctx))[:, 0]
        np.testing.assert_allclose(p_yes, hf["p_yes"], atol=P_YES_ATOL)
        worst = max(worst, float(np.abs(p_yes - hf["p_yes"]).max()))
    print(f"\nlargest |P(Yes) vllm - hf| over 80 records: {worst:.2e}")


def test_depth_reads_from_the_prefix_cache_equal_cold_re_feeds(both, vllm_backend, hf_backend):
    vllm_ctx, records = both["vllm"]
    think = records["think"]
    traces = think[think["trace_tokens"] >= DEPTH_K].head(DEPTH_TRACES)
    assert len(traces) == DEPTH_TRACES
    arm = Arm("think", True, 0)
    parts = [answer_parts(vllm_ctx, p, t, arm) for p, t in zip(traces["prompt"], traces["trace"])]
    requests = [replace(r, cuts=tuple(segment_cuts(len(r.trace_ids), DEPTH_K))) for r in parts]
    choices = answer_choices(vllm_ctx)
    assert vllm_backend.engine.llm_engine.vllm_config.cache_config.block_size == 32
    before = dict(vllm_backend.prefix_cache)
    depth = vllm_backend.depth_choice_probs(requests, choices)
    assert vllm_backend.prefix_cache["hits"] > before["hits"]  # the shared prompt + trace came from the cache
    worst = 0.0
    for request, probs in zip(requests, depth):
        assert probs.shape == (DEPTH_K, 2)
        for cut, row in zip(request.cuts, probs):
            vllm_backend.engine.reset_prefix_cache()
            cold = vllm_backend.choice_probs([request.prompt_ids + request.trace_ids[:cut] + request.suffix_ids],
                                             choices)[0]
            np.testing.assert_allclose(row, cold, atol=DEPTH_ATOL)
            worst = max(worst, float(np.abs(row - cold).max()))
    for ours, theirs in zip(depth, hf_backend.depth_choice_probs(requests, choices)):
        np.testing.assert_allclose(ours, theirs, atol=P_YES_ATOL)
    print(f"\nlargest |depth read - cold re-feed| over {DEPTH_TRACES * DEPTH_K} reads: {worst:.2e}")
