"""A password never leaves the process, whatever carries it: against the cluster suite's PostgreSQL on loopback,
which asks every TCP login for a password, a job, a sweep, a report and two failing starts with the password in both
URLs, then the matrix of issue 39 (a query string, a sweep over URLs holding it, failing sweep jobs, the store CLI,
`--cfg job`, a password that is a common word) leave it in no output, no MLflow param, tag or artifact, no store
row, no report file and no Hydra output folder, and every run complete; libpq's PGPASSWORD and ~/.pgpass keep it off
the command line altogether."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
import sqlalchemy as sa

from conftest import DATA_ROOT, REPO

pytestmark = pytest.mark.cluster
JOB = ("backend=mock", "model=tiny_qwen3", "dataset.n=3", "model.max_think_tokens=64", "backend.trace_tokens.median=20",
       "probe.n_boot=100")


@pytest.fixture(scope="module")
def server(pg_server):
    """The suite's PostgreSQL server (tests/conftest.py), on which the role `audit` logs in with a password holding
    '@' and '/' (percent-encoded in URLs) and owns the store and the MLflow tracking database, and the role `plain`
    logs in with the password `think`, a word the config and the runs' texts hold."""
    pg_server.password = f"hu@nt/{secrets.token_hex(8)}"
    admin = sa.create_engine(pg_server.admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE ROLE audit LOGIN PASSWORD '{pg_server.password}'"))
        conn.execute(sa.text("CREATE ROLE plain LOGIN PASSWORD 'think'"))
        for name, owner in (("store", "audit"), ("tracking", "audit"), ("plainstore", "plain"),
                            ("plaintracking", "plain")):
            conn.execute(sa.text(f"CREATE DATABASE {name} OWNER {owner}"))
    admin.dispose()
    return pg_server


def url(pg, database: str, password: str | None = None, port: int | None = None, user: str = "audit") -> str:
    login = user if password is None else f"{user}:{quote(password, safe='')}"
    return f"postgresql+psycopg://{login}@127.0.0.1:{port or pg.port}/{database}"


def fairaudit(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "FAIRAUDIT_DATA": str(DATA_ROOT), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
           **(env or {})}
    return subprocess.run([sys.executable, "-m", "fairaudit", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)


def database_text(address: str) -> str:
    """Every row of every table of a database, as text."""
    engine = sa.create_engine(address)
    with engine.connect() as conn:
        tables = conn.execute(sa.text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars().all()
        rows = [str(row) for table in tables for row in conn.execute(sa.text(f'SELECT t::text FROM "{table}" t'))]
    engine.dispose()
    assert len(tables) > 1 or "results" in tables
    return "\n".join(rows)


def test_a_password_in_both_urls_is_in_no_output_log_artifact_row_report_or_hydra_folder(tmp_path, server):
    from mlflow.tracking import MlflowClient

    token = server.password.rsplit("/", 1)[1]  # in every form the password may take: as typed, encoded, decoded
    store, tracking = url(server, "store", server.password), url(server, "tracking", server.password)
    places = (f"store.url={store}", f"tracking.uri={tracking}")
    done = {
        "job": fairaudit(tmp_path, *JOB, *places, f"hydra.run.dir={tmp_path}/outputs/job"),
        "sweep": fairaudit(tmp_path, *JOB, *places, f"hydra.sweep.dir={tmp_path}/multirun", "-m",
                           "dataset=adult,compas"),
        "report": fairaudit(tmp_path, "report", f"tracking.uri={tracking}", "select.parent=null",
                            f"hydra.run.dir={tmp_path}/outputs/report"),
        "server down": fairaudit(tmp_path, *JOB, f"store.url={url(server, 'store', server.password, port=1)}",
                                 f"tracking.uri={tracking}", f"hydra.run.dir={tmp_path}/outputs/down"),
        "wrong password": fairaudit(tmp_path, *JOB, f"store.url={url(server, 'store', server.password + 'x')}",
                                    f"tracking.uri={tracking}", f"hydra.run.dir={tmp_path}/outputs/wrong"),
    }
    assert [done[name].returncode for name in done] == [0, 0, 0, 2, 2], {n: d.stderr[-2000:] for n, d in done.items()}
    for name in ("server down", "wrong password"):
        (line,) = [line for line in done[name].stderr.splitlines() if line.startswith("error:")]
        assert "store.url 'postgresql+psycopg://audit:***@127.0.0.1:" in line, line
    leaks = {name: out for name, result in done.items() for out in (result.stdout, result.stderr) if token in out}
    assert leaks == {}
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.match("*/.hydra/overrides.yaml") for p in files) and any(p.name == "report.md" for p in files)
    assert any(p.match("mlruns/*/*/artifacts/config/config.yaml") for p in files)
    assert [p for p in files if token.encode() in p.read_bytes()] == []  # Hydra's folders, artifacts, the report
    for database in ("store", "tracking"):
        assert token not in database_text(url(server, database, server.password))

    client = MlflowClient(tracking)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert {r.data.tags.get("fairaudit.kind") for r in runs} == {"job", "sweep", "report"}
    job = next(r for r in runs if r.data.tags.get("fairaudit.kind") == "job")
    assert job.data.params["store.url"] == f"postgresql+psycopg://audit:***@127.0.0.1:{server.port}/store"
    config = Path(client.download_artifacts(job.info.run_id, "config/config.yaml", str(tmp_path / "back")))
    assert "postgresql+psycopg://audit:***@127.0.0.1" in config.read_text()


def test_pgpassword_and_pgpass_keep_the_password_off_the_command_line(tmp_path, server):
    places = (f"store.url={url(server, 'store')}", f"tracking.uri={url(server, 'tracking')}")
    pgpass = Path(server.root) / "pgpass"
    pgpass.write_text(f"127.0.0.1:{server.port}:*:audit:{server.password}\n")
    pgpass.chmod(0o600)
    by_env = fairaudit(tmp_path, *JOB, *places, f"hydra.run.dir={tmp_path}/a", env={"PGPASSWORD": server.password})
    by_file = fairaudit(tmp_path, *JOB, *places, "dataset.seed=1", f"hydra.run.dir={tmp_path}/b",
                        env={"PGPASSFILE": str(pgpass)})
    without = fairaudit(tmp_path, *JOB, *places, f"hydra.run.dir={tmp_path}/c",
                        env={"PGPASSFILE": str(tmp_path / "none")})
    assert (by_env.returncode, by_file.returncode) == (0, 0), (by_env.stderr[-2000:], by_file.stderr[-2000:])
    assert "model_calls" in by_env.stdout and "model_calls" in by_file.stdout
    assert without.returncode == 2
    (line,) = [line for line in without.stderr.splitlines() if line.startswith("error:")]
    assert "password" in line and server.password not in line


def test_every_carrier_of_a_password_leaves_it_nowhere_and_every_run_complete(tmp_path, server):
    """The matrix of issue 39: a password in a URL's query string, percent-encoded, one that is a common word
    (`think`, which the config's names and the runs' texts hold), a sweep over URLs holding it, failing sweep jobs
    whose errors name the URL, the store CLI and `--cfg job`: the password is in no output, file or database row,
    and every run they leave is complete (params, metrics, or its error)."""
    from mlflow.tracking import MlflowClient

    token, encoded = server.password.rsplit("/", 1)[1], quote(server.password, safe="")
    by_query = f"postgresql+psycopg://audit@127.0.0.1:{server.port}/store?sslmode=disable&password={encoded}"
    tracking = f"'postgresql+psycopg://audit@127.0.0.1:{server.port}/tracking?password={encoded}'"
    plain = (f"store.url={url(server, 'plainstore', 'think', user='plain')}",
             f"tracking.uri={url(server, 'plaintracking', 'think', user='plain')}")
    out = tmp_path / "out"
    done = {
        "query string": fairaudit(tmp_path, *JOB, f"store.url='{by_query}'", f"tracking.uri={tracking}",
                                  f"hydra.run.dir={out}/query"),
        "common word": fairaudit(tmp_path, *JOB, *plain, f"hydra.run.dir={out}/word"),
        "sweep over secrets": fairaudit(tmp_path, *JOB, f"tracking.uri={tracking}", f"hydra.sweep.dir={out}/sweep",
                                        "-m", f"store.url={url(server, 'store', server.password)},'{by_query}'"),
        "failing jobs": fairaudit(tmp_path, *JOB, f"tracking.uri={tracking}", f"hydra.sweep.dir={out}/failing",
                                  f"store.url={url(server, 'store', server.password, port=1)}", "-m", "dataset.n=2,3"),
        "--cfg job": fairaudit(tmp_path, *JOB, f"store.url='{by_query}'", f"tracking.uri={tracking}", "--cfg", "job"),
        "store verify": fairaudit(tmp_path, "store", "verify", "--store", by_query),
        "store export": fairaudit(tmp_path, "store", "export", str(tmp_path / "laptop.sqlite"), "--store",
                                  url(server, "store", server.password)),
    }
    assert {name: d.returncode for name, d in done.items()} == {
        "query string": 0, "common word": 0, "sweep over secrets": 0, "failing jobs": 1, "--cfg job": 0,
        "store verify": 0, "store export": 0}, {name: d.stderr[-2000:] for name, d in done.items()}
    assert "url: postgresql+psycopg://audit@127.0.0.1" in done["--cfg job"].stdout
    assert "password=***" in done["--cfg job"].stdout and "-> sqlite:///" in done["store export"].stdout
    assert "Error executing job" not in "".join(d.stderr for d in done.values())
    word = (":think@", "password=think")  # the common-word password as a URL holds it; the word itself is everywhere
    shown = {name: [s for s in (token, encoded, *word) if s in d.stdout + d.stderr] for name, d in done.items()}
    assert {name: found for name, found in shown.items() if found} == {}
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "multirun.yaml" for p in files) and any(p.match("*/.hydra/overrides.yaml") for p in files)
    assert [p for p in files if any(s.encode() in p.read_bytes() for s in (token, encoded, *word))] == []
    for database, user, password in (("store", "audit", server.password), ("tracking", "audit", server.password),
                                     ("plainstore", "plain", "think"), ("plaintracking", "plain", "think")):
        text = database_text(url(server, database, password, user=user))
        assert not [s for s in (token, encoded, *word) if s in text], database

    for address in (url(server, "tracking", server.password), url(server, "plaintracking", "think", user="plain")):
        client = MlflowClient(address)
        for run in client.search_runs([e.experiment_id for e in client.search_experiments()]):
            kind, status = run.data.tags.get("fairaudit.kind"), run.info.status
            assert status in ("FINISHED", "FAILED"), (kind, status)
            if kind == "job" and status == "FINISHED":
                assert "backend.thinking.style" in run.data.params and run.data.metrics["model_calls"] >= 0
            elif status == "FAILED":
                assert "store.url 'postgresql+psycopg://audit:***@127.0.0.1:1/store'" in run.data.tags[
                    "fairaudit.error" if kind == "job" else "fairaudit.failed_jobs"]
    client = MlflowClient(url(server, "tracking", server.password))
    (parent,) = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])  # this test's
                 if r.data.tags.get("fairaudit.sweep_dir") == str(out / "sweep")]  # (the module shares the database)
    jobs = parent.data.tags["fairaudit.jobs"]  # each job by what it varies, as Hydra escapes it (audit\\:***@)
    assert "password=***" in jobs and jobs.count("***@127.0.0.1") == 1
