"""Throughput of backend=openai against one vLLM server at several request concurrencies.

The work: 64 think-arm generations (32 Adult pairs, both sides) of up to 256 new tokens,
then their 64 Yes/No choice reads, as the default audit asks them. Each concurrency level
repeats the same work through a fresh store, so every call reaches the server.
The generated token count is re-tokenized from the text (one pass, after timing).

    .venv-vllm/bin/python benchmarks/openai_throughput.py                 # starts a local server on SmolLM2
    python benchmarks/openai_throughput.py --base-url http://host:8000/v1 --model-dir DIR

With --base-url the server is yours (a GPU user points it at `vllm serve <model folder>`);
--model-dir is the served model's local folder, whose tokenizer renders the prompts.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from fairaudit.app import model_spec
from fairaudit.backends.openai import OpenAIBackend
from fairaudit.backends.vllm_server import free_port, served
from fairaudit.models import embedded_model_dir
from fairaudit.probes import AuditContext
from fairaudit.probes.decisions import decide
from fairaudit.prompts.yesno import Arm
from fairaudit.store import CachedBackend, Store

CONF = Path(__file__).resolve().parents[1] / "conf"
DATA = os.environ.get("FAIRAUDIT_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data"))
CONCURRENCY = (1, 8, 32)


def audit_inputs(pairs: int):
    """The default audit's model spec and `pairs` Adult pairs (both sides)."""
    with initialize_config_dir(str(CONF), version_base=None):
        cfg = compose("config", overrides=[f"dataset.n={pairs}", f"data.root={DATA}"])
    return model_spec(cfg.model), instantiate(cfg.dataset).pairs()


def measure(url: str, model: str | None, model_dir: str, pairs: int, max_new_tokens: int) -> None:
    """Think-arm generations and their choice reads, as `probes.decisions.decide` asks them, per concurrency."""
    spec, frame = audit_inputs(pairs)
    arm = Arm(name="think", think=True, max_new_tokens=max_new_tokens)
    print(f"{len(frame)} think generations (<= {max_new_tokens} new tokens) + {len(frame)} choice reads, server {url}")
    print(f"{'concurrency':>11} {'seconds':>8} {'new tokens':>10} {'tokens/s':>9} {'requests/s':>10}")
    for concurrency in CONCURRENCY:
        backend = OpenAIBackend(model_dir, base_url=url, model=model, max_concurrency=concurrency)
        with tempfile.TemporaryDirectory() as tmp:  # a fresh store: every call reaches the server
            cached = CachedBackend(backend, Store(Path(tmp) / "store.sqlite"))
            ctx = AuditContext(backend=cached, model=spec, dataset=None, arm=arm)
            start = time.perf_counter()
            records = decide(ctx, frame, arm)
            seconds = time.perf_counter() - start
        tokens = int(records["text"].map(lambda t: len(backend.tokenizer.encode(t, add_special_tokens=False))).sum())
        print(f"{concurrency:>11} {seconds:>8.1f} {tokens:>10} {tokens / seconds:>9.1f} {cached.model_calls / seconds:>10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", help="a running server (.../v1); default: start vLLM on SmolLM2 here")
    parser.add_argument("--model", help="the served model name; default: the only one the server lists")
    parser.add_argument("--model-dir", help="local folder with the served model's tokenizer and config "
                                            "(default: the embedded SmolLM2)")
    parser.add_argument("--pairs", type=int, default=32, help="Adult pairs (2 generations each)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    args = parser.parse_args()
    model_dir = args.model_dir or str(embedded_model_dir())
    if args.base_url:
        measure(args.base_url, args.model, model_dir, args.pairs, args.max_new_tokens)
        return
    with served(model_dir, [free_port()]) as (url,):
        measure(url, None, model_dir, args.pairs, args.max_new_tokens)


if __name__ == "__main__":
    main()
