"""How fast the audit drives its engine: each stage's tokens/s against the engine's plain API on the same model file,
threads and token counts, measured in the same run.

    .venv-llamacpp/bin/python benchmarks/engine_efficiency.py [--backends llamacpp,hf] [--numerics exact,fast]
        [--pairs 8] [--K 10] [--threads 1] [HYDRA OVERRIDES]

Audit side: the think arm of `--pairs` Adult pairs as the audit renders it, through the backend's own calls
(untimed load first): generation (greedy), a choice read after each trace, depth reads at K cuts along it.
llamacpp's figures are its own timers (`metrics()`: tokens llama_decode computed per second of it, per stage); hf's
are timed around its calls (prompt prefill: a read after each bare prompt; generation: its prompts' prefill
included, as hf's generate cannot be timed without it).
Plain side, on the same file and threads: llama.cpp's high-level API (`llama_cpp.Llama`, its defaults: 512-token
passes, extra CPU buffer types) feeding each prompt alone (prefill), generating each audit sequence's token count
greedily (decode, one sequence at a time: all the plain API offers), and feeding each read's new tokens after its
context (reads: the context untimed); for hf a torch forward per prompt, `generate` per prompt (its prefill
included) and a forward per read sequence. Efficiency = audit tokens/s / plain tokens/s, per stage.
Every second is a CPU second of this process (the engine's timers too), so the two sides, minutes apart on a
shared machine, are not compared across its load swings; with one thread (the default) CPU time is the compute's.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fairaudit.analysis.cdpg import segment_cuts
from fairaudit.backends import GenerationRequest
from fairaudit.job.config import ModelSource, model_spec
from fairaudit.probes import AuditContext
from fairaudit.probes.decisions import answer_choices, answer_parts_all, encode, render_prompts
from fairaudit.prompts.yesno import Arm, split_output

CONF = Path(__file__).resolve().parents[1] / "conf"
STAGES = ("prompt prefill", "generation", "choice reads", "depth reads")
# llamacpp holds every sequence between stages, so reads extend what generation left in the cache
LLAMACPP = ["backend.n_ctx=32768", "backend.n_seq_max=128"]


def compose_config(backend: str, overrides: list[str], pairs: int, numerics: str = "exact"):
    extra = [*LLAMACPP, f"backend.numerics={numerics}"] if backend == "llamacpp" else []
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=[f"backend={backend}", f"dataset.n={pairs}", *extra, *overrides])


def audit_work(cfg, K: int) -> dict:
    """The think arm's sequences: prompts, and after generating (on the backend, not timed here) the reads."""
    backend = ModelSource.composed(cfg).backend()
    arm = Arm(**OmegaConf.to_container(cfg.arm, resolve=True))
    ctx = AuditContext(None, backend.tokenizer, model_spec(cfg.model), instantiate(cfg.dataset), arm)
    prompts = render_prompts(ctx, ctx.dataset.pairs(), arm)
    requests = [GenerationRequest(encode(backend.tokenizer, p), arm.max_new_tokens) for p in prompts]
    return {"backend": backend, "ctx": ctx, "prompts": prompts, "requests": requests, "K": K}


def seconds(work) -> tuple[object, float]:
    """`work()` and the CPU seconds this process spent on it (on one thread, the compute's own time: steadier than
    wall time on a shared machine)."""
    start = time.process_time()
    out = work()
    return out, time.process_time() - start


def run_audit(work: dict) -> dict:
    """Time the audit's stages on its backend; the token counts the plain side repeats come back with them."""
    backend, ctx, requests = work["backend"], work["ctx"], work["requests"]
    choices = answer_choices(ctx)
    backend.choice_probs([requests[0].prompt_ids], choices)  # load the model, untimed
    clear(backend)
    _, prefill_s = seconds(lambda: backend.choice_probs([r.prompt_ids for r in requests], choices))
    clear(backend)
    completions, generate_s = seconds(lambda: backend.generate(requests))
    outputs = [split_output(p, c.text, ctx.arm, ctx.model.thinking) for p, c in zip(work["prompts"], completions)]
    parts = answer_parts_all(ctx, work["prompts"], [o.trace for o in outputs], ctx.arm)
    choice_reads = [(x.prompt_ids + x.trace_ids, x.suffix_ids) for x in parts]
    _, choice_s = seconds(lambda: backend.choice_probs([c + s for c, s in choice_reads], choices))
    depth = [replace(x, cuts=tuple(segment_cuts(len(x.trace_ids), work["K"]))) for x in parts]
    _, depth_s = seconds(lambda: backend.depth_choice_probs(depth, choices))
    depth_reads = [(x.prompt_ids + x.trace_ids[:cut], x.suffix_ids) for x in depth for cut in x.cuts]
    generated = [len(c.token_ids) for c in completions]
    walls = {"prompt prefill": (sum(len(r.prompt_ids) for r in requests), prefill_s),
             "generation": (sum(generated), generate_s),
             "choice reads": (sum(len(c) + len(s) for c, s in choice_reads), choice_s),
             "depth reads": (packed_depth_tokens(depth), depth_s)}
    return {"rates": stage_rates(backend, walls), "prompts": [r.prompt_ids for r in requests],
            "generated": generated, "choice": choice_reads, "depth": depth_reads}


