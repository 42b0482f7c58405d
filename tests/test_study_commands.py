"""The commands of a first real study: a report on a sweep cut short names the jobs that did not finish and the
command that resumes it; a study that sweeps needs no -m; tracking.uri=<folder> is the database in that folder;
a rejected command leaves no output folder."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

import test_report
from conftest import DATA_ROOT, REPO, cut_short_model, model_results, run_app
from fairaudit.errors import AuditError
from fairaudit.models.locate import tiny_qwen3_dir
from fairaudit.report import app
from test_report import report_cfg, synthetic_records

mlflow_db, store = test_report.mlflow_db, test_report.store
OVERRIDES = ["model=tiny_qwen3", "dataset.n=2", "dataset=adult,compas,credit"]


def cut_short_sweep(store, finished: int) -> str:
    """A sweep as the callback leaves it after Ctrl-C in job `finished`: its jobs tagged, `finished` jobs
    FINISHED, the next KILLED, the rest never started, the parent KILLED."""
    parent = store.sweep()
    store.client.set_tag(parent, "fairaudit.jobs", json.dumps(["dataset=adult", "dataset=compas", "dataset=credit"]))
    store.client.set_tag(parent, "fairaudit.overrides", json.dumps(OVERRIDES))
    for num, dataset in enumerate(["adult", "compas"][:finished + 1]):
        run = store.job(synthetic_records(num, 8, dataset=dataset), parent, dataset=dataset,
                        status="FINISHED" if num < finished else "KILLED")
        store.client.set_tag(run, "fairaudit.job_num", str(num))
    store.client.set_terminated(parent, status="KILLED")
    return parent


RESUME = "resume it with: fairaudit model=tiny_qwen3 dataset.n=2 dataset=adult,compas,credit -m"


@pytest.mark.slow
def test_a_report_on_a_sweep_cut_short_names_the_jobs_left_and_the_resume_command(store, tmp_path, capsys):
    parent = cut_short_sweep(store, finished=1)
    result = app.run(report_cfg(store, tmp_path / "out", "log_to_mlflow=false"))
    assert len(result.selection.runs) == 1  # the finished job is reported
    (line,) = result.selection.unfinished
    assert line.startswith(f"sweep '{store.client.get_run(parent).info.run_name}' ({parent}) ended KILLED: 2 of 3 "
                           "jobs did not finish: dataset=compas (KILLED), dataset=credit (not started); ")
    assert line.endswith(RESUME)
    assert f"not finished: {line}" in " ".join(capsys.readouterr().err.split())
    assert f"Not finished: {line}." in (tmp_path / "out" / "report.md").read_text()


def test_a_report_on_a_sweep_cut_short_before_any_job_finished_is_that_line_not_a_filter(store, tmp_path):
    cut_short_sweep(store, finished=0)
    with pytest.raises(AuditError) as refused:
        app.run(report_cfg(store, tmp_path / "out", "log_to_mlflow=false"))
    message = str(refused.value)
    assert "0 of 3" not in message and "3 of 3 jobs did not finish: dataset=adult (KILLED), dataset=compas (not " \
        "started), dataset=credit (not started)" in message
    assert message.endswith(RESUME) and "tags." not in message  # no MLflow filter string


@pytest.mark.slow
def test_after_ctrl_c_in_a_sweep_the_report_says_what_to_resume(tmp_path):
    """A real sweep interrupted in its first job, then `fairaudit report` on its store: one line, exit 2."""
    places = [f"store.url={tmp_path}/store.sqlite", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
              f"hydra.sweep.dir={tmp_path}/multirun"]
    env = {"FAIRAUDIT_DATA": str(DATA_ROOT), "PYTHONUNBUFFERED": "1", "PATH": "/usr/bin:/bin",
           "FAIRAUDIT_HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "fairaudit", *places, "model.batch_size=1",
                             "model.max_think_tokens=32", "-m", *OVERRIDES], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and model_results(tmp_path / "store.sqlite") < 2:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    (interrupted,) = [line for line in err.splitlines() if line.startswith("interrupted")]
    command = interrupted.split("resumes from them: ")[1]  # what Ctrl-C printed
    report = run_app(tmp_path, "report", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", "log_to_mlflow=false",
                     f"output_dir={tmp_path}/report", in_tmp=True)
    lines = [line for line in report.stderr.splitlines() if line.strip()]
    assert report.returncode == 2 and len(lines) == 1, report.stderr[-2000:]
    assert "ended KILLED: 3 of 3 jobs did not finish: dataset=adult (KILLED), dataset=compas (not started)" in lines[0]
    assert lines[0].endswith(f"resume it with: {command}") and " -m fairaudit -m " in command


def test_a_study_that_sweeps_runs_its_sweep_without_minus_m(tmp_path):
    """+experiment=seed_sweep sets hydra.sweeper.params: five seeds, as with -m (a dry run: nothing loads)."""
    result = run_app(tmp_path, "+experiment=seed_sweep", "model=tiny_qwen3", "dataset.n=1", "dry_run=true")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Launching 5 jobs" in result.stderr and result.stderr.count("dry run: 4 prompts") == 5
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing, its sweep folder included


def test_a_rejected_command_leaves_no_output_folder(tmp_path):
    result = run_app(tmp_path, "model=tiny_qwen3", "dataset.n=0", in_tmp=True)
    assert result.returncode == 2 and "dataset.n=0 is out of range" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no outputs/<date>/<time>/.hydra, no store, no database


@pytest.mark.slow
def test_a_tracking_folder_is_the_sqlite_database_in_it(tmp_path):
    from mlflow.tracking import MlflowClient

    folder = tmp_path / "runs"
    result = run_app(tmp_path, "model=tiny_qwen3", "dataset.n=1", "model.max_think_tokens=4", f"tracking.uri={folder}")
    assert result.returncode == 0, result.stderr[-2000:]
    client = MlflowClient(f"sqlite:///{folder}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("fairaudit").experiment_id])
    assert run.info.status == "FINISHED" and (folder / "mlartifacts").is_dir()
    assert f"--backend-store-uri sqlite:///{folder}/mlflow.db" in result.stderr


@pytest.mark.slow
def test_a_sweep_job_with_a_bad_value_is_named_by_what_it_varies_before_anything_opens(tmp_path):
    """The grid is checked before the parent opens: the bad job's line names it by its number and what it varies,
    exit code 2, and no run (parent or child) is logged."""
    result = run_app(tmp_path, "model=tiny_qwen3", "model.max_think_tokens=4", "-m", "dataset.n=1,999999")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.splitlines() == [
        "error: job 1 (dataset.n=999999): dataset.n=999999 is out of range for 'adult': choose 1..45222"]
    assert not (tmp_path / "mlflow.db").exists()


def test_a_sweep_job_that_fails_as_it_runs_is_named_by_what_it_varies(tmp_path):
    from mlflow.tracking import MlflowClient

    bad = cut_short_model(tmp_path)
    result = run_app(tmp_path, "model=tiny_qwen3", "model.max_think_tokens=4", "dataset.n=1", "-m",
                     f"model.path={tiny_qwen3_dir()},{bad}")
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"model.path={bad}: model file {bad}/model.safetensors is cut short" in result.stderr
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("fairaudit").experiment_id],
                              "tags.`fairaudit.kind` = 'job' AND attributes.status = 'FAILED'")
    assert [run.info.run_name for run in runs] == [f"model.path={bad} | tiny_qwen3 adult counterfactual think"]


def test_a_tracking_folder_on_the_command_line_is_rewritten_and_one_in_a_config_is_one_line(tmp_path):
    from fairaudit.cli.overrides import tracking_database
    from fairaudit.tracking.location import tracking_problem

    assert tracking_database([f"tracking.uri={tmp_path}/runs", "dataset=adult"]) == [
        f"tracking.uri=sqlite:///{tmp_path}/runs/mlflow.db", "dataset=adult"]
    assert tracking_database([f"tracking.uri=file://{tmp_path}/m.db"]) == [f"tracking.uri=sqlite:///{tmp_path}/m.db"]
    kept = ["tracking.uri=http://127.0.0.1:5000", f"tracking.uri=sqlite:///{tmp_path}/x.db"]
    assert tracking_database(kept) == kept
    assert tracking_problem(str(tmp_path)) == (f"tracking.uri={str(tmp_path)!r} is a folder, and MLflow 3 keeps no "
                                               f"runs in folders: write tracking.uri=sqlite:///{tmp_path}/mlflow.db "
                                               "(what a folder on the command line means)")
