"""Answer reads at several truncation depths of a trace, for HF causal LMs.

`naive_depth_probs` is the reference: one sequence prompt + trace[:cut] + suffix per cut.
`packed_depth_probs` reads every depth of a trace in one forward pass: the sequence holds
prompt + trace once, then one copy of the suffix per cut. A tree attention mask lets copy k
see only prompt + trace[:cut_k] and itself (causally), and its position ids continue from
len(prompt) + cut_k, so each copy computes exactly what the naive re-feed computes.

The packed pass hands the model a ready 4D additive mask, which transformers (5.x) passes
through untouched to the attention function; that works with the "eager" and "sdpa"
attention implementations only, and only for models whose layers all use full attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Sequence

import numpy as np
import torch

from fairaudit.backends import DepthRequest
from fairaudit.backends.common import check_depth_request, depth_sequences, split_by_request
from fairaudit.backends.tensors import last_token_choice_probs, pooled_choice_probs

PACKABLE_ATTENTION = ("eager", "sdpa")
PREFIX = -1  # branch id of the shared prompt + trace tokens; suffix copies are 0..K-1


def naive_depth_probs(
    model,
    requests: Sequence[DepthRequest],
    choices: Sequence[Sequence[int]],
    *,
    pad_id: int = 0,
    batch_size: int = 8,
) -> list[np.ndarray]:
    """Reference depth reads: one left-padded sequence prompt + trace[:cut] + suffix per (request, cut).

    Returns one (len(cuts), len(choices)) float64 array per request, rows summing to 1.
    """
    sequences = depth_sequences(requests)
    chunks = [
        last_token_choice_probs(model, sequences[start : start + batch_size], choices, pad_id)
        for start in range(0, len(sequences), batch_size)
    ]
    probs = np.concatenate(chunks) if chunks else np.zeros((0, len(choices)))
    return split_by_request(probs, requests)


@dataclass(frozen=True)
class PackedRow:
    """One request laid out as prompt + trace[:max cut] + one suffix copy per cut.

    ids, positions, branch: per token (branch PREFIX for the shared prefix, k for copy k);
    prefix_limit[k] = len(prompt) + cut_k, the prefix tokens copy k sees; reads[k] the index
    of copy k's answer token (its last suffix token, or the last prefix token it sees when
    the suffix is empty).
    """

    ids: list[int]
    positions: list[int]
    branch: list[int]
    prefix_limit: list[int]
    reads: list[int]


def pack_request(request: DepthRequest) -> PackedRow:
    """Lay out one request for a packed pass."""
    check_depth_request(request)
    prefix = list(request.prompt_ids) + list(request.trace_ids[: max(request.cuts, default=0)])
    suffix, n_prompt = list(request.suffix_ids), len(request.prompt_ids)
    ids, positions, branch = list(prefix), list(range(len(prefix))), [PREFIX] * len(prefix)
    limits, reads = [], []
    for k, cut in enumerate(request.cuts):
        limit = n_prompt + cut
        ids += suffix
        positions += range(limit, limit + len(suffix))
        branch += [k] * len(suffix)
        limits.append(limit)
        reads.append(len(ids) - 1 if suffix else limit - 1)
    return PackedRow(ids, positions, branch, limits, reads)


def tree_mask(row: PackedRow) -> torch.Tensor:
    """(n, n) boolean: True where query i may attend key j in a packed row.

    Prefix tokens attend the prefix causally; copy k attends prefix tokens before
    prefix_limit[k] and its own earlier tokens. Copies never see one another.
    """
    branch = torch.tensor(row.branch)
    index = torch.arange(len(row.ids))
    is_prefix = branch == PREFIX
    # how many prefix tokens each query sees: up to itself for prefix queries, up to its cut for copies
    visible_prefix = torch.tensor([i + 1 if b == PREFIX else row.prefix_limit[b] for i, b in enumerate(row.branch)])
    sees_prefix = is_prefix[None, :] & (index[None, :] < visible_prefix[:, None])
    sees_own_copy = (branch[:, None] == branch[None, :]) & ~is_prefix[None, :] & (index[None, :] <= index[:, None])
    return sees_prefix | sees_own_copy


def pad_allowed(rows: Sequence, pad_id: int):
    """Left-pad rows (ids, positions, allowed) into input_ids, position_ids (B, T), allowed (B, T, T) and offsets."""
    width = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    allowed = torch.eye(width, dtype=torch.bool).repeat(len(rows), 1, 1)  # padding attends itself only
    offsets = []
    for b, row in enumerate(rows):
        offset = width - len(row.ids)
        ids[b, offset:] = torch.tensor(row.ids, dtype=torch.long)
        positions[b, offset:] = torch.tensor(row.positions, dtype=torch.long)
        allowed[b, offset:, offset:] = row.allowed
        offsets.append(offset)
    return ids, positions, allowed, offsets


def _pad_packed(rows: list[PackedRow], pad_id: int):
    """`pad_allowed` of packed rows under their tree masks, and each row's read columns (B, K) after padding."""
    ids, positions, allowed, offsets = pad_allowed(
        [SimpleNamespace(ids=r.ids, positions=r.positions, allowed=tree_mask(r)) for r in rows], pad_id)
    reads = torch.zeros((len(rows), max(len(r.reads) for r in rows)), dtype=torch.long)
    for b, (row, offset) in enumerate(zip(rows, offsets)):
        reads[b, : len(row.reads)] = torch.tensor(row.reads, dtype=torch.long) + offset
    return ids, positions, allowed, reads


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T, T) boolean -> (B, 1, T, T) additive mask: 0 where allowed, the dtype's minimum elsewhere.

    Both eager (adds it to the scores) and sdpa (takes a float mask of the query dtype) accept this form.
    """
    additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return additive.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def batches_within_budget(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Group row indices, longest first, so each batch's padded size B * T stays within budget.

    A row longer than the budget runs alone.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= token_budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def check_packable(model) -> None:
    """Raise unless the model's attention honours the tree mask as given (eager or sdpa, no sliding window).

    A ready 4D mask bypasses transformers' own mask building, sliding windows included.
    """
    implementation = model.config._attn_implementation
    if implementation not in PACKABLE_ATTENTION:
        raise ValueError(
            f"packed depth reads need attn_implementation in {PACKABLE_ATTENTION}, the model uses {implementation!r}; "
            "load it with attn_implementation='sdpa' or use naive_depth_probs"
        )
    layer_types = set(getattr(model.config, "layer_types", None) or ["full_attention"])
    window = getattr(model.config, "sliding_window", None)
    if layer_types != {"full_attention"} or window is not None:
        raise ValueError(
            f"packed depth reads need full attention in every layer, the model has layer types {sorted(layer_types)} "
            f"and sliding_window={window}; use naive_depth_probs"
        )


@torch.inference_mode()
def _packed_batch_probs(model, rows: list[PackedRow], choices, pad_id: int) -> list[np.ndarray]:
    ids, positions, allowed, reads = _pad_packed(rows, pad_id)
    device = model.device
    # logits at the union of read columns (a 1D logits_to_keep; per-row 2D indices need transformers >= 5.20)
    columns, column_of = reads.unique(return_inverse=True)
    out = model(
        input_ids=ids.to(device),
        attention_mask=additive_mask(allowed.to(device), model.dtype),
        position_ids=positions.to(device),
        logits_to_keep=columns.to(device),
    )
    logits = out.logits.gather(1, column_of.to(device)[..., None].expand(-1, -1, out.logits.shape[-1]))
    probs = pooled_choice_probs(logits.flatten(0, 1), choices).reshape(len(rows), reads.shape[1], len(choices))
    return [probs[b, : len(row.reads)] for b, row in enumerate(rows)]


def packed_depth_probs(
    model,
    requests: Sequence[DepthRequest],
    choices: Sequence[Sequence[int]],
    *,
    pad_id: int = 0,
    token_budget: int = 16384,
) -> list[np.ndarray]:
    """Depth reads of every cut of each trace in one forward pass per batch of traces (tree attention mask).

    Equal to `naive_depth_probs` up to float rounding. Traces are batched longest first while
    batch size x padded length stays within `token_budget` (a longer trace runs alone); the
    mask costs batch x length^2 elements of the model dtype. Returns one
    (len(cuts), len(choices)) float64 array per request, in request order.
    """
    check_packable(model)
    rows = [pack_request(r) for r in requests]
    results: list[np.ndarray] = [np.zeros((0, len(choices)))] * len(rows)
    to_read = [i for i, row in enumerate(rows) if row.reads]
    for batch in batches_within_budget([len(rows[i].ids) for i in to_read], token_budget):
        indices = [to_read[j] for j in batch]
        for i, probs in zip(indices, _packed_batch_probs(model, [rows[i] for i in indices], choices, pad_id)):
            results[i] = probs
    return results
