"""`dry_run=true`: print the exact prompts a run would send (the backend's tokenizer loaded, no model), or, when no
tokenizer can be had, the data's own messages."""

from __future__ import annotations

from typing import Sequence

from fairaudit.probes import Prompt


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
