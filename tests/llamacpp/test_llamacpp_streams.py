"""backend.kv_streams: one KV stream per sequence, on SmolLM2 (Q4_1) and Gemma 3 270M (Q4_K_M: the K-quant kernels
paper 001's files use). Reads that take over a resident's stream, beside full streams and after evictions, equal cold
reads of the unified engine exactly; generation is token-identical; and Gemma under llama.cpp agrees with hf on the
same file dequantised."""

from __future__ import annotations

import numpy as np
import pytest

from fairaudit.backends import GenerationRequest
from fairaudit.backends.llamacpp import LlamaCppBackend, free_engine
from fairaudit.models.files import ModelFiles

pytestmark = pytest.mark.llamacpp
MODELS = ["embedded:smollm2", "embedded:gemma3_270m_q4km"]
EXACT = 1e-5  # the unified engine's tolerance for reused reads (measured: 0.0)


def tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(100, 5000, size=n).tolist()


def engine(source: str, streams: bool, n_seq_max: int = 8, per_stream: int = 512):
    backend = LlamaCppBackend(LlamaCppBackend.resolve_model(ModelFiles(source), {}),
                              n_ctx=n_seq_max * per_stream if streams else 4096,
                              n_seq_max=n_seq_max, n_threads=1, kv_streams=streams)
    return backend.engine


def warm_reads(engine_, sequences, prompt, trace, suffix):
    """Five full sequences beside, a generation of prompt + trace (one step), then each read taking over the last."""
    for seed in range(5):
        engine_.feed([tokens(10 + seed, 300)])
    ids, _ = engine_.feed([prompt + trace])
    engine_.step(ids, [suffix[0]])
    before = dict(engine_.counts)
    warm = [engine_.feed([sequence])[1][0] for sequence in sequences]
    return warm, {k: engine_.counts[k] - before[k] for k in ("reused", "prefill_tokens")}


@pytest.fixture(scope="module", params=MODELS, ids=["smollm2-q4_1", "gemma3-q4_k_m"])
def reads(request):
    """Depth-read sequences of one trace (longest cut first): cold reads of the unified engine (emptied before
    each), and `warm_reads` on the unified engine and on the stream engine."""
    prompt, trace, suffix = tokens(0, 200), tokens(1, 120), tokens(2, 8)
    sequences = [prompt + trace[:cut] + suffix for cut in (120, 90, 60, 30, 5)]
    unified = engine(request.param, streams=False)
    cold = []
    for sequence in sequences:
        unified.clear()
        cold.append(unified.feed([sequence])[1][0])
    unified.clear()
    unified_warm, _ = warm_reads(unified, sequences, prompt, trace, suffix)
    free_engine()
    stream_warm, counts = warm_reads(engine(request.param, streams=True), sequences, prompt, trace, suffix)
    free_engine()
    return request.param, cold, unified_warm, stream_warm, counts, sequences


def largest(a, b) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def test_streams_compute_what_the_unified_cache_computes(reads):
    """The same feeds give the same logits with a stream per sequence as in one unified cache, on both files."""
    _, _, unified_warm, stream_warm, counts, sequences = reads
    assert largest(unified_warm, stream_warm) == 0.0
    # only each cut's suffix was computed (the longest cut's first suffix token was the generation's step)
    assert counts["prefill_tokens"] == len(sequences) * 8 - 1
    assert counts["reused"] == sum(map(len, sequences)) - counts["prefill_tokens"]


def test_reads_that_take_over_a_stream_equal_cold_reads_on_smollm2(reads):
    """Exact on SmolLM2 (Q4_1 and one Q8_0 tensor). On the Gemma file (Q5_0 and Q8_0 tensors: gemma-3-270m's
    width, 640, is no multiple of the 256 a K-quant block needs, so its "Q4_K_M" holds none) a logit depends on
    which tokens share its compute pass (a pass of under 8 new tokens: up to 0.9), so reused reads are not
    cold-exact there, in either cache (docs/backends.md)."""
    source, cold, _, stream_warm, _, _ = reads
    worst = largest(cold, stream_warm)
    print(f"\n{source}: largest |stream read - unified cold read| over {len(cold)} depth reads: {worst:.2e}")
    if source == "embedded:smollm2":
        assert worst <= EXACT
    else:
        assert worst > EXACT  # the pass-partition dependence docs/backends.md reports; fixed, this test must change


