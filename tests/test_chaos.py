"""Chaos on loopback: overlapping audits on one PostgreSQL store and one MLflow server while a schedule SIGKILLs,
SIGTERMs and SIGSTOPs the workers and the servers. No process outlives its bound, every run ends in a terminal
state once each stopped worker's printed command is run again, each call is committed by one process only (no
pause here outlasts a lease), and every finished run's metrics are a clean run's."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from mlflow.tracking import MlflowClient

from fairaudit.store.results import Store
from tests.conftest import DATA_ROOT, REPO, probe_metric_names
from tests.servers import MlflowServer, PostgresServer, wait_until

pytestmark = pytest.mark.cluster
JOB = ["model=tiny_qwen3", "backend=mock", "dataset.n=40", "backend.chunk_size=1", "model.max_think_tokens=600",
       "backend.trace_tokens.median=300"]  # 320 model calls, committed one by one
PACE = ["backend.seconds_per_call=0.2"]  # the workers' calls: at least 20 s of them, so each fault lands mid-run
WORKERS = 3
LIFE_S = 600  # no worker runs longer, whatever the schedule did to it (a loaded 2-core machine starts one in minutes)
STOPPED_S = 60  # a SIGTERMed worker closes its run and exits within this (6.6 s idle; 48 s measured at load 11)
ENV = {**os.environ, "FAIRAUDIT_DATA": str(DATA_ROOT), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
COMMITS = """
CREATE TABLE committed (key VARCHAR(64), kind TEXT);
CREATE FUNCTION note_commit() RETURNS trigger AS $$
BEGIN INSERT INTO committed VALUES (NEW.key, NEW.kind); RETURN NEW; END $$ LANGUAGE plpgsql;
CREATE TRIGGER note_commit BEFORE INSERT ON results FOR EACH ROW EXECUTE FUNCTION note_commit();
"""  # every result a process commits, kept or not (a key already stored keeps its first value)


@pytest.fixture
def postgres():
    """A server of this test's own (it is frozen and crashed), trust logins on loopback, so that each printed
    command runs as printed."""
    server = PostgresServer()
    yield server
    server.stop()


@pytest.fixture
def store_url(postgres):
    """The server's database, its tables made and every committed result noted (COMMITS)."""
    store = Store(postgres.url)
    with store.engine.begin() as conn:
        conn.exec_driver_sql(COMMITS)
    store.close()
    return postgres.url


def commits(url: str) -> tuple[int, int]:
    """(model results committed, of them a key committed before); (0, 0) while the server does not answer."""
    try:
        engine = sa.create_engine(url, connect_args={"connect_timeout": 2})
        with engine.connect() as conn:
            total, keys = conn.execute(sa.text("SELECT count(*), count(DISTINCT key) FROM committed "
                                               "WHERE kind != 'encode'")).one()
        engine.dispose()
        return total, total - keys
    except sa.exc.OperationalError:
        return 0, 0


class Worker:
    """One audit process: started, signalled, waited for within LIFE_S, and run again with its printed command. Its
    stderr goes to a file of its own per start (`{name}-stderr-{start}`), so the schedule can read what it printed so
    far."""

    def __init__(self, command: list[str], folder: Path, name: str):
        self.command, self.folder, self.name = command, folder, name
        self.codes, self.err, self.errs, self.starts = [], "", [], 0
        self.start()

    def start(self) -> None:
        self.started, self.starts = time.time(), self.starts + 1
        self.err_path = self.folder / f"{self.name}-stderr-{self.starts}"
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(self.command, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=err)

    def mid_run(self) -> bool:
        """Running, and it has printed no line that ends a run (an error it is exiting on, a stop)."""
        printed = self.err_path.read_text(errors="replace")  # a line may be half written
        return self.proc.poll() is None and not re.search(r"^(error|interrupted)", printed, re.M)

    def wait(self) -> None:
        """Its end: it must come within LIFE_S of its start (subprocess.TimeoutExpired otherwise)."""
        self.proc.wait(timeout=max(self.started + LIFE_S - time.time(), 1))
        self.err = self.err_path.read_text(errors="replace")
        self.codes.append(self.proc.returncode)
        self.errs.append(self.err[-1500:])

    def resume(self) -> None:
        """Run again the command its last line printed (a SIGKILLed worker printed none: the same command)."""
        printed = re.findall(r": (\S+ -m fairaudit .*)$", self.err, re.M)
        if printed:
            self.command = shlex.split(printed[-1])
            assert f"hydra.run.dir={self.folder}/{self.name}" in self.command, printed[-1]  # its own, whole
        self.start()


