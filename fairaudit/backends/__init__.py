"""The narrow backend protocol every model runtime implements (DESIGN.md).

All calls are batched and work on token ids, so the store can key them exactly.
Backends share helpers as free functions (`fairaudit.backends.common`), never by
inheritance; caching is a wrapper (`fairaudit.store.CachedBackend`), not a base class.

Two optional attributes: `streams_results = True` for a backend whose calls also take
`on_result(i, result)` and call it as each result arrives (a server pool; the store commits
them as they come), and `can_score = False` for one that only generates (chat-only APIs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to continue. temperature 0 means greedy; `seed` fixes a sampled continuation."""

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True)
class Completion:
    """What a generation produced.

    text: the new tokens decoded with special tokens kept (think tags stay visible),
    end-of-sequence and padding removed. token_ids: the new tokens, EOS excluded.
    finish_reason: "stop" (EOS) or "length" (the max_new_tokens budget cut it).
    """

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str


@dataclass(frozen=True)
class DepthRequest:
    """Read the answer after each truncation of one trace: prompt + trace[:cut] + suffix for cut in cuts."""

    prompt_ids: tuple[int, ...]
    trace_ids: tuple[int, ...]
    suffix_ids: tuple[int, ...]
    cuts: tuple[int, ...] = field(default=())


@runtime_checkable
class Backend(Protocol):
    """A loaded model. `fingerprint` names weights and numerics (dtype, device kind, backend version)."""

    fingerprint: str

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Continue each prompt; results in request order."""

    def choice_probs(self, prefixes: Sequence[Sequence[int]], choices: Sequence[Sequence[int]]) -> np.ndarray:
        """Softmax over the given answer choices only (not the vocabulary) at the next position.

        choices[j] lists the token ids that spell choice j (e.g. "Yes", " Yes", "yes"); their
        logits are pooled with logsumexp before the softmax across choices. Returns an array
        of shape (len(prefixes), len(choices)), rows summing to 1, columns in `choices` order.
        """

    def depth_choice_probs(self, requests: Sequence[DepthRequest], choices: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """choice_probs at every cut of each trace: one (len(cuts), len(choices)) array per request.

        Must equal calling choice_probs on each prompt + trace[:cut] + suffix (the naive re-feed).
        """
