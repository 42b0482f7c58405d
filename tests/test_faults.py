"""Faults a run can meet, each one `error:` line (exit 2, no run opened, nothing half-written, no output folder left)
within a bounded time: a tracking database server that is down, a database another process keeps locked, data files
that cannot be read, an output folder that cannot be written, an experiment name MLflow refuses, settings that would
run for days. SIGTERM and SIGHUP stop a run as Ctrl-C does. docs/reliability.md lists them with their times.

The one-line cases run forked from this process (tests/fork_runner.py), as tests/test_mistakes.py's do."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DATA_ROOT, REPO, model_results
from fairaudit.errors.locks import LOCK_WAIT_S, holders, locked_error
from fork_runner import fairaudit, preload
from warm import popen_python, run_python

BASE = ("model=tiny_qwen3", "dataset.n=2", "model.max_think_tokens=8")
MCQ = ("probe=position", "dataset=mmlu", "arm=direct")
HOLD = ("import sqlite3, sys, time\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "db.execute('CREATE TABLE IF NOT EXISTS held (x)')\n"
        "db.execute('BEGIN EXCLUSIVE')\n"
        "db.execute('INSERT INTO held VALUES (1)')\n"
        "print('holding', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n")

# (id, overrides, what the one error line says, seconds it may take in a forked child); {files}: the broken files
FAULTS = [
    ("tracking database server down", ["tracking.uri=postgresql+psycopg://audit:s3cret-pw@127.0.0.1:1/mlflow"],
     "tracking.uri 'postgresql+psycopg://audit:***@127.0.0.1:1/mlflow' cannot be opened: connection failed", 20),
    ("experiment name past MLflow's 500 characters", ["tracking.experiment=" + "x" * 600],
     "must be a string of at most 500 characters, not 600", 10),
    ("a billion bootstrap resamples", ["probe.n_boot=1000000000"],
     "probe.n_boot=1000000000 must be an integer in 100..100000", 10),
    ("depth cuts without end", ["probe=cdpg", "probe.K=100000"], "probe.K=100000 must be an integer in 1..100", 10),
    ("a context of a billion tokens", ["model.max_context=1000000000"],
     "model.max_context=1000000000 must be an integer in 2..262144", 10),
    ("own MCQ file not UTF-8", [*MCQ, "dataset.path={files}/latin1.jsonl"],
     "latin1.jsonl line 2 is not UTF-8 text (byte 0xe9, invalid continuation byte): save the file as UTF-8", 10),
    ("own MCQ CSV not UTF-8", [*MCQ, "dataset.path={files}/latin1.csv"],
     "latin1.csv line 3 is not UTF-8 text (byte 0xe9", 10),
    ("own MCQ CSV with an unterminated quote", [*MCQ, "dataset.path={files}/unterminated.csv"],
     "unterminated.csv: line 3 opens a quoted field that is never closed", 10),
    ("a text file named .parquet", [*MCQ, "dataset.path={files}/notes.parquet"],
     "notes.parquet is not a readable parquet file", 10),
    ("options as a JSON list", [*MCQ, "dataset.path={files}/listed.jsonl"],
     "listed.jsonl line 2: options must be one string reading 'A. ...\\nB. ...', not a list", 10),
    ("output folder that cannot be written", ["hydra.run.dir=/proc/fairaudit/outputs"],
     "hydra.run.dir: cannot write Hydra's output folder /proc/fairaudit/outputs", 10),
    ("sweep folder that cannot be written", ["hydra.sweep.dir=/proc/fairaudit/multirun", "-m", "dataset.n=1,2"],
     "hydra.sweep.dir: cannot write Hydra's output folder /proc/fairaudit/multirun", 10),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """Data files that cannot be read: Latin-1 bytes in UTF-8 JSONL and CSV, an unterminated quote, a text file
    named .parquet, and options given as a JSON list where the lettered layout reads one string."""
    root = tmp_path_factory.mktemp("unreadable")
    rows = [json.loads(line) for line in (DATA_ROOT / "mmlu" / "test.jsonl").read_text().splitlines()[:3]]
    lines = [json.dumps(row) for row in rows]
    (root / "latin1.jsonl").write_bytes("\n".join(lines[:1] + [lines[1].replace("The", "Th\xe9", 1)]).encode("latin-1"))
    header = "Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3\n"
    (root / "latin1.csv").write_bytes(f"{header}q1,a,b,c,d\nq\xe92,a,b,c,d\n".encode("latin-1"))
    (root / "unterminated.csv").write_text(f'{header}q1,a,b,c,d\n"q2,a,b,c,d\nq3,a,b,c,d\n')
    (root / "notes.parquet").write_text("meeting notes\n")
    listed = [rows[0], {**rows[1], "options": rows[1]["options"].split("\n")}]
    (root / "listed.jsonl").write_text("".join(json.dumps(row) + "\n" for row in listed))
    return root


def runs_in(folder: Path) -> int:
    if not (folder / "mlflow.db").exists():
        return 0
    with sqlite3.connect(folder / "mlflow.db") as db:
        return db.execute("SELECT count(*) FROM runs").fetchone()[0]


@pytest.mark.parametrize("name, typed, says, seconds", [pytest.param(*fault, id=fault[0]) for fault in FAULTS])
def test_each_fault_is_one_line_in_bounded_time_with_nothing_left(tmp_path, files, name, typed, says, seconds):
    argv = [a.replace("{files}", str(files)) for a in typed]
    places = [f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"hydra.run.dir={tmp_path}/outputs",
              f"hydra.sweep.dir={tmp_path}/multirun", f"store.url={tmp_path}/store.sqlite"]
    preload()  # the app's imports, once, outside the time measured
    start = time.time()
    done = fairaudit([*places, *BASE, *argv], tmp_path)
    took = time.time() - start
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-3000:]
    assert says in errors[0], errors[0]
    assert "Traceback" not in done.stderr and "Error executing job" not in done.stderr
    assert runs_in(tmp_path) == 0 and not (tmp_path / "store.sqlite").exists()
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()
    assert took < seconds, f"{took:.1f} s"
    assert "s3cret-pw" not in done.stdout + done.stderr


def test_a_full_output_folder_is_one_line(tmp_path):
    """A folder on a filesystem with no room: /dev/shm filled is not ours to fill, so the check's own rule is
    exercised on a folder whose free space is below the room it asks for."""
    from fairaudit.job import outputs

    room, outputs.ROOM = outputs.ROOM, 1 << 62  # more than any disk holds
    try:
        line = outputs.output_problem(tmp_path / "outputs" / "a" / "b", "hydra.run.dir")
    finally:
        outputs.ROOM = room
    assert line.startswith(f"hydra.run.dir: no space left in {tmp_path}/outputs/a/b (") and "nothing was run" in line
    assert not (tmp_path / "outputs").exists()  # the folders the check made are gone again


def hold(path: Path, seconds: float) -> subprocess.Popen:
    """Another process holding `path`'s sqlite write lock for `seconds` (a transaction left open)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "holding"
    return proc


