"""Real servers for the cluster tests, on loopback in a temp dir, stopped by pid."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

PG_BIN = Path(os.environ.get("FAIRAUDIT_PG_BIN", "/usr/lib/postgresql/15/bin"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(ready, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if ready():
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s")


def stop_pid(pid: int, sig: int = signal.SIGTERM, timeout: float = 60) -> None:
    """Signal one process and wait until it is gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return

    def gone() -> bool:
        try:
            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            return True
    wait_until(gone, timeout, f"process {pid} exit")


class PostgresServer:
    """initdb + pg_ctl as the `postgres` user (the tests run as root) on a loopback port: trust auth, or with
    auth="scram-sha-256" a password for every TCP login (`url` carries the superuser's; `admin_url`, over the
    server's socket, needs none)."""

    def __init__(self, auth: str = "trust"):
        if not (PG_BIN / "initdb").exists():
            pytest.skip(f"PostgreSQL binaries not found under {PG_BIN} (apt-get install postgresql)")
        self.root = root = Path(tempfile.mkdtemp(prefix="fairaudit-pg-"))  # outside pytest's root-only tmp tree
        root.chmod(0o777)
        self.data = root / "pgdata"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self.admin_url = f"postgresql+psycopg://postgres@/postgres?host={root}&port={self.port}"
        self._as_postgres([str(PG_BIN / "initdb"), "-D", str(self.data), "--auth-local=trust", f"--auth-host={auth}",
                           "-U", "postgres", "--no-sync"])
        self._as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-w", "-l", str(root / "pg.log"), "-o",
                           f"-p {self.port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"])
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        if auth != "trust":
            password = secrets.token_hex(12)
            self._as_postgres([str(PG_BIN / "psql"), "-h", str(root), "-p", str(self.port), "-U", "postgres", "-c",
                               f"ALTER ROLE postgres PASSWORD '{password}'"])
            self.url = f"postgresql+psycopg://postgres:{password}@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, args: list[str]) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        done = subprocess.run(prefix + args, capture_output=True, text=True, cwd=self.root)
        if done.returncode:
            raise RuntimeError(f"{args[0]} failed: {done.stderr or done.stdout}")

    def stop(self) -> None:
        stop_pid(self.pid, signal.SIGINT)  # fast shutdown
        shutil.rmtree(self.root, ignore_errors=True)


class MlflowServer:
    """`mlflow server` with a sqlite backend store and proxied artifacts (--serve-artifacts)."""

    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = open(root / "mlflow-server.log", "ab")
        self.proc = None
        self.start()

    def start(self) -> None:
        mlflow = Path(sys.executable).with_name("mlflow")
        self.proc = subprocess.Popen(
            [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{self.root}/server.db", "--serve-artifacts",
             "--artifacts-destination", str(self.root / "artifacts")],
            stdout=self.log, stderr=self.log, start_new_session=True)
        wait_until(self._healthy, 180, "mlflow server")

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited: see {self.root / 'mlflow-server.log'}")
        try:
            return urllib.request.urlopen(f"{self.uri}/health", timeout=2).status == 200
        except OSError:
            return False

    def stop(self) -> None:
        """The server's whole process group (uvicorn/gunicorn workers), by the leader's pid."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)


def have(command: str) -> bool:
    return shutil.which(command) is not None


# Ray on loopback alone: its nodes and drivers use 127.0.0.1 (else Ray resolves a loopback address to the host's
# network address), and no usage statistics are sent.
RAY_LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


class RayHead:
    """`ray start --head --block` on a loopback port, its own temp dir; stopped with its whole process group."""

    def __init__(self, num_cpus: int = 2):
        ray = Path(sys.executable).with_name("ray")
        if not ray.exists():
            pytest.skip("Ray is not installed in this environment (pip install -e '.[ray]')")
        self.root = Path(tempfile.mkdtemp(prefix="fa-ray-"))  # short: Ray's sockets live under it
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = open(self.root / "ray-head.log", "ab")
        token = self.root / "auth_token"  # Ray's token authentication, its token in a file only this test reads
        token.write_text(secrets.token_hex(16))
        token.chmod(0o600)
        self.env = {**RAY_LOOPBACK, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                    "RAY_ADDRESS": self.address}
        self.proc = subprocess.Popen(
            [str(ray), "start", "--head", "--block", f"--port={self.port}", "--node-ip-address=127.0.0.1",
             f"--num-cpus={num_cpus}", "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats",
             f"--temp-dir={self.root}"], stdout=self.log, stderr=self.log, start_new_session=True,
            env={**os.environ, **self.env})
        wait_until(self._up, 180, "ray head")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"ray head exited: see {self.root / 'ray-head.log'}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """The head and every process it started (raylets, workers), by its process group."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)
