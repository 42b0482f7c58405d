"""The package keeps its shape: its folders are the layers of docs/architecture.md, every import runs from a layer
to the same or a lower one, no import circle, short functions, short files.

An import is any edge the code takes to another module: a module-level or a lazy (in-function) import, a module
named in a string (`importlib.import_module("fairaudit.job.__main__")`), and a class or function a config names
(`_target_`, a probe's `report.sections`) from each module that looks one up (`get_class`, `instantiate`, ...);
the Hydra callback conf/config.yaml names is an edge of the audit's Hydra app, `fairaudit.job.__main__`.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import yaml

from conftest import REPO

PACKAGE = REPO / "fairaudit"
ARCHITECTURE = REPO / "docs" / "architecture.md"
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 400
MAX_TOP_MODULES = 5
LOOKUPS = {"get_class", "get_method", "get_object", "instantiate"}  # Hydra's: a dotted name in a config -> code


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache  # parsed once a session: the package's files do not change while the tests read them
def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def owner(dotted: str, known: set[str]) -> str | None:
    """The longest known module that `dotted` (a module, or a module's attribute) starts with."""
    parts = dotted.split(".")
    return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in known), None)


def imported(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """The package's modules `name` imports, at module level or inside a function, or names in a string."""
    package = name if any(k.startswith(name + ".") for k in known) else name.rpartition(".")[0]
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
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("fairaudit."):
            found.add(node.value)
    return {m for m in (owner(f, known) for f in found) if m and m != name}


def looks_up(tree: ast.Module) -> bool:
    """Whether the module turns a config's dotted name into code."""
    return any(isinstance(node, ast.Call) and (getattr(node.func, "id", None) or getattr(node.func, "attr", None))
               in LOOKUPS for node in ast.walk(tree))


def dotted_names(node) -> list[str]:
    """Every `_target_` and every `report.sections` entry in a config."""
    if isinstance(node, dict):
        found = [node["_target_"]] if isinstance(node.get("_target_"), str) else []
        sections = node.get("report", {}).get("sections") if isinstance(node.get("report"), dict) else None
        found += list(sections or [])
        return found + [n for key, value in node.items() if key != "hydra" for n in dotted_names(value)]
    return [n for value in node for n in dotted_names(value)] if isinstance(node, list) else []


def config_targets(known: set[str]) -> tuple[set[str], set[str]]:
    """(modules the config groups name, modules conf/config.yaml's Hydra node names)."""
    groups = [p for p in (REPO / "conf").rglob("*.yaml") if p.parent != REPO / "conf" and "hydra" not in p.parts]
    named = {n for path in groups for n in dotted_names(yaml.safe_load(path.read_text()) or {})}
    hydra = yaml.safe_load((REPO / "conf" / "config.yaml").read_text())["hydra"]
    callbacks = {cb["_target_"] for cb in hydra.get("callbacks", {}).values()}
    return ({m for m in (owner(n, known) for n in named) if m}, {m for m in (owner(n, known) for n in callbacks) if m})


def import_graph() -> dict[str, set[str]]:
    """Each module of the package: the modules it imports, looks up by name, or reaches through the configs."""
    return {name: set(targets) for name, targets in _import_graph().items()}


@functools.cache
def _import_graph() -> dict[str, set[str]]:
    trees = modules()
    known = set(trees)
    targets, callbacks = config_targets(known)
    graph = {name: imported(name, tree, known) | (targets if looks_up(tree) else set())
             for name, tree in trees.items()}
    graph["fairaudit.job.__main__"] |= callbacks
    for name in graph:
        graph[name].discard(name)
    return graph


def layers() -> list[tuple[str, list[str]]]:
    """docs/architecture.md's layer table, top to bottom: (layer, the files and folders it names)."""
    text = ARCHITECTURE.read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    return [(layer.strip(), re.findall(r"`([^`]+)`", places)) for layer, places in rows[1:]]


def layer_of(module: str, table: list[tuple[str, list[str]]]) -> int:
    """The index of the layer whose files or folders hold `module` (0: the top)."""
    path = module.replace(".", "/").removeprefix("fairaudit").lstrip("/")
    for index, (_, places) in enumerate(table):
        for place in places:
            if place.endswith("/") and (path + "/").startswith(place) or path + ".py" == place or \
                    (place == "__init__.py" and path == ""):
                return index
    raise AssertionError(f"{module} is in no layer of docs/architecture.md's table")


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


def test_the_graph_follows_lazy_imports_strings_and_config_lookups():
    graph = import_graph()
    assert {"fairaudit.store.results", "fairaudit.probes", "fairaudit.job.config"} <= graph["fairaudit.job.run"]
    assert "fairaudit.probes.position" in graph["fairaudit.catalog.registry"]  # a `_target_` the registry resolves
    assert "fairaudit.probes.paired_report" in graph["fairaudit.catalog.registry"]  # a report section it looks up
    assert "fairaudit.job.sweep" in graph["fairaudit.job.__main__"]  # the Hydra callback of conf/config.yaml
    assert "fairaudit.job.__main__" in graph["fairaudit.cli.main"]  # import_module("fairaudit.job.__main__")


def test_no_module_imports_itself_back():
    graph = import_graph()
    assert cycle(graph) is None, " -> ".join(cycle(graph))


def test_a_cycle_is_found_where_there_is_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_every_import_runs_to_the_same_layer_or_a_lower_one():
    table, graph = layers(), import_graph()
    top = ["entry", "report", "plan", "conformance", "job"]
    assert [layer for layer, _ in table][:5] == top and len(table) >= 10, table
    upward = [f"{a} ({table[layer_of(a, table)][0]}) -> {b} ({table[layer_of(b, table)][0]})"
              for a, targets in sorted(graph.items()) for b in sorted(targets)
              if layer_of(b, table) < layer_of(a, table)]
    assert not upward, "\n".join(upward)


def test_every_folder_is_one_layer_and_says_what_it_holds():
    table = layers()
    named = {place for _, places in table for place in places}
    folders = {f"{p.name}/" for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert folders <= named and set(top) <= named, (folders - named, set(top) - named)
    assert len(top) <= MAX_TOP_MODULES, top
    for folder in folders:
        doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text()))
        assert doc and re.search(r"\bnever\b", doc, re.I), f"fairaudit/{folder}__init__.py: what it holds, never does"


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


def test_the_report_and_the_command_line_read_the_catalog_not_the_job():
    """report/ and cli/ import nothing from job/ (the command line starts the audit's Hydra app by its name alone)."""
    trees = modules()
    known = set(trees)
    statements = {name: {m for m in (owner(n, known) for node in ast.walk(tree) for n in imported_names(node)) if m}
                  for name, tree in trees.items() if name.startswith(("fairaudit.report", "fairaudit.cli"))}
    climbing = {name: sorted(m for m in found if m.startswith("fairaudit.job")) for name, found in statements.items()}
    assert not any(climbing.values()), climbing


def imported_names(node: ast.AST) -> list[str]:
    """The dotted names an import statement takes (absolute imports: the package uses no relative ones)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        return [f"{node.module}.{a.name}" for a in node.names]
    return []
