"""The llamacpp backend on the embedded SmolLM2 GGUF (Q4_1, as it ships) against hf on the same file dequantised:
the default audit's generations and P(Yes), depth reads from the reused KV cache against cold re-feeds, and why
role-visibility graphs are not offered (llama_decode refuses a sequence whose positions have a hole)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from fairaudit.analysis.cdpg import segment_cuts
from fairaudit.backends import GenerationRequest
from fairaudit.backends.gguf import tiny_qwen3_gguf_dir
from fairaudit.backends.hf import HFBackend
from fairaudit.backends.llamacpp import LlamaCppBackend, free_engine
from fairaudit.models.files import ModelFiles
from fairaudit.models.locate import EMBEDDED_SMOLLM2, embedded_model_dir
from fairaudit.probes import AuditContext
from fairaudit.probes.decisions import answer_choices, answer_parts, decide, encode
from fairaudit.prompts.yesno import Arm
from fairaudit.store.client import CachingClient
from fairaudit.store.results import Store

pytestmark = pytest.mark.llamacpp
IDENTICAL_SHARE = 0.75  # the targets: the engines differ in arithmetic (quantised dot products)
MEAN_P_YES, DEPTH_ATOL = 0.02, 1e-5
DEPTH_TRACES, DEPTH_K = 6, 5


def smollm2_gguf():
    """The embedded SmolLM2's GGUF folder, as backend=llamacpp finds it."""
    return LlamaCppBackend.resolve_model(ModelFiles(EMBEDDED_SMOLLM2), {})


@pytest.fixture(scope="module")
def llamacpp_backend():
    backend = LlamaCppBackend(smollm2_gguf(), n_ctx=8192)
    yield backend
    free_engine()


def audit_records(backend, audit, store_path):
    spec, dataset, arms = audit
    ctx = AuditContext(CachingClient(backend, Store(store_path), chunk_size=8), backend.tokenizer, spec, dataset,
                       arms[0])
    return ctx, {arm.name: decide(ctx, dataset.pairs(), arm) for arm in arms}


@pytest.fixture(scope="module")
def both(default_audit, llamacpp_backend, tmp_path_factory):
    folder = tmp_path_factory.mktemp("agreement")
    hf = HFBackend(embedded_model_dir(), "float32", batch_size=8)
    return {name: audit_records(b, default_audit, folder / f"{name}.sqlite")
            for name, b in (("hf", hf), ("llamacpp", llamacpp_backend))}


def first_split(hf_backend, request, a, b) -> tuple[int, str, str, float]:
    """Where two completions of one prompt part, the two picks there (hf's, llama.cpp's), and how far apart hf's
    log-probabilities of them are."""
    j = next(i for i, (x, y) in enumerate(zip(a.token_ids + (None,), b.token_ids + (None,))) if x != y)
    with torch.inference_mode():
        logits = hf_backend.model(torch.tensor([request.prompt_ids + a.token_ids[:j]])).logits[0, -1].double()
    logp = torch.log_softmax(logits, -1)
    picks = [float(logp[c.token_ids[j]]) if j < len(c.token_ids)
             else float(torch.logsumexp(logp[sorted(hf_backend.stop_ids)], 0)) for c in (a, b)]

    def name(c):
        return repr(hf_backend.tokenizer.decode(c.token_ids[j:j + 1])) if j < len(c.token_ids) else "<stop>"

    return j, name(a), name(b), picks[0] - picks[1]


def test_the_default_audit_agrees_with_hf(both, default_audit):
    """>= 75% of the 80 greedy generations token-identical; mean |P(Yes) difference| <= 0.02 over the records."""
    (hf_ctx, hf_records), (lc_ctx, lc_records) = both["hf"], both["llamacpp"]
    identical, splits, differences, on_hf_prefixes = 0, [], [], []
    for arm in default_audit[2]:
        hf, lc = hf_records[arm.name], lc_records[arm.name]
        requests = [GenerationRequest(encode(hf_ctx.tokenizer, p), arm.max_new_tokens) for p in hf["prompt"]]
        for request, a, b in zip(requests, hf_ctx.client.generate(requests), lc_ctx.client.generate(requests)):
            if a.token_ids == b.token_ids:
                identical += 1
            else:
                splits.append((arm.name, *first_split(hf_ctx.client.backend, request, a, b)))
        differences += list(np.abs(lc["p_yes"].to_numpy() - hf["p_yes"].to_numpy()))
        # hf's exact answer prefixes
        parts = [answer_parts(hf_ctx, p, t, arm) for p, t in zip(hf["prompt"], hf["trace"])]
        p_yes = lc_ctx.client.choice_probs([x.prompt_ids + x.trace_ids + x.suffix_ids for x in parts],
                                           answer_choices(lc_ctx))
        on_hf_prefixes += list(np.abs(p_yes[:, 0] - hf["p_yes"].to_numpy()))
    print(f"\n{identical} of 80 greedy generations token-identical; near-ties that split them "
          f"(arm, new-token position, hf's pick / llama.cpp's, hf's log-prob margin between them): "
          f"{[(arm, j, f'{x} / {y}', round(gap, 4)) for arm, j, x, y, gap in splits]}")
    print(f"|P(Yes) llamacpp - hf| over the 80 records: mean {np.mean(differences):.4f}, "
          f"max {np.max(differences):.4f}; "
          f"on hf's exact answer prefixes: mean {np.mean(on_hf_prefixes):.4f}, max {np.max(on_hf_prefixes):.4f}")
    assert len(differences) == 80 and identical >= IDENTICAL_SHARE * 80
    assert np.mean(differences) <= MEAN_P_YES and np.mean(on_hf_prefixes) <= MEAN_P_YES


