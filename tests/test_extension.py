"""Open for extension: a new probe or backend is new files only. The shared modules name no shipped probe
or backend, and a probe class that breaks the contract fails in one `error:` line before any model loads."""

from __future__ import annotations

import ast
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, run_app
from fairaudit.catalog import registry
from fairaudit.errors import AuditError
from warm import run_python

# The modules every probe goes through; none may name one. Tests' shared files: conftest and the helper
# modules the tests import (tests/*.py other than test_*.py).
SHARED = ["fairaudit/*.py", "fairaudit/cli/*.py", "fairaudit/job/*.py", "fairaudit/plan/*.py", "fairaudit/catalog/*.py",
          "fairaudit/report/*.py",
          "fairaudit/tracking/*.py", "fairaudit/views/*.py", "fairaudit/store/*.py", "fairaudit/terminal/*.py",
          "fairaudit/errors/*.py", "tests/conftest.py", "tests/[!t]*.py"]


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
    assert len(names) >= 5 and {"run.py", "config.py", "build.py", "conftest.py"} <= {f.name for f in files}
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
        "error: probe class no_verdict.NoVerdictProbe does not implement verdict: a probe declares `needs` (a Needs) "
        "and `samples` (a SampleView) and implements prompts(ctx), run(ctx) and verdict(result) (docs/adding.md)"
    ], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "store.sqlite").exists()  # no model call was ever made, so the store never opened
    mlflow = tmp_path / "mlflow.db"
    if mlflow.exists():
        with sqlite3.connect(mlflow) as db:
            assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


def test_a_probe_class_without_needs_or_samples_fails_when_it_is_defined():
    from fairaudit.probes import Probe

    with pytest.raises(AuditError, match=r"^probe class .*Bare declares no `needs` \(a Needs\) and no `samples` "
                                         r"\(a SampleView\): a probe declares `needs`"):
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
    from fairaudit.cli.overrides import check

    monkeypatch.setattr(registry, "report_settings", lambda: {"newprobe": {"alpha": 0.05, "rounds": 3}})
    try:
        assert report_config("probes.newprobe.alpha=0.01").probes.newprobe.alpha == 0.01
        assert check("report", ["probes.newprobe.alpha=0.01"]) is None
        assert "did you mean probes.newprobe.alpha" in check("report", ["probes.newprobe.alfa=0.01"])
    finally:
        monkeypatch.undo()
        registry.store_report_settings()


def test_a_misspelt_report_setting_is_one_line_naming_the_nearest(tmp_path):
    from fairaudit.cli.overrides import check

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
    monkeypatch.setattr(registry, "config_file", lambda group, name: Path(f"conf/{group}/{name}.yaml"))
    with pytest.raises(AuditError, match=r"^conf/probe/p.yaml: report must be a mapping of `sections` .*; "
                                         r"`settings` \(their settings\); .*`sign_test` .*, not "
                                         r"\['fairaudit.x.section'\]$"):
        registry.report_sections("p")


# ---------------------------------------------------------------- a probe and a backend from outside fairaudit

EXTERNAL_PROBE = '''"""An audit outside fairaudit: the mean P(Yes) of each side, read straight after each prompt."""
from fairaudit.api import (Layout, Needs, Probe, ProbeResult, Prompt, SampleView, answer_choices, encode_all, esc,
                           item, render_prompts)


def one_pair(rows, group):
    return item(group, f"pair {rows[0]['pair_id']}", "".join(f"<p>{esc(r['side'])}: {r['p_yes']:.3f}</p>"
                                                            for r in rows))


PAIR_ROWS = Layout(unit="pair_id", label=lambda records: records["side"], item=one_pair)


class MeanPYesProbe(Probe):
    needs = Needs("decision", ("scores",))
    samples = SampleView("records", PAIR_ROWS)

    def prompts(self, ctx):
        pairs = ctx.dataset.pairs()
        return [Prompt(f"pair {r.pair_id}, {r.side}", f"arm {ctx.arm.name}", text)
                for r, text in zip(pairs.itertuples(), render_prompts(ctx, pairs, ctx.arm))]

    def run(self, ctx):
        pairs = ctx.dataset.pairs()
        probs = ctx.client.choice_probs(encode_all(ctx, render_prompts(ctx, pairs, ctx.arm)), answer_choices(ctx))
        records = pairs[["pair_id", "side"]].assign(p_yes=probs[:, 0])
        metrics = {f"mean_p_yes_{side}": float(rows["p_yes"].mean()) for side, rows in records.groupby("side")}
        return ProbeResult(metrics=metrics, records={"records": records}, headline=sorted(metrics))

    def verdict(self, result):
        means = {k[len("mean_p_yes_"):]: v for k, v in sorted(result.metrics.items()) if k.startswith("mean_p_yes_")}
        return ["mean P(Yes) per side: " + ", ".join(f"{side} {mean:.3f}" for side, mean in means.items()) + "."]
'''

