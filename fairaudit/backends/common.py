"""Helpers every backend shares, as free functions; torch-free (numpy), so any backend may import them."""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from fairaudit.backends import Completion, DepthRequest

DTYPES = ("float32", "bfloat16", "float16")  # model.dtype names the float backends compute in


def choice_token_ids(choices: Sequence[Sequence[int]]) -> list[int]:
    """Every token id spelling any choice, once, in ascending order (the columns `pooled_softmax` reads)."""
    return sorted({t for ids in choices for t in ids})


def pooled_softmax(scores: np.ndarray, token_ids: Sequence[int], choices: Sequence[Sequence[int]]) -> np.ndarray:
    """Softmax across choices of each choice's logsumexp-pooled token scores, in float64.

    scores: (n, len(token_ids)) logits or log-probabilities of `token_ids` (columns in that order)
    at one position each; log-probabilities differ from logits by one constant per row, which
    the softmax cancels. Returns (n, len(choices)), rows summing to 1, columns in `choices` order.
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1, len(token_ids))
    column = {t: j for j, t in enumerate(token_ids)}
    pooled = np.stack([np.logaddexp.reduce(scores[:, [column[t] for t in ids]], axis=1) for ids in choices], axis=1)
    pooled -= pooled.max(axis=1, keepdims=True)
    weights = np.exp(pooled)
    return weights / weights.sum(axis=1, keepdims=True)


def stop_token_ids(model_dir: str, tokenizer) -> set[int]:
    """Ids a generation stops at: the model's generation config's EOS ids and the tokenizer's EOS.

    The generation config is what transformers attaches to a loaded model: generation_config.json,
    or one derived from config.json when the folder has none. Read without loading weights.
    """
    from transformers import AutoConfig, GenerationConfig

    try:
        ids = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:
        ids = GenerationConfig.from_model_config(AutoConfig.from_pretrained(model_dir)).eos_token_id
    stop = set(ids if isinstance(ids, list) else [ids]) if ids is not None else set()
    if tokenizer.eos_token_id is not None:
        stop.add(tokenizer.eos_token_id)
    return stop


@functools.lru_cache(maxsize=8)
def folder_tokenizer(folder: str):
    """The tokenizer of a model folder, loaded once per process (a plan builds a rehearsal backend for each job of a
    study); for callers that only encode, decode and render with it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def encode_texts(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """`tokenizer.encode(text, add_special_tokens=False)` of each text, in one batch call of a fast tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (backend is None or not hasattr(backend, "encode_batch_fast")
            or getattr(tokenizer, "split_special_tokens", False)):
        return [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    return [encoding.ids for encoding in backend.encode_batch_fast(list(texts), add_special_tokens=False)]


def tokenizer_digest(tokenizer) -> str:
    """A digest naming what a tokenizer does to a text: its class and its whole serialised vocabulary, merges, rules."""
    import hashlib

    backend = getattr(tokenizer, "backend_tokenizer", None)
    state = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    return f"{type(tokenizer).__name__}-{hashlib.sha256(state.encode()).hexdigest()[:16]}"


def completion_from_ids(tokenizer, new_ids: Sequence[int], stop_ids: set[int], budget: int,
                        engine_stopped: bool = False, decode=None) -> Completion:
    """The Completion of newly generated ids: cut at the first stop id within the budget (finish "stop"),
    else at the budget ("length", or "stop" when the engine reports it stopped on a stop sequence of its own).
    decode: ids -> text, when a backend has a faster one equal to `tokenizer.decode(ids, skip_special_tokens=False)`."""
    stop = next((i for i, t in enumerate(new_ids[:budget]) if t in stop_ids), None)
    kept = list(new_ids[:budget] if stop is None else new_ids[:stop])
    finish = "stop" if stop is not None or engine_stopped else "length"
    text = decode(kept) if decode else tokenizer.decode(kept, skip_special_tokens=False)
    return Completion(text=text, token_ids=tuple(kept), finish_reason=finish)


def check_depth_request(request: DepthRequest) -> None:
    """Cuts inside the trace, and something to read at each."""
    bad = [cut for cut in request.cuts if not 0 <= cut <= len(request.trace_ids)]
    if bad:
        raise ValueError(f"cuts {bad} fall outside the trace of {len(request.trace_ids)} tokens")
    if not request.suffix_ids and any(len(request.prompt_ids) + cut == 0 for cut in request.cuts):
        raise ValueError("a cut of 0 with an empty prompt and an empty suffix leaves nothing to read")


def depth_sequences(requests: Sequence[DepthRequest]) -> list[list[int]]:
    """The naive re-feed: prompt + trace[:cut] + suffix for every cut of every request, in order."""
    for request in requests:
        check_depth_request(request)
    return [list(r.prompt_ids) + list(r.trace_ids[:cut]) + list(r.suffix_ids) for r in requests for cut in r.cuts]


def split_by_request(probs: np.ndarray, requests: Sequence[DepthRequest]) -> list[np.ndarray]:
    """Rows of `probs` (one per cut, requests in order) split into one array per request."""
    bounds = np.cumsum([len(r.cuts) for r in requests])[:-1]
    return np.split(probs, bounds) if requests else []
