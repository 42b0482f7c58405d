"""The `fairaudit` command: help, list, store delegation, shell completion, dry runs and a non-editable install."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from conftest import DATA_ROOT, REPO, run_app
from fairaudit.catalog import registry
from fairaudit.cli import main as cli
from warm import run_python

ENV = {**os.environ, "FAIRAUDIT_DATA": str(DATA_ROOT), "OMP_NUM_THREADS": "1"}


def fairaudit(*args: str, cwd: Path = REPO, python: str = sys.executable, **env: str) -> subprocess.CompletedProcess:
    return run_python([python, "-m", "fairaudit", *args], cwd=cwd, env={**ENV, **env}, timeout=600)


def test_help_describes_the_commands(capsys):
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    for command in ("fairaudit list", "fairaudit data fetch", "fairaudit data check", "fairaudit store",
                    "fairaudit report", "dry_run=true", "-sc install=bash"):
        assert command in text, command


def test_list_prints_one_line_per_config_with_its_description(capsys):
    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    sections = [line for line in lines if not line.startswith("  ")]
    assert [s.split()[0] for s in sections] == ["models", "datasets", "probes", "arms", "backends", "studies"]
    entries = {line.split()[0]: line for line in lines if line.startswith("  ")}
    for group in registry.GROUPS:
        for name in registry.names(group):
            assert name in entries, (group, name)
    assert "Qwen3-32B" in entries["qwen3"] and "MMLU" in entries["mmlu"] and "Paper 000" in entries["thinking_fairness"]
    assert all(len(line.split(None, 1)) == 2 for line in entries.values())  # every entry has a description
    assert entries["hf"].endswith("[can: scores, depth reads, target NLL, attention graphs]")
    assert "rehearsal, no model" in entries["mock"] and "needs vLLM" in entries["vllm"]


def complete(line: str) -> list[str]:
    """What bash offers for `line` after the README's `eval "$(fairaudit -sc install=bash)"`."""
    script = ('eval "$(fairaudit -sc install=bash)"; COMP_LINE="$LINE"; COMP_POINT=${#COMP_LINE}; '
              'COMP_WORDS=($COMP_LINE); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); '
              'hydra_bash_completion; printf "%s\\n" "${COMPREPLY[@]}"')
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # where the console script is
    done = subprocess.run(["bash", "-c", script], env={**ENV, "PATH": path, "LINE": line}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_bash_completion_of_the_console_script_completes_groups_and_options():
    assert "probe=" in complete("fairaudit prob")
    prefix = registry.names("probe")[0][0]  # the options of conf/probe/ that start with the first one's letter
    assert complete(f"fairaudit probe={prefix}") == [f"probe={p}" for p in registry.names("probe") if p[0] == prefix]


def test_bash_completion_covers_the_subcommands_and_their_options():
    assert sorted(complete("fairaudit da")) == ["data", "data.", "dataset.", "dataset="]  # a subcommand and overrides
    assert complete("fairaudit report select.pa") == ["select.parent="]  # the report's own keys, no parse error
    name, settings = next((p, s) for p, s in registry.report_settings().items() if s)
    assert f"probes.{name}.{sorted(settings)[0]}=" in complete(f"fairaudit report probes.{name}.")  # a probe's own
    assert complete("fairaudit data f") == ["fetch"]
    assert complete("fairaudit data fetch --root /tmp ad") == ["adult"]
    assert complete("fairaudit store export --s") == ["--store"]


def test_dry_run_prints_pairs_and_prompts_without_a_model(tmp_path):
    result = run_app(tmp_path, "dry_run=true", "model=tiny_qwen3", "dataset.n=2")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert out.count("=== pair adult-") == 4 and out.count("--- arm think") == 4 and out.count("--- arm nothink") == 4
    assert out.count("This person is a") == 8 and "Male" in out and "Female" in out
    assert "<|im_start|>user" in out  # the chat template was applied
    assert "dry run: 8 prompts, no model loaded, nothing logged" in result.stderr
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "store.sqlite").exists()


def test_a_dry_run_sweep_opens_no_parent_run(tmp_path):
    result = run_app(tmp_path, "dry_run=true", "model=tiny_qwen3", "dataset.n=1", "-m", "dataset=adult,compas")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("no model loaded, nothing logged") == 2
    assert not (tmp_path / "mlflow.db").exists() and "MLflow" not in result.stderr


def test_dry_run_of_an_mcq_probe_prints_each_permutation(tmp_path):
    result = run_app(tmp_path, "dry_run=true", "model=tiny_qwen3", "probe=position", "dataset=mmlu", "arm=direct",
                     "dataset.n=1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("=== question") == 4 and result.stdout.count("--- arm direct") == 4
    assert all(f"permutation {s}" in result.stdout for s in range(4))


def test_dry_run_of_the_influence_probe_prints_each_items_first_request_per_graph(tmp_path):
    result = run_app(tmp_path, "dry_run=true", "model=tiny_qwen3", "probe=influence", "dataset=mmlu", "dataset.n=2")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert (out.count("=== question") == 2 and out.count("--- graph masked") == 2
            and out.count("--- graph unmasked") == 2)
    assert out.count("The proposer A thinks privately") == 4 and out.count("<|im_start|>assistant\n<A_private>\n") == 4
    assert "dry run: 4 prompts, no model loaded, nothing logged" in result.stderr


@pytest.mark.slow
@pytest.mark.long
def test_wheel_installs_and_runs_outside_the_checkout(tmp_path):
    """A built wheel (not editable) carries its configs: `fairaudit list` and a dry run work from another folder."""
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("fairaudit-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    target = next((env_dir / "lib").glob("python*/site-packages"))
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                                str(wheel)], capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    script = target / "bin" / "fairaudit"
    deps = next(Path(p) for p in sys.path if p.endswith("site-packages"))  # this venv's dependencies, after the wheel
    env = {"PYTHONPATH": f"{target}{os.pathsep}{deps}"}
    where = tmp_path / "elsewhere"
    where.mkdir()
    python = str(env_dir / "bin" / "python")
    found = subprocess.run([python, "-c", "import fairaudit; print(fairaudit.__file__)"], cwd=where,
                           env={**ENV, **env}, capture_output=True, text=True)
    assert found.stdout.startswith(str(target)), found.stdout + found.stderr
    listed = subprocess.run([python, str(script), "list"], cwd=where, env={**ENV, **env}, capture_output=True,
                            text=True)
    assert listed.returncode == 0 and "thinking_fairness" in listed.stdout, listed.stderr[-2000:]
    dry = subprocess.run([python, str(script), "dry_run=true", "model=tiny_qwen3", "dataset.n=1",
                          f"store.url={tmp_path}/store.sqlite"],
                         cwd=where, env={**ENV, **env}, capture_output=True, text=True, timeout=600)
    assert dry.returncode == 0 and dry.stdout.count("=== pair") == 2, dry.stderr[-3000:]
