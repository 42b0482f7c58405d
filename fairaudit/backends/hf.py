"""Hugging Face transformers backend: batched, left-padded, CPU or CUDA."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Sequence

import numpy as np

from fairaudit.backends import (
    Backend,
    Capabilities,
    Completion,
    DepthRequest,
    GenerationRequest,
    GraphGenerationRequest,
    NLLRequest,
)
from fairaudit.backends.common import DTYPES, completion_from_ids, stop_token_ids
from fairaudit.errors import AuditError
from fairaudit.models.locate import model_fingerprint
from fairaudit.terminal.output import console

if TYPE_CHECKING:
    import torch

BACKEND_VERSION = "hf-1"
ATTENTION = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
# torch is imported where a device is picked or a model runs, not with this module: the command line's checks and
# the catalog's lookups of the backend's class do not pay for it.


def inference(method):
    """`torch.inference_mode()` around a backend method."""
    @functools.wraps(method)
    def run(*args, **kwargs):
        import torch

        with torch.inference_mode():
            return method(*args, **kwargs)
    return run


def pick_device(device: str) -> torch.device:
    """'auto' is CUDA when available, else CPU."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


_LOADED: dict[tuple, torch.nn.Module] = {}


def load_model(model_dir: str, dtype: str, device: torch.device, attn_implementation: str) -> torch.nn.Module:
    """The model, loaded once per process and reused by every job of a sequential sweep.

    One model is held at a time: a sweep that moves on to another model frees the last one first.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from fairaudit.backends.tensors import torch_dtype

    key = (model_dir, dtype, str(device), attn_implementation)
    if key not in _LOADED:
        _LOADED.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        # in place of transformers' bar
        console.print(f"Loading weights of {model_dir} ({dtype} on {device})", style="dim", highlight=False,
                      soft_wrap=True)
        _LOADED[key] = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch_dtype(dtype), attn_implementation=attn_implementation
        ).to(device).eval()
    return _LOADED[key]


def _kind(request) -> str:
    if isinstance(request, GraphGenerationRequest):
        return "graph"
    return "sampled" if request.temperature > 0.0 else "greedy"


def _prompt_length(request) -> int:
    if isinstance(request, GraphGenerationRequest):
        return sum(len(block.ids) for block in request.blocks)
    return len(request.prompt_ids)


def device_problem(device) -> str | None:
    """backend.device: auto, cpu, mps, cuda or cuda:N, and present on this machine."""
    if not isinstance(device, str):
        return f"backend.device={device!r} must be one of auto, cpu, cuda, cuda:N, mps"
    kind, _, index = device.partition(":")
    if device in ("auto", "cpu"):
        return None
    if kind == "cuda" and (not index or index.isdigit()):
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(index or 0) >= count:
            return (f"backend.device={device!r} is not available: this machine has {count} CUDA device(s); "
                    "use auto or cpu")
        return None
    if device == "mps":
        import torch

        return None if torch.backends.mps.is_available() else "backend.device='mps' is not available on this machine"
    return f"backend.device={device!r} must be one of auto, cpu, cuda, cuda:N, mps"


def written(completion: Completion) -> int:
    """Tokens a generation wrote, its stop id included."""
    return len(completion.token_ids) + (completion.finish_reason == "stop")


class HFBackend(Backend):
    """A transformers causal LM, in process; every call is batched by `batch_size`.

    Depth reads are one packed pass per trace (tree attention mask); visibility graphs are 4D masks.
    Construction reads only the tokenizer and the weight files' identity; the weights load
    on the first model call, so a run served wholly from the store never loads them.
    """

    name = "hf"
    capabilities = Capabilities(scores=True, depth_reads=True, target_nll=True, attention_graphs=True)

    @classmethod
    def check(cls, settings, model) -> None:
        """Device present, attention implementation known, depth budget positive, dtype supported: one line."""
        from fairaudit.errors.rules import check_fields, integer, one_of

        rules = {"attn_implementation": one_of(*ATTENTION), "depth_token_budget": integer(1)}
        extra = [device_problem(settings.get("device", "auto"))]
        if model["dtype"] not in DTYPES:
            extra.append(f"model.dtype={model['dtype']!r} is not supported by the hf backend; choices: {list(DTYPES)}")
        check_fields("backend", settings, rules, extra)

    def __init__(self, model_dir: str | Path, dtype: str = "float32", device: str = "auto", batch_size: int = 8,
                 attn_implementation: str = "sdpa", depth_token_budget: int = 16384):
        from transformers import AutoTokenizer

        self.check({"device": device, "attn_implementation": attn_implementation,
                    "depth_token_budget": depth_token_budget}, {"dtype": dtype})
        self.model_dir, self.dtype, self.attn_implementation = str(model_dir), dtype, attn_implementation
        self.device = pick_device(device)
        self.batch_size = batch_size
        self.depth_token_budget = depth_token_budget
        self.fingerprint = f"{model_fingerprint(Path(model_dir))}/{BACKEND_VERSION}/{dtype}/{self.device.type}"
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.pad_id = (self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
                       else self.tokenizer.eos_token_id)
        self.stop_ids = stop_token_ids(self.model_dir, self.tokenizer)
        self.computed, self.useful = Counter(), Counter()  # token positions computed / holding a real token, by stage

    @property
    def model(self) -> torch.nn.Module:
        return load_model(self.model_dir, self.dtype, self.device, self.attn_implementation)

    def _batches(self, lengths: Sequence[int]):
        """Index batches of similar length (less padding), in descending length."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        for start in range(0, len(order), self.batch_size):
            yield order[start:start + self.batch_size]

    @inference
    def generate(self, requests: Sequence[GenerationRequest | GraphGenerationRequest]) -> list[Completion]:
        """Greedy, sampled and graph requests, each kind batched by prompt length; results in request order."""
        out: list[Completion | None] = [None] * len(requests)
        kinds = (("greedy", self._greedy_batch), ("sampled", self._sample_batch), ("graph", self._graph_batch))
        for kind, run in kinds:
            group = [i for i, r in enumerate(requests) if _kind(r) == kind]
            if kind == "graph" and group:
                self._check_graphs()
            for batch in self._batches([_prompt_length(requests[i]) for i in group]):
                idx = [group[j] for j in batch]
                for i, completion in zip(idx, run([requests[i] for i in idx])):
                    out[i] = completion
        return out  # type: ignore[return-value]

    def _tally(self, stage: str, rows: int, width: int, lengths: Sequence[int]) -> None:
        """A batch of `rows` x `width` positions computed for `stage`, of which `lengths` (per row) were real tokens."""
        self.computed[stage] += rows * width
        self.useful[stage] += sum(lengths)

    def _padded_prompts(self, requests: Sequence[GenerationRequest]) -> tuple[torch.Tensor, torch.Tensor]:
        """The requests' prompts left-padded into (input_ids, attention_mask), their padding tallied."""
        from fairaudit.backends.tensors import left_pad

        ids, mask = left_pad([r.prompt_ids for r in requests], self.pad_id)
        self._tally("prompt_prefill", *ids.shape, [len(r.prompt_ids) for r in requests])
        return ids, mask

    def _greedy_batch(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        ids, mask = self._padded_prompts(requests)
        generated = self.model.generate(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device), do_sample=False, top_k=None,
            max_new_tokens=max(r.max_new_tokens for r in requests), pad_token_id=self.pad_id,
        )[:, ids.shape[1]:].tolist()
        completions = [self._completion(row, r.max_new_tokens) for row, r in zip(generated, requests)]
        self._tally("generation", len(generated), len(generated[0]), [written(c) for c in completions])
        return completions

    def _sample_batch(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Nucleus sampling, batched. Each row draws from its own generator seeded by its request,
        so a continuation does not depend on what it was batched with."""
        import torch

        from fairaudit.backends.tensors import next_cache, next_tokens, positions_after_left_pad

        ids, mask = (t.to(self.device) for t in self._padded_prompts(requests))
        generators, temperature, top_p = self._sampling(requests)
        positions = positions_after_left_pad(mask)
        step = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        new: list[list[int]] = [[] for _ in requests]
        stop_ids = self.stop_ids
        open_rows = set(range(len(requests)))
        next_position = positions[:, -1:] + 1
        while open_rows:
            tokens = next_tokens(step.logits[:, -1], temperature, top_p, generators)[:, None]
            for i in sorted(open_rows):
                new[i].append(int(tokens[i]))
                if new[i][-1] in stop_ids or len(new[i]) >= requests[i].max_new_tokens:
                    open_rows.discard(i)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            step = self.model(input_ids=tokens, attention_mask=mask, position_ids=next_position, use_cache=True,
                              **next_cache(step))
            next_position = next_position + 1
        self._tally("generation", len(new), max(map(len, new)), list(map(len, new)))
        return [self._completion(row, r.max_new_tokens) for row, r in zip(new, requests)]

    def _sampling(self, requests) -> tuple[list, torch.Tensor, torch.Tensor]:
        """Per request: a generator seeded by its seed (None when greedy), its temperature and top_p."""
        import torch

        generators = [torch.Generator(self.device).manual_seed(r.seed or 0) if r.temperature > 0.0 else None
                      for r in requests]
        temperature = torch.tensor([r.temperature for r in requests], device=self.device)
        return generators, temperature, torch.tensor([r.top_p for r in requests], device=self.device)

    def _check_graphs(self) -> None:
        from fairaudit.backends.packing import check_packable

        try:
            check_packable(self.model)
        except ValueError as err:
            raise AuditError(f"the hf backend cannot apply a visibility graph to this model: {err}") from None

    def _graph_batch(self, requests: Sequence[GraphGenerationRequest]) -> list[Completion]:
        """Greedy or seeded nucleus decoding under each request's visibility graph, with a KV cache.

        The prompt blocks run as one 4D mask; every new token attends what blocks[-1] may attend
        (its own earlier tokens included) plus the tokens generated before it, at the next position
        of the full sequence.
        """
        import torch

        from fairaudit.backends.graphs import graph_allowed
        from fairaudit.backends.packing import additive_mask, pad_allowed
        from fairaudit.backends.tensors import next_cache, next_tokens

        rows, step_rows = [], []
        for r in requests:
            block_of = [b for b, block in enumerate(r.blocks) for _ in block.ids]
            new_token = graph_allowed(block_of + [len(r.blocks) - 1], r.visibility)
            rows.append(SimpleNamespace(ids=[t for block in r.blocks for t in block.ids],
                                        positions=list(range(len(block_of))), allowed=new_token[:-1, :-1]))
            step_rows.append(new_token[-1, :-1])
        ids, positions, allowed, offsets = pad_allowed(rows, self.pad_id)
        step_allowed = torch.zeros((len(requests), ids.shape[1]), dtype=torch.bool)
        for b, (offset, row) in enumerate(zip(offsets, step_rows)):
            step_allowed[b, offset:] = row
        device, dtype = self.device, self.model.dtype
        step_allowed = step_allowed.to(device)
        step = self.model(input_ids=ids.to(device), attention_mask=additive_mask(allowed.to(device), dtype),
                          position_ids=positions.to(device), use_cache=True, logits_to_keep=1)
        next_position = positions[:, -1:].to(device) + 1
        stop_ids, new = self.stop_ids, [[] for _ in requests]
        open_rows, (generators, temperature, top_p) = set(range(len(requests))), self._sampling(requests)
        for _ in range(max(r.max_new_tokens for r in requests)):
            tokens = next_tokens(step.logits[:, -1], temperature, top_p, generators)
            for i in sorted(open_rows):
                new[i].append(int(tokens[i]))
                stop = requests[i].stop_ids
                if new[i][-1] in stop_ids or len(new[i]) >= requests[i].max_new_tokens or \
                        (stop and tuple(new[i][-len(stop):]) == stop):
                    open_rows.discard(i)
            if not open_rows:
                break
            step_allowed = torch.cat([step_allowed, torch.ones_like(step_allowed[:, :1])], dim=1)
            step = self.model(input_ids=tokens[:, None], attention_mask=additive_mask(step_allowed[:, None], dtype),
                              position_ids=next_position, use_cache=True, **next_cache(step))
            next_position = next_position + 1
        return [self._graph_completion(row, r) for row, r in zip(new, requests)]

    def _graph_completion(self, new_ids: list[int], request: GraphGenerationRequest) -> Completion:
        stop = request.stop_ids
        if stop and tuple(new_ids[-len(stop):]) == stop:
            kept = new_ids[:-len(stop)]
            return Completion(self.tokenizer.decode(kept, skip_special_tokens=False), tuple(kept), "stop")
        return self._completion(new_ids, request.max_new_tokens)

    @inference
    def target_nll(self, requests: Sequence[NLLRequest]) -> np.ndarray:
        """Mean target NLL in nats/token under each request's graph, tree-packed (see the protocol)."""
        from fairaudit.backends.graphs import packed_target_nll

        self._check_graphs()
        return packed_target_nll(self.model, requests, pad_id=self.pad_id, token_budget=self.depth_token_budget)

    def _completion(self, new_ids: list[int], budget: int) -> Completion:
        return completion_from_ids(self.tokenizer, new_ids, self.stop_ids, budget)

    @inference
    def choice_probs(self, prefixes: Sequence[Sequence[int]], choices: Sequence[Sequence[int]]) -> np.ndarray:
        """Softmax over the pooled choices at the position after each prefix (see the protocol)."""
        from fairaudit.backends.tensors import last_token_choice_probs

        out = np.zeros((len(prefixes), len(choices)))
        for batch in self._batches([len(p) for p in prefixes]):
            lengths = [len(prefixes[i]) for i in batch]
            self._tally("choice_reads", len(batch), max(lengths), lengths)
            out[batch] = last_token_choice_probs(self.model, [prefixes[i] for i in batch], choices, self.pad_id)
        return out

    def metrics(self) -> dict[str, float]:
        """Padding waste per stage: `padding_share_<stage>`, the share of the token positions computed that held no
        token of a request (left padding to a batch's longest prompt; a finished row decoded on while others write)."""
        return {f"padding_share_{stage}": 1.0 - self.useful[stage] / computed
                for stage, computed in self.computed.items() if computed}

    @inference
    def depth_choice_probs(self, requests: Sequence[DepthRequest],
                           choices: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """All cuts of a trace in one packed forward pass (tree attention mask); equals the naive re-feed."""
        from fairaudit.backends.packing import check_packable, naive_depth_probs, packed_depth_probs

        try:
            check_packable(self.model)
        except ValueError:  # flash attention or sliding-window layers: re-feed each prefix instead
            return naive_depth_probs(self.model, requests, choices, pad_id=self.pad_id, batch_size=self.batch_size)
        return packed_depth_probs(self.model, requests, choices, token_budget=self.depth_token_budget,
                                  pad_id=self.pad_id)
