"""Reliability as a user meets it: bad values, failing sweep jobs, concurrent first starts, kill -9 at many moments.

Everything runs `python -m fairaudit` in subprocesses against real sqlite MLflow and store files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import (
    DATA_ROOT,
    REPO,
    building_tracking_db,
    cache_without_schema,
    count,
    cut_short_model,
    integrity,
    model_results,
    run_app,
)
from warm import popen_python, run_python

TINY = ("model=tiny_qwen3", "model.max_think_tokens=4", "probe.n_boot=100")
ENV = {**os.environ, "FAIRAUDIT_DATA": str(DATA_ROOT), "OMP_NUM_THREADS": "1"}  # MKL's threads follow OMP's


def all_runs(tmp_path: Path) -> list:
    """Every run in tmp_path's tracking database (none when it was never created)."""
    from mlflow.tracking import MlflowClient

    if not (tmp_path / "mlflow.db").exists():
        return []
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    ids = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(ids) if ids else []


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


# ---------------------------------------------------------------- every typed value: FINISHED or one line


def maybe(key: str, values: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.none(), values.map(lambda value: f"{key}={value}"))


OVERRIDES = st.tuples(
    st.one_of(st.integers(1, 2), st.integers(-2, 0), st.sampled_from(["1.5", "abc", "null", "99999999"])).map(
        lambda n: f"dataset.n={n}"),
    maybe("dataset.seed", st.sampled_from([0, 3, -1, 4294967296])),
    maybe("model.batch_size", st.sampled_from([1, 4, 0, -3, 2.5])),
    maybe("model.max_think_tokens", st.sampled_from([2, 6, 0, -1, 4096, "1e8"])),
    maybe("probe.n_boot", st.sampled_from([100, 0, 99])),
    maybe("backend.device", st.sampled_from(["cpu", "auto", "tpu", "cuda:7"])),
    maybe("model.dtype", st.sampled_from(["float32", "int8"])),
    maybe("tracking.experiment", st.sampled_from(["other", "''"])),
    maybe("model.answer_source", st.sampled_from(["forced", "parsed", "guess"])),
)


@pytest.mark.slow
@pytest.mark.long
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OVERRIDES)
@example(("dataset.n=1", "dataset.seed=3", None, "model.max_think_tokens=2", None, "backend.device=cpu", None, None,
          None))
def test_any_typed_value_finishes_or_is_one_line_with_no_run(drawn):
    chosen = {o.split("=")[0]: o for o in (*TINY, *drawn) if o is not None}  # a drawn value replaces TINY's
    with tempfile.TemporaryDirectory() as folder:
        tmp_path = Path(folder)
        result = run_app(tmp_path, *chosen.values(), env=ENV)
        found = all_runs(tmp_path)
        if result.returncode == 0:
            assert [r.info.status for r in found] == ["FINISHED"], result.stderr[-2000:]
        else:
            assert result.returncode == 2, result.stderr[-3000:]
            assert len(error_lines(result.stderr)) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
            assert found == [] and "Loading weights" not in result.stderr


# ---------------------------------------------------------------- a failing job inside a sweep


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("launcher", [(), ("hydra/launcher=joblib", "hydra.launcher.n_jobs=2")],
                         ids=["sequential", "joblib"])
def test_failing_sweep_jobs_become_failed_children_and_the_rest_run(tmp_path, launcher):
    """Jobs that pass every check before the sweep opens and fail as they run (a weights file cut short)."""
    from fairaudit.models.locate import tiny_qwen3_dir

    good, bad = tiny_qwen3_dir(), cut_short_model(tmp_path)
    result = run_app(tmp_path, *TINY, *launcher, "-m", "dataset.n=2,1", f"model.path={good},{bad}", env=ENV)
    assert result.returncode == 1, result.stderr[-3000:]
    found = all_runs(tmp_path)
    (parent,) = [r for r in found if r.data.tags["fairaudit.kind"] == "sweep"]
    children = {r.data.tags["fairaudit.job_num"]: r for r in found if r.data.tags["fairaudit.kind"] == "job"}
    assert {num: run.info.status for num, run in children.items()} == {
        "0": "FINISHED", "1": "FAILED", "2": "FINISHED", "3": "FAILED"}
    size = (good / "model.safetensors").stat().st_size
    line = f"model file {bad}/model.safetensors is cut short: {size // 2:,} of {size:,} bytes"
    for num in "13":
        assert children[num].data.tags["fairaudit.error"].startswith(line)
        assert children[num].data.tags["fairaudit.error"] == children[num].data.tags["mlflow.note.content"]
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in children.values())
    assert parent.info.status == "FAILED"
    summary = parent.data.tags["fairaudit.failed_jobs"]
    assert summary.startswith("2 of 4 jobs failed: #1 ") and f"model.path={bad}" in summary and "#3 " in summary
    assert error_lines(result.stderr)[-1] == f"error: {summary}"


