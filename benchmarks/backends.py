"""The same audit work on the hf, vllm, openai and llamacpp backends: think-arm generations, their choice reads,
CDPG depth reads.

    python benchmarks/backends.py [HYDRA OVERRIDES] [--pairs 32] [--max-tokens 256] [--K 10]
        [--backends hf,vllm,openai,llamacpp] [--concurrency 1,8,32] [--base-url http://host:8000/v1]
        [--temperature 0[,1.0]] [--threads 1[,2]] [--same-work [--traces-out F | --traces-in F]] [--trace-tokens 1024]
        [--kv-streams]

Defaults: the embedded SmolLM2 in fp32, 32 Adult pairs (64 think-arm prompts), traces of up to
256 tokens, K = 10. Prompts are rendered by the project exactly as the audit renders them. On a
GPU it runs unchanged with a hub model, e.g. `python benchmarks/backends.py model=qwen3_awq
--base-url http://127.0.0.1:8000/v1` (a `vllm serve` of the same model for the openai column).

Each backend (each concurrency level, thread count and temperature) runs in its own process and loads
first (not timed), then times, from an emptied cache: a prefill pass (a choice read after each bare
prompt: prefill_tok_s), generation (generate_tok_s per generated token; decode_tok_s: the generated
tokens over the generation time less the prompts' prefill at prefill_tok_s), the choice reads after
each trace and the depth reads along it (tokens/s: prompt tokens the reads ask about).

--same-work: every backend scores the same token sequences. The first backend listed generates the
traces once; every backend (that one too) then reads the answer after those traces and along them
(choice and depth reads over identical tokens), while its own generation is timed per generated token.
all_same_s is the work of the shared traces: the prompts' prefill, the shared traces' tokens at this
backend's decode rate, and its choice and depth reads of them; depth_share_same is the depth reads'
part of the generation that share assumes.
--trace-tokens N: long traces: sampling at temperature 1.0 with the stop ids cleared (vLLM: ignore_eos),
so every trace runs to exactly N tokens; with --pairs 4 it measures the depth-read share of generation
at N-token traces.
--threads: torch's threads (hf), n_threads (llamacpp) and the cores vLLM binds (0, 0-1, ...) per run.

On CPU the vllm engine runs eager with a 2 GiB KV cache and 32-token KV blocks (override with backend.*
settings); llamacpp holds up to 128 sequences in 32,768 KV cells, so the reads reuse what generation
computed (--kv-streams: a KV stream per sequence, 128 streams of 512 cells, 32 of 2,048 with --trace-tokens).
Without --base-url the openai column starts one local vLLM server on the model folder with the
same CPU settings, and empties its prefix cache before each concurrency level. llamacpp times prefill
and decode itself too (prefill_tokens_per_s, decode_tokens_per_s: tokens computed per second of
llama_decode). peak_rss_mib: the backend process's peak resident memory; *_cpu_s: CPU seconds of the
backend process per phase (every thread), which a busy machine distorts less than wall time.
llamacpp runs in .venv-llamacpp (`.venv-llamacpp/bin/python benchmarks/backends.py --backends hf,llamacpp`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing
import os
import queue as queues
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
from fairaudit.backends import DepthRequest, GenerationRequest
from fairaudit.backends.vllm import free_engine
from fairaudit.backends.vllm_server import free_port, served
from fairaudit.job.config import ModelSource, model_spec
from fairaudit.probes import AuditContext
from fairaudit.probes.decisions import answer_choices, answer_parts_all, encode, render_prompts
from fairaudit.prompts.yesno import Arm, split_output

CONF = Path(__file__).resolve().parents[1] / "conf"
CPU_BLOCK_SIZE = 32  # vLLM's CPU default, 128 tokens, leaves most of a depth read's prompt outside the prefix cache
CPU_VLLM = ["backend.enforce_eager=true", "backend.kv_cache_space_gib=2", f"backend.block_size={CPU_BLOCK_SIZE}"]
CPU_SERVER = ("--block-size", str(CPU_BLOCK_SIZE))
# llama.cpp holds every think-arm sequence between phases (64 x ~250 tokens; 0.36 GiB of float16 KV cache for SmolLM2),
# so choice and depth reads extend what generation left in the cache, as vLLM's 2 GiB prefix cache does
LLAMACPP = ["backend.n_ctx=32768", "backend.n_seq_max=128"]
# --kv-streams: a KV stream per sequence, 128 streams of 512 cells (a think-arm sequence: ~220 prompt + 256 + suffix),
# 32 of 2,048 for --trace-tokens 1024
LLAMACPP_STREAMS = ["backend.kv_streams=true", "backend.n_ctx=65536"]
SHOWN = ("generated_tokens", "generate_tok_s", "prefill_tok_s", "decode_tok_s", "prefill_tokens_per_s",
         "decode_tokens_per_s", "choice_tok_s", "depth_reads", "depth_tok_s", "depth_over_generate", "all_s",
         "all_same_s", "depth_share_same", "all_cpu_s", "peak_rss_mib")
RATIOS = ("generate_tok_s", "prefill_tok_s", "decode_tok_s", "choice_tok_s", "depth_tok_s", "peak_rss_mib")


def compose_config(backend: str, overrides: list[str], pairs: int, max_tokens: int, threads: int | None = None,
                   kv_streams: bool = False, long: bool = False):
    streams = [*LLAMACPP_STREAMS, f"backend.n_seq_max={32 if long else 128}"]
    cpu = {"vllm": [] if torch.cuda.is_available() else CPU_VLLM,
           "llamacpp": streams if kv_streams else LLAMACPP}.get(backend, [])
    if threads and backend == "vllm" and not torch.cuda.is_available():
        cores = "0" if threads == 1 else f"0-{threads - 1}"
        cpu = [*cpu, f"backend.cpu_threads_bind='{cores}'"]  # quoted: the string "0", not Hydra's integer 0
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=[f"backend={backend}", f"dataset.n={pairs}",
                                            f"model.max_think_tokens={max_tokens}", *cpu, *overrides])


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


def cold(backend) -> None:
    """Empty what the engine holds of earlier sequences (llama.cpp's KV cache, vLLM's prefix cache; hf keeps none)."""
    engine = getattr(backend, "engine", None)
    if hasattr(engine, "clear"):
        engine.clear()
    elif hasattr(engine, "reset_prefix_cache"):
        engine.reset_prefix_cache()


def run_to_budget(backend) -> None:
    """Long traces: no stop id ends a generation, so every trace runs to its max_new_tokens."""
    backend.stop_ids = set()
    if backend.name == "vllm":
        import vllm.entrypoints.llm  # loaded before the patch: its annotations compose the real SamplingParams

        vllm.SamplingParams = functools.partial(vllm.SamplingParams, ignore_eos=True)


def audit_work(cfg, temperature: float, trace_tokens: int | None):
    """The backend (untimed load), its audit context and the think-arm generation requests."""
    backend = ModelSource.composed(cfg).backend()
    arm = Arm(**OmegaConf.to_container(cfg.arm, resolve=True))
    # no client: the backend is timed, not the store
    ctx = AuditContext(None, backend.tokenizer, model_spec(cfg.model), instantiate(cfg.dataset), arm)
    prompts = render_prompts(ctx, ctx.dataset.pairs(), arm)
    if trace_tokens:
        run_to_budget(backend)
        temperature = temperature or 1.0
    sampled = dict(temperature=temperature, top_p=0.95) if temperature else {}
    budget = trace_tokens or arm.max_new_tokens
    requests = [GenerationRequest(encode(backend.tokenizer, p), budget, seed=i if temperature else None, **sampled)
                for i, p in enumerate(prompts)]
    return backend, ctx, prompts, requests


def run_backend(cfg, K: int, temperature: float, shared: list[DepthRequest] | None = None,
                trace_tokens: int | None = None) -> dict:
    """Load the backend (untimed), then time prefill, generation, choice reads and depth reads of the think arm.

    temperature > 0: seeded nucleus sampling (top_p 0.95, request i has seed i) instead of greedy decoding.
    shared: the traces every backend reads (same-work mode); None: this backend's own. The figures carry the
    traces read (`parts`) for the next backend.
    """
    backend, ctx, prompts, requests = audit_work(cfg, temperature, trace_tokens)
    choices = answer_choices(ctx)
    backend.choice_probs([requests[0].prompt_ids], choices)  # load the weights / start the engine, untimed
    cold(backend)
    _, t_prefill = timed(lambda: backend.choice_probs([r.prompt_ids for r in requests], choices), "prefill")
    cold(backend)
    completions, t_gen = timed(lambda: backend.generate(requests), "generate")
    outputs = [split_output(p, c.text, ctx.arm, ctx.model.thinking) for p, c in zip(prompts, completions)]
    parts = shared or answer_parts_all(ctx, prompts, [o.trace for o in outputs], ctx.arm)
    prefixes = [x.prompt_ids + x.trace_ids + x.suffix_ids for x in parts]
    _, t_choice = timed(lambda: backend.choice_probs(prefixes, choices), "choice")
    depth = [replace(x, cuts=tuple(segment_cuts(len(x.trace_ids), K))) for x in parts]
    _, t_depth = timed(lambda: backend.depth_choice_probs(depth, choices), "depth")
    generated = sum(len(c.token_ids) for c in completions)
    prompt_tokens = sum(len(r.prompt_ids) for r in requests)
    figures = {
        "all_s": t_gen + t_choice + t_depth, "generations": len(requests), "generated_tokens": generated,
        "generate_s": t_gen, "generate_tok_s": generated / t_gen, "prompt_tokens": prompt_tokens,
        "prefill_s": t_prefill, "prefill_tok_s": prompt_tokens / t_prefill,
        "choice_s": t_choice, "choice_tok_s": sum(map(len, prefixes)) / t_choice,
        "depth_reads": sum(len(x.cuts) for x in depth), "depth_s": t_depth,
        "depth_tok_s": sum(len(x.prompt_ids) + cut + len(x.suffix_ids) for x in depth for cut in x.cuts) / t_depth,
        "depth_over_generate": t_depth / t_gen, "read_tokens": sum(len(x.trace_ids) for x in parts),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        **{f"{phase}_cpu_s": seconds for phase, seconds in CPU_SECONDS.items()},
        "all_cpu_s": sum(v for k, v in CPU_SECONDS.items() if k != "prefill"),
    }
    decode_s = t_gen - t_prefill  # generation less its prompts' prefill
    figures["decode_tok_s"] = generated / decode_s if decode_s > 0 else float("nan")
    # the shared traces' work at this backend's rates: prefill of the prompts, their tokens decoded, their reads
    generation_same = t_prefill + figures["read_tokens"] / figures["decode_tok_s"]
    figures["all_same_s"] = generation_same + t_choice + t_depth
    figures["depth_share_same"] = t_depth / generation_same
    figures.update(backend.metrics())
    figures["parts"] = [(x.prompt_ids, x.trace_ids, x.suffix_ids) for x in parts]
    return figures


def measure(queue, backend: str, overrides: list[str], args: argparse.Namespace, temperature: float = 0.0,
            threads: int | None = None, shared: list | None = None) -> None:
    try:
        if threads:
            torch.set_num_threads(threads)
        cfg = compose_config(backend, overrides, args.pairs, args.max_tokens, threads, args.kv_streams,
                             bool(args.trace_tokens))
        parts = [DepthRequest(*map(tuple, x)) for x in shared] if shared else None
        queue.put(run_backend(cfg, args.K, temperature, parts, args.trace_tokens))
    finally:
        free_engine()  # now: at exit, multiprocessing would wait for the engine's worker before atexit stops it


def in_fresh_process(*args, threads: int | None = None, **kwargs) -> dict:
    """`measure` in a spawned process, so each backend starts with the machine's (or GPU's) whole memory."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    if threads:  # read by torch and llama.cpp (n_threads) when the child starts
        os.environ["OMP_NUM_THREADS"] = str(threads)
    process = context.Process(target=measure, args=(queue, *args), kwargs={**kwargs, "threads": threads})
    process.start()
    result = None
    while result is None and (process.is_alive() or not queue.empty()):  # read before join: the traces fill the pipe
        with contextlib.suppress(queues.Empty):
            result = queue.get(timeout=1)
    process.join()
    if process.exitcode != 0 or result is None:
        raise SystemExit(f"the {args[0]} run failed (exit code {process.exitcode})")
    return result