def test_depth_reads_from_the_reused_cache_equal_cold_re_feeds_and_feed_each_trace_once(both, llamacpp_backend):
    lc_ctx, records = both["llamacpp"]
    think = records["think"]
    traces = think[think["trace_tokens"] >= DEPTH_K].head(DEPTH_TRACES)
    assert len(traces) == DEPTH_TRACES
    parts = [answer_parts(lc_ctx, p, t, Arm("think", True, 0)) for p, t in zip(traces["prompt"], traces["trace"])]
    requests = [replace(r, cuts=tuple(segment_cuts(len(r.trace_ids), DEPTH_K))) for r in parts]
    choices, engine = answer_choices(lc_ctx), llamacpp_backend.engine
    before = engine.counts["prefill_tokens"]
    depth = llamacpp_backend.depth_choice_probs(requests, choices)
    fed = engine.counts["prefill_tokens"] - before
    assert fed <= sum(len(r.prompt_ids) + len(r.trace_ids) + len(r.cuts) * len(r.suffix_ids) for r in requests)
    worst = 0.0
    for request, probs in zip(requests, depth):
        assert probs.shape == (DEPTH_K, 2)
        for cut, row in zip(request.cuts, probs):
            engine.clear()
            cold = llamacpp_backend.choice_probs([request.prompt_ids + request.trace_ids[:cut] + request.suffix_ids],
                                                 choices)[0]
            worst = max(worst, float(np.abs(row - cold).max()))
    print(f"\nlargest |depth read - cold re-feed| over {DEPTH_TRACES * DEPTH_K} reads: {worst:.2e}; tokens fed: {fed}")
    assert worst <= DEPTH_ATOL


def test_a_role_visibility_graph_cannot_keep_full_sequence_positions_in_llama_cpp():
    """Why `attention_graphs` is absent. A query of sequence s sees every cell holding s at a position <= its own,
    so membership could express a graph; but a block hidden from a later one leaves a hole in the later block's
    sequence, and llama_decode refuses a sequence whose positions are not continuous (code -1)."""
    backend = LlamaCppBackend(tiny_qwen3_gguf_dir(), n_ctx=256, n_seq_max=4, n_threads=1)
    engine = backend.engine
    hidden, seen = (0, 1, 2, 3), (4, 5, 6)  # block 1 (positions 4-6) hidden from block 2 (its own sequence, 1)
    items = [(100 + p, p, (0, 1) if p in hidden else (0,), False) for p in hidden + seen]
    items += [(200 + p, p, (1,), p == 9) for p in (7, 8, 9)]
    with pytest.raises(RuntimeError, match="code -1"):
        engine._decode(items)
    engine.clear()
    causal = [(t, p, (0, 1) if p < 7 else (1,), p == 9) for t, p, _, _ in items]  # the same tokens, nothing hidden
    assert engine._decode(causal)[0].shape == (engine.n_vocab,)
    free_engine()


def test_reads_stay_exact_when_sequences_are_evicted_and_the_cache_fills():
    """A token landing in a freed cell ahead of its context moved a logit by up to 0.46 (flash attention sums cells in
    cache order): an evicted sequence's cells stay (graveyard), and a call that would not fit empties the cache
    first."""
    backend = LlamaCppBackend(smollm2_gguf(), n_ctx=512, n_seq_max=3, n_threads=1)
    engine, text = backend.engine, backend.tokenizer.encode
    long = text("The quick brown fox jumps over the lazy dog. " * 30)[:300]
    short = text("Is the income above fifty thousand? " * 8)[:100]
    extended = short + text(" The answer is")
    engine.feed([long])
    engine.feed([short])
    _, (evicting,) = engine.feed([extended])  # the long sequence's id is freed; its 300 cells are not
    assert len(engine.residents) == 2 and engine.used == 300 + len(extended)
    # 360 new tokens beside the 360 cells in use: more than 512, so emptied first
    _, (filling,) = engine.feed([long + extended])
    assert engine.used == len(long + extended)
    engine.clear()
    _, (cold,) = engine.feed([extended])
    engine.clear()
    _, (cold_long,) = engine.feed([long + extended])
    assert np.array_equal(evicting, cold) and np.array_equal(filling, cold_long)
    free_engine()
