"""One job over several processes (`job.workers`): the same records and metrics as one process, every call computed
once between them, a worker that dies taken over; and what splitting buys in the plan's arithmetic."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from conftest import run_app
from fairaudit.analysis.cost import gpu_hours, split_jobs_wall, whole_jobs_wall

# The default audit (SmolLM2, think against nothink) on 8 Adult pairs: enough calls that a helper is mid-job when it is
# killed
SMALL = ("dataset.n=8",)


def test_the_grid_on_n_accelerators_whole_or_split():
    # longest first onto the soonest free: 5 -> A, 4 -> B, 3 -> B (7), 3 -> A (8), 3 -> B (10)
    assert whole_jobs_wall([3, 5, 3, 4, 3], 2) == 10
    assert whole_jobs_wall([3, 5, 3, 4, 3], 1) == 18 and whole_jobs_wall([3, 5, 3, 4, 3], 8) == 5
    assert split_jobs_wall([3, 5, 3, 4, 3], 2) == 9 and split_jobs_wall([3, 5, 3, 4, 3], 2, load_seconds=1) == 14
    assert gpu_hours(1800, 8) == 4.0 and gpu_hours(whole_jobs_wall([3600] * 3, 2), 2) == 4.0


def the_run(folder: Path) -> tuple[dict, pd.DataFrame, MlflowClient, str]:
    """The one run a job logged under `folder`: its metrics, its records and where to read more of it."""
    client = MlflowClient(f"sqlite:///{folder}/mlflow.db")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED"
    path = client.download_artifacts(run.info.run_id, "records/records.parquet", str(folder))
    return run.data.metrics, pd.read_parquet(path), client, run.info.run_id


def comparable(metrics: dict) -> dict:
    """A run's metrics but those that say which process computed what."""
    return {k: v for k, v in metrics.items() if k not in ("model_calls", "workers", "worker_model_calls")
            and not k.startswith("padding_share")}


@pytest.fixture(scope="module")
def alone(tmp_path_factory) -> tuple[dict, pd.DataFrame]:
    """The job in one process: its metrics and records, what the split job must equal."""
    folder = tmp_path_factory.mktemp("one")
    result = run_app(folder, *SMALL, env={"OMP_NUM_THREADS": "1"}, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics, records, _, _ = the_run(folder)
    return metrics, records


@pytest.mark.slow
@pytest.mark.long
def test_a_job_split_over_three_workers_equals_the_job_in_one_process(tmp_path, alone):
    result = run_app(tmp_path, *SMALL, "job.workers=3", env={"OMP_NUM_THREADS": "1"}, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    one, one_records = alone
    three, three_records, client, run_id = the_run(tmp_path)
    assert comparable(three) == comparable(one)
    pd.testing.assert_frame_equal(three_records, one_records)
    steps = [m.value for m in sorted(client.get_metric_history(run_id, "worker_model_calls"), key=lambda m: m.step)]
    assert three["workers"] == 3 and len(steps) == 3
    assert sum(steps) == three["model_calls"] == one["model_calls"] > 0


@pytest.mark.slow
@pytest.mark.long
def test_a_worker_killed_mid_job_leaves_its_calls_to_the_others(tmp_path, alone):
    """SIGKILL to one helper as soon as it computes: the job still ends FINISHED with every call in the store once
    (its rows, one per key, as many as one process computes), the dead helper's claims taken over at once."""
    import subprocess
    import sys

    from conftest import DATA_ROOT, REPO
    from warm import popen_python

    one, one_records = alone
    folder = tmp_path / "killed"
    folder.mkdir()
    env = {**os.environ, "FAIRAUDIT_DATA": str(DATA_ROOT), "OMP_NUM_THREADS": "1"}
    job = popen_python([sys.executable, "-m", "fairaudit", f"store.url={folder}/store.sqlite",
                        f"tracking.uri=sqlite:///{folder}/mlflow.db", f"hydra.run.dir={folder}/out",
                        *SMALL, "job.workers=3"], env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    victim = first_helper(job.pid, deadline=time.time() + 600)
    time.sleep(5)  # into its calls
    os.kill(victim, signal.SIGKILL)
    out, err = job.communicate(timeout=1200)
    assert job.returncode == 0, err[-3000:]
    killed, records, _, _ = the_run(folder)
    assert comparable(killed) == comparable(one)
    pd.testing.assert_frame_equal(records, one_records)
    import sqlite3

    rows = sqlite3.connect(folder / "store.sqlite").execute(
        "SELECT COUNT(*) FROM results WHERE kind != 'encode'").fetchone()[0]
    assert rows == one["model_calls"]


def first_helper(parent: int, deadline: float) -> int:
    """The pid of the first helper process `parent` started (`python -m fairaudit.job.workers`)."""
    while time.time() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if b"fairaudit.job.workers" in cmdline and int(stat[1]) == parent:
                return int(entry.name)
        time.sleep(0.2)
    raise AssertionError("the job started no helper")
