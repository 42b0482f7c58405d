"""kill -9 of a `backend=mock` job at five moments of its life, then the same command again: the re-run resumes
without recomputing a stored result, ends FINISHED with metrics equal to an uninterrupted run's, both databases
pass `PRAGMA integrity_check` and no run is left RUNNING.

Each moment is a real effect watched from outside, never a hook in the code: the job's process group is stopped
(SIGSTOP) as soon as the effect shows, the effect checked again while it cannot move, then killed (SIGKILL).
At CI size (`make test-long`) 100 pairs of ~300-token traces, killed at the three moments no other test kills at
(CI_MOMENTS); at paper size (`make test-paper`) 5,000 pairs of ~2,000-token traces, killed at all five
(docs/reliability.md has its figures: `pytest -m paper -s tests/test_kill_matrix.py`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from conftest import DATA_ROOT, REPO, count, integrity, model_results
from warm import popen_python, run_python

# At CI size one result per store commit: 800 commits of a job that generates in a second, so the moment inside
# a commit is there to be caught on a loaded machine (with 8 per commit it was missed once in CI).
SIZES = {"ci": ("dataset.n=100", "model.max_think_tokens=600", "backend.trace_tokens.median=300",
                "backend.chunk_size=1"),
         "paper": ("dataset.n=5000", "model.max_think_tokens=3000", "backend.trace_tokens.median=2000")}
JOB = ("backend=mock", "model=tiny_qwen3")
ENV = {**os.environ, "FAIRAUDIT_DATA": str(DATA_ROOT), "OMP_NUM_THREADS": "1"}  # MKL's threads follow OMP's


def command(folder: Path, size: str) -> list[str]:
    return [sys.executable, "-m", "fairaudit", *JOB, *SIZES[size], f"store.url={folder}/store.sqlite",
            f"tracking.uri=sqlite:///{folder}/mlflow.db", f"hydra.run.dir={folder}/outputs"]


@pytest.fixture(scope="module")
def empty_tracking_db(tmp_path_factory) -> Path:
    """MLflow's schema built once (seconds of migrations), copied into each job's folder: the kills come later."""
    from fairaudit.tracking.database import prepare_tracking

    path = tmp_path_factory.mktemp("schema") / "mlflow.db"
    prepare_tracking(f"sqlite:///{path}")
    return path


def launch(folder: Path, size: str) -> subprocess.Popen:
    """The job in a process group of its own, its temporary files (the samples' pages) in folder/tmp."""
    (folder / "tmp").mkdir(parents=True, exist_ok=True)
    return popen_python(command(folder, size), {**ENV, "TMPDIR": str(folder / "tmp")}, cwd=REPO,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def the_run(folder: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder}/mlflow.db")
    return client, client.search_runs([e.experiment_id for e in client.search_experiments()])


@dataclass
class Reference:
    """The uninterrupted job: its metrics, how many model results and store rows it made, and whether its samples
    took several pages."""

    metrics: dict[str, float]
    calls: int
    rows: int
    paged: bool
    seconds: float


def uninterrupted(folder: Path, size: str, empty_tracking_db: Path) -> Reference:
    shutil.copy(empty_tracking_db, folder / "mlflow.db")
    start = time.time()
    proc = launch(folder, size)
    out, err = proc.communicate(timeout=3600)
    assert proc.returncode == 0, err[-3000:]
    _, (run,) = the_run(folder)
    artifacts = next((folder / "mlartifacts").glob("*/*/artifacts"))
    return Reference(run.data.metrics, int(run.data.metrics["model_calls"]),
                     count(folder / "store.sqlite", "SELECT count(*) FROM results"),
                     (artifacts / "samples").is_dir(), time.time() - start)


@pytest.fixture(scope="module")
def references(tmp_path_factory, empty_tracking_db) -> Callable[[str], Reference]:
    """The uninterrupted job at a size (`ci` or `paper`), run once per size the module's tests ask for."""
    done: dict[str, Reference] = {}

    def reference(size: str) -> Reference:
        if size not in done:
            done[size] = uninterrupted(tmp_path_factory.mktemp(f"reference-{size}"), size, empty_tracking_db)
        return done[size]
    return reference


def holds_store_write_lock(folder: Path, pid: int) -> bool:
    """The job holds sqlite's WAL write lock (byte 120 of store.sqlite-shm): it is inside a store transaction."""
    try:
        inode = os.stat(folder / "store.sqlite-shm").st_ino
        locks = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return False
    return any(f[4] == str(pid) and f[5].rsplit(":", 1)[1] == str(inode) and f[6] == "120"
               for f in (line.split() for line in locks) if len(f) >= 8 and f[1] == "POSIX" and f[3] == "WRITE")


def artifacts_of(folder: Path) -> Path | None:
    return next((folder / "mlartifacts").glob("*/*/artifacts"), None)


Moment = Callable[[Path, int, Reference], bool]
MOMENTS: dict[str, Moment] = {
    # a third of the model's results are committed, more are coming
    "mid_generation": lambda folder, pid, ref: model_results(folder / "store.sqlite") >= ref.calls // 3,
    # past half of them, inside a commit (the write lock held between BEGIN and COMMIT; the lock is read first, as
    # /proc/locks costs far less than a query and the window is short)
    "mid_store_commit": lambda folder, pid, ref: (holds_store_write_lock(folder, pid)
                                                  and model_results(folder / "store.sqlite") >= ref.calls // 2),
    # every result stored, no metric logged yet: records, analysis, figures
    "during_analysis": lambda folder, pid, ref: (count(folder / "store.sqlite", "SELECT count(*) FROM results")
                                                 >= ref.rows and count(folder / "mlflow.db",
                                                                       "SELECT count(*) FROM metrics") == 0),
    # metrics logged and tables being written, the samples not yet
    "during_mlflow_logging": lambda folder, pid, ref: (artifacts_of(folder) is not None
                                                       and (artifacts_of(folder) / "tables").is_dir()),
    # samples.jsonl written to the job's temporary folder, its pages under way (a paged run: a page written)
    "during_samples_pages": lambda folder, pid, ref: (any((folder / "tmp").glob("*/samples/.part-*")) if ref.paged
                                                      else any((folder / "tmp").glob("*/samples.jsonl"))),
}


TRIES = 3  # a moment is a race with the job: one that a loaded machine let pass is watched for again, from scratch


def kill_at(folder: Path, size: str, moment: Moment, ref: Reference, empty_tracking_db: Path) -> float:
    """Run the job from empty databases and SIGKILL its process group at `moment` (stopped first, so the effect cannot
    pass meanwhile), trying again from scratch when the job ended first; returns the seconds the killed try ran."""
    for _ in range(TRIES - 1):
        try:
            return kill_once(folder, size, moment, ref, empty_tracking_db)
        except MomentMissed:
            pass
    return kill_once(folder, size, moment, ref, empty_tracking_db)


class MomentMissed(Exception):
    """The job ended before the moment was seen."""


def kill_once(folder: Path, size: str, moment: Moment, ref: Reference, empty_tracking_db: Path) -> float:
    for path in (folder / "store.sqlite", folder / "store.sqlite-wal", folder / "store.sqlite-shm"):
        path.unlink(missing_ok=True)
    for path in (folder / "mlartifacts", folder / "outputs", folder / "tmp"):
        shutil.rmtree(path, ignore_errors=True)
    shutil.copy(empty_tracking_db, folder / "mlflow.db")
    start, proc = time.time(), launch(folder, size)
    while proc.poll() is None and time.time() - start < 3600:
        if moment(folder, proc.pid, ref):
            os.killpg(proc.pid, signal.SIGSTOP)
            if moment(folder, proc.pid, ref):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                return time.time() - start
            os.killpg(proc.pid, signal.SIGCONT)
        time.sleep(0.005)
    raise MomentMissed(f"the job ended (exit {proc.poll()}) before the moment came: {proc.communicate()[1][-2000:]}")


# At CI size the moments no other test kills at; mid_generation and during_mlflow_logging are killed at in CI by
# tests/test_reliability.py's kill matrix (its mid_generation and logging_artifacts), on the tiny model, and all five
# at paper size in `make test-paper`.
CI_MOMENTS = ("mid_store_commit", "during_analysis", "during_samples_pages")
CASES = ([pytest.param("ci", name, marks=[pytest.mark.slow, pytest.mark.long], id=f"ci-{name}") for name in CI_MOMENTS]
         + [pytest.param("paper", name, marks=pytest.mark.paper, id=f"paper-{name}") for name in MOMENTS])


@pytest.mark.parametrize("size, name", CASES)
def test_kill_9_at_each_moment_then_the_rerun_resumes_and_equals_an_uninterrupted_run(tmp_path, references, size,
                                                                                     name, empty_tracking_db):
    ref = references(size)
    killed_after = kill_at(tmp_path, size, MOMENTS[name], ref, empty_tracking_db)
    assert integrity(tmp_path / "store.sqlite") == "ok"
    stored = model_results(tmp_path / "store.sqlite")
    start = time.time()
    rerun = run_python(command(tmp_path, size), {**ENV, "TMPDIR": str(tmp_path / "tmp")}, cwd=REPO, timeout=3600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    seconds = time.time() - start
    assert integrity(tmp_path / "store.sqlite") == "ok" and integrity(tmp_path / "mlflow.db") == "ok"
    assert not list((tmp_path / "tmp").iterdir())  # the killed job's temporary pages removed by the re-run
    _, runs = the_run(tmp_path)
    statuses = sorted(r.info.status for r in runs)
    assert statuses == ["FINISHED", "KILLED"]  # the killed one closed by the re-run, none left RUNNING
    (finished,) = [r for r in runs if r.info.status == "FINISHED"]
    assert finished.data.metrics["model_calls"] == ref.calls - stored  # nothing stored was computed again
    assert {k: v for k, v in finished.data.metrics.items() if k != "model_calls"} == {
        k: v for k, v in ref.metrics.items() if k != "model_calls"}
    print(f"\n{size} {name}: killed after {killed_after:.1f} s with {stored} of {ref.calls} results stored; the re-run "
          f"made {ref.calls - stored} calls in {seconds:.1f} s (uninterrupted: {ref.seconds:.1f} s), "
          f"{len(ref.metrics) - 1} metrics equal")
