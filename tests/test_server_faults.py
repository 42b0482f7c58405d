"""Servers and databases that fail mid-run, each one line in a bounded time: a damaged sqlite store or MLflow
database found before any model work, MLflow's HTTP requests bounded and a run closed in one try once its server is
gone, and (`cluster`) a PostgreSQL store that is frozen, restarted or stopped."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sqlite3
import subprocess
import threading
import time

import pytest
import sqlalchemy as sa

from fairaudit.errors import AuditError
from fairaudit.store import faults
from fairaudit.store.client import CachingClient
from fairaudit.store.results import Store
from fairaudit.tracking import http
from fairaudit.tracking.database import open_tracking
from fairaudit.tracking.runs import Tracker
from tests.servers import PG_BIN, PostgresServer, free_port
from tests.test_store import ScriptedBackend, requests


def damaged(path) -> None:
    """Interior pages of a sqlite file overwritten (its header left whole, so it still opens)."""
    data = bytearray(path.read_bytes())
    for start in range(2 * 4096, len(data) - 4096, 2 * 4096):
        data[start + 8:start + 400] = bytes(range(256)) + bytes(136)
    path.write_bytes(bytes(data))


def filled_store(path) -> None:
    store = Store(path)
    CachingClient(ScriptedBackend(), store, chunk_size=50).generate(requests(400))
    store.close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def test_a_damaged_store_file_is_one_line_naming_it_and_the_way_back(tmp_path):
    path = tmp_path / "store.sqlite"
    filled_store(path)
    damaged(path)
    with pytest.raises(AuditError) as caught:
        Store(path)
    line = str(caught.value)
    assert line.startswith(f"{path} (the store, store.url) is damaged (")
    assert f"sqlite3 {path} .recover | sqlite3 {path}.recovered" in line and "run the same command again" in line


def test_a_damaged_mlflow_database_is_one_line_before_any_model_work(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(uri, "fairaudit")
    for run in range(10):
        tracker.start(f"run {run}", {}, {f"p{i}": "x" * 200 for i in range(100)})
        tracker.end()
    damaged(tmp_path / "mlflow.db")
    with pytest.raises(AuditError) as caught:
        open_tracking(uri, "fairaudit")
    assert str(caught.value).startswith(f"{tmp_path}/mlflow.db (MLflow's database, tracking.uri) is damaged (")
    assert "the store holds the results, so it makes no model calls for them" in str(caught.value)


@pytest.mark.slow
def test_mlflow_requests_are_bounded_and_their_retries_one_line(monkeypatch, capsys):
    """A server that is gone: MLflow's retries within the window `retry_window_s` states, one line while they go on;
    closing the run after it is one try."""
    for name in http.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    uri = f"http://127.0.0.1:{free_port()}"
    http.bound_requests(uri)
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == str(http.TIMEOUT_S)
    assert http.retry_window_s() == pytest.approx(1 + 2 + 2 * http.JITTER)
    from mlflow.tracking import MlflowClient

    start = time.time()
    with pytest.raises(Exception):
        MlflowClient(uri).search_experiments()
    assert time.time() - start < http.request_bound_s()
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and f"tracking.uri {uri} does not answer; trying again for up to 4 s" in err
    with http.one_try(uri):
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
    logging.getLogger("urllib3.connectionpool").filters.clear()


class Postgres(PostgresServer):
    """A PostgreSQL server of this test's own, to stop, freeze and restart."""

    def pg_ctl(self, *args: str) -> None:
        self._as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-w", *args])

    def restart(self) -> None:
        self.pg_ctl("-l", str(self.root / "pg.log"), "-o",
                    f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])

    def processes(self) -> list[int]:
        children = subprocess.run(["pgrep", "-P", str(self.pid)], capture_output=True, text=True).stdout.split()
        return [self.pid, *map(int, children)]


@pytest.fixture
def postgres():
    server = Postgres()
    yield server
    for pid in server.processes():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    server.stop()


def half_done(postgres: Postgres) -> tuple[Store, CachingClient]:
    """A store on the server and a client that has committed 4 results through it."""
    store = Store(postgres.url)
    client = CachingClient(ScriptedBackend(), store, chunk_size=2)
    client.generate(requests(4))
    return store, client


def failing(client: CachingClient) -> tuple[BaseException, float]:
    """The error that ends the client's next calls, and how long they took to fail."""
    start = time.time()
    with pytest.raises(sa.exc.DBAPIError) as caught:
        client.generate(requests(8))
    return caught.value, time.time() - start


@pytest.mark.cluster
def test_a_frozen_postgres_store_is_one_line_after_its_stall_bound(postgres, monkeypatch):
    monkeypatch.setattr(faults, "STALL_S", 2.0)
    store, client = half_done(postgres)
    frozen = postgres.processes()
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    error, waited = failing(client)
    for pid in frozen:
        os.kill(pid, signal.SIGCONT)
    line = str(store.fault(error))
    assert 2.0 <= waited < 4.0, waited
    assert line.startswith("store.url 'postgresql+psycopg://postgres@127.0.0.1:") and "gave no answer for 2 s" in line
    assert "once it answers again, the same command resumes: " in line


@pytest.mark.cluster
def test_a_postgres_store_restarting_mid_run_is_waited_for_with_a_line(postgres, capfd):
    store, client = half_done(postgres)
    postgres.pg_ctl("-m", "fast", "stop")
    threading.Timer(3.0, postgres.restart).start()
    assert [c.text for c in client.generate(requests(8))][4:] == [f"{i} {i + 1}" for i in range(4, 8)]
    err = capfd.readouterr().err
    assert err.count("warning:") == 1 and "refuses connections" in err and "waiting up to 30 s" in err
    assert client.model_calls == 8 and store.count() == 8


@pytest.mark.cluster
def test_a_postgres_store_that_stays_down_is_one_line_after_its_wait(postgres, monkeypatch):
    monkeypatch.setattr(faults, "RESTART_WAIT_S", 2.0)
    store, client = half_done(postgres)
    postgres.pg_ctl("-m", "fast", "stop")
    error, waited = failing(client)
    assert waited < 6
    line = str(store.fault(error))
    assert "stopped answering mid-run and did not come back within 2 s (" in line and "Connection refused" in line
