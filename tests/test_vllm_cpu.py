"""vLLM on a CPU out of the box: the settings left null get CPU values, set ones are kept, and an engine that
cannot fit is one line naming the setting, before it starts (no vLLM needed: pure functions)."""

from __future__ import annotations

import pytest

from fairaudit.backends import vllm_cpu
from fairaudit.backends.vllm_cpu import THREADS_ENV, cores, cpu_defaults, kv_bytes_per_token, start_failure
from fairaudit.errors import AuditError
from fairaudit.models.locate import tiny_qwen3_dir

GPU_DEFAULTS = {"model": None, "dtype": "float32", "max_model_len": 4096, "tensor_parallel_size": 1,
                "gpu_memory_utilization": 0.9, "enforce_eager": None, "kv_cache_memory_bytes": None, "block_size": None}


@pytest.fixture
def settings(monkeypatch):
    monkeypatch.setattr(vllm_cpu, "free_memory_gib", lambda: 12.0)
    monkeypatch.delenv(THREADS_ENV, raising=False)
    return {**GPU_DEFAULTS, "model": str(tiny_qwen3_dir())}


def test_null_settings_get_a_quarter_of_the_free_memory_eager_mode_32_token_blocks_and_every_core(settings):
    out, env = cpu_defaults(settings, None)
    assert out["kv_cache_memory_bytes"] == 3 * 2**30 and out["enforce_eager"] is True and out["block_size"] == 32
    assert env == {THREADS_ENV: cores()} and out["gpu_memory_utilization"] == 0.9  # left as is: unused once KV is set


def test_what_the_user_set_is_kept(settings, monkeypatch):
    out, env = cpu_defaults({**settings, "kv_cache_memory_bytes": 2**30, "enforce_eager": False, "block_size": 128},
                            "0")
    assert (out["kv_cache_memory_bytes"], out["enforce_eager"], out["block_size"], env[THREADS_ENV]) == (
        2**30, False, 128, "0")
    # vLLM splits the cores
    assert cpu_defaults({**settings, "tensor_parallel_size": 2}, None)[1] == {THREADS_ENV: "auto"}
    monkeypatch.setenv(THREADS_ENV, "1")
    assert cpu_defaults(settings, None)[1] == {THREADS_ENV: "1"}


def test_a_kv_cache_beyond_the_free_memory_or_below_one_sequence_is_one_line_naming_the_setting(settings):
    with pytest.raises(AuditError, match=r"needs 20\.\d GiB \(KV cache 20\.0 GiB \+ weights\) but 12\.0 GiB is free: "
                                         r"lower backend\.kv_cache_space_gib"):
        cpu_defaults({**settings, "kv_cache_memory_bytes": 20 * 2**30}, None)
    # layers x (K, V) x heads x dim x fp32
    assert kv_bytes_per_token(settings["model"], "float32") == 2 * 2 * 2 * 16 * 4
    with pytest.raises(AuditError, match=r"=0\.000977 holds 2,048 tokens, fewer than one "
                                         r"backend\.max_model_len=4,096 sequence: raise it to at least 0\.00195 or"):
        cpu_defaults({**settings, "kv_cache_memory_bytes": 2048 * 512}, None)


def test_cores_are_written_as_vllms_binding_reads_them(monkeypatch):
    monkeypatch.setattr(vllm_cpu.os, "sched_getaffinity", lambda pid: {0, 2, 3, 4, 7})
    assert cores() == "0,2-4,7"


def test_an_engine_that_does_not_start_is_one_line_naming_what_decides_it():
    cpu = str(start_failure(RuntimeError("Engine core initialization failed.\nmore"),
                            {**GPU_DEFAULTS, "kv_cache_memory_bytes": 2**30}, True))
    assert "\n" not in cpu and "RuntimeError: Engine core initialization failed." in cpu
    assert "backend.kv_cache_space_gib (now 1.00)" in cpu and "backend.max_model_len (now 4096)" in cpu
    gpu = str(start_failure(ValueError("no memory"), GPU_DEFAULTS, False))
    assert "backend.gpu_memory_utilization (now 0.9)" in gpu and "backend.tensor_parallel_size" in gpu
