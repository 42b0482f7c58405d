"""The same audit work on the hf, vllm, openai and llamacpp backends: think-arm generations, their choice reads,
CDPG depth reads.

    python benchmarks/backends.py [HYDRA OVERRIDES] [--pairs 32] [--max-tokens 256] [--K 10]
        [--backends hf,vllm,openai,llamacpp] [--concurrency 1,8,32] [--base-url http://host:8000/v1] [--temperature 0]

Defaults: the embedded SmolLM2 in fp32, 32 Adult pairs (64 think-arm prompts), traces of up to
256 tokens, K = 10. Prompts are rendered by the project exactly as the audit renders them. On a
GPU it runs unchanged with a hub model, e.g. `python benchmarks/backends.py model=qwen3_awq
--base-url http://127.0.0.1:8000/v1` (a `vllm serve` of the same model for the openai column).
On CPU the vllm engine runs eager with a 2 GiB KV cache and 32-token KV blocks (override with
backend.* settings) on every core the process may use (VLLM_CPU_OMP_THREADS_BIND, unless set);
llamacpp holds up to 128 sequences in 32,768 KV cells, so the reads reuse what generation computed.
Without --base-url the openai column starts one local vLLM server on the model folder with the
same CPU settings, and empties its prefix cache before each concurrency level, so every level
does the same work from cold.
Each backend (and each concurrency level) runs in its own process and loads first (not timed),
then each phase is timed once; tokens/s counts generated tokens for generation and prompt
tokens fed for the reads. Prefill and decode are printed apart: llamacpp times them itself
(prefill_tokens_per_s, decode_tokens_per_s: tokens computed per second of llama_decode); for
every backend, decode_tok_s_derived is the generated tokens over the generation time less the
prompts' prefill at the choice reads' rate. peak_rss_mib: the backend process's peak resident memory;
*_cpu_s: CPU seconds of the backend process per phase (every thread), which a busy machine distorts less than wall time.
llamacpp runs in .venv-llamacpp (`.venv-llamacpp/bin/python benchmarks/backends.py --backends hf,llamacpp`).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import resource
import time
from dataclasses import replace
from pathlib import Path

import httpx
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fairaudit.analysis.cdpg import segment_cuts
from fairaudit.app import model_dir_for, model_spec
from fairaudit.backends import GenerationRequest
from fairaudit.backends.vllm import free_engine
from fairaudit.backends.vllm_server import free_port, served
from fairaudit.probes import AuditContext
from fairaudit.probes.decisions import answer_choices, answer_parts, encode, render_prompts
from fairaudit.prompts.yesno import Arm, split_output

CONF = Path(__file__).resolve().parents[1] / "conf"
CPU_BLOCK_SIZE = 32  # vLLM's CPU default, 128 tokens, leaves most of a depth read's prompt outside the prefix cache
CPU_VLLM = ["backend.enforce_eager=true", "backend.kv_cache_space_gib=2", f"backend.block_size={CPU_BLOCK_SIZE}"]
CPU_SERVER = ("--block-size", str(CPU_BLOCK_SIZE))
# llama.cpp holds every think-arm sequence between phases (64 x ~250 tokens; 0.36 GiB of float16 KV cache for SmolLM2),
# so choice and depth reads extend what generation left in the cache, as vLLM's 2 GiB prefix cache does
LLAMACPP = ["backend.n_ctx=32768", "backend.n_seq_max=128"]


def compose_config(backend: str, overrides: list[str], pairs: int, max_tokens: int):
    cpu = {"vllm": [] if torch.cuda.is_available() else CPU_VLLM, "llamacpp": LLAMACPP}.get(backend, [])
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=[f"backend={backend}", f"dataset.n={pairs}", f"model.max_think_tokens={max_tokens}",
                                             *cpu, *overrides])


def use_every_core() -> None:
    """On CPU, let vLLM compute on every core the process may use, as torch does for hf.

    vLLM's default keeps one core for its front end: half of a 2-core machine. An explicit
    VLLM_CPU_OMP_THREADS_BIND is left as it is.
    """
    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, sorted(os.sched_getaffinity(0)))))


CPU_SECONDS: dict[str, float] = {}  # phase -> CPU seconds of this process (every thread), robust to a busy machine


def timed(work, phase: str):
    start, cpu = time.perf_counter(), time.process_time()
    out = work()
    CPU_SECONDS[phase] = time.process_time() - cpu
    return out, time.perf_counter() - start


def run_backend(cfg, K: int, temperature: float) -> dict[str, float]:
    """Load the backend (untimed), then time generation, choice reads and depth reads of the think arm.

    temperature > 0: seeded nucleus sampling (top_p 0.95, request i has seed i) instead of greedy decoding.
    """
    backend = instantiate(cfg.backend, model_dir=str(model_dir_for(cfg)), dtype=cfg.model.dtype, batch_size=cfg.model.batch_size)
    arm = Arm(**OmegaConf.to_container(cfg.arm, resolve=True))
    ctx = AuditContext(backend, backend.tokenizer, model_spec(cfg.model), instantiate(cfg.dataset), arm)
    prompts = render_prompts(ctx, ctx.dataset.pairs(), arm)
    sampled = dict(temperature=temperature, top_p=0.95) if temperature else {}
    requests = [GenerationRequest(encode(backend.tokenizer, p), arm.max_new_tokens, seed=i if temperature else None, **sampled)
                for i, p in enumerate(prompts)]
    choices = answer_choices(ctx)
    backend.choice_probs([requests[0].prompt_ids], choices)  # load the weights / start the engine, untimed

    completions, t_gen = timed(lambda: backend.generate(requests), "generate")
    outputs = [split_output(p, c.text, arm, ctx.model.thinking) for p, c in zip(prompts, completions)]
    parts = [answer_parts(ctx, p, o.trace, arm) for p, o in zip(prompts, outputs)]
    prefixes = [x.prompt_ids + x.trace_ids + x.suffix_ids for x in parts]
    _, t_choice = timed(lambda: backend.choice_probs(prefixes, choices), "choice")
    depth = [replace(x, cuts=tuple(segment_cuts(len(x.trace_ids), K))) for x in parts]
    _, t_depth = timed(lambda: backend.depth_choice_probs(depth, choices), "depth")

    generated = sum(len(c.token_ids) for c in completions)
    prompt_tokens = sum(len(r.prompt_ids) for r in requests)
    depth_fed = sum(len(x.prompt_ids) + cut + len(x.suffix_ids) for x in depth for cut in x.cuts)
    figures = {
        "all_s": t_gen + t_choice + t_depth,
        "generations": len(requests), "generated_tokens": generated, "generate_s": t_gen, "generate_tok_s": generated / t_gen,
        "choice_s": t_choice, "choice_tok_s": sum(map(len, prefixes)) / t_choice, "prompt_tokens": prompt_tokens,
        "depth_reads": sum(len(x.cuts) for x in depth), "depth_s": t_depth, "depth_tok_s": depth_fed / t_depth,
        "depth_over_generate": t_depth / t_gen,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        **{f"{phase}_cpu_s": seconds for phase, seconds in CPU_SECONDS.items()}, "all_cpu_s": sum(CPU_SECONDS.values()),
    }
    prefill_s = prompt_tokens / figures["choice_tok_s"]  # the prompts at the choice reads' rate (both are prefill)
    figures["decode_tok_s_derived"] = generated / (t_gen - prefill_s) if t_gen > prefill_s else float("nan")
    figures.update(backend.metrics())
    return figures


def measure(queue, backend: str, overrides: list[str], args: argparse.Namespace) -> None:
    try:
        queue.put(run_backend(compose_config(backend, overrides, args.pairs, args.max_tokens), args.K, args.temperature))
    finally:
        free_engine()  # now: at exit, multiprocessing would wait for the engine's worker before atexit stops it


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


@contextlib.contextmanager
def openai_server(base_url: str | None, overrides: list[str]):
    """The given server's URL, or a local vLLM server on the configured model, stopped on exit."""
    if base_url:
        yield base_url
        return
    cfg = compose_config("hf", overrides, 1, 1)
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # serves POST /reset_prefix_cache
    cpu = () if torch.cuda.is_available() else CPU_SERVER
    with served(model_dir_for(cfg), [free_port()], kv_cache_gib=2, extra_args=cpu) as (url,):
        yield url


