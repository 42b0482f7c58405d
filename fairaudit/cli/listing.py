"""`fairaudit list`: every selectable config, one line each, grouped; backends with what they can do."""

from __future__ import annotations

import argparse

from fairaudit.catalog import registry

CAPABILITY_WORDS = {"scores": "scores", "depth_reads": "depth reads", "target_nll": "target NLL",
                    "attention_graphs": "attention graphs"}


def capabilities_line(name: str) -> str:
    """What a backend can do (its declared capabilities), whether it is a rehearsal, and what it needs installed."""
    from fairaudit.backends import NEEDABLE

    cls = registry.target("backend", name)
    can = [CAPABILITY_WORDS[c] for c in NEEDABLE if cls.capabilities.has(c)]
    words = [f"can: {', '.join(can) or 'generation only'}"]
    words += ["rehearsal, no model"] if cls.rehearsal else []
    words += [f"needs {cls.requires.label}{'' if cls.available() else ' (not installed here)'}"] if cls.requires else []
    return f"[{'; '.join(words)}]"


def list_configs(argv: list[str]) -> int:
    """`fairaudit list`: every selectable config, one line each, grouped (backends with their capabilities)."""
    argparse.ArgumentParser(prog="fairaudit list", description="List models, datasets, probes, arms, backends "
                            "and studies.").parse_args(argv)
    for group, title in registry.GROUPS.items():
        names = registry.names(group)
        print(f"{title} ({'+' if group == 'experiment' else ''}{group}=NAME):")
        width = max((len(name) for name in names), default=0)
        for name in names:
            extra = f" {capabilities_line(name)}" if group == "backend" else ""
            print(f"  {name:<{width}}  {registry.describe(group, name)}{extra}".rstrip())
    return 0
