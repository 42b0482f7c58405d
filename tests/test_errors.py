"""Errors that help: a misspelt option or key names the nearest ones, a checkpoint label must name weights,
a sweep that cannot read its data starts nothing, and Ctrl-C keeps what was computed and says how to resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import DATA_ROOT, REPO, model_results, run_app
from fairaudit.cli.overrides import check
from warm import popen_python


@pytest.mark.parametrize("argv, line", [
    (["model=smolm2"], "model=smolm2: there is no model named 'smolm2'; did you mean smollm2? "
                       "(`fairaudit list` shows them all)"),
    (["dataset=adlt"], "dataset=adlt: there is no dataset named 'adlt'; did you mean adult?"),
    (["-m", "dataset=adult,compus"], "dataset=adult,compus: there is no dataset named 'compus'; did you mean compas?"),
    (["modle=qwen3"], "modle: the config has no key 'modle'; did you mean model? "
                      "(to add a new key on purpose, write +modle=...)"),
    (["dataset.nn=3"], "dataset.nn: the config has no key 'dataset.nn'; did you mean dataset.n or dataset.name?"),
    (["model.thinking.styl=none"], "did you mean model.thinking.style"),
    (["arm=sideways"], "there is no arm named 'sideways'; choices: cot, direct, nothink, reason, think"),
])
def test_a_misspelt_option_or_key_names_the_nearest_ones(argv, line):
    assert line in check("config", argv)


@pytest.mark.parametrize("argv", [["dataset.n=4", "model=tiny_qwen3"], ["probe=cdpg", "probe.K=3"],
                                  ["+experiment=thinking_fairness_smoke"], ["-m", "model.checkpoint.label=a,b"],
                                  ["hydra.run.dir=/tmp/x"], ["--cfg", "job"], []])
def test_overrides_that_compose_pass(argv):
    assert check("config", argv) is None


def test_the_reports_own_keys_are_checked_against_its_config():
    assert "did you mean select.parent" in check("report", ["select.parnt=abc"])
    assert check("report", ["select.parent=null", "select.tags.probe=cdpg"]) is None


@pytest.mark.slow
def test_a_misspelt_model_is_one_line_and_exit_2_before_anything_loads(tmp_path):
    result = run_app(tmp_path, "model=smolm2")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: model=smolm2: there is no model named 'smolm2'; did you mean smollm2? "
        "(`fairaudit list` shows them all)"]
    assert not (tmp_path / "mlflow.db").exists()


IMPORTED = """import sys
from fairaudit.cli import main as cli
try:
    cli.main(sys.argv[1:])
finally:
    print(*(name for name in ("mlflow", "transformers", "torch") if name in sys.modules))
"""


@pytest.mark.slow
@pytest.mark.parametrize("setting, says", [
    ("model.batch_size=0", "model.batch_size=0 must be an integer >= 1"),
    ("backend.device=gpu", "backend.device='gpu' must be one of auto"),  # the hf backend's own check
    ("probe=bbq", "probe 'bbq' takes mcq datasets"),  # the probe's fit to the data set, after the backend's class
])
def test_a_bad_value_is_told_without_importing_mlflow_transformers_or_torch(tmp_path, setting, says):
    """Seconds of imports a typo need not wait for: the libraries are quieted through their environment, and the hf
    backend imports torch where a model loads or a CUDA or MPS device is asked for."""
    done = subprocess.run([sys.executable, "-c", IMPORTED, setting, f"hydra.run.dir={tmp_path}/out",
                           f"store.url={tmp_path}/s.sqlite", f"tracking.uri=sqlite:///{tmp_path}/m.db"],
                          cwd=REPO, env={**os.environ, "FAIRAUDIT_DATA": str(DATA_ROOT)}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and says in done.stderr, done.stderr[-2000:]
    assert done.stdout.strip() == ""


@pytest.mark.slow
def test_a_checkpoint_label_without_weights_is_one_line_unless_same_weights_is_asked_for(tmp_path):
    refused = run_app(tmp_path, "model=tiny_qwen3", "dataset.n=1", "model.checkpoint.label=step20")
    assert refused.returncode == 2
    (line,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert "model.checkpoint.label='step20' names no weights of its own" in line
    assert "+model.checkpoint.same_weights=true" in line and "Traceback" not in refused.stderr


@pytest.mark.slow
def test_a_sweep_with_a_missing_data_file_creates_no_run(tmp_path):
    from mlflow.tracking import MlflowClient

    empty = tmp_path / "no-data"
    empty.mkdir()
    result = run_app(tmp_path, "model=tiny_qwen3", "dataset.n=2", f"data.root={empty}", "-m", "dataset=adult,compas")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2, result.stderr[-2000:]
    assert errors[0].startswith("error: job 0 (dataset=adult): data file "), errors[0]
    assert "adult.data is missing" in errors[0]
    assert f"`fairaudit data fetch adult --root {empty}`" in errors[0] and "FAIRAUDIT_DATA" in errors[0]
    assert "job 1 (dataset=compas)" in errors[1]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("fairaudit")
    assert experiment is None or client.search_runs([experiment.experiment_id]) == []


def _interrupted(tmp_path, overrides: list[str], after: int):
    """A real `python -m fairaudit` run, sent SIGINT once `after` results are in its store."""
    store = tmp_path / "store.sqlite"
    env = {**os.environ, "FAIRAUDIT_DATA": str(DATA_ROOT), "PYTHONUNBUFFERED": "1"}
    proc = popen_python([sys.executable, "-m", "fairaudit", f"store.url={store}",
                         f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"hydra.run.dir={tmp_path}/outputs",
                         f"hydra.sweep.dir={tmp_path}/multirun", *overrides],
                        env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
        if model_results(store) >= after:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.slow
@pytest.mark.parametrize("sweep", [False, True])
def test_ctrl_c_keeps_the_results_ends_the_runs_killed_and_exits_130(tmp_path, sweep):
    from mlflow.tracking import MlflowClient

    overrides = ["model=tiny_qwen3", "dataset.n=8", "model.batch_size=2", "model.max_think_tokens=32"]
    code, err = _interrupted(tmp_path, overrides + (["-m", "dataset=adult,compas"] if sweep else []), after=4)
    assert code == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("interrupted")]
    kept = model_results(tmp_path / "store.sqlite")
    assert f"its {kept} results" in line and "are kept in the store; the same command resumes from them:" in line
    assert line.endswith(" ".join(overrides + (["dataset=adult,compas"] if sweep else [])))
    assert (" -m fairaudit -m " in line) == sweep  # Hydra's -m, moved before the overrides
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("fairaudit").experiment_id])
    assert runs and {r.info.status for r in runs} == {"KILLED"}
    assert len(runs) == (2 if sweep else 1)  # a sweep's parent and its interrupted job


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once(tmp_path):
    """The first SIGINT starts the orderly stop; a second one during it exits 130 immediately."""
    code = subprocess.run([sys.executable, "-c", (
        "import os, signal, time\n"
        "from fairaudit.errors import interrupt\n"
        "interrupt.arm()\n"
        "try:\n    os.kill(os.getpid(), signal.SIGINT); time.sleep(5)\n"
        "except KeyboardInterrupt:\n    os.kill(os.getpid(), signal.SIGINT); time.sleep(30)\n"
        "print('not reached')\n")], cwd=REPO, capture_output=True, text=True, timeout=20)
    assert code.returncode == 130 and "not reached" not in code.stdout
    assert "interrupted again: stopping now" in code.stderr
