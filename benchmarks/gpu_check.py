"""GPU acceptance check: the hf backend's generation speed and packed CDPG reads on a model of Qwen3-8B's shape.

    python benchmarks/gpu_check.py                 # one CUDA GPU, Qwen3-8B's shape in bf16 (5 minutes on an H100/H200)
    python benchmarks/gpu_check.py --tiny          # the same steps on a 2-layer model of that family, on the CPU (1 m)
    python benchmarks/gpu_check.py --out gpu.json  # also write the figures as JSON

Needs torch and transformers only (a machine with torch 2.11 + CUDA 13 and transformers 5.17 is the case
planned for); nothing is fetched: the weights are random (they do not change speed), built from a config
in bf16 and saved to a temporary folder the hf backend loads as it loads any model; the tokenizer is a
word-level one made on the spot. Measured, each in its own phase with its peak GPU memory:
- `hf` generation, greedy, 256-token prompts and 256 new tokens, at 1, 16 and 64 sequences (tokens/s);
- CDPG depth reads of 2,000-token traces, K = 10: one packed pass per trace (tree attention mask) against
  re-feeding each of the 10 prefixes, both in bf16, and the largest |dP(Yes)| of each against an fp32 re-feed.
At the end it lists the fairaudit modules it imported and checks that no Hydra, MLflow, OmegaConf, pandas
or vLLM module was (exit 1 if one was).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fairaudit.backends import DepthRequest, GenerationRequest
from fairaudit.backends.hf import HFBackend
from fairaudit.backends.packing import naive_depth_probs

QWEN3_8B = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                rope_theta=1_000_000.0, tie_word_embeddings=False)
TINY = {**QWEN3_8B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16}
FULL_SIZES = dict(prompt=256, new=256, batches=(1, 16, 64), traces=8, trace=2000, K=10)
TINY_SIZES = dict(prompt=32, new=8, batches=(1, 4, 8), traces=2, trace=200, K=10)
# fairaudit could import them; transformers may import scipy where it is installed
FORBIDDEN = ("hydra", "mlflow", "omegaconf", "pandas", "vllm", "sqlalchemy")
PAD, EOS = 0, 1


def model_folder(folder: Path, shape: dict, device: str) -> None:
    """A random-weight Qwen3 of `shape` in bf16 and a word-level tokenizer over its vocabulary, saved in `folder`."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    vocab = {f"t{i}": i for i in range(shape["vocab_size"])}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t2")),
                                        pad_token=f"t{PAD}", eos_token=f"t{EOS}", unk_token="t2")
    tokenizer.save_pretrained(folder)
    config = Qwen3Config(**shape, bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(config)
        model.save_pretrained(folder)
    finally:
        torch.set_default_dtype(default)
    del model


class Phase:
    """Wall time and peak GPU memory of one phase."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self.start
        self.peak_gib = torch.cuda.max_memory_allocated() / 2**30 if self.cuda else float("nan")


def random_ids(generator: torch.Generator, n: int, vocab: int) -> tuple[int, ...]:
    return tuple(torch.randint(10, vocab, (n,), generator=generator).tolist())


def generation(backend: HFBackend, sizes: dict, vocab: int, device: str) -> list[dict]:
    """Greedy generation tokens/s at each batch size (a warm-up call first)."""
    generator = torch.Generator().manual_seed(1)
    prompts = [random_ids(generator, sizes["prompt"], vocab) for _ in range(max(sizes["batches"]))]
    backend.generate([GenerationRequest(prompts[0], 4)])  # warm-up: kernels, allocator
    rows = []
    for batch in sizes["batches"]:
        with Phase(device) as phase:
            done = backend.generate([GenerationRequest(p, sizes["new"]) for p in prompts[:batch]])
        tokens = sum(len(c.token_ids) for c in done)
        rows.append({"sequences": batch, "new_tokens": tokens, "seconds": phase.seconds,
                     "tokens_per_s": tokens / phase.seconds, "peak_gib": phase.peak_gib})
    return rows


def depth_reads(backend: HFBackend, sizes: dict, vocab: int, device: str) -> dict:
    """Packed against naive CDPG reads in bf16, each compared with an fp32 re-feed."""
    generator = torch.Generator().manual_seed(2)
    n, K = sizes["trace"], sizes["K"]
    cuts = tuple(-(-k * n // K) for k in range(1, K + 1))  # analysis.cdpg.segment_cuts
    requests = [DepthRequest(random_ids(generator, 300 if n >= 1000 else 30, vocab), random_ids(generator, n, vocab),
                             random_ids(generator, 6, vocab), cuts) for _ in range(sizes["traces"])]
    choices = [[11], [12]]
    backend.depth_choice_probs(requests[:1], choices)  # warm-up
    with Phase(device) as packed_phase:
        packed = backend.depth_choice_probs(requests, choices)
    with Phase(device) as naive_phase:
        naive = naive_depth_probs(backend.model, requests, choices, pad_id=backend.pad_id, batch_size=8)
    backend.model.float()  # the same weights in fp32 for the reference
    with Phase(device) as fp32_phase:
        reference = naive_depth_probs(backend.model, requests, choices, pad_id=backend.pad_id, batch_size=8)

    def gap(rows):
        return max(float(abs(a[:, 0] - b[:, 0]).max()) for a, b in zip(rows, reference))

    return {"traces": len(requests), "trace_tokens": n, "K": K, "packed_s": packed_phase.seconds,
            "naive_s": naive_phase.seconds, "packed_over_naive": packed_phase.seconds / naive_phase.seconds,
            "max_dp_packed_bf16_vs_fp32": gap(packed), "max_dp_naive_bf16_vs_fp32": gap(naive),
            "peak_gib_packed": packed_phase.peak_gib, "peak_gib_naive": naive_phase.peak_gib,
            "fp32_refeed_s": fp32_phase.seconds, "peak_gib_fp32": fp32_phase.peak_gib}


def import_closure() -> tuple[list[str], list[str]]:
    """(fairaudit modules imported, forbidden top-level packages imported)."""
    ours = sorted(m for m in sys.modules if m == "fairaudit" or m.startswith("fairaudit."))
    return ours, sorted({m.split(".")[0] for m in sys.modules} & set(FORBIDDEN))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true",
                        help="a 2-layer model on the CPU: checks the script, not the GPU")
    parser.add_argument("--device", default=None, help="default: cuda (cpu with --tiny)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    device = args.device or ("cpu" if args.tiny else "cuda")
    shape, sizes = (TINY, TINY_SIZES) if args.tiny else (QWEN3_8B, FULL_SIZES)
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), device {device}"
          + (f" ({torch.cuda.get_device_name()})" if device.startswith("cuda") else ""), flush=True)
    with tempfile.TemporaryDirectory(prefix="fairaudit-gpu-check-") as folder:
        with Phase(device) as build:
            model_folder(Path(folder), shape, device)
        backend = HFBackend(folder, dtype="bfloat16", device=device, batch_size=max(sizes["batches"]))
        with Phase(device) as load:
            backend.model  # loads the weights, as the first model call does
        print(f"built in {build.seconds:.0f} s, loaded in {load.seconds:.0f} s ({load.peak_gib:.1f} GiB)", flush=True)
        figures = {"device": device, "shape": shape,
                   "generation": generation(backend, sizes, shape["vocab_size"], device)}
        for row in figures["generation"]:
            print(f"generate {row['sequences']:3d} sequences: {row['tokens_per_s']:9.1f} tokens/s "
                  f"({row['new_tokens']} tokens in {row['seconds']:.1f} s, peak {row['peak_gib']:.1f} GiB)", flush=True)
        figures["depth"] = depth = depth_reads(backend, sizes, shape["vocab_size"], device)
    print(f"CDPG, {depth['traces']} traces of {depth['trace_tokens']} tokens, K={depth['K']}: "
          f"packed {depth['packed_s']:.2f} s, "
          f"naive {depth['naive_s']:.2f} s (packed = {depth['packed_over_naive']:.3f} x naive); max |dP| vs fp32: "
          f"packed {depth['max_dp_packed_bf16_vs_fp32']:.2e}, naive {depth['max_dp_naive_bf16_vs_fp32']:.2e}; peak GiB "
          f"packed {depth['peak_gib_packed']:.1f}, naive {depth['peak_gib_naive']:.1f}, "
          f"fp32 {depth['peak_gib_fp32']:.1f}")
    ours, forbidden = import_closure()
    figures["imports"] = {"fairaudit": ours, "forbidden": forbidden}
    print(f"imported: {', '.join(ours)}; "
          f"{'none of ' + ', '.join(FORBIDDEN) if not forbidden else 'ALSO ' + ', '.join(forbidden)}")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2))
    return 1 if forbidden else 0


if __name__ == "__main__":
    sys.exit(main())
