"""Time the influence probe's scoring: cost per contrast, tree-packed against a naive per-sequence baseline.

    python benchmarks/influence.py [--traces 4] [--block-tokens 48] [--repeats 3]

A contrast needs two target NLLs (natural and donor prefix); a trace gives an A->B and a B->A
contrast under the masked graph, four sequences that share the prompt and most blocks. The
packed path hands all of them to `packed_target_nll` (shared leading blocks laid out once, one
forward per batch of rows); the naive path scores every sequence in a forward pass of its own
(shared_prefix=False). Embedded SmolLM2, fp32, CPU; medians over repeats after one warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from fairaudit.backends import Block, NLLRequest
from fairaudit.backends.graphs import packed_target_nll, tree_length
from fairaudit.models.locate import embedded_model_dir
from fairaudit.probes.influence import visibility

WORDS = ("the proposer weighs each option against the facts it knows and the verifier checks whether the claimed "
         "answer follows from the question before it gives a verdict on the public claim ").split()


def block(tokenizer, i: int, tokens: int, role: str = "", channel: str = "public") -> Block:
    text = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(tokens * 2))
    return Block(tuple(tokenizer.encode(text, add_special_tokens=False)[:tokens]), role, channel)


def contrast_requests(tokenizer, traces: int, tokens: int) -> list[NLLRequest]:
    """Per trace: A->B natural and donor, B->A natural and donor (after a bridge), masked graph."""
    requests = []
    for i in range(traces):
        chat = tokenizer.apply_chat_template([{"role": "user", "content": f"Question {i}: " + " ".join(WORDS)}],
                                             add_generation_prompt=True, tokenize=False)
        prompt = Block(tuple(tokenizer.encode(chat, add_special_tokens=False)))
        a_priv, a_pub = block(tokenizer, i, tokens, "A", "private"), block(tokenizer, i + 1, tokens, "A", "public")
        b_priv, b_pub = block(tokenizer, i + 2, tokens, "B", "private"), block(tokenizer, i + 3, tokens, "B", "public")
        bridge, a2 = block(tokenizer, 0, 8), block(tokenizer, i + 4, tokens, "A", "private")
        donor_a = block(tokenizer, i + 7, tokens, "A", "private")
        donor_b = block(tokenizer, i + 9, tokens, "B", "private")
        first = (prompt, a_priv, a_pub, b_priv, b_pub)
        full = first + (bridge, a2)
        for blocks, x, donor, target in ((first, 1, donor_a, (3, 4)), (full, 3, donor_b, (6,))):
            graph = visibility(blocks, "masked")
            swapped = blocks[:x] + (donor,) + blocks[x + 1:]
            requests += [NLLRequest(blocks, target, graph), NLLRequest(swapped, target, graph)]
    return requests


def timed(fn, repeats: int) -> tuple[float, object]:
    fn()
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=4)
    parser.add_argument("--block-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model_dir = embedded_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    packed_requests = contrast_requests(tokenizer, args.traces, args.block_tokens)
    naive_requests = [NLLRequest(r.blocks, r.target, r.visibility, shared_prefix=False) for r in packed_requests]
    contrasts = len(packed_requests) // 2
    packed_s, packed = timed(lambda: packed_target_nll(model, packed_requests, pad_id=0), args.repeats)
    naive_s, naive = timed(lambda: packed_target_nll(model, naive_requests, pad_id=0), args.repeats)
    tokens_packed = sum(tree_length([r for r in packed_requests if r.blocks[0] == p])
                        for p in dict.fromkeys(r.blocks[0] for r in packed_requests))
    tokens_naive = sum(sum(len(b.ids) for b in r.blocks) for r in packed_requests)
    print(f"{args.traces} traces, {contrasts} contrasts, blocks of {args.block_tokens} tokens, "
          f"{torch.get_num_threads()} threads")
    print(f"tokens per forward: packed {tokens_packed}, naive {tokens_naive}")
    print(f"packed: {packed_s / contrasts * 1000:.1f} ms per contrast ({packed_s:.2f} s)")
    print(f"naive:  {naive_s / contrasts * 1000:.1f} ms per contrast ({naive_s:.2f} s)")
    print(f"ratio packed / naive: {packed_s / naive_s:.3f}")
    print(f"largest |packed - naive| NLL: {np.abs(packed - naive).max():.2e} nats/token")


if __name__ == "__main__":
    main()
