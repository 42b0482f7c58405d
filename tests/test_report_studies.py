"""`fairaudit report +experiment=NAME` reports that study's runs, as a run of it files them, on a real sqlite MLflow
store filled by real sweeps of the embedded model."""

from __future__ import annotations

import pandas as pd
import pytest

from conftest import run_app
from fairaudit.errors import AuditError
from fairaudit.report.studies import study_selection
from fork_runner import fairaudit

TINY = ("model=tiny_qwen3", "dataset.n=2")


def test_a_study_is_read_as_the_mlflow_experiment_its_runs_log_to():
    assert study_selection(["+experiment=seed_sweep", "select.tags.model=m"]) == [
        "select.experiment=seed_sweep", "select.tags.model=m"]
    assert study_selection(["+experiment=thinking_fairness_smoke"]) == ["select.experiment=thinking_fairness_smoke"]
    # a run of the study with tracking.experiment=mine logs there: the report given the same looks there
    assert study_selection(["tracking.experiment=mine", "+experiment=seed_sweep"]) == [
        "tracking.experiment=mine", "select.experiment=mine"]
    assert study_selection(["+experiment=seed_swep"]) == ["+experiment=seed_swep"]  # the override check names it
    with pytest.raises(AuditError, match=r"^\+experiment=seed_sweep and select.experiment=x: a report reads one study"):
        study_selection(["+experiment=seed_sweep", "select.experiment=x"])


def test_a_study_without_an_experiment_of_its_own_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\ndataset:\n  n: 2\n")
    monkeypatch.setenv("FAIRAUDIT_PATH", str(tmp_path))
    with pytest.raises(AuditError, match=r"^\+experiment=mine: the study names no MLflow experiment of its own"):
        study_selection(["+experiment=mine"])


@pytest.mark.slow
def test_a_study_not_yet_run_is_one_line_naming_how_to_run_it(tmp_path):
    from mlflow import MlflowClient

    from fairaudit.report.runs import experiment_ids

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    with pytest.raises(AuditError, match=r"^select.experiment: no MLflow experiment 'seed_sweep' in sqlite:.*"
                                         r" \(study seed_sweep's runs go there, and none has run: fairaudit "
                                         r"\+experiment=seed_sweep runs it\); experiments: \['Default'\]$"):
        experiment_ids(client, "seed_sweep")
    with pytest.raises(AuditError, match=r"no MLflow experiment 'mine' in sqlite:\S+; experiments"):
        experiment_ids(client, "mine")  # no study logs there: the plain line


@pytest.mark.slow
def test_report_of_a_study_reads_its_sweep_not_the_latest_other(tmp_path):
    """A seed sweep, then another sweep (the latest): `report +experiment=seed_sweep` reports the seed sweep's jobs."""
    from mlflow import MlflowClient

    study = run_app(tmp_path, "+experiment=seed_sweep", *TINY, "-m", "dataset.seed=0,1")
    assert study.returncode == 0, study.stderr[-3000:]
    other = run_app(tmp_path, *TINY, "-m", "dataset.seed=range(1,2)")  # its job's results come from the store
    assert other.returncode == 0, other.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    seed_sweep = client.get_experiment_by_name("seed_sweep").experiment_id
    (parent,) = client.search_runs([seed_sweep], "tags.`fairaudit.kind` = 'sweep'")
    jobs = client.search_runs([seed_sweep], "tags.`fairaudit.kind` = 'job'")
    done = fairaudit(["report", "+experiment=seed_sweep", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
                      f"hydra.run.dir={tmp_path}/report"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"report on 2 runs of sweep {parent.info.run_name!r} ({parent.info.run_id}) in experiment 'seed_sweep'" \
        in done.stderr
    (report,) = client.search_runs([seed_sweep], "tags.`fairaudit.kind` = 'report'")
    assert report.data.tags["fairaudit.source_parent"] == parent.info.run_id
    assert set(report.data.tags["fairaudit.source_runs"].split(",")) == {run.info.run_id for run in jobs}
    # Table 2 carries each run's P(Yes) gap, by hand from its records: what a "read the P(Yes) gap" warning points at
    table2 = pd.read_csv(tmp_path / "report" / "table2.csv", dtype={"seed": str})
    for run in jobs:
        records = pd.read_parquet(client.download_artifacts(run.info.run_id, "records/records.parquet", str(tmp_path)))
        wide = records.pivot(index="pair_id", columns=["arm", "side"], values="p_yes").dropna()
        gap = {arm: (wide[(arm, "alpha")] - wide[(arm, "alpha_prime")]).abs().mean() for arm in ("think", "nothink")}
        row = table2[table2["seed"] == run.data.tags["seed"]].iloc[0]
        for arm in ("think", "nothink"):
            assert row[f"p_gap_{arm}"] == pytest.approx(gap[arm]), arm