# ---------------------------------------------------------------- first starts on a new tracking database


def test_concurrent_first_starts_share_one_tracking_database(tmp_path):
    """Processes opening a new sqlite tracking database at once: one builds it, the others wait and use it."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code = f"from fairaudit.tracking.database import open_tracking; print(open_tracking({uri!r}, 'fairaudit')[1])"
    env = {**ENV, **cache_without_schema(tmp_path)}  # both build MLflow's schema at once, then the database
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [proc.communicate(timeout=600) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    assert len({out.strip() for out, _ in outputs}) == 1  # one experiment, found or created by each
    assert integrity(tmp_path / "mlflow.db") == "ok"
    assert not building_tracking_db(tmp_path)


@pytest.mark.slow
@pytest.mark.long
def test_two_concurrent_first_runs_both_finish(tmp_path):
    places = [f"store.url={tmp_path}/store.sqlite", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"]
    procs = [popen_python([sys.executable, "-m", "fairaudit", *places, f"hydra.run.dir={tmp_path}/out{i}", *TINY,
                           "dataset.n=1", f"dataset.seed={i}"], ENV, cwd=REPO, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE) for i in range(2)]
    errors = [proc.communicate(timeout=900)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err[-2000:] for err in errors]
    assert sorted(r.info.status for r in all_runs(tmp_path)) == ["FINISHED", "FINISHED"]
    assert integrity(tmp_path / "mlflow.db") == "ok"


STARTS = """
import sys, time
from pathlib import Path
from fairaudit.job.outputs import output_problem
parent, name, rounds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
(parent / f"ready-{name}").touch()
while not (parent / "go").exists():
    time.sleep(0.001)
at = float((parent / "go").read_text())
for round in range(rounds):
    folder = parent / str(round) / "new" / name
    time.sleep(max(0.0, at + round * 0.2 - time.time()))  # each round starts at the same instant in every process
    problem = output_problem(folder, "hydra.run.dir")
    assert problem is None, f"round {round}: {problem}"
    (folder / ".hydra").mkdir(parents=True, exist_ok=True)  # as Hydra makes the job's folder and writes into it
    (folder / ".hydra" / "config.yaml").write_text("a: 1")
    time.sleep(0.1)
    assert (folder / ".hydra" / "config.yaml").exists(), f"round {round}: {name}'s .hydra/ was removed"
