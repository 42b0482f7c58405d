"""`dry_run=true`: print the exact prompts a run would send (the backend's tokenizer loaded, no model)."""

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
