"""Role-visibility graphs (paper 002) for HF causal LMs: attention masks of block sequences, and the
target NLL of many block sequences tree-packed into few forward passes (leading blocks shared once)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from fairaudit.backends.packing import additive_mask, batches_within_budget, check_packable, pad_allowed


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
                                           any(not 0 <= j < i for i, row in enumerate(request.visibility)
                                               for j in row)):
        raise ValueError("visibility must hold one row per block, naming earlier blocks only")


@torch.inference_mode()
def rows_target_nll(model, rows: list[TreeRow], groups: list[list], pad_id: int) -> list[list[float]]:
    """Mean target NLL (nats/token) of every request of every row, the rows in one left-padded forward pass.

    groups[b]: the requests laid out in rows[b], in the order of its paths.
    """
    ids, positions, allowed, offsets = pad_allowed(rows, pad_id)
    device = model.device
    hidden = model.base_model(input_ids=ids.to(device), attention_mask=additive_mask(allowed.to(device), model.dtype),
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
    batches = [[shared[j] for j in batch]
               for batch in batches_within_budget([len(rows[g].ids) for g in shared], token_budget)]
    batches += [[g] for g, group in enumerate(groups) if not requests[group[0]].shared_prefix]
    out = np.zeros(len(requests))
    for batch in batches:
        scores = rows_target_nll(model, [rows[g] for g in batch], [[requests[i] for i in groups[g]] for g in batch],
                                 pad_id)
        for g, values in zip(batch, scores):
            out[groups[g]] = values
    return out
