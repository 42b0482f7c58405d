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
from typing import Sequence

import numpy as np
import torch

from fairaudit.backends import DepthRequest
from fairaudit.backends.common import last_token_choice_probs, pooled_choice_probs

PACKABLE_ATTENTION = ("eager", "sdpa")
PREFIX = -1  # branch id of the shared prompt + trace tokens; suffix copies are 0..K-1


def _check_request(request: DepthRequest) -> None:
    bad = [cut for cut in request.cuts if not 0 <= cut <= len(request.trace_ids)]
    if bad:
        raise ValueError(f"cuts {bad} fall outside the trace of {len(request.trace_ids)} tokens")
    if not request.suffix_ids and any(len(request.prompt_ids) + cut == 0 for cut in request.cuts):
        raise ValueError("a cut of 0 with an empty prompt and an empty suffix leaves nothing to read")


def split_by_request(probs: np.ndarray, requests: Sequence[DepthRequest]) -> list[np.ndarray]:
    """Rows of `probs` (one per cut, requests in order) split into one array per request."""
    bounds = np.cumsum([len(r.cuts) for r in requests])[:-1]
    return np.split(probs, bounds) if requests else []


def depth_sequences(requests: Sequence[DepthRequest]) -> list[list[int]]:
    """The naive re-feed: prompt + trace[:cut] + suffix for every cut of every request, in order."""
    for request in requests:
        _check_request(request)
    return [list(r.prompt_ids) + list(r.trace_ids[:cut]) + list(r.suffix_ids) for r in requests for cut in r.cuts]


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
    _check_request(request)
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


def _pad_rows(rows: list[PackedRow], pad_id: int):
    """Left-pad packed rows into input_ids, position_ids (B, T), allowed attention (B, T, T) and read columns (B, K)."""
    width = max(len(r.ids) for r in rows)
    n_reads = max(len(r.reads) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    allowed = torch.eye(width, dtype=torch.bool).repeat(len(rows), 1, 1)  # padding attends itself only
    reads = torch.zeros((len(rows), n_reads), dtype=torch.long)
    for b, row in enumerate(rows):
        offset = width - len(row.ids)
        ids[b, offset:] = torch.tensor(row.ids, dtype=torch.long)
        positions[b, offset:] = torch.tensor(row.positions, dtype=torch.long)
        allowed[b, offset:, offset:] = tree_mask(row)
        reads[b, : len(row.reads)] = torch.tensor(row.reads, dtype=torch.long) + offset
    return ids, positions, allowed, reads


def _additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T, T) boolean -> (B, 1, T, T) additive mask: 0 where allowed, the dtype's minimum elsewhere.

    Both eager (adds it to the scores) and sdpa (takes a float mask of the query dtype) accept this form.
    """
    additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return additive.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def _batches_within_budget(lengths: list[int], token_budget: int) -> list[list[int]]:
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
    ids, positions, allowed, reads = _pad_rows(rows, pad_id)
    device = model.device
    # logits at the union of read columns (a 1D logits_to_keep; per-row 2D indices need transformers >= 5.20)
    columns, column_of = reads.unique(return_inverse=True)
    out = model(
        input_ids=ids.to(device),
        attention_mask=_additive_mask(allowed.to(device), model.dtype),
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
    for batch in _batches_within_budget([len(rows[i].ids) for i in to_read], token_budget):
        indices = [to_read[j] for j in batch]
        for i, probs in zip(indices, _packed_batch_probs(model, [rows[i] for i in indices], choices, pad_id)):
            results[i] = probs
    return results


# Role-visibility graphs (paper 002): target NLL of block sequences, tree-packed.


def graph_allowed(block_of: Sequence[int], visibility) -> torch.Tensor:
    """(n, n) boolean for one block sequence: token i may attend token j <= i of its own block or of a block it sees.

    block_of: the block index of each token; visibility: None (causal) or visibility[b] = the blocks b sees.
    """
    n = len(block_of)
    causal = torch.ones((n, n), dtype=torch.bool).tril()
    if visibility is None:
        return causal
    sees = torch.eye(len(visibility), dtype=torch.bool)
    for b, row in enumerate(visibility):
        sees[b, list(row)] = True
    index = torch.tensor(list(block_of), dtype=torch.long)
    return causal & sees[index[:, None], index[None, :]]


def _visible(request, i: int) -> tuple[int, ...]:
    return tuple(range(i)) if request.visibility is None else tuple(sorted(request.visibility[i]))


def _node_keys(request) -> list[tuple]:
    """One key per block: (block index, block, blocks it sees); equal key paths share trie nodes."""
    return [(i, block, _visible(request, i)) for i, block in enumerate(request.blocks)]


def tree_length(requests: Sequence) -> int:
    """Tokens in the packed row of `requests` (each distinct leading block path counted once)."""
    seen: set[tuple] = set()
    total = 0
    for request in requests:
        path: tuple = ()
        for key in _node_keys(request):
            path = path + (key,)
            if path not in seen:
                seen.add(path)
                total += len(key[1].ids)
    return total


@dataclass(frozen=True)
class TreeRow:
    """NLL requests laid out as a trie of blocks: leading blocks that requests share appear once.

    ids, positions: per column (positions are those of the full sequence of every request through
    the column); allowed: (n, n) who may attend whom; paths[r]: the column of each token of request r.
    """

    ids: list[int]
    positions: list[int]
    allowed: torch.Tensor
    paths: list[list[int]]


def pack_tree(requests: Sequence) -> TreeRow:
    """Lay out NLL requests in one row. A block shared by several requests (same block, index,
    visible blocks and same blocks before it) is laid out once; a token attends its own block's
    earlier tokens and the blocks before it on its path that its block sees."""
    node_of: dict[tuple, int] = {}
    spans: list[tuple[int, int]] = []
    parent: list[int] = []
    keys: list[tuple] = []
    ids: list[int] = []
    positions: list[int] = []
    paths: list[list[int]] = []
    for request in requests:
        here, position, path = -1, 0, []
        for key in _node_keys(request):
            block = key[1]
            if (here, key) not in node_of:
                node_of[(here, key)] = len(spans)
                spans.append((len(ids), len(ids) + len(block.ids)))
                parent.append(here)
                keys.append(key)
                ids += block.ids
                positions += range(position, position + len(block.ids))
            here = node_of[(here, key)]
            path += range(*spans[here])
            position += len(block.ids)
        paths.append(path)
    allowed = torch.zeros((len(ids), len(ids)), dtype=torch.bool)
    for node, (start, end) in enumerate(spans):
        allowed[start:end, start:end] = torch.ones((end - start, end - start), dtype=torch.bool).tril()
        ancestor = parent[node]
        while ancestor >= 0:
            if keys[ancestor][0] in keys[node][2]:
                allowed[start:end, slice(*spans[ancestor])] = True
            ancestor = parent[ancestor]
    return TreeRow(ids, positions, allowed, paths)


def target_reads(request, path: list[int]) -> tuple[list[int], list[int]]:
    """(columns whose logits predict each target token, the target token ids) of one request laid out on `path`."""
    starts = np.cumsum([0] + [len(b.ids) for b in request.blocks])
    sequence = [t for block in request.blocks for t in block.ids]
    offsets = [p for b in request.target for p in range(starts[b], starts[b + 1])]
    return [path[p - 1] for p in offsets], [sequence[p] for p in offsets]


def check_nll_request(request) -> None:
    """Raise ValueError unless the request has a non-empty target after its first token and a well-formed graph."""
    n = len(request.blocks)
    if not request.target or any(not 0 <= b < n for b in request.target):
        raise ValueError(f"target blocks {request.target} must be indices into the {n} blocks")
    if any(not request.blocks[b].ids for b in request.target):
        raise ValueError("target blocks must be non-empty")
    if not any(block.ids for block in request.blocks[:min(request.target)]):
        raise ValueError("the target must follow at least one token (its first token is predicted from the one before)")
    if request.visibility is not None and (len(request.visibility) != n or
                                           any(not 0 <= j < i for i, row in enumerate(request.visibility) for j in row)):
        raise ValueError("visibility must hold one row per block, naming earlier blocks only")


def pad_allowed(rows: Sequence, pad_id: int):
    """Left-pad rows (ids, positions, allowed) into input_ids, position_ids (B, T) and allowed (B, T, T), and each row's offset."""
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


