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


@dataclass(frozen=True)
class Block:
    """A labelled span of a role-channel transcript.

    role: "A", "B", ... or "" for text no role owns (the prompt, a bridge); channel: "private" or "public".
    """

    ids: tuple[int, ...]
    role: str = ""
    channel: str = "public"


Visibility = tuple[tuple[int, ...], ...]  # visibility[i]: indices of the earlier blocks block i may attend


@dataclass(frozen=True)
class GraphGenerationRequest:
    """Continue the last block of `blocks` greedily under a visibility graph.

    The new tokens belong to blocks[-1]: they attend what it attends (visibility[-1]) plus itself.
    visibility None is ordinary causal attention. Generation stops at EOS, after `stop_ids`
    (a token sequence, left out of the completion) or after max_new_tokens.
    """

    blocks: tuple[Block, ...]
    visibility: Visibility | None
    max_new_tokens: int
    stop_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class NLLRequest:
    """Score the target blocks of one block sequence under a visibility graph (paper 002 Eq. 3).

    blocks: the whole sequence in order; target: indices of the blocks scored (teacher-forced);
    visibility: None for ordinary causal attention, else one tuple per block naming the earlier
    blocks it may attend (a block always attends its own earlier tokens). Position ids are those
    of the full sequence. shared_prefix True lets a backend compute leading blocks that other
    requests share once (a tree-packed pass, equal to a separate pass up to float rounding);
    False gives the request a pass of its own, unpadded, so two requests with the same block
    lengths that differ only in tokens the target cannot reach under the graph score bit-identically.
    """

    blocks: tuple[Block, ...]
    target: tuple[int, ...]
    visibility: Visibility | None = None
    shared_prefix: bool = True


@runtime_checkable
class Backend(Protocol):
    """A loaded model. `fingerprint` names weights and numerics (dtype, device kind, backend version)."""

    fingerprint: str

    def generate(self, requests: Sequence[GenerationRequest | GraphGenerationRequest]) -> list[Completion]:
        """Continue each prompt; results in request order.

        A GraphGenerationRequest is decoded greedily under its visibility graph (one 4D attention
        mask, full-sequence position ids); a backend that cannot apply a custom mask refuses it
        with an AuditError naming the backend.
        """

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

    def target_nll(self, requests: Sequence[NLLRequest]) -> np.ndarray:
        """Mean negative log-likelihood per target token, in nats, of each request (paper 002 Eq. 3).

        For request r with target tokens t_1..t_n (the target blocks' ids, in order, tags included):
        -1/n * sum_i ln p(t_i | every earlier token it may see under r.visibility), where the first
        token of a target block is predicted at the last token before it. Returns a float64 array of
        len(requests), in request order. A backend that cannot apply a custom attention mask refuses
        a request whose visibility is not None with an AuditError.
        """
