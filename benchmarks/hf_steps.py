"""The hf backend's overhead per decoding step, against a plain `model.generate` loop, in one process.

    python benchmarks/hf_steps.py                # tiny_qwen3, CPU: 64 Adult think prompts, batches of 8, 24 tokens
    python benchmarks/hf_steps.py --n 32 --new 48

Each path generates the same greedy continuations of the same prompts (the think arm's, rendered by
the project), in the same batches of --batch prompts of similar length:
- forward loop: one forward per step on the KV cache and an argmax, written out (what `generate` costs itself);
- plain: `model.generate` on the left-padded batch, the call the backend makes (the floor the ratios divide by);
- backend: `HFBackend.generate` (padding, the call, cutting at stop ids, decoding);
- client: `CachingClient.generate` on a fresh store (store keys, reads and commits around the backend);
- records: the think arm's whole record path, `probes.decisions.decide` (tokenizing, generation, P(Yes)
  reads of prompt + trace, parsing), on a fresh store.
The per-step cost of a path is (time at --new tokens - time at 1 token) / (--new - 1); the rest is per call.
Paths alternate over --repeats rounds and the median is kept, so a shared machine's load hits them alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fairaudit.backends import GenerationRequest
from fairaudit.backends.hf import HFBackend
from fairaudit.backends.tensors import left_pad, next_cache, positions_after_left_pad
from fairaudit.data.tabular import CounterfactualTabular
from fairaudit.models.locate import tiny_qwen3_dir
from fairaudit.probes import AuditContext, ModelSpec
from fairaudit.probes.decisions import decide, encode, render_prompts
from fairaudit.prompts.yesno import Arm, Thinking
from fairaudit.store.client import CachingClient
from fairaudit.store.results import Store


def plain(backend: HFBackend, requests: list[GenerationRequest]) -> None:
    """`model.generate` per batch, batches as the backend forms them (similar lengths together)."""
    for batch in backend._batches([len(r.prompt_ids) for r in requests]):
        ids, mask = left_pad([requests[i].prompt_ids for i in batch], backend.pad_id)
        backend.model.generate(input_ids=ids, attention_mask=mask, do_sample=False, top_k=None,
                               max_new_tokens=requests[batch[0]].max_new_tokens, pad_token_id=backend.pad_id)


@torch.inference_mode()
def forward_loop(backend: HFBackend, requests: list[GenerationRequest]) -> None:
    """The decoding loop by hand: one forward per step on the KV cache, argmax, no `generate` machinery."""
    model = backend.model
    for batch in backend._batches([len(r.prompt_ids) for r in requests]):
        ids, mask = left_pad([requests[i].prompt_ids for i in batch], backend.pad_id)
        positions = positions_after_left_pad(mask)
        step = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        for _ in range(requests[batch[0]].max_new_tokens - 1):
            tokens = step.logits[:, -1].argmax(-1, keepdim=True)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            positions = positions[:, -1:] + 1
            step = model(input_ids=tokens, attention_mask=mask, position_ids=positions, use_cache=True,
                         **next_cache(step))


def timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=64, help="prompts (Adult think prompts, 2 per pair)")
    parser.add_argument("--new", type=int, default=24, help="new tokens per prompt (tiny_qwen3's think budget)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    backend = HFBackend(tiny_qwen3_dir(), device="cpu", batch_size=args.batch)
    data = CounterfactualTabular("adult", args.n // 2, 0, "sex", "Male", "Female",
                                 "Does this person earn more than $50K per year?",
                                 "{description}\nQuestion: {question} Answer with a single word: Yes or No.",
                                 os.environ.get("FAIRAUDIT_DATA"))
    spec = ModelSpec("tiny_qwen3", Thinking(style="native"), {"enable_thinking": True}, answer_source="forced")
    pairs = data.pairs()

    def context(budget: int) -> AuditContext:
        client = CachingClient(backend, Store(Path(tempfile.mkdtemp()) / "store.sqlite"), chunk_size=args.batch)
        return AuditContext(client, backend.tokenizer, spec, data, Arm("think", True, budget))

    prompts = [encode(backend.tokenizer, p) for p in render_prompts(context(1), pairs, Arm("think", True, 1))]
    print(f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
          f"batches of {args.batch}, {torch.get_num_threads()} torch threads, load {os.getloadavg()[0]:.1f}",
          flush=True)
    paths = {
        "forward loop by hand": lambda new: forward_loop(backend, [GenerationRequest(p, new) for p in prompts]),
        "plain model.generate": lambda new: plain(backend, [GenerationRequest(p, new) for p in prompts]),
        "HFBackend.generate": lambda new: backend.generate([GenerationRequest(p, new) for p in prompts]),
        "CachingClient.generate":
            lambda new: context(new).client.generate([GenerationRequest(p, new) for p in prompts]),
        "decide (think records)": lambda new: decide(context(new), pairs, Arm("think", True, new)),
    }
    paths["plain model.generate"](2)  # warm-up: the weights load, the kernels settle
    times = {(name, new): [] for name in paths for new in (1, args.new)}
    for _ in range(args.repeats):
        for name, run in paths.items():
            for new in (1, args.new):
                times[(name, new)].append(timed(lambda: run(new)))
    floor = statistics.median(times[("plain model.generate", args.new)])
    batches = -(-len(prompts) // args.batch)
    print(f"\n{'path':26s}{'s at ' + str(args.new):>10s}{'s at 1':>9s}{'ms/step/batch':>15s}{'x plain':>9s}")
    for name in paths:
        full, one = (statistics.median(times[(name, new)]) for new in (args.new, 1))
        step = (full - one) / (args.new - 1) / batches * 1000
        print(f"{name:26s}{full:10.2f}{one:9.2f}{step:15.1f}{full / floor:9.2f}")
    print(f"\nload average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
