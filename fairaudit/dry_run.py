"""`dry_run=true`: print the exact prompts a run would send, loading the tokenizer but no model."""

from __future__ import annotations

from typing import Sequence

from fairaudit.models import EMBEDDED_SMOLLM2, EMBEDDED_TINY_QWEN3, resolve_model_dir
from fairaudit.probes import Prompt


def load_tokenizer(source: str, path: str | None, revision: str | None):
    """The model's tokenizer (its chat template renders the prompts); a hub model fetches its tokenizer files only."""
    from transformers import AutoTokenizer

    if path or source in (EMBEDDED_SMOLLM2, EMBEDDED_TINY_QWEN3):
        return AutoTokenizer.from_pretrained(str(resolve_model_dir(source, path, revision)))
    return AutoTokenizer.from_pretrained(source, revision=revision)


def show(prompts: Sequence[Prompt]) -> int:
    """Print the prompts to stdout under their headings (a heading once for its run of prompts); returns the count."""
    heading = None
    for prompt in prompts:
        if prompt.heading != heading:
            heading = prompt.heading
            print(f"=== {heading}")
        print(f"--- {prompt.label}")
        print(prompt.text)
        print()
    return len(prompts)
