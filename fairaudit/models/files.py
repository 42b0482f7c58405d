"""What names a model's files (`ModelFiles`, from a model config at its checkpoint) and the one line a
missing model gets (`ModelMissing`): no I/O here, so every layer may name model files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from fairaudit.errors import AuditError

PROMPT_FILES = ["*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken"]  # config, tokenizer, chat template: no weights


@dataclass(frozen=True)
class ModelFiles:
    """Where a model's files are, as its config names them at its checkpoint.

    source: a hub id or an embedded model (embedded:smollm2, embedded:tiny_qwen3, embedded:gemma3_270m_q4km);
    path: a local folder or file (takes precedence); revision: a hub revision; gguf_file: one GGUF file of the hub
    repository `source`.
    """

    source: str
    path: str | None = None
    revision: str | None = None
    gguf_file: str | None = None

    @classmethod
    def of(cls, model: Mapping) -> "ModelFiles":
        """The files of a `model` config at its checkpoint (the checkpoint's path or revision when it sets one)."""
        checkpoint = checkpoint_spec(model)
        return cls(model["source"], checkpoint["path"] or model["path"], checkpoint["revision"] or model["revision"],
                   model.get("gguf_file"))


def checkpoint_spec(model: Mapping) -> dict:
    """model.checkpoint as {label, path, revision}; a plain string names a hub revision and labels it."""
    checkpoint = model["checkpoint"]
    if isinstance(checkpoint, str):
        return {"label": checkpoint, "path": None, "revision": checkpoint}
    return {"label": checkpoint["label"], "path": checkpoint["path"], "revision": checkpoint["revision"]}


class ModelMissing(AuditError):
    """A model's files are neither here nor to be had from the hub: what, why, and how to get them."""

    def __init__(self, files: ModelFiles, why: str, weights: bool = True):
        self.files, self.why, self.weights = files, why, weights
        super().__init__(self.line())

    def line(self, model=None) -> str:
        """The one line: what is missing (of config `model`: its name, size and hardware), why, what to do."""
        files = self.files
        what = f"{files.gguf_file!r} from {files.source!r}" if files.gguf_file else repr(files.source)
        if not self.weights and not files.gguf_file:
            what = f"the tokenizer and chat template of {what}"
        what += f" at revision {files.revision}" if files.revision else ""
        return f"cannot get {what}{about(model, self.weights)}: {self.why}; {self.advice()}"

    def advice(self) -> str:
        """The command that downloads what is missing (where the hub is reachable), or model.path."""
        files = self.files
        words = ["hf download", files.source, *([files.gguf_file] if files.gguf_file else [])]
        words += [f"--revision {files.revision}"] if files.revision else []
        if not self.weights and not files.gguf_file:
            words += ["--include", *(f"'{pattern}'" for pattern in PROMPT_FILES)]
        return f"download it with `{' '.join(words)}` where the hub is reachable, or set model.path to a local copy"


def about(model, weights: bool = True) -> str:
    """' (model qwen3: about 66 GB, needs a GPU)' from a model config's name, weights_gb and needs_gpu (weights=False:
    its name alone)."""
    if model is None:
        return ""
    if not weights:
        return f" (model {model['name']})"
    size = model.get("weights_gb")
    parts = [f"about {size:g} GB" if size else "", "needs a GPU" if model.get("needs_gpu") else ""]
    shown = ", ".join(part for part in parts if part)
    return f" (model {model['name']}{': ' + shown if shown else ''})"
