"""A model's files checked before anything loads, each problem one line naming the file: JSON files that do not
parse (config, tokenizer, index), weight files cut short (an interrupted download), shards the index names but the
folder lacks, a tokenizer without a chat template (every probe renders its prompts with it), and GGUF files that
are cut short, are no GGUF at all, or hold no language model transformers can read (e.g. a vision projector).
Beside them, the GGUF header readers: one metadata value (`gguf_metadata`, shared with `backends.gguf`) and the
size a complete file has (`gguf_extent`)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from fairaudit.errors import AuditError

JSON_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
              "model.safetensors.index.json", "chat_template.json")
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
AGAIN = "download it again (or delete it to have it fetched anew)"


def check_model_folder(folder: Path, weights: bool = True) -> None:
    """One AuditError naming every problem of a model folder's files (its weights too when `weights`)."""
    problems = [p for name in JSON_FILES if (folder / name).exists() for p in [json_problem(folder / name)] if p]
    if not problems:
        problems += [p for p in [template_problem(folder)] if p]
    if weights:
        problems += [p for p in (safetensors_problem(path) for path in sorted(folder.glob("*.safetensors"))) if p]
        problems += shard_problems(folder)
    if problems:
        raise AuditError("; ".join(problems))


def json_problem(path: Path) -> str | None:
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        return f"model file {path} cannot be read ({error})"
    except ValueError as error:
        return f"model file {path} is not valid JSON ({error}; cut short?): {AGAIN}"
    return None


def template_problem(folder: Path) -> str | None:
    """The tokenizer has a chat template: in tokenizer_config.json or a file of its own."""
    config = folder / "tokenizer_config.json"
    if any((folder / name).exists() for name in TEMPLATE_FILES):
        return None
    if config.exists() and json.loads(config.read_text(encoding="utf-8")).get("chat_template"):
        return None
    return (f"model folder {folder} has no chat template (no chat_template in tokenizer_config.json, no "
            f"{' or '.join(TEMPLATE_FILES)}): the probes render every prompt with it; use the model's chat (instruct) "
            "release, or copy its template into the folder")


def safetensors_problem(path: Path) -> str | None:
    """A safetensors file holds its whole header and every byte its header places (8 + header + data)."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if length < 0 or 8 + length > size:
            return f"model file {path} is cut short ({size:,} bytes, no complete safetensors header): {AGAIN}"
        try:
            header = json.loads(handle.read(length))
        except ValueError:
            return f"model file {path} is not a safetensors file (its header does not parse): {AGAIN}"
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    expected = 8 + length + max(ends, default=0)
    if size < expected:
        return f"model file {path} is cut short: {size:,} of {expected:,} bytes: {AGAIN}"
    return None


def shard_problems(folder: Path) -> list[str]:
    """Every weight shard the index names is in the folder."""
    index = folder / "model.safetensors.index.json"
    if not index.exists():
        return []
    shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
    return [f"model folder {folder} lacks {name}, which {index.name} names (an interrupted download?)"
            for name in shards if not (folder / name).exists()]


def check_gguf(path: Path) -> None:
    """A GGUF file that is complete and holds a language model whose prompts transformers can render."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        architecture = gguf_metadata(path, "general.architecture") or "unknown"  # no GGUF at all: its own line
        expected = gguf_extent(path)
    except AuditError:
        raise
    except Exception as error:  # a header cut short ends in the middle of a value
        raise AuditError(f"GGUF file {path} is damaged or cut short ({type(error).__name__}: {error}): "
                         f"{AGAIN}") from None
    size = path.stat().st_size
    if size < expected:
        raise AuditError(f"GGUF file {path} is cut short: {size:,} of {expected:,} bytes: {AGAIN}")
    known = {a.replace("_", "") for a in GGUF_SUPPORTED_ARCHITECTURES}
    if architecture.replace("_", "").replace("-", "") not in known:
        hint = " (a vision projector, mmproj file: point model.path at the language model's GGUF)" \
            if architecture == "clip" else ""
        raise AuditError(f"GGUF file {path} holds a {architecture!r} model{hint}; the GGUF architectures "
                         f"fairaudit reads prompts from: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}")


# GGUF metadata value types as struct codes (8: string, 9: array)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


def _read_string(handle) -> str:
    (length,) = struct.unpack("<Q", handle.read(8))
    return handle.read(length).decode("utf-8", "replace")


def _read_value(handle, kind: int):
    """One GGUF metadata value; arrays of scalars are skipped over (None), not read."""
    if kind == STRING:
        return _read_string(handle)
    if kind == ARRAY:
        item, count = struct.unpack("<IQ", handle.read(12))
        if item in SCALARS:
            handle.seek(count * struct.calcsize(SCALARS[item]), 1)
            return None
        return [_read_value(handle, item) for _ in range(count)]
    code = SCALARS[kind]
    return struct.unpack("<" + code, handle.read(struct.calcsize(code)))[0]


def _counts(handle, gguf: Path) -> tuple[int, int]:
    """The numbers of tensors and of metadata values a GGUF file (v2 or later) holds, read from its first bytes."""
    head = handle.read(24)
    magic, version, n_tensors, n_kv = struct.unpack("<4sIQQ", head) if len(head) == 24 else (head[:4], 0, 0, 0)
    if magic != b"GGUF" or version < 2:
        raise AuditError(f"{str(gguf)!r} is not a GGUF file of version 2 or later")
    return n_tensors, n_kv


def _metadata(handle, n_kv: int):
    """Each (key, value) of a GGUF file's metadata, in the file's order (arrays of scalars as None)."""
    for _ in range(n_kv):
        name = _read_string(handle)
        (kind,) = struct.unpack("<I", handle.read(4))
        yield name, _read_value(handle, kind)


def gguf_metadata(gguf: Path, key: str):
    """One metadata value of a GGUF file (v2 or later), read from its header up to that key; None when absent."""
    with open(gguf, "rb") as handle:
        _, n_kv = _counts(handle, gguf)
        return next((value for name, value in _metadata(handle, n_kv) if name == key), None)


def gguf_extent(gguf: Path) -> int:
    """The bytes a complete GGUF file holds: its header, then its tensors' data from the next multiple of its
    alignment (`general.alignment`, else 32), each tensor at its offset, sized by its type's blocks. Read from the
    header alone, so a file cut short in its data says how much it lacks."""
    import math

    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(gguf, "rb") as handle:
        n_tensors, n_kv = _counts(handle, gguf)
        alignment = dict(_metadata(handle, n_kv)).get("general.alignment") or 32
        end = 0
        for _ in range(n_tensors):
            _read_string(handle)
            (n_dims,) = struct.unpack("<I", handle.read(4))
            shape = struct.unpack(f"<{n_dims}Q", handle.read(8 * n_dims))
            kind, offset = struct.unpack("<IQ", handle.read(12))
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
            end = max(end, offset + math.prod(shape) // block * size)
        return -(-handle.tell() // alignment) * alignment + end
