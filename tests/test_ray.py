"""Past one cluster, on a Ray head on loopback (`ray start --head`, stopped by its pid): the smoke study as a Ray
sweep (`hydra/launcher=ray`) with the metrics of a local sweep, one job split over Ray workers
(`job.workers_on=ray`) equal to one process, and a cluster that does not answer as one line before anything starts."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from conftest import SMOKE, SMOKE_JOBS, run_app
from servers import RAY_LOOPBACK, RayHead, free_port
from test_cluster import job_metrics
from test_workers import comparable, the_run

pytestmark = pytest.mark.cluster
ONE_THREAD = {"OMP_NUM_THREADS": "1", **RAY_LOOPBACK}


@pytest.fixture(scope="module")
def ray_head():
    head = RayHead(num_cpus=2)
    yield head
    head.stop()


def test_the_smoke_study_as_a_ray_sweep_matches_a_local_sweep(tmp_path, local_smoke, ray_head):
    """Every job of the smoke study's slice (`SMOKE`) a Ray task, under one parent, with the metrics the same sweep has
    locally."""
    swept = run_app(tmp_path, *SMOKE, "hydra/launcher=ray", "-m", in_tmp=True, timeout=1800,
                    env={**ONE_THREAD, **ray_head.env})
    assert swept.returncode == 0, swept.stderr[-3000:]
    _, expected = job_metrics(MlflowClient(f"sqlite:///{local_smoke}/mlflow.db"), "thinking_fairness_smoke")
    found, got = job_metrics(MlflowClient(f"sqlite:///{tmp_path}/mlflow.db"), "thinking_fairness_smoke")
    (parent,) = [r for r in found if r.data.tags.get("fairaudit.kind") == "sweep"]
    children = [r for r in found if r.data.tags.get("fairaudit.kind") == "job"]
    assert len(children) == SMOKE_JOBS and all(r.info.status == "FINISHED" for r in found)
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert len(expected) == SMOKE_JOBS and got == expected


def test_a_job_split_over_ray_workers_equals_the_job_in_one_process(tmp_path, ray_head):
    small = ("dataset.n=6",)
    for name, extra in (("one", ()), ("ray", ("job.workers=3", "job.workers_on=ray"))):
        (tmp_path / name).mkdir()
        result = run_app(tmp_path / name, *small, *extra, timeout=1200,
                         env={**ONE_THREAD, **ray_head.env})
        assert result.returncode == 0, result.stderr[-3000:]
    one, one_records, _, _ = the_run(tmp_path / "one")
    split, records, client, run_id = the_run(tmp_path / "ray")
    assert comparable(split) == comparable(one) and records.equals(one_records)
    steps = [m.value for m in client.get_metric_history(run_id, "worker_model_calls")]
    assert split["workers"] == 3 and len(steps) == 3 and sum(steps) == split["model_calls"]
    assert split["model_calls"] <= one["model_calls"]  # a helper cancelled before it reported counts 0


@pytest.mark.parametrize("launcher", [("hydra/launcher=ray", "-m", "dataset=adult,compas"),
                                      ("job.workers=2", "job.workers_on=ray")])
def test_a_ray_cluster_that_does_not_answer_is_one_line_before_anything_starts(tmp_path, launcher):
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    result = run_app(tmp_path, "dataset.n=2", *launcher, env={**ONE_THREAD, "RAY_ADDRESS": address})
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert f"the Ray cluster at {address} does not answer" in line and "Traceback" not in result.stderr
    assert not (tmp_path / "mlflow.db").exists() or not MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").search_runs(
        [e.experiment_id for e in MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").search_experiments()])


def test_sigterm_to_a_ray_sweep_ends_its_tasks_and_leaves_every_run_killed(tmp_path, ray_head):
    import signal
    import subprocess
    import time

    from test_sweep_signals import ENV, generating, runs, sweep_command

    proc = subprocess.Popen(sweep_command(tmp_path, 400, "hydra/launcher=ray"), env={**ENV, **ray_head.env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 600
    while proc.poll() is None and time.time() < deadline and not generating(tmp_path, 2):
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    ended = runs(tmp_path)
    assert len(ended) == 3 and {r.info.status for r in ended} == {"KILLED"}, [r.info.status for r in ended]
    listed = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "ray::_run_job" not in listed  # no task of the sweep goes on after it