def reset_prefix_cache(base_url: str) -> bool:
    """Empty a vLLM server's prefix cache (dev mode only); False where the server does not offer it."""
    with contextlib.suppress(httpx.HTTPError):
        return httpx.post(base_url.removesuffix("/v1") + "/reset_prefix_cache", timeout=60).status_code == 200
    return False


def openai_columns(args, levels: list[int]) -> dict[str, dict[str, float]]:
    """The work through one server at each max_concurrency, each level from an empty prefix cache."""
    results = {}
    with openai_server(args.base_url, args.overrides) as url:
        for level in levels:
            if not reset_prefix_cache(url):
                print(f"note: {url} has no /reset_prefix_cache; level {level} may reuse earlier levels' prefixes")
            overrides = [*args.overrides, f"backend.base_url={url}", f"backend.max_concurrency={level}"]
            results[f"openai@{level}"] = in_fresh_process("openai", overrides, args)
            report(f"openai@{level}", results[f"openai@{level}"])
    return results


def report(name: str, figures: dict[str, float]) -> None:
    print(name, {k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}, flush=True)


def print_table(results: dict[str, dict[str, float]]) -> None:
    """Figures side by side, then each backend's ratios to hf and each openai level's to the offline vllm engine."""
    print(f"\n{'':24}" + "".join(f"{name:>12}" for name in results))
    for key in ("generated_tokens", "generate_tok_s", "decode_tok_s_derived", "prefill_tokens_per_s", "decode_tokens_per_s",
                "choice_tok_s", "depth_reads", "depth_tok_s", "depth_over_generate", "all_s", "all_cpu_s", "peak_rss_mib"):
        print(f"{key:24}" + "".join(f"{r.get(key, float('nan')):>12.3g}" for r in results.values()))
    pairs = [(name, "hf") for name in ("vllm", "llamacpp") if name in results and "hf" in results]
    pairs += [(name, "vllm") for name in results if name.startswith("openai@")]
    for name, base in pairs:
        if {name, base} <= results.keys():
            speedups = [f"{key} {results[name][key] / results[base][key]:.2f}"
                        for key in ("generate_tok_s", "decode_tok_s_derived", "choice_tok_s", "depth_tok_s", "peak_rss_mib")]
            print(f"{name} / {base}: " + ", ".join(speedups) + f", all work {results[base]['all_s'] / results[name]['all_s']:.2f}"
                  f" (CPU seconds {results[base]['all_cpu_s'] / results[name]['all_cpu_s']:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=qwen3_awq backend.tensor_parallel_size=2")
    parser.add_argument("--pairs", type=int, default=32, help="Adult pairs; two think-arm prompts each")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--K", type=int, default=10)
    parser.add_argument("--backends", default="hf,vllm,openai")
    parser.add_argument("--concurrency", default="1,8,32", help="openai: the max_concurrency levels")
    parser.add_argument("--base-url", help="openai: a running server (.../v1) of the same model; default: start one here")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="> 0: seeded sampling, for longer traces on a small model (backends then draw different tokens)")
    args = parser.parse_args()
    use_every_core()
    results = {}
    for name in args.backends.split(","):
        if name == "openai":
            results.update(openai_columns(args, [int(level) for level in args.concurrency.split(",")]))
            continue
        results[name] = in_fresh_process(name, args.overrides, args)
        report(name, results[name])
    print_table(results)


if __name__ == "__main__":
    main()