"""


def test_runs_starting_at_once_under_one_new_parent_folder_keep_their_folders(tmp_path):
    """Three processes check their output folders (`job.outputs.output_problem`) under one new parent at the same
    instant, each then writing its .hydra/ as Hydra does: none is refused, none loses its files, and nothing the
    checks made is left but the folders the runs wrote."""
    rounds = 20
    procs = [subprocess.Popen([sys.executable, "-c", STARTS, str(tmp_path), name, str(rounds)], cwd=REPO, env=ENV,
                              stderr=subprocess.PIPE, text=True) for name in "abc"]
    while len(list(tmp_path.glob("ready-*"))) < 3 and all(proc.poll() is None for proc in procs):
        time.sleep(0.01)
    (tmp_path / "go.new").write_text(str(time.time() + 0.5))
    (tmp_path / "go.new").rename(tmp_path / "go")  # whole when it appears: a process may read it at once
    errors = [proc.communicate(timeout=300)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], [err[-2000:] for err in errors]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.glob("*/new/*")) == \
        sorted(f"{r}/new/{name}" for r in range(rounds) for name in "abc")
    assert not list(tmp_path.glob("**/.fairaudit-write-*"))


# ---------------------------------------------------------------- kill -9 at many moments, then run again


def run_open(tmp: Path) -> bool:
    return count(tmp / "mlflow.db", "SELECT count(*) FROM runs WHERE status = 'RUNNING'") > 0


def mid_generation(tmp: Path) -> bool:
    return model_results(tmp / "store.sqlite") >= 4


def logging_artifacts(tmp: Path) -> bool:
    return any((tmp / "mlartifacts").glob("*/*/artifacts/tables"))  # artifacts live beside the sqlite DB


def sweep_parent_open(tmp: Path) -> bool:
    return count(tmp / "mlflow.db", "SELECT count(*) FROM tags WHERE key = 'fairaudit.kind' AND value = 'sweep'") > 0


def between_sweep_jobs(tmp: Path) -> bool:
    return count(tmp / "mlflow.db", "SELECT count(*) FROM runs WHERE status = 'FINISHED'") >= 1


SINGLE = ("dataset.n=6", "model.batch_size=2", "model.max_think_tokens=24")
SWEEP = ("-m", "dataset.n=1,2")
MOMENTS: dict[str, tuple[Callable[[Path], bool], tuple[str, ...]]] = {
    "tracking_db_creation": (building_tracking_db, SINGLE),
    "run_open": (run_open, SINGLE),
    "mid_generation": (mid_generation, SINGLE),
    "logging_artifacts": (logging_artifacts, SINGLE),
    "sweep_parent_open": (sweep_parent_open, SWEEP),
    "between_sweep_jobs": (between_sweep_jobs, SWEEP),
}


def kill_when(tmp_path: Path, moment: Callable[[Path], bool], overrides: tuple[str, ...], env: dict) -> None:
    """Start the run and SIGKILL it (its whole process group) the moment `moment` holds."""
    args = [sys.executable, "-m", "fairaudit", f"store.url={tmp_path}/store.sqlite",
            f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"hydra.run.dir={tmp_path}/outputs",
            f"hydra.sweep.dir={tmp_path}/multirun", *TINY, *overrides]
    proc = popen_python(args, env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        start_new_session=True)
    deadline = time.time() + 600
    while proc.poll() is None and time.time() < deadline and not moment(tmp_path):
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before the moment came"
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("name", list(MOMENTS))
def test_kill_9_then_the_same_run_again_leaves_nothing_running_or_counted_twice(tmp_path, name):
    from mlflow.tracking import MlflowClient
    from omegaconf import OmegaConf

    from fairaudit.report.runs import select_runs

    moment, overrides = MOMENTS[name]
    env = {**ENV, **cache_without_schema(tmp_path)}  # the first start builds MLflow's schema too
    kill_when(tmp_path, moment, overrides, env)
    rerun = run_python([sys.executable, "-m", "fairaudit", f"store.url={tmp_path}/store.sqlite",
                        f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"hydra.run.dir={tmp_path}/outputs",
                        f"hydra.sweep.dir={tmp_path}/multirun2", *TINY, *overrides], env, cwd=tmp_path, timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert integrity(tmp_path / "mlflow.db") == "ok"
    found = all_runs(tmp_path)
    assert "RUNNING" not in {r.info.status for r in found}
    finished = {r.info.run_id for r in found if r.info.status == "FINISHED"}
    for run in found:
        if run.info.status == "KILLED":  # closed by the re-run of the same job, which links to it
            successor = run.data.tags["fairaudit.superseded_by"]
            assert successor in finished
            resumed = next(r for r in found if r.info.run_id == successor)
            assert run.info.run_id in resumed.data.tags["fairaudit.resumes"]
    jobs = 2 if overrides == SWEEP else 1
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    select = OmegaConf.create({"experiment": None, "parent": None, "sweep_dir": None, "tags": {}, "filter": None,
                               "status": None})
    assert len(select_runs(client, select).runs) == jobs  # what a report pools: one run per job