EXTERNAL_BACKEND = '''"""An engine outside fairaudit: `first` to every first choice; generation repeats the prompt."""
from pathlib import Path

import numpy as np

from fairaudit.api import Backend, Capabilities, completion_from_ids, model_fingerprint, refuse_graphs, stop_token_ids

BACKEND_VERSION = "constant-1"


class ConstantBackend(Backend):
    name = "constant"
    capabilities = Capabilities(scores=True, depth_reads=False)

    def __init__(self, model_dir, dtype="float32", batch_size=8, first=0.75):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.stop_ids, self.first = stop_token_ids(str(model_dir), self.tokenizer), first
        self.fingerprint = f"{model_fingerprint(Path(model_dir))}/{BACKEND_VERSION}/{first}"

    def generate(self, requests):
        refuse_graphs(self, requests)
        return [completion_from_ids(self.tokenizer, [r.prompt_ids[-1]] * r.max_new_tokens, self.stop_ids,
                                    r.max_new_tokens) for r in requests]

    def choice_probs(self, prefixes, choices):
        rest = (1.0 - self.first) / (len(choices) - 1)
        return np.array([[self.first] + [rest] * (len(choices) - 1) for _ in prefixes], dtype=np.float64)
'''

EXTERNAL_CONFIGS = {
    "probe/mean_p_yes.yaml": "# Mean P(Yes) per side (an audit from outside fairaudit).\n"
                             "_target_: {module}.probe.MeanPYesProbe\nsmallest_run: [dataset.n=2]\n",
    "backend/constant.yaml": "# Constant scores (an engine from outside fairaudit).\n"
                             "_target_: {module}.backend.ConstantBackend\nfirst: 0.75\n"
                             "conformance: {{tolerance: 0.0}}\n",
}
EXTERNAL_RUN = ("probe=mean_p_yes", "backend=constant", "model=tiny_qwen3", "arm=nothink", "dataset.n=2")


def write_extension(package: Path, conf: Path) -> None:
    """The probe and backend modules in `package` (a Python package folder), their configs in `conf`."""
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "probe.py").write_text(EXTERNAL_PROBE)
    (package / "backend.py").write_text(EXTERNAL_BACKEND)
    for path, text in EXTERNAL_CONFIGS.items():
        (conf / path).parent.mkdir(parents=True, exist_ok=True)
        (conf / path).write_text(text.format(module=package.name))


def assert_the_external_audit_ran(tmp_path: Path, env: dict[str, str]) -> None:
    """`fairaudit list` shows the external probe and backend, and an audit with them runs end to end: its mean
    P(Yes) is the backend's constant 0.75 on both sides, logged to MLflow with its verdict."""
    from mlflow import MlflowClient

    listed = run_python([sys.executable, "-m", "fairaudit", "list"], env={**os.environ, **env}, timeout=120)
    assert listed.returncode == 0, listed.stderr[-2000:]
    entries = {line.split()[0]: line for line in listed.stdout.splitlines() if line.startswith("  ")}
    assert "outside fairaudit" in entries["mean_p_yes"] and "[can: scores]" in entries["constant"]
    done = run_app(tmp_path, *EXTERNAL_RUN, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "mean P(Yes) per side: alpha 0.750, alpha_prime 0.750." in done.stdout
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("fairaudit").experiment_id])
    assert run.data.metrics == {"mean_p_yes_alpha": 0.75, "mean_p_yes_alpha_prime": 0.75, "model_calls": 4.0}
    assert run.data.tags["probe"] == "mean_p_yes" and run.data.tags["engine"].startswith("constant")


@pytest.mark.slow
def test_the_outside_probe_and_backend_import_only_the_public_api():
    """What an outside author imports from fairaudit is `fairaudit.api` alone, and every name it uses is there."""
    import fairaudit.api

    for source in (EXTERNAL_PROBE, EXTERNAL_BACKEND):
        imports = [node for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.Import, ast.ImportFrom))]
        modules = {node.module if isinstance(node, ast.ImportFrom) else alias.name
                   for node in imports for alias in node.names}
        assert {m for m in modules if m.split(".")[0] == "fairaudit"} == {"fairaudit.api"}, modules
        taken = {alias.name for node in imports if isinstance(node, ast.ImportFrom) and node.module == "fairaudit.api"
                 for alias in node.names}
        assert taken <= set(fairaudit.api.__all__), taken - set(fairaudit.api.__all__)


def test_a_probe_and_a_backend_of_an_installed_package_run_end_to_end(tmp_path):
    source = tmp_path / "source"
    write_extension(source / "ext_audits", source / "ext_audits" / "conf")
    (source / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "ext-audits"\nversion = "0.1"\n\n'
        '[project.entry-points.fairaudit]\nconf = "ext_audits.conf"\n\n'
        '[tool.setuptools.package-data]\next_audits = ["conf/*/*.yaml"]\n')
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                                "--target", str(site), str(source)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    assert (site / "ext_audits" / "conf" / "probe" / "mean_p_yes.yaml").exists()
    assert_the_external_audit_ran(tmp_path, {"PYTHONPATH": str(site)})


@pytest.mark.slow
def test_a_probe_and_a_backend_in_a_folder_on_fairaudit_path_run_end_to_end(tmp_path):
    folder = tmp_path / "my_audits"
    write_extension(folder / "folder_audits", folder)
    assert_the_external_audit_ran(tmp_path, {"FAIRAUDIT_PATH": str(folder)})


def test_a_fairaudit_path_that_is_no_folder_is_one_line(tmp_path, monkeypatch):
    from fairaudit.places import extension_roots

    monkeypatch.setenv("FAIRAUDIT_PATH", str(tmp_path / "missing"))
    with pytest.raises(AuditError, match=rf"^FAIRAUDIT_PATH: {tmp_path}/missing is not a folder"):
        extension_roots()
