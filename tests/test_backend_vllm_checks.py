"""backend=vllm refuses bad settings, and a missing vLLM (or llama-cpp-python under backend=llamacpp), in one line
before anything loads (no engine needed)."""

from __future__ import annotations

import pytest

from conftest import run_app
from fairaudit.backends.llamacpp import INSTALL_HINT as LLAMACPP_HINT
from fairaudit.backends.llamacpp import llamacpp_version
from fairaudit.backends.vllm import INSTALL_HINT, VLLMBackend, vllm_distribution
from fairaudit.errors import AuditError


@pytest.mark.parametrize("backend, model, message", [
    ({"kv_cache_space_gib": 0}, {"dtype": "float32"}, "backend.kv_cache_space_gib must be a positive number of GiB"),
    ({"kv_cache_space_gib": None}, {"dtype": "int8"}, "model.dtype 'int8' is not supported by the vllm backend"),
])
def test_bad_settings_are_refused_by_the_backend_check(backend, model, message):
    with pytest.raises(AuditError, match=message):
        VLLMBackend.check(backend, model)


@pytest.mark.parametrize("backend, installed, expected", [
    ("vllm", vllm_distribution, f"error: backend=vllm needs vLLM, which is not installed: {INSTALL_HINT}"),
    ("llamacpp", llamacpp_version, f"error: llama-cpp-python is not installed: {LLAMACPP_HINT}"),
])
def test_an_engine_backend_without_its_engine_is_one_error_line_naming_what_to_install(tmp_path, backend, installed,
                                                                                       expected):
    if installed():
        pytest.skip(f"the {backend} engine is installed here")
    result = run_app(tmp_path, f"backend={backend}")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [expected], result.stderr[-2000:]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "store.sqlite").exists()
