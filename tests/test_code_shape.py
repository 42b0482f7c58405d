"""The package keeps its shape: no import circle between its modules, short functions, short files."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fairaudit"
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """The package's modules `name` imports, at module level or inside a function (a lazy import is an edge too)."""
    package = name if name in known and any(k.startswith(name + ".") for k in known) else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {m for m in found if m in known and m != name}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return None

    return next((found for node in sorted(graph) if node not in state and (found := visit(node))), None)


def test_no_module_imports_itself_back():
    trees = modules()
    known = set(trees)
    graph = {name: imported(name, tree, known) for name, tree in trees.items()}
    assert graph["fairaudit.app"] >= {"fairaudit.client", "fairaudit.probes"}  # the graph is read at all
    assert cycle(graph) is None, " -> ".join(cycle(graph))


def test_a_cycle_is_found_where_there_is_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_functions_and_files_stay_short():
    long_functions, long_files = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().count("\n")
        if lines > MAX_FILE_LINES:
            long_files.append(f"{path.name}: {lines}")
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES):
                long_functions.append(f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1})")
    assert not long_files and not long_functions, (long_files, long_functions)