@contextlib.contextmanager
def openai_server(base_url: str | None, overrides: list[str]):
    """The given server's URL, or a local vLLM server on the configured model, stopped on exit."""
    if base_url:
        yield base_url
        return
    cfg = compose_config("hf", overrides, 1, 1)
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # serves POST /reset_prefix_cache
    cpu = () if torch.cuda.is_available() else CPU_SERVER
    with served(ModelSource.composed(cfg).folder(), [free_port()], kv_cache_gib=2, extra_args=cpu) as (url,):
        yield url


def reset_prefix_cache(base_url: str) -> bool:
    """Empty a vLLM server's prefix cache (dev mode only); False where the server does not offer it."""
    with contextlib.suppress(httpx.HTTPError):
        return httpx.post(base_url.removesuffix("/v1") + "/reset_prefix_cache", timeout=60).status_code == 200
    return False


def openai_columns(args, levels: list[int], temperature: float) -> dict[str, dict]:
    """The work through one server at each max_concurrency, each level from an empty prefix cache."""
    results = {}
    with openai_server(args.base_url, args.overrides) as url:
        for level in levels:
            if not reset_prefix_cache(url):
                print(f"note: {url} has no /reset_prefix_cache; level {level} may reuse earlier levels' prefixes")
            overrides = [*args.overrides, f"backend.base_url={url}", f"backend.max_concurrency={level}"]
            results[f"openai@{level}"] = in_fresh_process("openai", overrides, args, temperature)
            report(f"openai@{level}", results[f"openai@{level}"])
    return results


