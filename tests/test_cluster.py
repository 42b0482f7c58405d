"""Beyond one machine, against real servers on loopback: a PostgreSQL store shared by concurrent
processes, an MLflow tracking server, and sweeps through a one-node SLURM (`scripts/cluster.sh up`)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa

from fairaudit.backends import GenerationRequest
from fairaudit.store import cli as store_cli
from fairaudit.store.client import CachingClient
from fairaudit.store.results import RESULTS, Store
from tests.conftest import REPO, SMOKE, SMOKE_JOBS, model_results, probe_metric_names, run_app
from tests.servers import MlflowServer, have
from tests.test_claims import issue_pair, no_deadlock, open_at_once, race, two_audits_at_once
from tests.test_store import ScriptedBackend, requests
from tests.test_sweep_signals import runs, stop_sweep, tree

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.cluster
TINY = ["model=tiny_qwen3", "dataset.n=2", "model.max_think_tokens=8"]


@pytest.fixture(scope="module")
def postgres(pg_server):
    """The suite's shared server (tests/conftest.py)."""
    return pg_server


@pytest.fixture
def pg_url(postgres, request):
    """A fresh database on the server for each test."""
    name = "t_" + request.node.name.lower().replace("[", "_").replace("]", "").replace("-", "_")[:50]
    admin = sa.create_engine(postgres.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return postgres.url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """One server for the module (it takes a while to start); each test logs to its own experiment."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    yield server
    server.stop()


def slurm_up() -> bool:
    return have("sinfo") and subprocess.run(["sinfo", "-h"], capture_output=True).returncode == 0


def job_metrics(client: MlflowClient, experiment: str) -> tuple[list, dict]:
    """A sweep's runs, and each job's metrics by (model, dataset, probe), but those of the calls it computed, which
    depend on job order and on which job computed a call two ran at once (model_calls, hf's padding shares)."""
    found = client.search_runs([client.get_experiment_by_name(experiment).experiment_id], max_results=1000)
    jobs = [r for r in found if r.data.tags.get("fairaudit.kind") == "job"]
    return found, {(r.data.tags["model"], r.data.tags["dataset"], r.data.tags["probe"]):
                   {k: r.data.metrics[k] for k in probe_metric_names(r.data.metrics) - {"model_calls"}} for r in jobs}


def test_processes_opening_a_new_postgres_store_at_once_all_open_it(tmp_path, pg_url):
    open_at_once(pg_url, tmp_path)


def test_four_processes_on_overlapping_keys_compute_each_call_once(tmp_path, pg_url):
    """Each process asks for 20 of 35 ids, in its own order; afterwards every id is stored once with the right
    value, computed by exactly one process (their claims, tests/test_claims.py), and a re-run computes nothing."""
    logs = race(pg_url, tmp_path)
    print(f"4 processes x 20 ids (35 distinct): model calls {[log['model_calls'] for log in logs]}")
    rerun = CachingClient(ScriptedBackend("slow-copy"), Store(pg_url))
    again = rerun.generate([GenerationRequest(prompt_ids=(i,), max_new_tokens=1) for i in range(35)])
    assert [c.text for c in again] == [f"copy {i}" for i in range(35)]
    assert rerun.model_calls == 0


def test_two_identical_audits_at_once_on_postgres_compute_each_call_once(tmp_path, pg_url):
    alone, *pair = two_audits_at_once(tmp_path, pg_url)
    print(f"one audit alone: {alone} model calls; the same two at once on PostgreSQL: {pair}")


def test_two_processes_each_holding_a_partial_chunk_on_postgres_never_wait_on_each_other(tmp_path, pg_url):
    print(f"the pair took {no_deadlock(pg_url, tmp_path):.1f} s")


@pytest.mark.paper  # minutes of CPU: the deterministic pair above proves the same on PostgreSQL in the cluster suite
def test_two_copies_of_a_1500_pair_audit_at_once_on_postgres_never_wait_on_each_other(tmp_path, pg_url):
    print(f"the copies took {issue_pair(tmp_path / 'home', pg_url)} s")


def test_damaged_value_on_postgres_is_recomputed(pg_url, capfd):
    first = CachingClient(ScriptedBackend(), Store(pg_url))
    probs = first.choice_probs([(1, 2), (3, 4)], [[1], [2]])
    store = Store(pg_url)
    with store.engine.begin() as conn:
        conn.execute(RESULTS.update().where(RESULTS.c.kind == "choice_probs").values(value="[0.9, 0.547]"))
    again = CachingClient(ScriptedBackend(), Store(pg_url))
    np.testing.assert_array_equal(again.choice_probs([(1, 2), (3, 4)], [[1], [2]]), probs)
    assert again.model_calls == 2
    assert capfd.readouterr().err.count("warning:") == 2
    assert store_cli.main(["verify", "--store", pg_url]) == 0


def test_export_import_between_postgres_and_a_laptop_sqlite(tmp_path, pg_url, capsys):
    cluster = CachingClient(ScriptedBackend(), Store(pg_url), chunk_size=3)
    outputs = cluster.generate(requests(6))
    probs = cluster.choice_probs([(1, 2), (3, 4)], [[1], [2]])
    assert store_cli.main(["export", str(tmp_path / "cluster-run.sqlite"), "--store", pg_url]) == 0
    laptop = CachingClient(ScriptedBackend(), Store(tmp_path / "cluster-run.sqlite"))
    assert laptop.generate(requests(6)) == outputs
    np.testing.assert_array_equal(laptop.choice_probs([(1, 2), (3, 4)], [[1], [2]]), probs)
    assert laptop.model_calls == 0

    # 3 more on the laptop
    CachingClient(ScriptedBackend(), Store(tmp_path / "cluster-run.sqlite")).generate(requests(9))
    assert store_cli.main(["import", str(tmp_path / "cluster-run.sqlite"), "--store", pg_url]) == 0
    assert "3 copied, 8 already present" in capsys.readouterr().out
    assert Store(pg_url).count() == 11
    back = CachingClient(ScriptedBackend(), Store(pg_url))
    back.generate(requests(9))
    assert back.model_calls == 0


def test_audit_rerun_against_postgres_makes_zero_model_calls(tmp_path, pg_url):
    from mlflow.tracking import MlflowClient

    for attempt in range(2):
        result = run_app(tmp_path, *TINY, f"store.url={pg_url}", in_tmp=True)
        assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("fairaudit").experiment_id],
                              order_by=["attributes.start_time"])
    assert [r.data.metrics["model_calls"] for r in runs] == [2 * 2 * 2 * 2, 0]


