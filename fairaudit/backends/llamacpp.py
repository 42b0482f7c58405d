"""llama.cpp backend: llama-cpp-python's low-level API on a GGUF file as it ships (paper 001's engine).

Records, prompts and store keys mean what they mean under `hf`: prompts go in as token ids rendered
by the project (the tokenizer read from the GGUF's metadata), completions are cut at the same stop
ids, and choice reads pool the same tokens the same way (`common.pooled_softmax` of the choice ids'
logits at the answer position, read with `llama_get_logits_ith`; no `logits_all`). Sequences are
decoded together in one KV cache (`llamacpp_engine`): shared prefixes are computed once and a
sequence that extends one still held (a depth read's prompt + trace, a choice read after its
generation) feeds only its new tokens, so each read equals the naive re-feed.

Role-visibility graphs are not offered: llama.cpp's attention rule could express a graph through
sequence membership, but llama_decode requires each sequence's positions to be continuous, so a
block hidden from a later block cannot keep its full-sequence positions (docs/backends.md).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from fairaudit.backends import Backend, Capabilities, Completion, DepthRequest, Engine, GenerationRequest, refuse_graphs
from fairaudit.backends.common import (
    choice_token_ids,
    completion_from_ids,
    depth_sequences,
    pooled_softmax,
    split_by_request,
    stop_token_ids,
)
from fairaudit.backends.gguf import gguf_digest, gguf_file_type, resolve_gguf_dir
from fairaudit.errors import AuditError
from fairaudit.models.files import ModelFiles
from fairaudit.models.locate import GGUF_NAME, model_fingerprint

BACKEND_VERSION = "llamacpp-2"  # the arithmetic: flash attention on float16 K, V; then the numerics (fingerprint)
NUMERICS = ("exact", "fast")  # exact: 32-token passes on the plain kernels; fast: n_batch-token passes, extra buffers
PIN = "0.3.36"  # the llama-cpp-python release whose low-level API names this backend uses
INSTALL_HINT = (f"pip install -e '.[llamacpp]' (builds llama-cpp-python=={PIN} from source: needs cmake and a C++ "
                "compiler; `make test-llamacpp` builds it once into .wheels/; docs/backends.md 'llama.cpp')")

ENGINE = Engine("llama-cpp-python", ("llama_cpp_python",), INSTALL_HINT)


def llamacpp_version() -> str | None:
    """The installed llama-cpp-python's version, None when it is absent; found without importing it."""
    found = ENGINE.found()
    return found[1] if found else None