def report(name: str, figures: dict) -> None:
    print(name, {k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items() if k != "parts"}, flush=True)


def ratio_lines(results: dict[str, dict]) -> list[str]:
    """Each backend's figures over hf's (each openai level's over the offline vllm engine's): rates, then work."""
    base_of = {name: "hf" for name in results if name != "hf" and not name.startswith("openai@")}
    base_of.update({name: "vllm" for name in results if name.startswith("openai@")})
    lines = []
    for name, base in base_of.items():
        if base not in results:
            continue
        ours, theirs = results[name], results[base]
        speedups = [f"{key} {ours[key] / theirs[key]:.2f}" for key in RATIOS if key in ours and key in theirs]
        work = [f"{label} {theirs[key] / ours[key]:.2f}" for label, key in
                (("all work", "all_s"), ("same work", "all_same_s"), ("CPU seconds", "all_cpu_s"))]
        lines.append(f"{name} / {base}: " + ", ".join(speedups + work))
    return lines


def print_table(results: dict[str, dict], title: str = "") -> None:
    """Figures side by side, then the ratios (`ratio_lines`)."""
    print(f"\n{title:24}" + "".join(f"{name:>12}" for name in results))
    for key in SHOWN:
        print(f"{key:24}" + "".join(f"{r.get(key, float('nan')):>12.3g}" for r in results.values()))
    for line in ratio_lines(results):
        print(line)


