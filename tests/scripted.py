"""A scripted backend: the whole contract without a model (inspect's mockllm, with logits).

Next-token logits over VOCAB are a fixed function of the last three tokens and the position, so every
call is exact and instant: generation is their argmax (or a draw from a generator seeded by the request),
choice and depth reads their pooled softmax. It fixes what a conforming backend returns, cheaply.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Sequence

import numpy as np

from fairaudit.backends import Backend, Capabilities, Completion, DepthRequest, GenerationRequest, refuse_graphs
from fairaudit.backends.common import (
    choice_token_ids,
    completion_from_ids,
    depth_sequences,
    pooled_softmax,
    split_by_request,
    stop_token_ids,
)
from fairaudit.models.locate import model_fingerprint

BACKEND_VERSION = "scripted-1"
VOCAB = np.arange(1000, 1064)  # the ids it generates (real tokens of the Qwen3 tokenizer), EOS added


class ScriptedModel(Backend):
    """The contract's calls on scripted logits; `model_dir` lends its tokenizer and its identity."""

    name = "scripted"
    capabilities = Capabilities(scores=True, depth_reads=True)

    def __init__(self, model_dir: str | Path, dtype: str = "float32", batch_size: int = 8):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.stop_ids = stop_token_ids(str(model_dir), self.tokenizer)
        self.eos = min(self.stop_ids)
        self.fingerprint = f"{model_fingerprint(Path(model_dir))}/{BACKEND_VERSION}"

    def logits(self, prefix: Sequence[int]) -> dict[int, float]:
        """Next-token logits of VOCAB and EOS after `prefix`."""
        seed = zlib.crc32(np.asarray([len(prefix), *prefix[-3:]], dtype=np.int64).tobytes())
        values = np.random.default_rng(seed).normal(size=len(VOCAB) + 1)
        return dict(zip([*VOCAB.tolist(), self.eos], values.tolist()))

    def _next(self, prefix: list[int], request: GenerationRequest, rng: np.random.Generator) -> int:
        scores = self.logits(prefix)
        ids, values = np.array(list(scores)), np.array(list(scores.values()))
        if request.temperature == 0.0:
            return int(ids[values.argmax()])
        probs = np.exp((values - values.max()) / request.temperature)
        order = np.argsort(-probs)
        kept = order[: int(np.searchsorted(np.cumsum(probs[order]) / probs.sum(), request.top_p)) + 1]
        return int(rng.choice(ids[kept], p=probs[kept] / probs[kept].sum()))

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        refuse_graphs(self, requests)
        out = []
        for request in requests:
            rng, new = np.random.default_rng(request.seed or 0), []
            while len(new) < request.max_new_tokens and (not new or new[-1] not in self.stop_ids):
                new.append(self._next(list(request.prompt_ids) + new, request, rng))
            out.append(completion_from_ids(self.tokenizer, new, self.stop_ids, request.max_new_tokens))
        return out

    def choice_probs(self, prefixes: Sequence[Sequence[int]], choices: Sequence[Sequence[int]]) -> np.ndarray:
        token_ids = choice_token_ids(choices)
        scores = [[self.logits(list(p)).get(t, -5.0 - t % 7) for t in token_ids] for p in prefixes]
        return pooled_softmax(np.array(scores).reshape(len(prefixes), len(token_ids)), token_ids, choices)

    def depth_choice_probs(self, requests: Sequence[DepthRequest],
                           choices: Sequence[Sequence[int]]) -> list[np.ndarray]:
        return split_by_request(self.choice_probs(depth_sequences(requests), choices), requests)
