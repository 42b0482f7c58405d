"""A password never leaves the process, whatever carries it, and never needs the command line.

Cheap, on every run of the suite: a password typed on the command line where Hydra's grammar or a driver would cut
it (a `!` or `,`, an unencoded `@` or `#`, a URL given as a config group, a key given twice, a sweep whose commas
split a URL or that carries passwords; for an audit, `plan` and `report`, under `--cfg job` and `--info`) is one
line holding no piece of it, with nothing written; typed where it works, it is moved into the environment, so a
run's console, its output folder named by its overrides, `.hydra/`, the MLflow database and artifacts and the store
hold no piece of it, and the resume line is runnable as printed once the variable it names is exported;
FAIRAUDIT_STORE_URL and FAIRAUDIT_TRACKING_URI place the store and the tracking database; submitit's folder is
private (its pickles too, in a `long` sweep).

`make test-cluster`: against the suite's PostgreSQL on loopback, which asks every TCP login for a password, a job,
a sweep, a report and two failing starts with the password in both URLs, then the matrix of a query string, a sweep
over URLs holding it (refused), failing sweep jobs, the store CLI, `--cfg job` and a password that is a common word
leave it in no output, no MLflow param, tag or artifact, no store row, no report file and no Hydra output folder,
and every run complete; libpq's PGPASSWORD and ~/.pgpass and FAIRAUDIT_STORE_URL keep it off the command line."""

from __future__ import annotations

import os
import secrets
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from conftest import DATA_ROOT, REPO
from fairaudit.cli import main as cli
from fairaudit.cli.credentials import into_environment
from fairaudit.errors import interrupt
from fairaudit.errors import secrets as redact
from fairaudit.job.launcher_files import PrivateLauncherFiles, launcher_folder
from warm import run_python

JOB = ("backend=mock", "model=tiny_qwen3", "dataset.n=3", "model.max_think_tokens=64", "backend.trace_tokens.median=20",
       "probe.n_boot=100")
HEAD, TAIL = "pwHead7Qx", "pwTail9Zk"  # the two halves of every cheap test's password: neither may show anywhere


def password(inside: str) -> str:
    return f"{HEAD}{inside}{TAIL}"


def store_url(inside: str) -> str:
    return f"store.url=postgresql+psycopg://audit:{password(inside)}@127.0.0.1:1/store"


def pieces(text: str) -> list[str]:
    return [piece for piece in (HEAD, TAIL) if piece in text]


def leaked_paths(root: Path) -> list[Path]:
    """Every file under `root` whose name or bytes hold a piece of the password (Hydra's folders, the MLflow
    database and artifacts, the store, submitit's pickles)."""
    return [path for path in root.rglob("*") if pieces(str(path.relative_to(root))) or (
        path.is_file() and any(piece.encode() in path.read_bytes() for piece in (HEAD, TAIL)))]


@pytest.fixture
def forget():
    seen = set(redact._SEEN)
    yield
    redact._SEEN.clear()
    redact._SEEN.update(seen)


