"""A disk that fills mid-run: the store, MLflow's database and the run's artifact folder each on a small tmpfs of
their own, filled to the last byte while the job is generating. The job stops with one `error:` line naming the
folder and the space the failed write needed, its run ends FAILED, nothing committed is lost (both databases pass
`PRAGMA integrity_check`, every result committed before is still there), and once the space is freed the same
command resumes from the store. Needs root, to mount (CI runs as root); the mounts go in the teardown."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DATA_ROOT, REPO, integrity, model_results
from warm import popen_python, run_python

pytestmark = [pytest.mark.slow, pytest.mark.long,
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small filesystem needs root")]
JOB = ("backend=mock", "model=tiny_qwen3", "dataset.n=100", "model.max_think_tokens=600",
       "backend.trace_tokens.median=300")
ENV = {**os.environ, "FAIRAUDIT_DATA": str(DATA_ROOT), "OMP_NUM_THREADS": "1"}


@contextlib.contextmanager
def small_filesystems(*folders: tuple[Path, int]):
    """A tmpfs of the given MB mounted at each folder, unmounted (lazily if still busy) on the way out."""
    mounted = []
    try:
        for folder, megabytes in folders:
            folder.mkdir(parents=True, exist_ok=True)
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(folder)],
                                  capture_output=True, text=True)
            if done.returncode:
                pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
            mounted.append(folder)
        yield
    finally:
        for folder in reversed(mounted):
            if subprocess.run(["umount", str(folder)], capture_output=True).returncode:
                subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def fill(folder: Path) -> Path:
    """Take every free byte of the filesystem holding `folder`; returns the filler file."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as handle:
        for chunk in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    handle.write(bytes(chunk))
    return filler


def command(store: Path, db: Path, tmp_path: Path) -> list[str]:
    return [sys.executable, "-m", "fairaudit", *JOB, f"store.url={store}", f"tracking.uri=sqlite:///{db}",
            f"hydra.run.dir={tmp_path}/outputs"]


# where the store, the tracking database and the artifacts go, and which folder is the small one
LAYOUTS = {
    "store": lambda t: (t / "small" / "store.sqlite", t / "mlflow.db", [(t / "small", 64)]),
    "tracking database": lambda t: (t / "store.sqlite", t / "small" / "mlflow.db",
                                    [(t / "small", 16), (t / "small" / "mlartifacts", 512)]),
    "artifact folder": lambda t: (t / "store.sqlite", t / "mlflow.db", [(t / "mlartifacts", 16)]),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_disk_that_fills_mid_run_is_one_line_a_failed_run_and_a_resume_once_freed(tmp_path, layout):
    from mlflow.tracking import MlflowClient

    store, db, mounts = LAYOUTS[layout](tmp_path)
    small = mounts[0][0]
    with small_filesystems(*mounts):
        proc = popen_python(command(store, db, tmp_path), ENV, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
        start = time.time()
        while model_results(store) < 300 and proc.poll() is None and time.time() - start < 600:
            time.sleep(0.01)
        filler = fill(small)
        at_fill = model_results(store)
        out, err = proc.communicate(timeout=900)
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
        assert f"no space left in {small}" in errors[0] and " needed" in errors[0], errors[0]
        assert integrity(store) == "ok" and integrity(db) == "ok"
        stored = model_results(store)
        assert 0 < at_fill <= stored  # nothing committed is lost
        client = MlflowClient(f"sqlite:///{db}")
        (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
        assert run.info.status == "FAILED" and run.data.tags["fairaudit.error"] == errors[0].removeprefix("error: ")

        filler.unlink()
        again = run_python(command(store, db, tmp_path), ENV, cwd=REPO, timeout=900)
        assert again.returncode == 0, again.stderr[-3000:]
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        (finished,) = [r for r in runs if r.info.status == "FINISHED"]
        assert stored + finished.data.metrics["model_calls"] == model_results(store)  # each result computed once
        assert integrity(store) == "ok" and integrity(db) == "ok"
        print(f"\n{layout}: {errors[0]}\nre-run: {int(finished.data.metrics['model_calls'])} calls after {stored} "
              "results kept")