@pytest.mark.parametrize("source", MODELS, ids=["smollm2-q4_1", "gemma3-q4_k_m"])
def test_evicted_streams_are_freed_whole_and_reads_stay_exact(source):
    """Three streams for four sequences: the least recent is removed, and a read after the eviction is cold-exact."""
    streams = engine(source, streams=True, n_seq_max=3, per_stream=256)
    first, others = tokens(3, 200), [tokens(4 + i, 200) for i in range(3)]
    streams.feed([first])
    for sequence in others:
        streams.feed([sequence])
    assert len(streams.residents) == 3 and first not in list(streams.residents.values())
    _, (after,) = streams.feed([first + tokens(9, 10)])
    streams.clear()
    _, (cold,) = streams.feed([first + tokens(9, 10)])
    assert np.array_equal(after, cold)
    free_engine()


@pytest.mark.parametrize("source", MODELS, ids=["smollm2-q4_1", "gemma3-q4_k_m"])
def test_generation_is_token_identical_with_and_without_streams(source, default_audit):
    from fairaudit.probes import AuditContext
    from fairaudit.probes.decisions import encode, render_prompts

    spec, dataset, arms = default_audit
    outputs = {}
    for streams in (False, True):
        backend = LlamaCppBackend(LlamaCppBackend.resolve_model(ModelFiles(source), {}),
                                  n_ctx=8 * 1024 if streams else 4096, n_seq_max=8, n_threads=1, kv_streams=streams)
        ctx = AuditContext(None, backend.tokenizer, spec, dataset, arms[0])
        prompts = render_prompts(ctx, dataset.pairs().head(4), arms[0])
        requests = [GenerationRequest(encode(backend.tokenizer, p), 24) for p in prompts]
        outputs[streams] = [c.token_ids for c in backend.generate(requests)]
        free_engine()
    assert outputs[True] == outputs[False] and all(outputs[True])


def test_gemma_under_llama_cpp_agrees_with_hf_on_the_same_file(default_audit):
    """P(Yes) of the default audit's think prompts, read after the same prefixes: llama.cpp's Q4_K_M kernels against
    hf's float32 computation of the same file dequantised (only the arithmetic differs)."""
    from fairaudit.backends.hf import HFBackend
    from fairaudit.models.locate import resolve_model_dir
    from fairaudit.probes import AuditContext
    from fairaudit.probes.decisions import answer_choices, answer_parts_all, render_prompts

    spec, dataset, arms = default_audit
    spec = type(spec)(**{**spec.__dict__, "name": "gemma3_270m_q4km"})
    hf = HFBackend(resolve_model_dir("embedded:gemma3_270m_q4km"), "float32", batch_size=8)
    lc = LlamaCppBackend(LlamaCppBackend.resolve_model(ModelFiles("embedded:gemma3_270m_q4km"), {}),
                         n_ctx=4096, n_threads=1)
    ctx = AuditContext(None, hf.tokenizer, spec, dataset, arms[0])
    prompts = render_prompts(ctx, dataset.pairs().head(10), arms[0])
    parts = answer_parts_all(ctx, prompts, ["The person works long hours."] * len(prompts), arms[0])
    prefixes = [x.prompt_ids + x.trace_ids + x.suffix_ids for x in parts]
    choices = answer_choices(ctx)
    difference = np.abs(hf.choice_probs(prefixes, choices)[:, 0] - lc.choice_probs(prefixes, choices)[:, 0])
    free_engine()
    print(f"\n|P(Yes) llamacpp - hf| on Gemma 3 270M Q4_K_M over {len(prefixes)} reads: mean {difference.mean():.4f}, "
          f"max {difference.max():.4f}")
    assert difference.mean() <= 0.02
