"""The same audit work on the hf and vllm backends: think-arm generations, their choice reads, CDPG depth reads.

    python benchmarks/backends.py [HYDRA OVERRIDES] [--pairs 32] [--max-tokens 256] [--K 10] [--backends hf,vllm]

Defaults: the embedded SmolLM2 in fp32, 32 Adult pairs (64 think-arm prompts), traces of up to
256 tokens, K = 10. Prompts are rendered by the project exactly as the audit renders them. On a
GPU it runs unchanged with a hub model, e.g. `python benchmarks/backends.py model=qwen3_awq`.
On CPU the vllm engine runs eager with a 2 GiB KV cache (override with backend.* settings).
Each backend runs in its own process and loads first (not timed), then each phase is timed once; tokens/s counts generated
tokens for generation and prompt tokens fed for the reads.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from dataclasses import replace
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fairaudit.analysis.cdpg import segment_cuts
from fairaudit.app import model_spec
from fairaudit.backends import GenerationRequest
from fairaudit.models import resolve_model_dir
from fairaudit.probes import AuditContext
from fairaudit.probes.decisions import answer_choices, answer_parts, encode, render_prompts
from fairaudit.prompts.yesno import Arm, split_output

CONF = Path(__file__).resolve().parents[1] / "conf"
CPU_VLLM = ["backend.enforce_eager=true", "backend.kv_cache_space_gib=2"]


def compose_config(backend: str, overrides: list[str], pairs: int, max_tokens: int):
    cpu = [] if torch.cuda.is_available() or backend != "vllm" else CPU_VLLM
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=[f"backend={backend}", f"dataset.n={pairs}", f"model.max_think_tokens={max_tokens}",
                                             *cpu, *overrides])


def timed(work):
    start = time.perf_counter()
    out = work()
    return out, time.perf_counter() - start


def run_backend(cfg, K: int) -> dict[str, float]:
    """Load the backend (untimed), then time generation, choice reads and depth reads of the think arm."""
    model_dir = resolve_model_dir(cfg.model.source, cfg.model.path, cfg.model.revision)
    backend = instantiate(cfg.backend, model_dir=str(model_dir), dtype=cfg.model.dtype, batch_size=cfg.model.batch_size)
    arm = Arm(**OmegaConf.to_container(cfg.arm, resolve=True))
    ctx = AuditContext(backend=backend, model=model_spec(cfg.model), dataset=instantiate(cfg.dataset), arm=arm)
    prompts = render_prompts(ctx, ctx.dataset.pairs(), arm)
    requests = [GenerationRequest(encode(backend.tokenizer, p), arm.max_new_tokens) for p in prompts]
    choices = answer_choices(ctx)
    backend.choice_probs([requests[0].prompt_ids], choices)  # load the weights / start the engine, untimed

    completions, t_gen = timed(lambda: backend.generate(requests))
    outputs = [split_output(p, c.text, arm, ctx.model.thinking) for p, c in zip(prompts, completions)]
    parts = [answer_parts(ctx, p, o.trace, arm) for p, o in zip(prompts, outputs)]
    prefixes = [x.prompt_ids + x.trace_ids + x.suffix_ids for x in parts]
    _, t_choice = timed(lambda: backend.choice_probs(prefixes, choices))
    depth = [replace(x, cuts=tuple(segment_cuts(len(x.trace_ids), K))) for x in parts]
    _, t_depth = timed(lambda: backend.depth_choice_probs(depth, choices))

    generated = sum(len(c.token_ids) for c in completions)
    depth_fed = sum(len(x.prompt_ids) + cut + len(x.suffix_ids) for x in depth for cut in x.cuts)
    figures = {
        "generations": len(requests), "generated_tokens": generated, "generate_s": t_gen, "generate_tok_s": generated / t_gen,
        "choice_s": t_choice, "choice_tok_s": sum(map(len, prefixes)) / t_choice,
        "depth_reads": sum(len(x.cuts) for x in depth), "depth_s": t_depth, "depth_tok_s": depth_fed / t_depth,
        "depth_over_generate": t_depth / t_gen,
    }
    if hasattr(backend, "run_metrics"):
        figures.update(backend.run_metrics())
    return figures


def measure(queue, backend: str, overrides: list[str], pairs: int, max_tokens: int, K: int) -> None:
    queue.put(run_backend(compose_config(backend, overrides, pairs, max_tokens), K))


def in_fresh_process(*args) -> dict[str, float]:
    """`measure` in a spawned process, so each backend starts with the machine's (or GPU's) whole memory."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=measure, args=(queue, *args))
    process.start()
    process.join()  # the result is a small dict: it fits the queue's pipe before the child exits
    if process.exitcode != 0:
        raise SystemExit(f"the {args[0]} run failed (exit code {process.exitcode})")
    return queue.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=qwen3_awq backend.tensor_parallel_size=2")
    parser.add_argument("--pairs", type=int, default=32, help="Adult pairs; two think-arm prompts each")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--K", type=int, default=10)
    parser.add_argument("--backends", default="hf,vllm")
    args = parser.parse_args()
    results = {}
    for name in args.backends.split(","):
        results[name] = in_fresh_process(name, args.overrides, args.pairs, args.max_tokens, args.K)
        print(name, {k: round(v, 4) if isinstance(v, float) else v for k, v in results[name].items()}, flush=True)
    print(f"\n{'':24}" + "".join(f"{name:>12}" for name in results))
    for key in ("generated_tokens", "generate_tok_s", "choice_tok_s", "depth_reads", "depth_tok_s", "depth_over_generate"):
        print(f"{key:24}" + "".join(f"{r[key]:>12.3g}" for r in results.values()))
    if {"hf", "vllm"} <= results.keys():
        for key in ("generate_tok_s", "choice_tok_s", "depth_tok_s"):
            print(f"vllm / hf {key}: {results['vllm'][key] / results['hf'][key]:.2f}")


if __name__ == "__main__":
    main()
