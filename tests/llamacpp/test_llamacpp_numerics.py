"""backend.numerics: exact and fast results never share a fingerprint, and fast asks for llama.cpp's repacked CPU
kernels only where a probe decode with them survived in a subprocess (a crash there ends the probe, not the audit)."""

from __future__ import annotations

import pytest

from fairaudit.backends import llamacpp_engine
from fairaudit.backends.gguf import tiny_qwen3_gguf_dir
from fairaudit.backends.llamacpp import LlamaCppBackend, engine_arguments

pytestmark = pytest.mark.llamacpp
SETTINGS = {"gguf": "model.gguf", "n_ctx": 64, "n_batch": 128, "n_seq_max": 4, "n_threads": 1, "n_gpu_layers": 0,
            "kv_streams": False}


def test_exact_and_fast_have_fingerprints_and_engine_tags_of_their_own():
    exact, fast = (LlamaCppBackend(tiny_qwen3_gguf_dir(), numerics=n) for n in ("exact", "fast"))
    assert exact.fingerprint != fast.fingerprint and "llamacpp-2-fast" in fast.fingerprint
    assert fast.numerics == f"{exact.numerics} fast"


def test_fast_falls_back_to_the_plain_kernels_in_one_line_where_the_probe_decode_died(monkeypatch, capsys):
    monkeypatch.setattr(llamacpp_engine, "extra_bufts_run", lambda gguf: (False, "a probe decode ended in signal 11"))
    arguments = engine_arguments({**SETTINGS, "numerics": "fast"})
    assert arguments["extra_bufts"] is False and arguments["n_ubatch"] == SETTINGS["n_batch"]
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == ["numerics=fast without llama.cpp's repacked CPU kernels: a probe decode ended in signal 11 on "
                     "this CPU"]
    plain = {k: v for k, v in SETTINGS.items() if k != "kv_streams"}
    assert engine_arguments({**SETTINGS, "numerics": "exact"}) == plain


def test_a_probe_decode_that_dies_is_reported_not_raised(tmp_path):
    broken = tmp_path / "model.gguf"
    broken.write_bytes(b"not a GGUF file")
    assert llamacpp_engine.extra_bufts_run(str(broken)) == (False, "a probe decode with them ended in exit code 1")
    assert llamacpp_engine.extra_bufts_run(str(tiny_qwen3_gguf_dir() / "model.gguf")) == (True, "")
