"""backend=vllm refuses bad settings, and a missing vLLM, in one line before anything loads (no vLLM needed)."""

from __future__ import annotations

import pytest

from conftest import run_app
from fairaudit.backends.vllm import INSTALL_HINT, VLLMBackend, vllm_distribution
from fairaudit.errors import AuditError


@pytest.mark.parametrize("backend, model, message", [
    ({"kv_cache_space_gib": 0}, {"dtype": "float32"}, "backend.kv_cache_space_gib must be a positive number of GiB"),
    ({"kv_cache_space_gib": None}, {"dtype": "int8"}, "model.dtype 'int8' is not supported by the vllm backend"),
])
def test_bad_settings_are_refused_by_the_backend_check(backend, model, message):
    with pytest.raises(AuditError, match=message):
        VLLMBackend.check(backend, model)


@pytest.mark.skipif(vllm_distribution() is not None, reason="vLLM is installed here")
def test_backend_vllm_without_vllm_is_one_error_line_naming_what_to_install(tmp_path):
    result = run_app(tmp_path, "backend=vllm")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: backend=vllm needs vLLM, which is not installed: {INSTALL_HINT}"], result.stderr[-2000:]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "store.sqlite").exists()