def traces_file(stem: str, temperature: float, threads: int | None) -> Path:
    return Path(f"{stem}.threads{threads or 0}.T{temperature:g}.json")


def run_columns(args, temperature: float, threads: int | None) -> dict[str, dict]:
    """Every listed backend at one temperature and thread count; in same-work mode, the first one's traces for all
    (or those of --traces-in: another environment's run, e.g. vllm's, reads the traces hf generated in this one)."""
    results: dict[str, dict] = {}
    shared = json.loads(traces_file(args.traces_in, temperature, threads).read_text()) if args.traces_in else None
    for name in args.backends.split(","):
        if name == "openai":
            results.update(openai_columns(args, [int(level) for level in args.concurrency.split(",")], temperature))
            continue
        results[name] = in_fresh_process(name, args.overrides, args, temperature, threads=threads, shared=shared)
        report(name, results[name])
        if args.same_work and shared is None:
            shared = results[name]["parts"]
            if args.traces_out:
                traces_file(args.traces_out, temperature, threads).write_text(json.dumps(shared))
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*",
                        help="Hydra overrides, e.g. model=qwen3_awq backend.tensor_parallel_size=2")
    parser.add_argument("--pairs", type=int, default=32, help="Adult pairs; two think-arm prompts each")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--K", type=int, default=10)
    parser.add_argument("--backends", default="hf,vllm,openai")
    parser.add_argument("--concurrency", default="1,8,32", help="openai: the max_concurrency levels")
    parser.add_argument("--base-url",
                        help="openai: a running server (.../v1) of the same model; default: start one here")
    parser.add_argument("--temperature", default="0", help="comma-separated; > 0: seeded sampling (longer traces)")
    parser.add_argument("--threads", default="", help="comma-separated thread counts, one run each (default: as set)")
    parser.add_argument("--same-work", action="store_true", help="every backend reads the first backend's traces")
    parser.add_argument("--trace-tokens", type=int, help="long traces of exactly this many tokens (temperature 1.0)")
    parser.add_argument("--traces-out", help="same-work: write the shared traces to FILE.threads<n>.T<t>.json")
    parser.add_argument("--traces-in", help="same-work: read the shared traces from what --traces-out wrote")
    parser.add_argument("--kv-streams", action="store_true",
                        help="llamacpp: one KV stream per sequence (LLAMACPP_STREAMS)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    use_every_core()
    tables = {}
    for threads in [int(t) for t in args.threads.split(",") if t] or [None]:
        for temperature in [float(t) for t in args.temperature.split(",")]:
            title = f"threads={threads or 'default'} T={temperature:g}" + (" same work" if args.same_work else "")
            tables[title] = run_columns(args, temperature, threads)
            print_table(tables[title], title)
    return tables


if __name__ == "__main__":
    main()
