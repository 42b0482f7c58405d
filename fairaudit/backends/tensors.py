"""Torch helpers shared by the backends that run a transformers model in process (hf, packing)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from fairaudit.backends.common import choice_token_ids, pooled_softmax


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a `common.DTYPES` name."""
    return getattr(torch, name)


def pooled_choice_probs(logits: torch.Tensor, choices: Sequence[Sequence[int]]) -> np.ndarray:
    """`common.pooled_softmax` of next-token logits (n, vocab): returns (n, len(choices)) float64 probabilities."""
    token_ids = choice_token_ids(choices)
    return pooled_softmax(logits[:, token_ids].float().cpu().numpy(), token_ids, choices)


def next_cache(output) -> dict:
    """A forward's KV cache as keyword arguments for the next forward.

    transformers 5.20 renamed `past_key_values` to `cache` (output field and keyword); both work.
    """
    name = "cache" if "cache" in output else "past_key_values"
    return {name: output[name]}


def positions_after_left_pad(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that ignore left padding: 0 at each row's first real token."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


@torch.inference_mode()
def last_token_choice_probs(model, sequences: Sequence[Sequence[int]], choices: Sequence[Sequence[int]],
                            pad_id: int) -> np.ndarray:
    """pooled_choice_probs at the position after each sequence, in one left-padded forward pass."""
    ids, mask = left_pad(sequences, pad_id)
    ids, mask = ids.to(model.device), mask.to(model.device)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions_after_left_pad(mask), logits_to_keep=1)
    return pooled_choice_probs(out.logits[:, -1], choices)


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token id lists into (input_ids, attention_mask) tensors."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq):] = torch.tensor(list(seq), dtype=torch.long)
            mask[row, width - len(seq):] = 1
    return ids, mask


def nucleus_probs(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Sampling distribution per row: softmax(logits / T) cut to the smallest top set of mass >= top_p.

    logits: (n, vocab); temperature, top_p: (n,). The most likely token is always kept.
    """
    probs = torch.softmax(logits.float() / temperature[:, None], dim=-1)
    ranked, order = probs.sort(dim=-1, descending=True)
    outside = ranked.cumsum(-1) - ranked >= top_p[:, None]  # mass before this token already reaches top_p
    ranked = ranked.masked_fill(outside, 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, order, ranked)
    return kept / kept.sum(-1, keepdim=True)


def next_tokens(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """One next token per row of logits (n, vocab): the argmax where the row's generator is None
    (greedy), else a draw from `nucleus_probs` with that row's own generator, so a row's draw does
    not depend on what it was batched with. Returns (n,) token ids."""
    tokens = logits.argmax(-1)
    sampled = [i for i, g in enumerate(generators) if g is not None]
    if sampled:
        rows = torch.tensor(sampled, device=logits.device)
        probs = nucleus_probs(logits[rows], temperature[rows], top_p[rows])
        for j, i in enumerate(sampled):
            tokens[i] = torch.multinomial(probs[j], 1, generator=generators[i])[0]
    return tokens
