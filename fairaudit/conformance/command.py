"""`fairaudit check backend=NAME`: the backend built as its config's `conformance:` entry says, on the tiny Qwen3
(or the embedded model the entry names), and held to every check of the contract (`checks.CHECKS`): a line per
check on stdout, exit code 0 when all hold, 1 when one breaks, 2 for bad input (one `error:` line)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Iterator

from fairaudit.backends import Backend
from fairaudit.catalog import registry
from fairaudit.conformance.checks import CHECKS
from fairaudit.errors import AuditError
from fairaudit.models.locate import embedded_model_dir, tiny_qwen3_dir

MODELS = {"tiny_qwen3": tiny_qwen3_dir, "smollm2": embedded_model_dir}  # what a declaration's `model` may name
DECLARED = {"tolerance", "settings", "model", "folder", "serve"}


def declaration(name: str) -> dict:
    """conf/backend/<name>.yaml's `conformance:` node, checked: {tolerance, settings, model, folder, serve}."""
    node = registry.meta("backend", name, "conformance")
    if not (isinstance(node, dict) and "tolerance" in node and set(node) <= DECLARED):
        raise AuditError(f"{registry.config_file('backend', name)} declares no conformance: {{tolerance, settings, "
                         f"model, folder, serve}} (docs/adding.md), found {node!r}")
    return node


@contextlib.contextmanager
def built(name: str, model_dir: Path, base_url: str | None = None) -> Iterator[Backend]:
    """The backend `name` as its declaration builds it on `model_dir` (the tiny Qwen3 stands for the model its
    `model` names), turned into its own folder by its `folder` function, with its `settings` (and `base_url`, the
    server it is declared to be served behind); closed (`Backend.close`) when done."""
    from hydra.utils import get_method

    node = declaration(name)
    folder = MODELS[node.get("model", "tiny_qwen3")]() if model_dir == tiny_qwen3_dir() else model_dir
    folder = get_method(node["folder"])(folder) if node.get("folder") else folder
    backend = registry.target("backend", name)(folder, **node.get("settings", {}),
                                               **({"base_url": base_url} if base_url else {}))
    try:
        assert backend.name == name, f"conformance entry {name!r} built backend {backend.name!r}"
        yield backend
    finally:
        backend.close()


def run_checks(backend: Backend, tolerance: float) -> list[str]:
    """Each check's line (`ok NAME` or `FAILED NAME: why`), in order."""
    lines = []
    for check in CHECKS:
        try:
            check(backend, tolerance)
            lines.append(f"ok      {check.__name__}")
        except (AssertionError, AuditError) as error:
            lines.append(f"FAILED  {check.__name__}: {' '.join(str(error).split())[:500]}")
    return lines


def main(argv: list[str]) -> int:
    """`fairaudit check backend=NAME`."""
    names = [arg.split("=", 1)[1] for arg in argv if arg.startswith("backend=")]
    try:
        if len(names) != 1 or len(argv) != 1:
            raise AuditError(f"fairaudit check takes one backend=NAME (one of {', '.join(registry.names('backend'))})")
        node = declaration(registry.config_file("backend", names[0]).stem)
        if node.get("serve"):
            raise AuditError(f"backend={names[0]} is checked behind a server it does not start (conformance.serve: "
                             f"{node['serve']}): run tests/test_conformance.py in a checkout")
        with built(names[0], tiny_qwen3_dir()) as backend:
            lines = run_checks(backend, float(node["tolerance"]))
    except AuditError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    failed = sum(line.startswith("FAILED") for line in lines)
    print(f"backend={names[0]}: {len(lines) - failed} of {len(lines)} checks hold")
    return 1 if failed else 0
