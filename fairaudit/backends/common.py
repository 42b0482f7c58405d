"""Helpers shared by backends as free functions."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from fairaudit.backends import Completion


def pooled_choice_probs(logits: torch.Tensor, choices: Sequence[Sequence[int]]) -> np.ndarray:
    """Softmax across choices of each choice's logsumexp-pooled token logits.

    logits: (n, vocab) next-token logits; returns (n, len(choices)) float64 probabilities.
    """
    logits = logits.float()
    pooled = torch.stack([torch.logsumexp(logits[:, list(ids)], dim=-1) for ids in choices], dim=-1)
    return torch.softmax(pooled.double(), dim=-1).cpu().numpy()


def next_cache(output) -> dict:
    """A forward's KV cache as keyword arguments for the next forward.

    transformers 5.20 renamed `past_key_values` to `cache` (output field and keyword); both work.
    """
    name = "cache" if "cache" in output else "past_key_values"
    return {name: output[name]}


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


def completion_from_ids(tokenizer, new_ids: Sequence[int], stop_ids: set[int], budget: int) -> Completion:
    """The Completion of newly generated ids: cut at the first stop id (finish "stop") or at the budget ("length")."""
    stop = next((i for i, t in enumerate(new_ids) if t in stop_ids), None)
    stopped = stop is not None and stop < budget
    kept = list(new_ids[:stop] if stopped else new_ids[:budget])
    return Completion(text=tokenizer.decode(kept, skip_special_tokens=False), token_ids=tuple(kept),
                      finish_reason="stop" if stopped else "length")


def positions_after_left_pad(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that ignore left padding: 0 at each row's first real token."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


@torch.inference_mode()
def last_token_choice_probs(model, sequences: Sequence[Sequence[int]], choices: Sequence[Sequence[int]], pad_id: int) -> np.ndarray:
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