def test_the_holder_of_a_locked_database_is_named_with_what_to_do(tmp_path):
    proc = hold(tmp_path / "store.sqlite", 60)
    try:
        (held,) = holders(tmp_path / "store.sqlite")
        assert held.startswith(f"pid {proc.pid} (") and "db = sqlite3.connect(sys.argv[1]" in held
        line = str(locked_error(tmp_path / "store.sqlite", "the store, store.url", "the results committed are kept"))
        assert line == (f"{tmp_path}/store.sqlite (the store, store.url) stayed locked by {held} for {LOCK_WAIT_S} s: "
                        "let it finish or stop it, then run the same command again; the results committed are kept")
    finally:
        proc.kill()
        proc.wait()
    assert holders(tmp_path / "store.sqlite") == []


ENV = {**os.environ, "FAIRAUDIT_DATA": str(DATA_ROOT), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def command(tmp_path: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "fairaudit", f"store.url={tmp_path}/store.sqlite",
            f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"hydra.run.dir={tmp_path}/outputs",
            f"hydra.sweep.dir={tmp_path}/multirun", *overrides]


def statuses(tmp_path: Path) -> list[str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    return sorted(r.info.status for r in client.search_runs([e.experiment_id for e in client.search_experiments()]))


@pytest.mark.slow
@pytest.mark.long
def test_a_store_locked_mid_run_is_one_line_naming_its_holder_and_the_run_ends_failed(tmp_path):
    """Another process takes the store's write lock once the run has committed results and keeps it: the run's next
    commit waits LOCK_WAIT_S, then the run ends FAILED with one line naming the holder; the re-run resumes."""
    job = ("model=tiny_qwen3", "backend=mock", "dataset.n=40", "backend.chunk_size=1", "model.max_think_tokens=600",
           "backend.trace_tokens.median=300")
    proc = popen_python(command(tmp_path, *job), ENV, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while proc.poll() is None and model_results(tmp_path / "store.sqlite") < 8:
        time.sleep(0.01)
    holder = hold(tmp_path / "store.sqlite", 600)
    try:
        start = time.time()
        _, err = proc.communicate(timeout=600)
        waited = time.time() - start
    finally:
        holder.kill()
        holder.wait()
    (line,) = [e for e in err.splitlines() if e.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in err, err[-3000:]
    assert line.startswith(f"error: {tmp_path}/store.sqlite (the store, store.url) stayed locked by pid {holder.pid} (")
    assert LOCK_WAIT_S <= waited < LOCK_WAIT_S + 60
    assert statuses(tmp_path) == ["FAILED"]
    again = run_python(command(tmp_path, *job), ENV, cwd=REPO, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert statuses(tmp_path) == ["FAILED", "FINISHED"]


@pytest.mark.slow
@pytest.mark.parametrize("sig, sweep", [(signal.SIGTERM, False), (signal.SIGHUP, False), (signal.SIGTERM, True)],
                         ids=["SIGTERM", "SIGHUP", "SIGTERM in a sweep"])
def test_sigterm_and_sighup_stop_a_run_as_ctrl_c_does(tmp_path, sig, sweep):
    """One line saying what is kept and the command that resumes, exit code 128 + the signal, every run KILLED,
    every committed result kept."""
    from mlflow.tracking import MlflowClient

    overrides = ["model=tiny_qwen3", "dataset.n=8", "model.batch_size=2", "model.max_think_tokens=32",
                 *(["-m", "dataset=adult,compas"] if sweep else [])]
    proc = popen_python(command(tmp_path, *overrides), ENV, cwd=REPO, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and model_results(tmp_path / "store.sqlite") < 4:
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    (line,) = [e for e in err.splitlines() if e.startswith("interrupted")]
    name = signal.Signals(sig).name
    kept = model_results(tmp_path / "store.sqlite")
    assert line.startswith(f"interrupted by {name}") and f"its {kept} results" in line
    assert line.endswith(" ".join(overrides).replace("-m ", "") if not sweep else "dataset=adult,compas")
    assert set(statuses(tmp_path)) == {"KILLED"} and len(statuses(tmp_path)) == (2 if sweep else 1)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("fairaudit").experiment_id])
    assert all(f"interrupted ({name})" in r.data.tags["mlflow.note.content"] for r in runs)


def test_cfg_job_prints_the_config_with_its_secrets_hidden(tmp_path):
    done = fairaudit(["--cfg", "job", "store.url='postgresql+psycopg://audit:s3cret-pw@db/x?sslpassword=k3y-phrase'",
                      "+lab.api_key=sk-0123456789"], tmp_path)  # a key of the user's own (a backend's is checked)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "url: postgresql+psycopg://audit:***@db/x?sslpassword=***" in done.stdout
    assert "api_key: '***'" in done.stdout or "api_key: ***" in done.stdout
    assert not [s for s in ("s3cret-pw", "k3y-phrase", "sk-0123456789") if s in done.stdout + done.stderr]


BUG = """import hydra

from fairaudit.terminal.task import run_or_exit


def fails(cfg):
    raise RuntimeError(f"cannot reach {cfg.store.url}")


@hydra.main(version_base=None, config_path=None)
def main(cfg):
    run_or_exit(fails, cfg)


main()
"""


@pytest.mark.slow
def test_an_unexpected_error_is_its_traceback_and_one_line_never_hydras_line_with_the_command(tmp_path):
    """Hydra's own "Error executing job with overrides: [...]" repeats the command line, password included: a job
    never lets an exception reach Hydra; its traceback and its line are redacted, the exit code is 1."""
    (tmp_path / "app.py").write_text(BUG)
    done = subprocess.run([sys.executable, str(tmp_path / "app.py"), "+store.url=postgresql://audit:s3cret-pw@db/x",
                           f"hydra.run.dir={tmp_path}/outputs"], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1
    assert "Error executing job" not in done.stderr and "Traceback (most recent call last)" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "error: RuntimeError: cannot reach postgresql://audit:***@db/x"
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "app.py" and b"s3cret-pw" in p.read_bytes()]
    assert "s3cret-pw" not in done.stdout + done.stderr and leaks == []
