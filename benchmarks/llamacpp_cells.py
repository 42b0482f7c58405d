"""llama.cpp's cost per token against the KV cells other sequences hold: reads (prefill) and decode steps with
about 1k, 4k, 16k and 32k cells held, on the embedded SmolLM2 GGUF (or any model= override).

    .venv-llamacpp/bin/python benchmarks/llamacpp_cells.py [--held 1024,4096,16384,32768] [--threads 1]
        [--reads 8] [--read-tokens 256] [--steps 32] [--n-seq-max 64] [--streams] [model=...]

One engine (`fairaudit.backends.llamacpp_engine.Engine`, the backend's settings) is filled with filler
sequences of random tokens (kept for reuse, as the benchmark's audit keeps its traces) until it holds each
level; then `--reads` new sequences of `--read-tokens` tokens are fed (prefill tokens/s) and decoded together for
`--steps` steps (decode tokens/s). Levels are measured in rising order on the same engine (the work of one
level stays held at the next). Prints one row per level: cells held, prefill tokens/s, decode tokens/s, and
each relative to the first level. --streams: the same with `backend.kv_streams=true` (a stream per sequence).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from hydra import compose, initialize_config_dir

from fairaudit.backends.llamacpp import LlamaCppBackend, load_engine
from fairaudit.job.config import ModelSource

CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
FILLER = 512  # tokens per filler sequence


def engine_for(overrides: list[str], n_ctx: int, n_seq_max: int, threads: int, streams: bool):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = compose("config", overrides=["backend=llamacpp", *overrides])
    backend = LlamaCppBackend(ModelSource.composed(cfg).folder(), n_ctx=n_ctx, n_seq_max=n_seq_max, n_threads=threads,
                              kv_streams=streams)
    return load_engine(backend.settings), backend


def fill(engine, level: int, rng, vocab: int) -> None:
    while engine.held < level:
        engine.feed([rng.integers(1000, vocab, size=min(FILLER, level - engine.held + 1)).tolist()])


def measure(engine, rng, vocab: int, reads: int, read_tokens: int, steps: int) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) of `reads` new sequences beside what the engine holds."""
    sequences = [rng.integers(1000, vocab, size=read_tokens).tolist() for _ in range(reads)]
    start = time.perf_counter()
    seqs = []
    for sequence in sequences:  # one at a time, as feed's limit on sequences per call asks
        seqs += engine.feed([sequence])[0]
    prefill = reads * read_tokens / (time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(steps):
        engine.step(seqs, rng.integers(1000, vocab, size=len(seqs)).tolist())
    return prefill, reads * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--held", default="1024,4096,16384,32768")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reads", type=int, default=8)
    parser.add_argument("--read-tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--n-seq-max", type=int, default=64, help="unified cache: sequence ids")
    parser.add_argument("--streams", action="store_true", help="kv_streams: one KV stream per sequence")
    args = parser.parse_args()
    levels = [int(level) for level in args.held.split(",")]
    work = args.reads * (args.read_tokens + args.steps)
    if args.streams:  # a stream per filler and per read, each as long as the longest of them
        per_stream = max(FILLER, args.read_tokens + args.steps)
        n_seq_max = -(-(max(levels) + work) // FILLER) + args.reads + 1
        engine, backend = engine_for(args.overrides, n_seq_max * per_stream, n_seq_max, args.threads, True)
    else:
        engine, backend = engine_for(args.overrides, max(levels) + work + FILLER, args.n_seq_max, args.threads, False)
    vocab, rng, rows = len(backend.tokenizer), np.random.default_rng(0), []
    for level in levels:
        fill(engine, level, rng, vocab)
        cells = engine.held
        prefill, decode = measure(engine, rng, vocab, args.reads, args.read_tokens, args.steps)
        rows.append((cells, prefill, decode))
        print(f"held {cells:>6} cells: prefill {prefill:8.1f} tok/s ({prefill / rows[0][1]:.2f}x), "
              f"decode {decode:8.1f} tok/s ({decode / rows[0][2]:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