def test_joblib_sweep_reports_to_the_mlflow_server(tmp_path, mlflow_server):
    from mlflow.tracking import MlflowClient

    result = run_app(tmp_path, *TINY, "tracking=server", f"tracking.uri={mlflow_server.uri}",
                     "tracking.experiment=joblib", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "-m",
                     "dataset=adult,compas", in_tmp=True)
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(mlflow_server.uri)
    found = client.search_runs([client.get_experiment_by_name("joblib").experiment_id])
    (parent,) = [r for r in found if r.data.tags.get("fairaudit.kind") == "sweep"]
    children = [r for r in found if r.data.tags.get("fairaudit.kind") == "job"]
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in found)
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    keys = set(sqlite3.connect(tmp_path / "store.sqlite").execute("SELECT key FROM results").fetchall())
    for child in children:
        assert child.info.artifact_uri.startswith("mlflow-artifacts:")
        records = pd.read_parquet(client.download_artifacts(child.info.run_id, "records/records.parquet",
                                                            str(tmp_path / child.info.run_id)))
        assert len(records) > 0 and {(h,) for h in records["prompt_hash"]} <= keys


@pytest.mark.skipif(not slurm_up(), reason="no SLURM here: scripts/cluster.sh up, then export SLURM_CONF=...")
def test_smoke_study_on_slurm_matches_a_local_run(tmp_path, mlflow_server, local_smoke):
    """Every job of the smoke study's slice (`SMOKE`: a job per data set) a SLURM job of its own reporting to the
    server, under one parent, with the metrics of the same sweep run locally (each sweep with its own store, so both
    compute everything)."""
    from mlflow.tracking import MlflowClient

    (tmp_path / "slurm").mkdir()
    slurm = run_app(tmp_path / "slurm", *SMOKE, "tracking=server",
                    f"tracking.uri={mlflow_server.uri}", "hydra/launcher=slurm", "hydra.launcher.gpus_per_node=null",
                    "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=3", "hydra.launcher.timeout_min=30",
                    "hydra.launcher.array_parallelism=2",
                    'hydra.launcher.setup=["export OMP_NUM_THREADS=1"]', "-m", in_tmp=True, timeout=1800,
                    env={"OMP_NUM_THREADS": "1"})
    assert slurm.returncode == 0, slurm.stderr[-3000:]

    _, expected = job_metrics(MlflowClient(f"sqlite:///{local_smoke}/mlflow.db"), "thinking_fairness_smoke")
    client = MlflowClient(mlflow_server.uri)
    found, got = job_metrics(client, "thinking_fairness_smoke")
    (parent,) = [r for r in found if r.data.tags.get("fairaudit.kind") == "sweep"]
    children = [r for r in found if r.data.tags.get("fairaudit.kind") == "job"]
    assert len(children) == SMOKE_JOBS and all(r.info.status == "FINISHED" for r in found)
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    logs = {p.name for p in (tmp_path / "slurm" / "multirun").glob("*/*/.submitit/*_*") if p.is_dir()}
    assert {c.data.tags["slurm_job_id"] for c in children} == logs and len(logs) == SMOKE_JOBS
    assert len(expected) == SMOKE_JOBS and got == expected
    config = client.download_artifacts(children[0].info.run_id, "config/config.yaml", str(tmp_path))
    assert "thinking_fairness_smoke" in Path(config).read_text()