URL_AS_GROUP = f"tracking=http://me:{password('9')}@127.0.0.1:1"
REFUSED = {  # what each command line is refused with, in one line
    "a '!' (audit)": ([store_url("!")], "Hydra's override grammar reads this value only in quotes"),
    "a '!' (plan)": (["plan", store_url("!")], "Hydra's override grammar reads this value only in quotes"),
    "a '!' (report)": (["report", f"tracking.uri=http://me:{password('!')}@127.0.0.1:1"], "only in quotes"),
    "a ',' (audit)": ([store_url(",")], "store.url: its commas split this value into 2, not all of them URLs"),
    "a ',' under -m, as advised": (["-m", store_url(",")], "its commas split this value into 2"),
    "a ',' (plan -m)": (["plan", "-m", store_url(",")], "its commas split this value into 2"),
    "a ',' (report)": (["report", f"tracking.uri=http://me:{password(',')}@127.0.0.1:1"], "its commas split"),
    "a URL as a group (audit)": ([URL_AS_GROUP], "tracking picks one of mlflow, server; a URL is a value of it: "
                                                 "tracking.uri=URL"),
    "a URL as a group (plan)": (["plan", URL_AS_GROUP], "a URL is a value of it: tracking.uri=URL"),
    "a URL as a group (report)": (["report", URL_AS_GROUP], "a URL is a value of it: tracking.uri=URL"),
    "a key given twice": (["-m", "store.url=/tmp/a.sqlite,/tmp/b.sqlite", store_url("9")], "store.url is set twice"),
    "an unencoded '@'": ([store_url("@")], "store.url: the password in this URL holds '@' unencoded"),
    "an unencoded '#', quoted": ([f"tracking.uri='http://me:{password('#')}@127.0.0.1:1'"],
                                 "tracking.uri: the password in this URL holds '#' unencoded"),
    "a sweep over passwords": (["-m", f"{store_url('9')},{store_url('8').split('=', 1)[1]}x"],
                               "a sweep over values that hold passwords"),
    "a sweep over passwords, one quoted": (["-m", f"{store_url('9')},'{store_url('8').split('=', 1)[1]}x'"],
                                           "a sweep over values that hold passwords"),
    "--cfg job": (["--cfg", "job", store_url("!")], "Hydra's override grammar reads this value only in quotes"),
    "--info": ([URL_AS_GROUP, "--info"], "a URL is a value of it: tracking.uri=URL"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_password_hydra_would_cut_is_one_line_that_holds_no_piece_of_it(case, tmp_path, monkeypatch, capsys,
                                                                          forget):
    argv, line = REFUSED[case]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAIRAUDIT_HOME", str(tmp_path))
    monkeypatch.setattr(interrupt, "arm", lambda: None)  # the test process's own signals stay as they are
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("error: ") and line in err, err
    assert pieces(err) == []
    assert list(tmp_path.iterdir()) == []  # nothing written


def fairaudit(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "FAIRAUDIT_DATA": str(DATA_ROOT), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
           "FAIRAUDIT_HOME": str(tmp_path), **(env or {})}
    return run_python([sys.executable, "-m", "fairaudit", *args], cwd=tmp_path, env=env, timeout=900)


def test_a_password_read_from_the_environment_that_would_be_cut_is_one_line(tmp_path):
    done = fairaudit(tmp_path, *JOB, f"hydra.run.dir={tmp_path}/out",
                     env={"FAIRAUDIT_STORE_URL": store_url("@").split("=", 1)[1]})
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1].startswith("error: store.url: the password in this URL holds '@' unencoded")
    assert pieces(done.stdout + done.stderr) == [] and leaked_paths(tmp_path) == []


def test_a_password_typed_where_it_works_is_kept_in_the_environment_and_shows_nowhere(tmp_path):
    """`+lab.api_token="<password with , and !>"`, quoted as Hydra's grammar needs, in a run whose output folder is
    named by its overrides: the run finishes, and its console, folder names, `.hydra/`, MLflow's database, params,
    tags and artifacts and the store hold no piece of the password; FAIRAUDIT_STORE_URL and FAIRAUDIT_TRACKING_URI
    place the store and the tracking database (FAIRAUDIT_HOME holds neither)."""
    places = tmp_path / "places"
    env = {"FAIRAUDIT_STORE_URL": str(places / "store.sqlite"),
           "FAIRAUDIT_TRACKING_URI": f"sqlite:///{places}/mlflow.db"}
    places.mkdir()
    done = fairaudit(tmp_path, *JOB, f"+lab.api_token=\"{password(',!')}\"",
                     f"hydra.run.dir={tmp_path}/out/${{hydra.job.override_dirname}}", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert pieces(done.stdout + done.stderr) == []
    (folder,) = (tmp_path / "out").iterdir()
    assert "dataset.n=3" in folder.name and "api_token" not in folder.name  # a value from the environment names no job
    assert "+lab.api_token=***" in (folder / ".hydra" / "overrides.yaml").read_text()
    assert {"mlartifacts", "mlflow.db", "store.sqlite"} <= {p.name for p in places.iterdir()}
    assert not (tmp_path / "store.sqlite").exists() and not (tmp_path / "mlflow.db").exists()
    assert leaked_paths(tmp_path) == []
    client = MlflowClient(env["FAIRAUDIT_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("fairaudit").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["lab.api_token"] == "***"
    verify = fairaudit(tmp_path, "store", "verify", env=env)
    assert verify.returncode == 0 and "generate: 12 sound" in verify.stdout  # FAIRAUDIT_HOME has no store.sqlite


def test_the_resume_line_names_the_variable_and_runs_as_printed(monkeypatch, forget):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from fairaudit import CONF_DIR

    typed = store_url(",!").split("=", 1)[1]
    monkeypatch.setenv("FAIRAUDIT_STORE_URL", "")  # restored after the test: into_environment sets it
    monkeypatch.setattr(sys, "argv", ["fairaudit", *into_environment(["backend=mock", f"store.url='{typed}'"])])
    line = interrupt.message(12)
    assert pieces(line) == [] and "***" not in line
    assert "the same command resumes from them (with FAIRAUDIT_STORE_URL exported" in line
    command = line.rsplit(": ", 1)[1]
    assert command == "fairaudit backend=mock 'store.url=${oc.env:FAIRAUDIT_STORE_URL}'"
    assert os.environ["FAIRAUDIT_STORE_URL"] == typed
    GlobalHydra.instance().clear()
    with initialize_config_dir(CONF_DIR, version_base=None):
        cfg = compose("config", overrides=shlex.split(command)[1:])
    assert cfg.store.url == typed  # the printed command, run where the variable is exported, opens the same store


def test_submitits_folder_is_private_and_its_files_too(tmp_path, monkeypatch):
    config = OmegaConf.create({"hydra": {"launcher": {"submitit_folder": f"{tmp_path}/sweep/.submitit/%j"}}})
    assert launcher_folder(config) == tmp_path / "sweep" / ".submitit"
    assert launcher_folder(OmegaConf.create({"hydra": {"launcher": {"n_jobs": 2}}})) is None
    files = PrivateLauncherFiles()
    files.on_multirun_start(config)
    assert stat.S_IMODE((tmp_path / "sweep" / ".submitit").stat().st_mode) == 0o700
    job = tmp_path / "sweep" / ".submitit" / "17"
    job.mkdir()
    (job / "17_submitted.pkl").write_bytes(b"x")
    (job / "17_submitted.pkl").chmod(0o644)
    monkeypatch.setenv("SUBMITIT_FOLDER", str(job))
    files.on_job_start(config)
    assert stat.S_IMODE((job / "17_submitted.pkl").stat().st_mode) == 0o600
    before = os.umask(0o022)
    try:
        files.on_job_end(config)
        assert os.umask(before) == 0o077  # the result pickle, written next, is 0600
    finally:
        os.umask(before)


@pytest.mark.long
def test_a_submitit_sweep_keeps_the_password_out_of_its_pickles_and_them_private(tmp_path):
    done = fairaudit(tmp_path, *JOB, f"+lab.api_token=\"{password(',!')}\"", "-m", "dataset.seed=1",
                     "hydra/launcher=submitit_local", f"hydra.sweep.dir={tmp_path}/sweep")
    assert done.returncode == 0, done.stderr[-2000:]
    assert pieces(done.stdout + done.stderr) == [] and leaked_paths(tmp_path) == []
    launcher = tmp_path / "sweep" / ".submitit"
    pickles = sorted(launcher.rglob("*.pkl"))
    assert {p.name.split("_", 1)[1] for p in pickles} == {"submitted.pkl", "0_result.pkl"}
    assert {stat.S_IMODE(p.stat().st_mode) for p in launcher.rglob("*") if p.is_file()} == {0o600}
    assert stat.S_IMODE(launcher.stat().st_mode) == 0o700


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


def database_text(address: str) -> str:
    """Every row of every table of a database, as text."""
    engine = sa.create_engine(address)
    with engine.connect() as conn:
        tables = conn.execute(sa.text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars().all()
        rows = [str(row) for table in tables for row in conn.execute(sa.text(f'SELECT t::text FROM "{table}" t'))]
    engine.dispose()
    assert len(tables) > 1 or "results" in tables
    return "\n".join(rows)


@pytest.mark.cluster
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
    overrides = (tmp_path / "outputs" / "job" / ".hydra" / "overrides.yaml").read_text()
    assert "store.url=${oc.env:FAIRAUDIT_STORE_URL}" in overrides and "tracking.uri=${oc.env:FAIRAUDIT_TRACKING_URI}" \
        in overrides  # the typed URLs were kept in the job's environment
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


@pytest.mark.cluster
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
    by_url = fairaudit(tmp_path, *JOB, "dataset.seed=2", f"hydra.run.dir={tmp_path}/d", env={
        "FAIRAUDIT_STORE_URL": url(server, "store", server.password), "PGPASSFILE": str(tmp_path / "none"),
        "FAIRAUDIT_TRACKING_URI": url(server, "tracking", server.password)})
    assert (by_env.returncode, by_file.returncode, by_url.returncode) == (0, 0, 0), (
        by_env.stderr[-2000:], by_file.stderr[-2000:], by_url.stderr[-2000:])
    assert "model_calls" in by_env.stdout and "model_calls" in by_file.stdout and "model_calls" in by_url.stdout
    token = server.password.rsplit("/", 1)[1]
    assert [p for p in tmp_path.rglob("*") if p.is_file() and token.encode() in p.read_bytes()] == []
    assert token not in by_url.stdout + by_url.stderr
    assert without.returncode == 2
    (line,) = [line for line in without.stderr.splitlines() if line.startswith("error:")]
    assert "password" in line and server.password not in line


@pytest.mark.cluster
def test_every_carrier_of_a_password_leaves_it_nowhere_and_every_run_complete(tmp_path, server):
    """The matrix of issue 39: a password in a URL's query string, percent-encoded, one that is a common word
    (`think`, which the config's names and the runs' texts hold), a sweep over URLs holding it (refused in one
    line, nothing written), failing sweep jobs whose errors name the URL, the store CLI and `--cfg job`: the password
    is in no output, file or database row, and every run they leave is complete (params, metrics, or its error)."""
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
        "query string": 0, "common word": 0, "sweep over secrets": 2, "failing jobs": 1, "--cfg job": 0,
        "store verify": 0, "store export": 0}, {name: d.stderr[-2000:] for name, d in done.items()}
    assert done["sweep over secrets"].stderr.startswith("error: store.url: a sweep over values that hold passwords")
    assert "url: postgresql+psycopg://audit@127.0.0.1" in done["--cfg job"].stdout
    assert "password=***" in done["--cfg job"].stdout and "-> sqlite:///" in done["store export"].stdout
    assert "Error executing job" not in "".join(d.stderr for d in done.values())
    word = (":think@", "password=think")  # the common-word password as a URL holds it; the word itself is everywhere
    shown = {name: [s for s in (token, encoded, *word) if s in d.stdout + d.stderr] for name, d in done.items()}
    assert {name: found for name, found in shown.items() if found} == {}
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "multirun.yaml" for p in files) and any(p.match("*/.hydra/overrides.yaml") for p in files)
    assert [p for p in files if any(s.encode() in p.read_bytes() for s in (token, encoded, *word))] == []
    assert not (out / "sweep").exists()  # refused before anything was written
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
