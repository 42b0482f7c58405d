"""`dry_run=true`: print the exact prompts a run would send (the backend's tokenizer loaded, no model), or, when no
tokenizer can be had, the data's own messages."""

from __future__ import annotations

from typing import Sequence

from fairaudit.errors import AuditError
from fairaudit.job.config import Job
from fairaudit.models.files import ModelMissing
from fairaudit.probes import AuditContext, Prompt
from fairaudit.terminal.output import console


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


def show_messages(messages: Sequence[tuple[str, str]]) -> int:
    """Print (heading, text) messages to stdout, unrendered; returns the count."""
    for heading, text in messages:
        print(f"=== {heading} (the user message, no chat template applied)")
        print(text)
        print()
    return len(messages)


def preview(job: Job) -> None:
    """dry_run=true: print the prompts the probe would send, rendered by the backend's tokenizer on the folder
    it finds without weights; no model loads, nothing is logged. Without a tokenizer (offline, not cached), the
    data's messages unrendered, then one error line saying why and how to get it."""
    try:
        tokenizer = job.backend_class.load_tokenizer(job.source.folder(weights=False), job.backend_settings)
    except (AuditError, OSError, ValueError) as error:  # transformers' OSError: a folder without a tokenizer
        shown = show_messages(job.dataset.messages())
        why = error.line(job.model) if isinstance(error, ModelMissing) else " ".join(str(error).split())
        raise AuditError(f"dry run: the {shown} messages above are the data it would send, but it cannot render "
                         f"them into prompts: {why}") from None
    count = show(job.probe.prompts(AuditContext(None, tokenizer, job.spec, job.dataset, job.arm)))
    console.print(f"dry run: {count} prompts, no model loaded, nothing logged")