def test_server_down_mid_run_fails_cleanly_and_keeps_the_results(tmp_path, mlflow_server):
    """Last in the module: it stops the shared server."""
    from mlflow.tracking import MlflowClient

    store = tmp_path / "store.sqlite"
    env = {**os.environ, "FAIRAUDIT_DATA": os.environ.get("FAIRAUDIT_DATA", str(REPO.parent / "shared" / "data")),
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5", "OMP_NUM_THREADS": "1"}
    overrides = ["model=tiny_qwen3", "dataset.n=8", "model.batch_size=2", "model.max_think_tokens=32",
                 "tracking=server",
                 f"tracking.uri={mlflow_server.uri}", "tracking.experiment=mid_run", f"store.url={store}",
                 f"hydra.run.dir={tmp_path}/outputs"]
    proc = subprocess.Popen([sys.executable, "-m", "fairaudit", *overrides], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and model_results(store) < 2:
        time.sleep(0.2)
    mlflow_server.stop()
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err
    (line,) = [e for e in err.splitlines() if e.startswith("error:")]
    assert f"tracking.uri {mlflow_server.uri} failed mid-run" in line
    assert model_results(store) == 8 * 2 * 2 * 2

    local = [o for o in overrides if not o.startswith("tracking")] + [f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"]
    again = subprocess.run([sys.executable, "-m", "fairaudit", *local], cwd=REPO, env=env, capture_output=True,
                           text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("fairaudit").experiment_id])
    assert run.data.metrics["model_calls"] == 0




@pytest.mark.skipif(not slurm_up(), reason="no SLURM here: scripts/cluster.sh up, then export SLURM_CONF=...")
def test_sigterm_to_a_slurm_sweeps_parent_cancels_its_array_and_leaves_every_run_killed(tmp_path):
    """SIGTERM to the parent of a sweep whose jobs are a SLURM array, once both jobs generate: the array cancelled
    (scancel), each job's run closed KILLED by its job, the parent's run KILLED, no job left in the queue or on the
    node, and the parent exits 143."""
    slurm = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=null", "hydra.launcher.cpus_per_task=1",
             "hydra.launcher.mem_gb=3", "hydra.launcher.timeout_min=30",
             'hydra.launcher.setup=["export OMP_NUM_THREADS=1"]']
    proc, err, gone_after = stop_sweep(tmp_path, slurm, signal.SIGTERM, pairs=1000)  # SLURM starts its jobs apart
    assert proc.returncode == 143 and "Traceback" not in err, err[-3000:]
    ended = runs(tmp_path)
    assert len(ended) == 3 and {r.info.status for r in ended} == {"KILLED"}
    assert sum("interrupted (SIGTERM) after" in r.data.tags["mlflow.note.content"] for r in ended) == 2
    queued = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    submitted = {p.name.split("_")[0] for p in (tmp_path / "multirun" / ".submitit").glob("*_*") if p.name[0].isdigit()}
    assert len(submitted) == 1 and not {q.split("_")[0] for q in queued} & submitted
    left = subprocess.run(["pgrep", "-f", f"submitit.*{tmp_path}"], capture_output=True, text=True).stdout.split()
    assert not left and not tree(proc.pid) and gone_after < 60