def default_threads() -> int:
    """OMP_NUM_THREADS when set (as torch reads it for hf), else every core this process may run on.

    llama.cpp's threads wait for each other at every operation: more threads than free cores slow it
    down many times over (measured here: 12.6 decode tokens/s on one thread, 1.2 on two, on a busy 2-core machine).
    """
    value = os.environ.get("OMP_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


_ENGINE: dict[tuple, object] = {}


def engine_key(settings: dict) -> tuple:
    return tuple(sorted(settings.items()))


def load_engine(settings: dict):
    """The model and its context, loaded once per process and reused by every job of a sequential sweep.

    One is held at a time: a sweep that moves on to another model frees the last one first.
    """
    key = engine_key(settings)
    if key not in _ENGINE:
        free_engine()
        from fairaudit.backends.llamacpp_engine import Engine, StreamEngine
        from fairaudit.terminal.output import console

        console.print(f"Loading {settings['gguf']} into llama.cpp", style="dim", highlight=False, soft_wrap=True)
        engine = StreamEngine if settings["kv_streams"] else Engine
        _ENGINE[key] = engine(**engine_arguments(settings))
    return _ENGINE[key]


def engine_arguments(settings: dict) -> dict:
    """The engine's arguments for the backend's settings. numerics=exact: UBATCH-token passes on the plain kernels
    (a read equals the sequence fed alone into an empty cache); fast: n_batch-token passes, with llama.cpp's extra
    CPU buffer types (repacked kernels) where a probe decode shows they run on this CPU (one line where they do not)."""
    from fairaudit.backends.llamacpp_engine import extra_bufts_run

    arguments = {k: v for k, v in settings.items() if k not in ("kv_streams", "numerics")}
    if settings["numerics"] == "exact":
        return arguments
    runs, why = extra_bufts_run(settings["gguf"])
    if not runs:
        from fairaudit.terminal.output import console

        console.print(f"numerics=fast without llama.cpp's repacked CPU kernels: {why} on this CPU", style="yellow",
                      highlight=False, soft_wrap=True)
    return {**arguments, "n_ubatch": settings["n_batch"], "extra_bufts": runs}


def free_engine() -> None:
    """Free the held model and context."""
    for engine in _ENGINE.values():
        engine.close()
    _ENGINE.clear()


class LlamaCppBackend(Backend):
    """A GGUF model in llama.cpp, in process, on CPU (or with `n_gpu_layers` offloaded to a GPU build).

    Construction reads only the tokenizer and the GGUF file's digest; the model loads on the first
    model call. `model_dir` is a GGUF folder (`resolve_model`, `backends.gguf`). `batch_size` (model.batch_size)
    is the number of sequences decoded together. Settings: n_ctx (KV cells shared by the sequences held), n_batch
    (tokens per llama_decode), n_seq_max (sequences held in the KV cache, for reuse by later calls), n_threads
    (null: OMP_NUM_THREADS, else every core), n_gpu_layers, kv_streams, numerics (exact or fast, `engine_arguments`;
    the fingerprint names it, so results of the two never mix).
    """

    name = "llamacpp"
    capabilities = Capabilities(scores=True, depth_reads=True)
    requires = ENGINE

    @classmethod
    def resolve_model(cls, files: ModelFiles, settings: Mapping, weights: bool = True,
                      fetch: bool = True) -> Path | None:
        """The model's GGUF folder (`backends.gguf.resolve_gguf_dir`): the file as it ships, never converted, so a
        dry run (weights=False) takes the same folder, built from the file's metadata; fetch=False: the check alone."""
        return resolve_gguf_dir(files, fetch)

    @classmethod
    def require_engine(cls) -> None:
        """llama-cpp-python installed, at the release whose low-level API this backend names: one line."""
        super().require_engine()
        version = llamacpp_version()
        if version != PIN:
            raise AuditError(f"backend=llamacpp needs llama-cpp-python=={PIN} (its low-level API), found {version}: "
                             f"{INSTALL_HINT}")

    @classmethod
    def check(cls, settings: Mapping, model: Mapping) -> None:
        """Settings in range: one line, before anything loads."""
        from omegaconf import DictConfig, OmegaConf

        from fairaudit.errors.rules import boolean, check_fields, integer, one_of, optional

        if isinstance(settings, DictConfig):  # n_ctx is ${model.max_context}
            settings = OmegaConf.to_container(settings, resolve=True)
        rules = {"n_ctx": integer(16), "n_batch": integer(1), "n_seq_max": integer(3, 256), "n_gpu_layers": integer(-1),
                 "n_threads": optional(integer(1)), "kv_streams": boolean, "numerics": one_of(*NUMERICS)}
        check_fields("backend", settings, rules)

    def __init__(self, model_dir: str | Path, dtype: str = "float32", batch_size: int = 8, *, n_ctx: int = 4096,
                 n_batch: int = 512, n_seq_max: int = 256, n_threads: int | None = None, n_gpu_layers: int = 0,
                 kv_streams: bool = False, numerics: str = "exact"):
        from transformers import AutoTokenizer

        settings = {"n_ctx": n_ctx, "n_batch": n_batch, "n_seq_max": n_seq_max, "n_threads": n_threads,
                    "n_gpu_layers": n_gpu_layers, "kv_streams": kv_streams, "numerics": numerics}
        self.check(settings, {"dtype": dtype})
        self.require_engine()
        gguf = Path(model_dir) / GGUF_NAME
        if not gguf.exists():
            raise AuditError(f"{str(model_dir)!r} holds no {GGUF_NAME}: backend=llamacpp reads a GGUF file "
                             "(model.gguf_file of a hub repository, or model.path to a local .gguf)")
        self.model_dir, self.batch_size = str(model_dir), batch_size
        self.settings = {**settings, "gguf": str(gguf), "n_threads": n_threads or default_threads()}
        device = "cpu" if n_gpu_layers == 0 else f"gpu{n_gpu_layers}"
        self.fingerprint = (f"{model_fingerprint(Path(model_dir))}/{BACKEND_VERSION}-{numerics}"
                            f"/llama-cpp-python-{llamacpp_version()}/gguf-{gguf_digest(gguf)[:16]}/{device}")
        self.file_type = gguf_file_type(gguf)  # the weights as they ship: llama.cpp computes in their format
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.stop_ids = stop_token_ids(self.model_dir, self.tokenizer)
        self._counts_before: dict | None = None  # the engine's counters when this backend first used it
        self.stages: dict[str, list] = {}  # "prompt", "choice", "depth" -> [tokens computed, seconds] (`_staged`)

    @property
    def numerics(self) -> str:
        """The GGUF's weight format (e.g. `Q4_K_M`): llama.cpp computes in it, whatever model.dtype says; `fast` after
        it under numerics=fast."""
        return self.file_type if self.settings["numerics"] == "exact" else f"{self.file_type} fast"

    @property
    def batch_invariant(self) -> bool:
        """Under numerics=exact a read equals the sequence fed alone into an empty cache, whatever shares its pass."""
        return self.settings["numerics"] == "exact"

    @property
    def engine(self):
        engine = load_engine(self.settings)
        if self._counts_before is None:
            self._counts_before = dict(engine.counts)
        return engine

    def _staged(self, stage: str, work):
        """`work()`, the prefill tokens it computed and their seconds (the engine's counters) added to `stage`'s."""
        counts = self.engine.counts
        tokens, seconds = counts["prefill_tokens"], counts["prefill_s"]
        out = work()
        done = self.stages.setdefault(stage, [0, 0.0])
        done[0] += counts["prefill_tokens"] - tokens
        done[1] += counts["prefill_s"] - seconds
        return out

    def _groups(self, lengths: Sequence[int]) -> list[list[int]]:
        """Indices in descending length (a shorter read then extends a longer one still held), grouped so that a
        group is at most batch_size sequences whose lengths fit: unified, half the n_seq_max - 1 ids sequences may
        hold and n_ctx cells together; with kv_streams, n_seq_max streams of n_ctx / n_seq_max cells each."""
        n_ctx, n_seq_max, streams = self.settings["n_ctx"], self.settings["n_seq_max"], self.settings["kv_streams"]
        limit = max(1, min(self.batch_size, n_seq_max if streams else (n_seq_max - 1) // 2))
        cells = n_ctx // n_seq_max if streams else n_ctx
        too_long = [n for n in lengths if n > cells]
        if too_long:
            where = (f"a KV stream's {cells} cells (backend.n_ctx / backend.n_seq_max); raise backend.n_ctx or lower "
                     "backend.n_seq_max" if streams else f"backend.n_ctx={cells}; raise backend.n_ctx")
            raise AuditError(f"a sequence of {max(too_long)} tokens exceeds {where}")
        total = math.inf if streams else cells
        groups: list[list[int]] = []
        for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
            if not groups or len(groups[-1]) == limit or sum(lengths[j] for j in groups[-1]) + lengths[i] > total:
                groups.append([])
            groups[-1].append(i)
        return groups

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Greedy (temperature 0) or seeded nucleus sampling per request, decoded together; results in request order."""
        refuse_graphs(self, requests)
        out: list[Completion | None] = [None] * len(requests)
        for group in self._groups([len(r.prompt_ids) + r.max_new_tokens for r in requests]):
            for i, completion in zip(group, self._generate_group([requests[i] for i in group])):
                out[i] = completion
        return out  # type: ignore[return-value]

    def _generate_group(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Prompts fed together, then one decode step per new token for every open sequence."""
        import torch

        from fairaudit.backends.tensors import nucleus_probs

        generators = [torch.Generator().manual_seed(r.seed or 0) for r in requests]

        def pick(i: int, logits: np.ndarray) -> int:
            request = requests[i]
            if request.temperature == 0.0:
                return int(np.argmax(logits))
            probs = nucleus_probs(torch.from_numpy(logits)[None], torch.tensor([request.temperature]),
                                  torch.tensor([request.top_p]))
            return int(torch.multinomial(probs[0], 1, generator=generators[i]))

        seqs, rows = self._staged("prompt", lambda: self.engine.feed([r.prompt_ids for r in requests],
                                                                     steps=sum(r.max_new_tokens for r in requests)))
        new: list[list[int]] = [[] for _ in requests]
        open_rows = list(range(len(requests)))
        while open_rows:
            for i, logits in zip(open_rows, rows):
                new[i].append(pick(i, logits))
            open_rows = [i for i in open_rows
                         if new[i][-1] not in self.stop_ids and len(new[i]) < requests[i].max_new_tokens]
            if open_rows:
                rows = self.engine.step([seqs[i] for i in open_rows], [new[i][-1] for i in open_rows])
        return [completion_from_ids(self.tokenizer, row, self.stop_ids, r.max_new_tokens)
                for row, r in zip(new, requests)]

    def choice_probs(self, prefixes: Sequence[Sequence[int]], choices: Sequence[Sequence[int]]) -> np.ndarray:
        """Softmax over the pooled choices at the position after each prefix (see the protocol)."""
        return self._staged("choice", lambda: self._read(prefixes, choices))

    def _read(self, prefixes: Sequence[Sequence[int]], choices: Sequence[Sequence[int]]) -> np.ndarray:
        """`choice_probs`, its sequences fed in groups (`_groups`)."""
        token_ids = choice_token_ids(choices)
        scores = np.zeros((len(prefixes), len(token_ids)))
        for group in self._groups([len(p) for p in prefixes]):
            _, rows = self.engine.feed([prefixes[i] for i in group])
            scores[group] = np.stack(rows)[:, token_ids]
        return pooled_softmax(scores, token_ids, choices)

    def depth_choice_probs(self, requests: Sequence[DepthRequest],
                           choices: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Every cut's re-fed sequence, read from the KV cache: prompt + trace fed once, each cut's suffix on its
        prefix."""
        probs = self._staged("depth", lambda: self._read(depth_sequences(requests), choices))
        return split_by_request(probs, requests)

    def close(self) -> None:
        """The engine shut down (`free_engine`): every backend of this process shares it."""
        free_engine()

    def metrics(self) -> dict[str, float]:
        """Share of prompt tokens served from the KV cache (shared or held), prefill / decode tokens per second, and
        the prefill tokens per second of each stage: generation's prompts, choice reads, depth reads (computed tokens
        over llama_decode's seconds)."""
        engine = _ENGINE.get(engine_key(self.settings))
        if self._counts_before is None or engine is None:  # no model call made (or the engine was freed since)
            return {}
        counts = {k: v - self._counts_before[k] for k, v in engine.counts.items()}
        rate = lambda tokens, seconds: counts[tokens] / counts[seconds] if counts[seconds] else float("nan")  # noqa: E731
        return {"prefix_cache_hit_rate": counts["reused"] / counts["asked"] if counts["asked"] else float("nan"),
                "prefill_tokens_per_s": rate("prefill_tokens", "prefill_s"),
                "decode_tokens_per_s": rate("decode_tokens", "decode_s"),
                **{f"{stage}_prefill_tokens_per_s": tokens / seconds
                   for stage, (tokens, seconds) in self.stages.items() if seconds}}