def clear(backend) -> None:
    """From an empty KV cache and stage timers (llama.cpp; hf keeps neither)."""
    if hasattr(backend, "stages"):
        backend.engine.clear()
        backend.stages.clear()


def packed_depth_tokens(depth) -> int:
    """Tokens hf computes for depth reads: prompt and trace once, each cut's suffix (tree-packed)."""
    return sum(len(x.prompt_ids) + len(x.trace_ids) + len(x.cuts) * len(x.suffix_ids) for x in depth)


def stage_rates(backend, walls: dict) -> dict:
    """Tokens/s per stage: llamacpp's own timers (tokens computed per second of llama_decode), hf's wall times."""
    if not hasattr(backend, "stages"):
        return {stage: tokens / s for stage, (tokens, s) in walls.items()}
    metrics = backend.metrics()
    return {"prompt prefill": metrics["prompt_prefill_tokens_per_s"],
            "generation": metrics["decode_tokens_per_s"],
            "choice reads": metrics["choice_prefill_tokens_per_s"],
            "depth reads": metrics["depth_prefill_tokens_per_s"]}


def plain_llamacpp(gguf: str, threads: int, work: dict) -> dict:
    """llama.cpp's high-level API on the audit's token counts: tokens/s per stage (llama.cpp's own timers)."""
    import llama_cpp as lc

    llm = lc.Llama(model_path=gguf, n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False)

    def timed_eval(context, new) -> tuple[int, float]:
        llm.reset()
        if context:
            llm.eval(list(context))
        _, s = seconds(lambda: llm.eval(list(new)))
        return len(new), s

    def rate(pairs) -> float:
        counts = [timed_eval(c, n) for c, n in pairs]
        return sum(n for n, _ in counts) / sum(s for _, s in counts)

    def decode_rate() -> float:
        tokens, total = 0, 0.0
        for prompt, n in zip(work["prompts"], work["generated"]):
            timed_eval((), prompt)
            for _ in range(n):  # greedy, one token a step, as create_completion decodes
                token = int(llm.scores[llm.n_tokens - 1].argmax())
                total += seconds(lambda: llm.eval([token]))[1]
            tokens += n
        return tokens / total

    return {"prompt prefill": rate([((), p) for p in work["prompts"]]), "generation": decode_rate(),
            "choice reads": rate(work["choice"]), "depth reads": rate(work["depth"])}


def plain_hf(model_dir: str, work: dict) -> dict:
    """torch on the audit's token counts: a forward per prompt and per read sequence, `generate` per prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def forward_rate(sequences) -> float:
        with torch.inference_mode():
            _, s = seconds(lambda: [model(torch.tensor([list(x)]), logits_to_keep=1) for x in sequences])
        return sum(map(len, sequences)) / s

    def generate_rate() -> float:
        with torch.inference_mode():
            _, s = seconds(lambda: [model.generate(torch.tensor([list(prompt)]), max_new_tokens=n, min_new_tokens=n,
                                                   do_sample=False) for prompt, n in zip(work["prompts"],
                                                                                         work["generated"])])
        return sum(work["generated"]) / s

    return {"prompt prefill": forward_rate(work["prompts"]), "generation": generate_rate(),
            "choice reads": forward_rate([c + s for c, s in work["choice"]]),
            "depth reads": forward_rate([c + s for c, s in work["depth"]])}


def column(backend: str, overrides: list[str], args, numerics: str = "exact") -> dict:
    """One backend's audit rates, then the plain engine's on the same counts, in this process."""
    work = audit_work(compose_config(backend, overrides, args.pairs, numerics), args.K)
    audit = run_audit(work)
    engine = work["backend"]
    if backend == "llamacpp":
        plain = plain_llamacpp(engine.settings["gguf"], engine.settings["n_threads"], audit)
    else:
        plain = plain_hf(engine.model_dir, audit)
    engine.close()
    return {"audit": audit["rates"], "plain": plain, "generated": sum(audit["generated"]),
            "reads": len(audit["choice"]) + len(audit["depth"])}


def print_table(columns: dict[str, dict]) -> None:
    """One row per stage and column: audit tokens/s, plain tokens/s, efficiency (audit / plain)."""
    print("| column | stage | audit tokens/s | plain tokens/s | efficiency |")
    print("|---|---|---|---|---|")
    for name, figures in columns.items():
        for stage in STAGES:
            audit, plain = figures["audit"][stage], figures["plain"][stage]
            print(f"| {name} | {stage} | {audit:.1f} | {plain:.1f} | {audit / plain:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="llamacpp,hf")
    parser.add_argument("--numerics", default="exact,fast", help="llamacpp's backend.numerics, one column each")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--K", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch's threads and llama.cpp's n_threads")
    args, overrides = parser.parse_known_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if "llamacpp" in args.backends:
        from fairaudit.backends import llamacpp_engine

        llamacpp_engine.clock = time.process_time  # the engine's stage timers in CPU seconds too
    import torch

    torch.set_num_threads(args.threads)
    columns = {}
    for backend in args.backends.split(","):
        for numerics in args.numerics.split(",") if backend == "llamacpp" else ["-"]:
            name = backend if numerics == "-" else f"{backend} {numerics}"
            columns[name] = column(backend, overrides, args, numerics)
    print(f"{args.pairs} Adult pairs' think arm, K = {args.K}, {args.threads} thread(s)")
    print_table(columns)


if __name__ == "__main__":
    main()
