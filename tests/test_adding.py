"""docs/adding.md runs as written: its worked backend (`echo`) and probe (`yes_rate`) are written, block by block,
into a copy of the repository at the paths their `<!-- file: PATH -->` markers name, and the copy runs them end
to end on the tiny model, through the shared tests that run every backend and every probe. Every block is a new
file and every other file of the copy, tests included, equals the repository's, so a passing test shows a backend
and a probe are new files only, and the page cannot go stale."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import DATA_ROOT, REPO
from warm import run_python

pytestmark = pytest.mark.slow

GUIDE = REPO / "docs" / "adding.md"
BLOCK = re.compile(r"<!-- file: (\S+)[^>]*-->\n```\w+\n(.*?)```", re.S)
COPIED = ("fairaudit", "conf", "experiments", "tests", "pyproject.toml")
TINY = ("model=tiny_qwen3", "dataset.n=2", "model.max_think_tokens=8")


def guide_blocks() -> dict[str, str]:
    """PATH -> the code of the block marked `<!-- file: PATH -->`, in the page's order."""
    blocks = dict(BLOCK.findall(GUIDE.read_text()))
    assert len(blocks) >= 6, f"docs/adding.md: expected the worked examples' file blocks, found {sorted(blocks)}"
    return blocks


def files_of(root: Path) -> dict[str, bytes]:
    """Every file under the copied folders of `root`, by its path relative to `root` (caches left out)."""
    found = {}
    for name in COPIED:
        paths = [root / name] if (root / name).is_file() else (root / name).rglob("*")
        found.update({str(path.relative_to(root)): path.read_bytes() for path in paths
                      if path.is_file() and not path.is_symlink() and "__pycache__" not in path.parts
                      and not {"vllm", "llamacpp", ".pytest_cache"} & set(path.relative_to(root).parts)})
    return found


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """The repository's code, configs and tests, with the guide's files added."""
    root = tmp_path_factory.mktemp("adding") / "repo"
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, root / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "vllm", "llamacpp"))
        else:
            shutil.copy(source, root / name)
    for path, code in guide_blocks().items():
        assert not (root / path).exists(), f"docs/adding.md's block for {path} would change an existing file"
        (root / path).write_text(code)
    return root


def run(copy: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """A command of the copy: its own `fairaudit` package first on the path, its store and MLflow file inside it."""
    env = {**os.environ, "PYTHONPATH": str(copy), "FAIRAUDIT_DATA": str(DATA_ROOT), "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1"}
    return run_python([sys.executable, *args], cwd=copy, env=env, timeout=timeout)


def audit(copy: Path, *overrides: str) -> subprocess.CompletedProcess:
    return run(copy, "-m", "fairaudit", f"store.url={copy}/store.sqlite", f"tracking.uri=sqlite:///{copy}/mlflow.db",
               f"hydra.run.dir={copy}/outputs", *overrides)


def test_the_guide_adds_files_only(copy):
    repository, copied = files_of(REPO), files_of(copy)
    added = set(copied) - set(repository)
    assert added == set(guide_blocks()), added ^ set(guide_blocks())
    changed = [path for path in repository if copied.get(path) != repository[path]]
    assert not changed, f"following docs/adding.md changed existing files: {changed}"
    result = run(copy, "-c", "import fairaudit; print(fairaudit.__file__)")
    assert result.stdout.strip() == str(copy / "fairaudit" / "__init__.py")  # the copy runs, not the checkout


def test_the_shared_tests_run_the_new_backend_and_probe_and_no_shared_module_names_them(copy):
    """The conformance suite on `echo`, every config composing, the smallest run of `yes_rate` with its intervals,
    its verdict printed and kept, no shared module naming either: the shared tests take them unedited."""
    result = run(copy, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "not cluster and not paper",
                 "tests/test_conformance.py", "tests/test_configs.py", "tests/test_intervals.py",
                 "tests/test_verdicts.py", "tests/test_extension.py",
                 "-k", "echo or yes_rate or every_backend_declares or shared_modules or every_shipped_probe")
    assert result.returncode == 0, result.stdout[-3000:]
    passed = [line.split(" PASSED")[0] for line in result.stdout.splitlines() if " PASSED" in line]
    assert sum("[echo]" in test for test in passed) >= 5, passed  # the conformance suite on echo
    for test in ("test_intervals.py::test_every_interval_a_probe_logs_has_its_n_and_its_few_flag[yes_rate]",
                 "test_verdicts.py::test_every_probe_prints_its_verdict_before_its_table_and_keeps_it_as_the_run_"
                 "description[yes_rate]", "test_configs.py::test_every_option_composes_and_binds[probe-yes_rate]",
                 "test_configs.py::test_every_option_composes_and_binds[backend-echo]",
                 "test_conformance.py::test_every_backend_declares_its_conformance"):
        assert any(line.endswith(test) for line in passed), (test, passed)


def test_the_echo_backend_runs_a_probe_and_is_refused_one_it_cannot_serve(copy):
    done = audit(copy, "backend=echo", "probe=position", "dataset=mmlu", "arm=direct", *TINY,
                 "probe.truncation.enabled=false", "arm.max_new_tokens=4")
    assert done.returncode == 0, done.stderr[-3000:]
    refused = audit(copy, "backend=echo", "probe=counterfactual", *TINY)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode == 2 and len(errors) == 1, refused.stderr[-2000:]
    assert errors[0].startswith("error: probe 'counterfactual' needs a backend that can read answer scores")
    assert "backend=echo cannot" in errors[0] and "Backends that can: backend=hf" in errors[0]
    assert errors[0].endswith("probes backend=echo runs: position")


def test_the_yes_rate_probe_runs_logs_its_rates_and_previews_its_prompts(copy):
    from mlflow import MlflowClient

    preview = audit(copy, "probe=yes_rate", "dry_run=true", *TINY)
    assert preview.returncode == 0, preview.stderr[-2000:]
    assert preview.stdout.count("=== pair ") == 4 and "dry run: 4 prompts" in preview.stderr

    done = audit(copy, "probe=yes_rate", *TINY)
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{copy}/mlflow.db")
    run_ = next(r for r in client.search_runs([client.get_experiment_by_name("fairaudit").experiment_id])
                if r.data.tags.get("probe") == "yes_rate")
    records = pd.read_parquet(client.download_artifacts(run_.info.run_id, "records/records.parquet", str(copy)))
    for side, rows in records.groupby("side"):  # the logged rate is the share of Yes among the side's records
        assert run_.data.metrics[f"yes_rate_{side}"] == pytest.approx((rows["answer"] == "Yes").mean(), abs=1e-12)
    verdict = run_.data.tags["mlflow.note.content"]
    assert verdict.startswith("Yes rate per side: alpha ") and verdict in done.stdout

    report = run(copy, "-m", "fairaudit", "report", f"tracking.uri=sqlite:///{copy}/mlflow.db", "select.parent=null",
                 "select.tags.probe=yes_rate", "probes.yes_rate.digits=2", f"output_dir={copy}/report")
    assert report.returncode == 0, report.stderr[-3000:]
    table = pd.read_csv(copy / "report" / "yes_rates.csv")
    assert table["yes_rate_alpha"].tolist() == [run_.data.metrics["yes_rate_alpha"]]
    shown = (copy / "report" / "report.md").read_text()
    assert "## Yes rate per side" in shown
    assert "Yes rate per side" in report.stdout  # its `report.main` section, printed in the terminal
    assert f"| {run_.data.metrics['yes_rate_alpha']:.2f} |" in shown  # probes.yes_rate.digits=2 formats it
