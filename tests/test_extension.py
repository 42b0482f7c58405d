"""Open for extension: a new probe or backend is new files only. The shared modules name no shipped probe
or backend, and a probe class that breaks the contract fails in one `error:` line before any model loads."""

from __future__ import annotations

import ast
import re
import sqlite3
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, run_app
from fairaudit import registry
from fairaudit.errors import AuditError

# The modules every probe goes through; none may name one. Tests' shared files: conftest and the helper
# modules the tests import (tests/*.py other than test_*.py).
SHARED = ["fairaudit/app.py", "fairaudit/cli.py", "fairaudit/validate.py", "fairaudit/samples.py",
          "fairaudit/dry_run.py", "fairaudit/tracking.py", "fairaudit/report/*.py", "tests/conftest.py",
          "tests/[!t]*.py"]


def shared_files() -> list[Path]:
    return sorted({path for pattern in SHARED for path in REPO.glob(pattern)})


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes (a module's, class's or function's first string): prose, not code."""
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(node.body[0].value) for node in ast.walk(tree) if isinstance(node, owners) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
            and isinstance(node.body[0].value.value, str)}


def code_words(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every name the code uses or defines (variables, attributes, imports, functions,
    classes, arguments, keywords) and every string literal that is not a docstring. Comments are not in
    the tree; docstrings are left out because `position` and `influence` are also English words."""
    prose = docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words = [node.id]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, ast.alias):
            words = [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom):
            words = [node.module or ""]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words = [node.name]
        elif isinstance(node, ast.arg):
            words = [node.arg]
        elif isinstance(node, ast.keyword):
            words = [node.arg or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            words = [node.value]
        else:
            continue
        found += [(getattr(node, "lineno", 0), word) for word in words if word]
    return found


def name_uses(source: str, names: list[str]) -> list[tuple[int, str]]:
    """(line, name) of every word-boundary occurrence of one of `names` in the code of `source`."""
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    return [(line, match.group(0)) for line, word in code_words(ast.parse(source)) for match in pattern.finditer(word)]


def test_the_count_sees_names_strings_and_imports_but_not_prose():
    source = textwrap.dedent('''
        """A docstring may say position."""
        from fairaudit.probes.position import X  # a comment may say position
        def f(counterfactual):
            """So may this one: influence."""
            return runs["probe"] == "cdpg" or cfg.btm or f"probe={name}" or "report.position.zero_method"
        ''')
    uses = name_uses(source, ["position", "counterfactual", "influence", "cdpg", "btm"])
    assert sorted(name for _, name in uses) == ["btm", "cdpg", "counterfactual", "position", "position"]
    assert name_uses("css = 'answer_position cdpg_slope'", ["position", "cdpg"]) == []  # whole words only


@pytest.mark.parametrize("group", ["probe", "backend"])
def test_the_shared_modules_name_no_shipped_probe_or_backend(group):
    names = registry.names(group)
    files = shared_files()
    assert len(names) >= 5 and {"app.py", "build.py", "conftest.py"} <= {f.name for f in files}
    uses = {f"{path.relative_to(REPO)}:{line}: {name}" for path in files
            for line, name in name_uses(path.read_text(), names)}
    assert not uses, sorted(uses)


NO_VERDICT = '''
from fairaudit.probes import Needs, Probe, Prompt, SampleView
from fairaudit.probes.paired_samples import PAIRS


class NoVerdictProbe(Probe):
    needs = Needs("decision", ("scores",))
    samples = SampleView("records", PAIRS)

    def __init__(self, **settings):
        raise AssertionError("never built")

    def prompts(self, ctx):
        return []

    def run(self, ctx):
        raise AssertionError("never run")
'''


def test_a_probe_without_verdict_fails_in_one_line_before_any_model_loads(tmp_path):
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "no_verdict.py").write_text(NO_VERDICT)
    result = run_app(tmp_path, "probe._target_=no_verdict.NoVerdictProbe", env={"PYTHONPATH": str(tmp_path / "extra")})
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and errors == [
        "error: probe class no_verdict.NoVerdictProbe does not implement verdict: a probe implements prompts(ctx), "
        "run(ctx) and verdict(result) (docs/adding.md)"], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "store.sqlite").exists()  # no model call was ever made, so the store never opened
    mlflow = tmp_path / "mlflow.db"
    if mlflow.exists():
        with sqlite3.connect(mlflow) as db:
            assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


def test_a_probe_class_without_needs_or_samples_fails_when_it_is_defined():
    from fairaudit.probes import Probe

    with pytest.raises(AuditError, match=r"^probe class .*Bare declares no `needs` \(a Needs\) and no `samples` "
                                         r"\(a SampleView\): every probe says what it needs"):
        class Bare(Probe):
            def prompts(self, ctx):
                return []

            def run(self, ctx):
                return None

            def verdict(self, result):
                return []

    class Base(Probe):  # a base of probes, abstract: its concrete subclasses declare what they need
        pass

    with pytest.raises(AuditError, match=r"^probe class .*Base does not implement prompts, run, verdict"):
        Base()


# ---------------------------------------------------------------- a probe's report settings


def report_config(*overrides: str):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    registry.store_report_settings()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("report", overrides=list(overrides))


def test_every_probe_declares_its_report_settings_and_the_report_config_holds_them():
    from omegaconf import OmegaConf

    declared = registry.report_settings()
    assert set(declared) == set(registry.names("probe"))
    assert OmegaConf.to_container(report_config().probes) == declared
    assert all(registry.report_sections(probe) for probe in declared)  # every shipped probe has report sections


def test_a_new_probes_report_settings_are_overridable_without_touching_the_report_config(monkeypatch):
    from fairaudit.overrides import check

    monkeypatch.setattr(registry, "report_settings", lambda: {"newprobe": {"alpha": 0.05, "rounds": 3}})
    try:
        assert report_config("probes.newprobe.alpha=0.01").probes.newprobe.alpha == 0.01
        assert check("report", ["probes.newprobe.alpha=0.01"]) is None
        assert "did you mean probes.newprobe.alpha" in check("report", ["probes.newprobe.alfa=0.01"])
    finally:
        monkeypatch.undo()
        registry.store_report_settings()


def test_a_misspelt_report_setting_is_one_line_naming_the_nearest(tmp_path):
    from fairaudit.overrides import check

    name = registry.names("probe")[0]
    key = sorted(registry.report_settings()[name])[0]
    assert check("report", [f"probes.{name}.{key}x=1"]) == (
        f"probes.{name}.{key}x: the config has no key 'probes.{name}.{key}x'; did you mean probes.{name}.{key}? "
        f"(to add a new key on purpose, write +probes.{name}.{key}x=...)")
    typo = check("report", [f"probes.{name[:-1]}.{key}=1"])
    assert re.search(rf"no key .probes\.{name[:-1]}.; did you mean probes\.{name}\b", typo), typo
    result = run_app(tmp_path, "report", f"probes.{name}.{key}x=1", in_tmp=True)  # the command line checks it
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: {check('report', [f'probes.{name}.{key}x=1'])}"]


def test_a_report_node_in_another_shape_is_one_error_naming_the_file(monkeypatch):
    monkeypatch.setattr(registry, "settings", lambda group, name: {"report": ["fairaudit.x.section"]})
    with pytest.raises(AuditError, match=r"^conf/probe/p.yaml: report must be a mapping of `sections` .* and "
                                         r"`settings` \(their settings\), not \['fairaudit.x.section'\]$"):
        registry.report_sections("p")
