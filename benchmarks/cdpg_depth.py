"""Time CDPG depth reads: packed (one pass per batch of traces) against the naive re-feed and one plain forward.

    python benchmarks/cdpg_depth.py [--model-dir DIR] [--traces 2] [--trace-tokens 500] [--K 10] [--repeats 3]

Runs on the embedded SmolLM2 (fp32, CPU) by default. The naive path batches the K
prefixes of a trace together (left-padded), as a backend without packing would. Every
timing is the median over repeats after one warm-up, the paths interleaved in one process.
Targets: packed <= 0.25x the naive re-feed and <= 1.5x one plain forward pass over
prompt + trace (the floor).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from fairaudit.analysis.cdpg import segment_cuts
from fairaudit.backends import DepthRequest
from fairaudit.backends.packing import naive_depth_probs, packed_depth_probs
from fairaudit.backends.tensors import left_pad
from fairaudit.models.locate import embedded_model_dir

PROFILE = (
    "A {age}-year-old person works in {job} for {hours} hours a week. They completed {education}, are married, "
    "and were born in the United States. Their capital gain last year was {gain} dollars.\n"
    "Question: Does this person earn more than $50K per year? Answer with a single word: Yes or No."
)
REASONING = (
    "Let me weigh the evidence. The occupation usually pays a middle income, and the weekly hours are full time. "
    "Education matters a lot for income, so a degree raises the odds. Age also matters: earnings tend to peak in "
    "the forties and fifties. A capital gain suggests investments, which is more common above the threshold. "
    "On the other hand, many people in this job earn below fifty thousand dollars. "
)
SUFFIX = "\n</think>\n\nAnswer:"


def build_requests(tokenizer, n_traces: int, trace_tokens: int, K: int) -> list[DepthRequest]:
    """Chat-formatted profile prompts with a reasoning trace cut to exactly `trace_tokens` tokens."""
    requests = []
    for i in range(n_traces):
        profile = PROFILE.format(age=30 + 7 * i, job=["sales", "teaching", "repair"][i % 3], hours=40 + i,
                                 education="a bachelor's degree", gain=1000 * i)
        messages = [{"role": "user", "content": profile}]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt_ids = tuple(tokenizer.encode(prompt, add_special_tokens=False))
        trace = tokenizer.encode(REASONING * (trace_tokens // 40 + 2), add_special_tokens=False)[i : i + trace_tokens]
        suffix = tuple(tokenizer.encode(SUFFIX, add_special_tokens=False))
        requests.append(DepthRequest(prompt_ids, tuple(trace), suffix, tuple(segment_cuts(len(trace), K))))
    return requests


@torch.inference_mode()
def plain_forward(model, requests, pad_id: int) -> None:
    """The floor: one forward over prompt + trace per trace (batched), reading only the last position."""
    ids, mask = left_pad([r.prompt_ids + r.trace_ids for r in requests], pad_id)
    model(input_ids=ids, attention_mask=mask, logits_to_keep=1)


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default=None, help="HF model folder (default: the embedded SmolLM2)")
    parser.add_argument("--traces", type=int, default=2)
    parser.add_argument("--trace-tokens", type=int, default=500)
    parser.add_argument("--K", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    model_dir = args.model_dir or embedded_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    requests = build_requests(tokenizer, args.traces, args.trace_tokens, args.K)
    choices = [tokenizer.encode(w, add_special_tokens=False) for w in ("Yes", "No")]
    paths = {
        "plain forward (floor)": lambda: plain_forward(model, requests, pad_id),
        "packed": lambda: packed_depth_probs(model, requests, choices, pad_id=pad_id),
        "naive": lambda: naive_depth_probs(model, requests, choices, pad_id=pad_id, batch_size=args.K),
    }
    warm_up = {name: fn() for name, fn in paths.items()}
    times = {name: [] for name in paths}
    for _ in range(args.repeats):  # interleaved, so load drifts hit every path alike
        for name, fn in paths.items():
            times[name].append(seconds(fn))
    median = {name: statistics.median(t) for name, t in times.items()}

    max_diff = max(float(np.abs(p - n).max()) for p, n in zip(warm_up["packed"], warm_up["naive"]))
    prompt_tokens = len(requests[0].prompt_ids)
    print(f"model {model_dir} ({model.config.model_type}, {model.dtype}, {model.config._attn_implementation}), "
          f"torch threads {torch.get_num_threads()}")
    print(f"{args.traces} traces x {args.trace_tokens} tokens, prompt {prompt_tokens} tokens, "
          f"suffix {len(requests[0].suffix_ids)} tokens, K={args.K}; median of {args.repeats} repeats after a warm-up")
    for name, value in median.items():
        print(f"  {name:24s} {value:8.3f} s   (runs: {', '.join(f'{t:.2f}' for t in times[name])})")
    ratio_naive = median["packed"] / median["naive"]
    ratio_floor = median["packed"] / median["plain forward (floor)"]
    for label, ratio, target in (("packed / naive", ratio_naive, 0.25), ("packed / plain forward", ratio_floor, 1.5)):
        print(f"{label + ':':31s}{ratio:.3f}   target <= {target}: {'met' if ratio <= target else 'MISSED'}")
    print(f"max |P packed - P naive|:      {max_diff:.2e}")


if __name__ == "__main__":
    main()