@torch.inference_mode()
def rows_target_nll(model, rows: list[TreeRow], groups: list[list], pad_id: int) -> list[list[float]]:
    """Mean target NLL (nats/token) of every request of every row, the rows in one left-padded forward pass.

    groups[b]: the requests laid out in rows[b], in the order of its paths.
    """
    ids, positions, allowed, offsets = pad_allowed(rows, pad_id)
    device = model.device
    hidden = model.base_model(input_ids=ids.to(device), attention_mask=_additive_mask(allowed.to(device), model.dtype),
                              position_ids=positions.to(device)).last_hidden_state
    head = model.get_output_embeddings()
    out = []
    for b, (row, requests) in enumerate(zip(rows, groups)):
        values = []
        for request, path in zip(requests, row.paths):
            columns, tokens = target_reads(request, path)
            logits = head(hidden[b, [c + offsets[b] for c in columns]]).float()
            picked = logits.gather(-1, torch.tensor(tokens, device=device)[:, None])[:, 0]
            values.append(float((logits.logsumexp(-1) - picked).double().mean()))
        out.append(values)
    return out


def _packed_groups(requests: Sequence, token_budget: int) -> list[list[int]]:
    """Request indices per packed row: shared-prefix requests with the same first block share a row
    within the budget; every other request gets a row of its own."""
    groups: dict[tuple, list[list[int]]] = {}
    alone = []
    for i, request in enumerate(requests):
        if not request.shared_prefix:
            alone.append([i])
            continue
        rows = groups.setdefault(_node_keys(request)[0], [[]])
        if rows[-1] and tree_length([requests[j] for j in rows[-1] + [i]]) > token_budget:
            rows.append([])
        rows[-1].append(i)
    return [row for rows in groups.values() for row in rows] + alone


def packed_target_nll(model, requests: Sequence, *, pad_id: int = 0, token_budget: int = 16384) -> np.ndarray:
    """Target NLL of each request (see Backend.target_nll), tree-packed.

    Requests that share leading blocks (and allow sharing) are laid out once per row (`pack_tree`);
    rows are batched longest first within `token_budget`. A request with shared_prefix False runs
    alone in a pass of its own (no sharing, no padding, no batch companions), so its score depends
    on nothing but itself. Returns float64 nats/token in request order.
    """
    check_packable(model)
    for request in requests:
        check_nll_request(request)
    groups = _packed_groups(requests, token_budget)
    rows = [pack_tree([requests[i] for i in group]) for group in groups]
    shared = [g for g, group in enumerate(groups) if requests[group[0]].shared_prefix]
    batches = [[shared[j] for j in batch] for batch in _batches_within_budget([len(rows[g].ids) for g in shared], token_budget)]
    batches += [[g] for g, group in enumerate(groups) if not requests[group[0]].shared_prefix]
    out = np.zeros(len(requests))
    for batch in batches:
        scores = rows_target_nll(model, [rows[g] for g in batch], [[requests[i] for i in groups[g]] for g in batch], pad_id)
        for g, values in zip(batch, scores):
            out[groups[g]] = values
    return out
