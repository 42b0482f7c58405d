"""A signal to a sweep's parent stops the whole sweep under every launcher fairaudit ships: the jobs stop, every run
(the parent and its children) ends KILLED in MLflow, no process of the sweep is left, and the parent exits with 128 +
the signal's number, printing the command that resumes. The SLURM launcher's case is in tests/test_cluster.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import DATA_ROOT, REPO, model_results
from warm import popen_python

ENV = {**os.environ, "FAIRAUDIT_DATA": str(DATA_ROOT), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
JOB = ("backend=mock", "model=tiny_qwen3", "backend.chunk_size=1", "model.max_think_tokens=1200",
       "backend.trace_tokens.median=1000", "backend.trace_tokens.distribution=fixed")
LAUNCHERS = {"basic": [], "joblib": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
             "submitit_local": ["hydra/launcher=submitit_local"]}


def sweep_command(tmp_path: Path, pairs: int, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "fairaudit", f"store.url={tmp_path}/store.sqlite",
            f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"hydra.sweep.dir={tmp_path}/multirun", *JOB,
            f"dataset.n={pairs}", *overrides, "-m", "dataset=adult,compas"]


def runs(tmp_path: Path) -> list:
    """Every run of the sweep's experiment (none while its database is not there yet or locked)."""
    if not (tmp_path / "mlflow.db").exists():  # left for the sweep to build: MLflow would build one here
        return []
    try:
        client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
        experiment = client.get_experiment_by_name("fairaudit")
        return client.search_runs([experiment.experiment_id]) if experiment else []
    except Exception:
        return []


def generating(tmp_path: Path, jobs: int) -> bool:
    """`jobs` child runs open and computing: each RUNNING, and results landing in the store."""
    children = [r for r in runs(tmp_path) if r.data.tags.get("fairaudit.kind") != "sweep"]
    return sum(r.info.status == "RUNNING" for r in children) >= jobs and model_results(tmp_path / "store.sqlite") > 4


def tree(pid: int) -> list[int]:
    """The processes of the session `pid` leads: the sweep's parent and everything it started."""
    listed = subprocess.run(["ps", "-o", "pid=", "-s", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in listed]


def stop_sweep(tmp_path: Path, launcher: str | list[str], sig: int,
               pairs: int = 400) -> tuple[subprocess.Popen, str, float]:
    """The sweep of two jobs of `pairs` pairs each started in a session of its own, signalled once both generate
    (SIGINT to its whole process group, as a terminal's Ctrl-C); (its process, its stderr, seconds from the signal
    until no process of its session is left)."""
    chosen = LAUNCHERS[launcher] if isinstance(launcher, str) else launcher  # a launcher's name, or its overrides
    proc = popen_python(sweep_command(tmp_path, pairs, *chosen), ENV, cwd=REPO, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 600
    while proc.poll() is None and time.time() < deadline and not generating(tmp_path, 1 if launcher == "basic" else 2):
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    signalled = time.time()
    if sig == signal.SIGINT:  # Ctrl-C in a terminal: every process of its foreground group gets it
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=180)
    while tree(proc.pid) and time.time() < signalled + 60:
        time.sleep(0.05)
    print(f"{launcher}: every process gone {time.time() - signalled:.1f} s after the signal")  # docs/reliability.md
    return proc, err, time.time() - signalled


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("launcher, sig", [pytest.param("basic", signal.SIGTERM, marks=pytest.mark.paper),  # as
                                           # tests/test_faults.py's SIGTERM in a sweep, at CI size
                                           ("joblib", signal.SIGTERM),
                                           ("submitit_local", signal.SIGTERM), ("joblib", signal.SIGINT)])
def test_a_signal_to_a_sweeps_parent_stops_every_job_and_leaves_every_run_killed(tmp_path, launcher, sig):
    proc, err, gone_after = stop_sweep(tmp_path, launcher, sig)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert not tree(proc.pid), f"left running: {tree(proc.pid)}"
    assert gone_after < 60
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted") and last.endswith("dataset=adult,compas"), err[-3000:]
    ended = runs(tmp_path)
    jobs = 1 if launcher == "basic" else 2  # the basic launcher runs its jobs one by one: the second never started
    assert len(ended) == 1 + jobs and {r.info.status for r in ended} == {"KILLED"}, \
        [(r.info.run_name, r.info.status) for r in ended]
    name = "Ctrl-C" if sig == signal.SIGINT else signal.Signals(sig).name
    assert all(f"interrupted ({name})" in r.data.tags["mlflow.note.content"] for r in ended)
    assert not (tmp_path / "multirun" / ".fairaudit-jobs").exists()
