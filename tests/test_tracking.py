"""Tracking against a real sqlite MLflow store: stale runs closed KILLED, superseded runs, the database built once."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pandas as pd
import pytest
import sqlalchemy as sa
from omegaconf import OmegaConf

from conftest import REPO, building_tracking_db, cache_without_schema
from fairaudit.report.runs import select_runs
from fairaudit.tracking.jobs_view import refresh_jobs_view
from fairaudit.tracking.runs import Tracker
from fairaudit.tracking.succession import process_tags
from fairaudit.tracking.tags import EXPERIMENT_KIND_TAG, KEY_TAG, MODEL_TRAINING_KIND, PROCESS_TAGS, SUPERSEDED_TAG
from fairaudit.tracking.ui import JOBS_VIEW, SHARED_VIEW_TAG

SELECT_ALL = OmegaConf.create({"experiment": None, "parent": None, "sweep_dir": None, "tags": {}, "filter": None,
                               "status": None})


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns


@pytest.fixture
def tracker(tmp_path):
    return Tracker(f"sqlite:///{tmp_path}/mlflow.db", "fairaudit")


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def left_running(tracker: Tracker, key: str, owner: dict[str, str]) -> str:
    """A run of job `key` that its owner left RUNNING (as kill -9 leaves it)."""
    tags = {"fairaudit.kind": "job", KEY_TAG: key, **owner}
    return tracker.client.create_run(tracker.experiment_id, tags=tags).info.run_id


def test_next_run_of_the_same_job_closes_a_dead_process_run_as_killed(tracker):
    host = process_tags()["fairaudit.host"]
    killed = left_running(tracker, "job-a", dict(zip(PROCESS_TAGS, (host, str(dead_pid()), "1"))))
    alive = left_running(tracker, "job-a", process_tags())                       # still running here: kept
    elsewhere = left_running(tracker, "job-a", dict(zip(PROCESS_TAGS, ("other-node", "1", "1"))))  # unseen: kept
    other_job = left_running(tracker, "job-b", dict(zip(PROCESS_TAGS, (host, str(dead_pid()), "1"))))

    new = tracker.start("rerun", {"fairaudit.kind": "job", KEY_TAG: "job-a"}, {})
    tracker.end()

    client = tracker.client
    assert client.get_run(killed).info.status == "KILLED"
    assert client.get_run(killed).data.tags[SUPERSEDED_TAG] == new
    assert client.get_run(new).data.tags["fairaudit.resumes"] == killed
    assert [client.get_run(r).info.status for r in (alive, elsewhere, other_job)] == ["RUNNING"] * 3


def test_a_finished_rerun_supersedes_the_earlier_one_and_the_report_counts_it_once(tracker):
    tags = {"fairaudit.kind": "job", KEY_TAG: "job-a", "model": "m", "dataset": "adult", "probe": "counterfactual",
            "arm": "think", "seed": "0", "checkpoint": "base"}
    first = tracker.start("first", tags, {})
    tracker.end()
    failed = tracker.start("failed", tags, {})
    tracker.end(failed=True, error="dataset.n=3 is out of range")
    second = tracker.start("second", tags, {})
    tracker.end()

    client = tracker.client
    assert client.get_run(first).data.tags[SUPERSEDED_TAG] == second
    assert client.get_run(failed).data.tags["fairaudit.error"] == "dataset.n=3 is out of range"
    assert client.get_run(failed).data.tags["mlflow.note.content"] == "dataset.n=3 is out of range"
    selection = select_runs(client, SELECT_ALL)
    assert selection.runs["run_id"].tolist() == [second]
    assert sorted(selection.left_out["run_id"]) == sorted([first, failed])


def test_kill_during_the_tracking_database_creation_leaves_one_the_next_start_uses(tmp_path):
    from mlflow.tracking import MlflowClient

    db = tmp_path / "mlflow.db"
    code = f"from fairaudit.tracking.database import prepare_tracking; prepare_tracking('sqlite:///{db}')"
    env = {**os.environ, "OMP_NUM_THREADS": "1", **cache_without_schema(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stderr=subprocess.DEVNULL)
    while proc.poll() is None and not building_tracking_db(tmp_path):
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the database was built before the kill"
    assert not db.exists()  # only the copy being built was touched

    tracker = Tracker(f"sqlite:///{db}", "fairaudit")
    run_id = tracker.start("after the kill", {"fairaudit.kind": "job"}, {})
    tracker.end()
    assert MlflowClient(f"sqlite:///{db}").get_run(run_id).info.status == "FINISHED"
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert not list(tmp_path.glob(".mlflow.db.building-*"))


@pytest.mark.slow
def test_a_new_database_is_built_in_place_when_the_user_cache_cannot_be_written(tmp_path, monkeypatch):
    from fairaudit.tracking.database import prepare_tracking

    monkeypatch.setenv("FAIRAUDIT_CACHE", "/proc/fairaudit-cache")
    prepare_tracking(f"sqlite:///{tmp_path}/mlflow.db")
    db = sqlite3.connect(tmp_path / "mlflow.db")
    assert db.execute("SELECT artifact_location FROM experiments").fetchall() == [
        (f"{(tmp_path / 'mlartifacts').as_uri()}/0",)]
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_database_an_older_version_left_half_built_is_rebuilt(tmp_path):
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as half:  # what a kill during MLflow's own first setup left behind
        half.execute("CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name TEXT)")
        half.execute("CREATE TABLE _alembic_tmp_metrics (x)")
    tracker = Tracker(f"sqlite:///{db}", "fairaudit")
    run_id = tracker.start("after", {"fairaudit.kind": "job"}, {})
    tracker.end()
    assert tracker.client.get_run(run_id).info.status == "FINISHED"


@contextlib.contextmanager
def another_job_inserting_first(db, table: str, row=lambda parameters: parameters, holding=None):
    """Before MLflow's first insert into `table` (of a row `holding` that value), another connection inserts
    row(its parameters) and commits: as a parallel job of the same sweep does between MLflow's look for that row and
    its insert."""
    inserted = []

    def other_job_first(conn, cursor, statement, parameters, context, executemany):
        if statement.startswith(f"INSERT INTO {table} ") and holding in (None, *parameters) and not inserted:
            with sqlite3.connect(db) as other:
                other.execute(statement, row(parameters))
            inserted.append(row(parameters))

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", other_job_first)
    try:
        yield
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", other_job_first)
    assert inserted  # the race was run


def test_a_data_set_another_job_inserts_between_mlflows_look_and_insert_is_linked(tracker, tmp_path):
    """Parallel jobs of one sweep log the same data set into one experiment; MLflow looks for it, then inserts it,
    not atomically (three processes at once broke its unique key in 1 of 18 tries here; a PostgreSQL pair in CI).
    The run logs it again, linking the one data set there is."""
    db = tmp_path / "mlflow.db"
    tracker.start("job", {}, {})
    with another_job_inserting_first(db, "datasets", lambda parameters: ("another-job-uuid", *parameters[1:])):
        tracker.content.log_dataset(pd.DataFrame({"age": [39, 50], "sex": ["Male", "Female"]}), "adult",
                                    "/data/adult.csv")
    run_id = tracker.run.info.run_id
    tracker.end()
    (linked,) = tracker.client.get_run(run_id).inputs.dataset_inputs
    assert (linked.dataset.name, linked.dataset.source) == ("adult", '{"uri": "/data/adult.csv"}')
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT dataset_uuid, name FROM datasets").fetchall() == [("another-job-uuid", "adult")]


def test_a_job_opens_the_experiment_another_job_tagged_between_mlflows_look_and_insert(tmp_path):
    """The experiment's kind tag, set by the first jobs on a new experiment: a parallel job setting it at the same
    moment (a PostgreSQL pair in CI) does not fail the other."""
    db = tmp_path / "mlflow.db"
    with another_job_inserting_first(db, "experiment_tags", holding=EXPERIMENT_KIND_TAG):
        tracker = Tracker(f"sqlite:///{db}", "fairaudit")
    assert tracker.client.get_experiment(tracker.experiment_id).tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING_KIND


def test_two_jobs_saving_the_experiments_jobs_view_at_once_both_save_it(tracker, tmp_path):
    """Every job saves the experiment's jobs view as it ends (an experiment tag); the first two of a new experiment
    ending together both insert it."""
    with another_job_inserting_first(tmp_path / "mlflow.db", "experiment_tags", holding=SHARED_VIEW_TAG + JOBS_VIEW):
        key = refresh_jobs_view(tracker.client, tracker.experiment_id)
    assert SHARED_VIEW_TAG + key in tracker.client.get_experiment(tracker.experiment_id).tags
