"""Shell completion (`eval "$(fairaudit -sc install=bash)"`): the subcommands and their arguments here, the
overrides from Hydra's own completion (after `report`, the report's)."""

from __future__ import annotations

import argparse
import sys


def argparse_words(parser: argparse.ArgumentParser, typed: list[str]) -> list[str]:
    """What may come next on an argparse command line after the words `typed`: subcommands, choices, options."""
    words = [option for action in parser._actions for option in action.option_strings]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            if typed and typed[0] in action.choices:
                return argparse_words(action.choices[typed[0]], typed[1:])
            return list(action.choices) + words
        if action.choices and not action.option_strings and not any(t in action.choices for t in typed):
            return list(action.choices) + words
    return words


def own_words(typed: list[str]) -> list[str] | None:
    """What may follow the complete words `typed` inside `data`, `store` or `list`; None elsewhere (Hydra's)."""
    if typed[0] == "data":
        from fairaudit.data.fetch import DATASETS, parser

        return argparse_words(parser(), typed[1:]) + (list(DATASETS) if len(typed) > 1 else [])
    if typed[0] == "store":
        from fairaudit.store.cli import parser

        return argparse_words(parser(), typed[1:])
    return ["--help"] if typed[0] == "list" else None


def complete(argv: list[str], commands: list[str]) -> int:
    """`fairaudit -sc query=bash`, which Hydra's bash completion calls with the line in COMP_LINE: the
    subcommands (`commands`) and their arguments here; overrides from Hydra (after `report`, the report's own)."""
    import importlib
    import os

    line = os.environ.get("COMP_LINE", "")
    words = line.split()
    typed = words[1:] if line.endswith(" ") else words[1:-1]  # the complete words before the one being typed
    own = own_words(typed) if typed else None
    if own is not None:
        print(" ".join(own))
        return 0
    module = "fairaudit.job.__main__"
    if typed and typed[0] == "report":
        os.environ["COMP_LINE"] = line.replace(" report", "", 1)
        module = "fairaudit.report.__main__"
    elif not typed:
        print(" ".join([*commands, "--help"]), end=" ")
    sys.argv = [sys.argv[0], *argv]
    importlib.import_module(module).main()
    return 0
