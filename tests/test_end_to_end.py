"""`python -m fairaudit` as a user runs it, read back from a real sqlite MLflow store."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from statsmodels.stats.multitest import multipletests

from conftest import DATA_ROOT, REPO, model_results, run_app
from fairaudit.catalog.registry import store_report_settings
from fairaudit.models.locate import tiny_qwen3_dir
from fairaudit.report import app as report
from warm import popen_python, run_python

pytestmark = pytest.mark.slow
TINY = ("model=tiny_qwen3", "dataset.n=4")


def runs(tmp_path, filter_string: str = ""):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("fairaudit")
    return client, client.search_runs([experiment.experiment_id], filter_string) if experiment else []


def artifact_paths(client, run_id: str, folder: str) -> set[str]:
    return {a.path for a in client.list_artifacts(run_id, folder)}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One `TINY` audit: its folder (store, MLflow database, artifacts) and its result, for the tests that run
    something after it to copy."""
    folder = tmp_path_factory.mktemp("tiny")
    result = run_app(folder, *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder, result


def after_tiny_run(tiny_run, tmp_path):
    """tmp_path holding a copy of the `TINY` audit's result store (its MLflow database stays its own)."""
    shutil.copy(tiny_run[0] / "store.sqlite", tmp_path / "store.sqlite")
    return tmp_path


def test_default_job_logs_metrics_tables_figure_and_records(tmp_path):
    result = run_app(tmp_path, "dataset.n=2", "model.max_think_tokens=16")
    assert result.returncode == 0, result.stderr[-3000:]
    client, found = runs(tmp_path)
    (run,) = found
    assert run.info.status == "FINISHED"
    metrics = run.data.metrics
    for name in ["cell_a", "cell_b", "cell_c", "cell_d", "mcnemar_log10_p", "d_cf_think", "d_cf_nothink",
                 "parse_rate_think"]:
        assert name in metrics, name
    assert sum(metrics[f"cell_{c}"] for c in "abcd") == metrics["n_pairs"] == 2
    tags = run.data.tags
    assert (tags["model"], tags["dataset"], tags["probe"], tags["arm"], tags["seed"]) == (
        "smollm2", "adult", "counterfactual", "think", "0")
    assert run.data.params["dataset.n"] == "2" and run.data.params["model.thinking.style"] == "prompted"
    assert ({"tables/contingency.parquet", "tables/cell_disparity.parquet", "tables/contingency.json"}
            <= artifact_paths(client, run.info.run_id, "tables"))
    assert artifact_paths(client, run.info.run_id, "figures") == {"figures/disparity_shift.png"}
    assert {"config/config.yaml", "config/overrides.txt"} <= artifact_paths(client, run.info.run_id, "config")
    records = pd.read_parquet(client.download_artifacts(run.info.run_id, "records/records.parquet", str(tmp_path)))
    assert len(records) == 8 and set(records["arm"]) == {"think", "nothink"}
    assert records["p_yes"].between(0, 1).all() and set(records["answer"]) <= {"Yes", "No"}
    assert "MLflow run" in result.stderr and "ui --backend-store-uri" in result.stderr


def test_artifacts_go_beside_the_tracking_database_whatever_the_working_folder(tiny_run, tmp_path):
    from mlflow.tracking import MlflowClient

    elsewhere, db = tmp_path / "started-here", tmp_path / "study" / "m.db"
    after_tiny_run(tiny_run, tmp_path)  # the model's results from the store: this is about where files go
    elsewhere.mkdir()
    env = {**os.environ, "FAIRAUDIT_DATA": str(DATA_ROOT)}
    done = run_python([sys.executable, "-m", "fairaudit", *TINY, f"tracking.uri=sqlite:///{db}",
                       f"store.url={tmp_path}/store.sqlite", f"hydra.run.dir={tmp_path}/outputs"],
                      cwd=elsewhere, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{db}")
    (run,) = client.search_runs([client.get_experiment_by_name("fairaudit").experiment_id])
    assert run.info.artifact_uri.startswith((db.parent / "mlartifacts").as_uri())
    assert (db.parent / "mlartifacts" / run.info.experiment_id / run.info.run_id / "artifacts"
            / "samples.html").exists()
    assert list(elsewhere.iterdir()) == []  # no mlruns/ (or anything else) where the command was started


def test_second_identical_run_makes_no_model_call(tiny_run, tmp_path):
    second = run_app(after_tiny_run(tiny_run, tmp_path), *TINY)
    assert second.returncode == 0, second.stderr[-3000:]
    (_, (first_run,)), (_, (second_run,)) = runs(tiny_run[0]), runs(tmp_path)
    assert first_run.data.metrics["model_calls"] == 32  # 4 pairs x 2 sides x 2 arms x (generate + score)
    assert second_run.data.metrics["model_calls"] == 0
    assert "Loading weights" in tiny_run[1].stderr
    assert "Loading weights" not in second.stderr  # a run served from the store never loads the model


def test_btm_after_counterfactual_reuses_every_generation(tiny_run, tmp_path):
    btm = run_app(after_tiny_run(tiny_run, tmp_path), *TINY, "probe=btm")
    assert btm.returncode == 0, btm.stderr[-3000:]
    client, found = runs(tmp_path, "tags.probe = 'btm'")
    (run,) = found
    assert run.data.metrics["model_calls"] == 0
    assert "tables/tpair_split.parquet" in artifact_paths(client, run.info.run_id, "tables")
    assert artifact_paths(client, run.info.run_id, "figures") == {"figures/tpair_split.png",
                                                                  "figures/t_alpha_vs_alpha_prime.png"}


@pytest.mark.long  # kept out of make test's 10 minutes; CI runs it in make test-long
def test_hub_model_runs_offline_from_a_local_folder(tmp_path):
    """model.path wins over the hub id, and nothing reaches for the hub (HF_HUB_OFFLINE=1)."""
    local = tiny_qwen3_dir()
    result = run_app(tmp_path, "model=qwen3", f"model.path={local}", "model.dtype=float32", "model.max_think_tokens=8",
                     "model.answer_source=forced", "dataset.n=1", env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    _, (run,) = runs(tmp_path)
    assert run.data.tags["model"] == "qwen3" and run.data.params["model.path"] == str(local)


def test_multirun_gives_one_parent_and_a_child_per_dataset(tmp_path):
    """With the default store and tracking URI: files in $FAIRAUDIT_HOME (here the folder it ran from)."""
    result = run_app(tmp_path, "model=tiny_qwen3", "dataset.n=4", "-m", "dataset=adult,compas,credit", in_tmp=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "multirun").is_dir() and (tmp_path / "store.sqlite").exists()
    client, found = runs(tmp_path)
    parents = [r for r in found if r.data.tags.get("fairaudit.kind") == "sweep"]
    children = [r for r in found if r.data.tags.get("fairaudit.kind") == "job"]
    assert len(parents) == 1 and len(children) == 3
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert sorted(c.data.tags["dataset"] for c in children) == ["adult", "compas", "credit"]
    assert all(r.info.status == "FINISHED" for r in found)
    # the parent's verdict on the family of McNemar tests, and the report's Holm and BH columns beside each p
    parent = client.get_run(parents[0].info.run_id)
    p = [10 ** c.data.metrics["mcnemar_log10_p"] for c in sorted(children, key=lambda c: c.data.tags["dataset"])]
    holm, bh = (multipletests(p, method=m) for m in ("holm", "fdr_bh"))
    verdict = (f"3 tests (mcnemar_log10_p: one per model x dataset hypothesis) across the sweep's 3 finished jobs: "
               f"{sum(v <= 0.05 for v in p)} significant at 0.05 uncorrected, {holm[0].sum()} after Holm, "
               f"{bh[0].sum()} after Benjamini-Hochberg")
    note = parent.data.tags["mlflow.note.content"].split("\n\n")
    assert any(line.startswith(verdict) for line in note) and verdict in result.stdout
    assert parent.data.metrics["family_n_tests"] == 3
    assert parent.data.metrics["family_n_significant_holm"] == holm[0].sum()
    store_report_settings()  # the probes' report settings, which the report config's defaults name
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("report", overrides=[f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"output_dir={tmp_path}/r"])
    report.run(cfg)
    family = pd.read_csv(tmp_path / "r" / "family.csv").sort_values("dataset")
    assert family["p_holm"].tolist() == pytest.approx(holm[1]) and family["p_bh"].tolist() == pytest.approx(bh[1])
    header = "| model | dataset | test | runs | p | Holm p | BH p | median p | range |"
    assert header in (tmp_path / "r" / "report.md").read_text()


@pytest.mark.long  # kept out of make test's 10 minutes; CI runs it in make test-long
def test_parallel_sweep_jobs_share_the_store_and_the_parent_run(tmp_path):
    result = run_app(tmp_path, "model=tiny_qwen3", "dataset.n=3", "model.max_think_tokens=8", "hydra/launcher=joblib",
                     "hydra.launcher.n_jobs=2", "-m", "dataset=adult,compas,credit")
    assert result.returncode == 0, result.stderr[-3000:]
    _, found = runs(tmp_path)
    parents = [r for r in found if r.data.tags.get("fairaudit.kind") == "sweep"]
    children = [r for r in found if r.data.tags.get("fairaudit.kind") == "job"]
    assert len(parents) == 1 and len(children) == 3 and all(r.info.status == "FINISHED" for r in found)
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert model_results(tmp_path / "store.sqlite") == 3 * 3 * 2 * 2 * 2


@pytest.mark.long  # kept out of make test's 10 minutes; CI runs it in make test-long
def test_checkpoint_sweep_tags_each_label(tmp_path):
    local = tiny_qwen3_dir()
    result = run_app(tmp_path, "model=tiny_qwen3", "dataset.n=1", "model.max_think_tokens=4", f"model.path={local}",
                     "+model.checkpoint.same_weights=true", "-m", "model.checkpoint.label=step1,step2")
    assert result.returncode == 0, result.stderr[-3000:]
    _, found = runs(tmp_path, "tags.`fairaudit.kind` = 'job'")
    assert sorted(r.data.tags["checkpoint"] for r in found) == ["step1", "step2"]


@pytest.mark.long  # half a minute; the kill -9 matrix (test_reliability.py) is long too
def test_killed_run_resumes_where_it_stopped(tmp_path):
    """SIGKILL a run midway through generation; the re-run computes only what is missing."""
    overrides = ["model=tiny_qwen3", "dataset.n=8", "model.batch_size=2", "model.max_think_tokens=32"]
    env = {**os.environ, "FAIRAUDIT_DATA": str(DATA_ROOT)}
    store = tmp_path / "store.sqlite"
    proc = popen_python([sys.executable, "-m", "fairaudit", f"store.url={store}",
                         f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"hydra.run.dir={tmp_path}/outputs",
                         *overrides], env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stored = 0
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
        stored = model_results(store)
        if stored >= 4:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait()
    assert 4 <= stored < 64, "the run was not killed midway"
    before = model_results(store)
    resumed = run_app(tmp_path, *overrides)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _, found = runs(tmp_path, "attributes.status = 'FINISHED'")
    (run,) = found
    assert run.data.metrics["model_calls"] == 64 - before  # 8 pairs x 2 sides x 2 arms x 2 calls
    assert model_results(store) == 64


@pytest.mark.parametrize("overrides, message", [  # tests/test_mistakes.py has fifty more, run in forked children
    (["dataset.n=0"], "dataset.n=0 is out of range for 'adult': choose 1..45222"),
    (["model.path=/nonexistent/model"], "model.path '/nonexistent/model' is not a model folder"),
])
def test_bad_input_is_one_error_line_before_any_model_loads(tmp_path, overrides, message):
    result = run_app(tmp_path, *overrides)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "Loading weights" not in result.stderr
    _, found = runs(tmp_path)
    assert not [r for r in found if r.info.status == "FINISHED"]


@pytest.mark.parametrize("override, choice", [("model=nope", "smollm2"), ("arm=sideways", "nothink"),
                                              ("dataset=iris", "compas")])
def test_unknown_group_option_lists_the_choices(tmp_path, override, choice):
    result = run_app(tmp_path, override)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {override}: there is no ") and choice in line
