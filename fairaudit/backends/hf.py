"""Hugging Face transformers backend: batched, left-padded, CPU or CUDA."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from fairaudit.backends import Completion, DepthRequest, GenerationRequest
from fairaudit.backends.common import (completion_from_ids, last_token_choice_probs, left_pad, next_cache, nucleus_probs,
                                       positions_after_left_pad, stop_token_ids)
from fairaudit.errors import AuditError
from fairaudit.models import model_fingerprint

BACKEND_VERSION = "hf-1"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(device: str) -> torch.device:
    """'auto' is CUDA when available, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


_LOADED: dict[tuple, torch.nn.Module] = {}


def load_model(model_dir: str, dtype: str, device: torch.device, attn_implementation: str) -> torch.nn.Module:
    """The model, loaded once per process and reused by every job of a sequential sweep.

    One model is held at a time: a sweep that moves on to another model frees the last one first.
    """
    from transformers import AutoModelForCausalLM

    key = (model_dir, dtype, str(device), attn_implementation)
    if key not in _LOADED:
        _LOADED.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        _LOADED[key] = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=DTYPES[dtype], attn_implementation=attn_implementation
        ).to(device).eval()
    return _LOADED[key]


class HFBackend:
    """A transformers causal LM; every call is batched by `batch_size`.

    Construction reads only the tokenizer and the weight files' identity; the weights load
    on the first model call, so a run served wholly from the store never loads them.
    """

    def __init__(self, model_dir: str | Path, dtype: str = "float32", device: str = "auto", batch_size: int = 8,
                 attn_implementation: str = "sdpa", depth_token_budget: int = 16384):
        from transformers import AutoTokenizer

        if dtype not in DTYPES:
            raise AuditError(f"model.dtype {dtype!r} is not supported by the hf backend; choices: {sorted(DTYPES)}")
        self.model_dir, self.dtype, self.attn_implementation = str(model_dir), dtype, attn_implementation
        self.device = pick_device(device)
        self.batch_size = batch_size
        self.depth_token_budget = depth_token_budget
        self.fingerprint = f"{model_fingerprint(Path(model_dir))}/{BACKEND_VERSION}/{dtype}/{self.device.type}"
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.stop_ids = stop_token_ids(self.model_dir, self.tokenizer)

    @property
    def model(self) -> torch.nn.Module:
        return load_model(self.model_dir, self.dtype, self.device, self.attn_implementation)

    def _batches(self, lengths: Sequence[int]):
        """Index batches of similar length (less padding), in descending length."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        for start in range(0, len(order), self.batch_size):
            yield order[start:start + self.batch_size]

    @torch.inference_mode()
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Greedy and sampled requests, each kind batched by prompt length; results in request order."""
        out: list[Completion | None] = [None] * len(requests)
        for sampled, run in ((False, self._greedy_batch), (True, self._sample_batch)):
            group = [i for i, r in enumerate(requests) if (r.temperature > 0.0) == sampled]
            for batch in self._batches([len(requests[i].prompt_ids) for i in group]):
                idx = [group[j] for j in batch]
                for i, completion in zip(idx, run([requests[i] for i in idx])):
                    out[i] = completion
        return out  # type: ignore[return-value]

    def _greedy_batch(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        ids, mask = left_pad([r.prompt_ids for r in requests], self.pad_id)
        generated = self.model.generate(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device), do_sample=False, top_k=None,
            max_new_tokens=max(r.max_new_tokens for r in requests), pad_token_id=self.pad_id,
        )[:, ids.shape[1]:].tolist()
        return [self._completion(row, r.max_new_tokens) for row, r in zip(generated, requests)]

    def _sample_batch(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Nucleus sampling, batched. Each row draws from its own generator seeded by its request,
        so a continuation does not depend on what it was batched with."""
        ids, mask = (t.to(self.device) for t in left_pad([r.prompt_ids for r in requests], self.pad_id))
        generators = [torch.Generator(self.device).manual_seed(r.seed or 0) for r in requests]
        temperature = torch.tensor([r.temperature for r in requests], device=self.device)
        top_p = torch.tensor([r.top_p for r in requests], device=self.device)
        positions = positions_after_left_pad(mask)
        step = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        new: list[list[int]] = [[] for _ in requests]
        stop_ids = self.stop_ids
        open_rows = set(range(len(requests)))
        next_position = positions[:, -1:] + 1
        while open_rows:
            probs = nucleus_probs(step.logits[:, -1], temperature, top_p)
            tokens = torch.stack([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(generators)])
            for i in sorted(open_rows):
                new[i].append(int(tokens[i]))
                if new[i][-1] in stop_ids or len(new[i]) >= requests[i].max_new_tokens:
                    open_rows.discard(i)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            step = self.model(input_ids=tokens, attention_mask=mask, position_ids=next_position, use_cache=True, **next_cache(step))
            next_position = next_position + 1
        return [self._completion(row, r.max_new_tokens) for row, r in zip(new, requests)]

    def _completion(self, new_ids: list[int], budget: int) -> Completion:
        return completion_from_ids(self.tokenizer, new_ids, self.stop_ids, budget)

    @torch.inference_mode()
    def choice_probs(self, prefixes: Sequence[Sequence[int]], choices: Sequence[Sequence[int]]) -> np.ndarray:
        """Softmax over the pooled choices at the position after each prefix (see the protocol)."""
        out = np.zeros((len(prefixes), len(choices)))
        for batch in self._batches([len(p) for p in prefixes]):
            out[batch] = last_token_choice_probs(self.model, [prefixes[i] for i in batch], choices, self.pad_id)
        return out

    @torch.inference_mode()
    def depth_choice_probs(self, requests: Sequence[DepthRequest], choices: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """All cuts of a trace in one packed forward pass (tree attention mask); equals the naive re-feed."""
        from fairaudit.backends.packing import check_packable, naive_depth_probs, packed_depth_probs

        try:
            check_packable(self.model)
        except ValueError:  # flash attention or sliding-window layers: re-feed each prefix instead
            return naive_depth_probs(self.model, requests, choices, pad_id=self.pad_id, batch_size=self.batch_size)
        return packed_depth_probs(self.model, requests, choices, token_budget=self.depth_token_budget, pad_id=self.pad_id)