def reference(tmp_path: Path) -> subprocess.Popen:
    """The same audit alone on a store and tracking database of its own: the clean run."""
    return subprocess.Popen([sys.executable, "-m", "fairaudit", *JOB, f"store.url={tmp_path}/clean/store.sqlite",
                             f"tracking.uri=sqlite:///{tmp_path}/clean/mlflow.db",
                             f"hydra.run.dir={tmp_path}/clean/out"], cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def metrics(client: MlflowClient, experiment: str) -> tuple[list[str], list[dict]]:
    """Every run's status, and each FINISHED run's metrics less those of the calls it computed (model_calls)."""
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return sorted(r.info.status for r in runs), [
        {k: r.data.metrics[k] for k in probe_metric_names(r.data.metrics) - {"model_calls"}}
        for r in runs if r.info.status == "FINISHED"]


def group_of(pid: int) -> list[int]:
    """A PostgreSQL postmaster and its children."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [pid, *map(int, children)]


def paused(pids: list[int], seconds: float) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(seconds)
    for pid in pids:
        os.kill(pid, signal.SIGCONT)


def test_overlapping_audits_survive_kills_stops_and_server_faults(tmp_path, store_url, postgres):
    started = time.time()
    server = MlflowServer(tmp_path)
    clean = reference(tmp_path)
    workers = [Worker([sys.executable, "-m", "fairaudit", *JOB, *PACE, "tracking=server", f"tracking.uri={server.uri}",
                       "tracking.experiment=chaos", f"store.url={store_url}", f"hydra.run.dir={tmp_path}/w{i}"],
                      tmp_path, f"w{i}")
               for i in range(WORKERS)]
    try:
        schedule(workers, server, postgres.pid, store_url)
        codes = [finish(worker) for worker in workers]
        assert clean.wait(timeout=LIFE_S) == 0, clean.stderr.read()[-3000:]
        statuses, finished = metrics(MlflowClient(server.uri), "chaos")
    finally:
        for worker in workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
        server.stop()
    _, (expected,) = metrics(MlflowClient(f"sqlite:///{tmp_path}/clean/mlflow.db"), "fairaudit")
    total, twice = commits(store_url)
    print(f"chaos: {time.time() - started:.0f} s; each worker's exit codes {codes}; runs {statuses}; {total} results "
          f"committed, {twice} of them twice")
    assert "RUNNING" not in statuses and statuses.count("FINISHED") == WORKERS
    assert finished == [expected] * WORKERS
    assert twice == 0  # every pause was shorter than a lease: no call was computed by two processes


def schedule(workers: list[Worker], server: MlflowServer, postmaster: int, store_url: str) -> None:
    """Each fault once the store holds a share of the job's results."""
    w0, w1, w2 = workers

    def after(results: int) -> None:
        wait_until(lambda: commits(store_url)[0] >= results, LIFE_S, f"{results} results")

    after(20)
    paused([w0.proc.pid], 3)                      # a worker paused (well within its lease)
    paused(group_of(postmaster), 3)               # the store's server frozen briefly
    after(80)
    w1.proc.kill()                                # a worker killed: its claims are free at once (its pid is gone)
    paused([server.proc.pid], 3)                  # the tracking server frozen briefly
    os.kill(group_of(postmaster)[-1], signal.SIGKILL)  # one server process killed: PostgreSQL restarts them all
    after(140)
    # a worker stopped mid-run: its run KILLED, exit 143, within STOPPED_S (w2, or w0 where the store's crash
    # ended w2's run with its error line: a process exiting on its error is not mid-run)
    stopped = next((worker for worker in (w2, w0) if worker.mid_run()), None)
    assert stopped, f"no worker left mid-run to stop: {[w.proc.poll() for w in workers]}"
    stopped.proc.send_signal(signal.SIGTERM)
    signalled = time.time()
    stopped.wait()
    assert stopped.codes[-1] == 143 and time.time() - signalled < STOPPED_S, (stopped.codes, stopped.err[-3000:])
    os.killpg(server.proc.pid, signal.SIGKILL)    # the tracking server killed, then started again
    server.proc.wait()
    server.start()


def finish(worker: Worker) -> list[int]:
    """The worker to its end, each stop followed by its printed command, until it finishes (three starts at most)."""
    if len(worker.codes) < worker.starts:
        worker.wait()
    while worker.codes[-1] != 0:
        assert worker.codes[-1] in (2, 143, -signal.SIGKILL) and "Traceback" not in worker.err, worker.err[-3000:]
        assert worker.starts < 3, (worker.codes, worker.errs)
        worker.resume()
        worker.wait()
    return worker.codes
