"""The `process` mark, set at collection on every test that starts a process (`python -m fairaudit`, a server, a
fork), itself, through a fixture, or through a helper of its module or of the tests' helper modules, so that
`make test-fast` (-m "not process ...") is the tests that run in-process. Registered by tests/conftest.py."""

from __future__ import annotations

import ast
import inspect
import re
from functools import lru_cache
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
STARTS = {"subprocess.run", "Popen", "fork", "check_output", "check_call", "Process", "start_new_session"}
SUBPROCESS_RUN = re.compile(r"\bsubprocess\.run\(")


@lru_cache(maxsize=None)
def called_names(node: ast.AST) -> frozenset[str]:
    """The names a function or class calls (`f(...)`, `x.f(...)`: f), and "subprocess.run" when it calls that (a
    bare `run` names too many things to count); kept per definition, since every test module's search reads the
    helper modules' definitions again."""
    names = {call.func.id if isinstance(call.func, ast.Name) else call.func.attr for call in ast.walk(node)
             if isinstance(call, ast.Call) and isinstance(call.func, (ast.Name, ast.Attribute))}
    return frozenset(names | ({"subprocess.run"} if SUBPROCESS_RUN.search(ast.unparse(node)) else set()))


@lru_cache(maxsize=None)
def definitions(path: Path) -> dict[str, ast.AST]:
    tree = ast.parse(path.read_text())
    return {node.name: node for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


@lru_cache(maxsize=None)
def starters(module_path: Path) -> frozenset[str]:
    """Names of the functions and classes (of this module and the tests' helper modules) that start a process,
    directly or through one another."""
    defined: dict[str, ast.AST] = {}
    for helper in sorted(TESTS.glob("[!t]*.py")):
        defined.update(definitions(helper))
    defined.update(definitions(module_path))
    found = set(STARTS)
    while True:
        more = {name for name, node in defined.items() if name not in found and called_names(node) & found}
        if not more:
            return frozenset(found)
        found |= more


@lru_cache(maxsize=None)
def calls_in(function) -> frozenset[str]:
    """The names a test or fixture function calls (`called_names`); none when its source is not at hand."""
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return frozenset()
    return frozenset(called_names(ast.parse(inspect.cleandoc("\n" + source))))


def starts_a_process(item: pytest.Function) -> bool:
    names = starters(Path(item.path))
    functions = [item.function] + [defs[-1].func for defs in item._fixtureinfo.name2fixturedefs.values()]
    return any(calls_in(function) & names for function in functions)


def pytest_collection_modifyitems(items):
    for item in items:
        if isinstance(item, pytest.Function) and starts_a_process(item):
            item.add_marker(pytest.mark.process)
