"""A warm interpreter for the tests' `python -m fairaudit` runs: one process per test worker imports the heavy
libraries a run imports (torch, transformers, MLflow, Hydra, pandas, scipy, matplotlib) once, then forks a process
per run, which runs `python -m <module>` as a fresh interpreter would (its argv, environment, folder, stdout and
stderr; exit code or signal). A run spends most of its ~15 s importing; forked, it starts in well under a second.

The fork is used only where it cannot change what the run does: the same interpreter and the same environment as
the warm process but for the settings SAFE_PREFIXES and SAFE_KEYS name (read at run time, or PYTHONPATH, which the
forked run puts on its path); any other difference (another Python, HF_HOME, OMP_NUM_THREADS, stdin input) runs a
real new interpreter, as does everything when FAIRAUDIT_TEST_COLD=1. fairaudit's own modules are never imported by
the warm process, so each run imports the code as it is on disk.
"""

from __future__ import annotations

import io
import json
import locale
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# What a run imports that takes seconds (and reads no fairaudit setting at import time): the libraries, and the parts
# of them that a run on the tiny model imports lazily (the model class, generation, MLflow's store and tracing).
PRELOAD = (
    "torch", "torch._dynamo", "torch.distributed", "sympy", "accelerate", "transformers",
    "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
    "transformers.models.qwen3.modeling_qwen3", "transformers.generation.utils", "transformers.integrations.gguf",
    "mlflow", "mlflow.tracking", "mlflow.tracing", "mlflow.store.tracking.sqlalchemy_store", "mlflow.store.db.utils",
    "opentelemetry.sdk.metrics", "git", "PIL.Image", "hydra", "hydra._internal.utils",
    "hydra._internal.core_plugins.basic_launcher", "omegaconf", "pandas", "pyarrow.parquet", "scipy.stats",
    "statsmodels.api", "matplotlib.pyplot", "matplotlib.backends.backend_agg", "sqlalchemy",
    "sqlalchemy.dialects.sqlite", "alembic", "alembic.command", "rich.console", "rich.progress",
)

# The settings a run may change and still be forked: those read at run time only (fairaudit's own, MLflow's client
# settings and the telemetry session an MLflow client leaves in its process's environment, libpq's, PYTHONPATH,
# which is put on the forked run's path as a new interpreter would), and those that fairaudit sets itself before a run
# (terminal.output.quiet_libraries), which it applies directly to a library already imported; any other difference
# may change what a library did as it was imported, and gets a new interpreter.
SAFE_PREFIXES = ("FAIRAUDIT_", "MLFLOW_", "_MLFLOW_", "PG")
SAFE_KEYS = {"PYTHONUNBUFFERED", "PYTHONPATH", "PYTEST_CURRENT_TEST", "TOKENIZERS_PARALLELISM",
             "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "TORCHINDUCTOR_CACHE_DIR"}


def run_python(args: list[str], env: dict[str, str], cwd: Path | str | None = None,
               timeout: float | None = None) -> subprocess.CompletedProcess:
    """`subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)` for a Python command
    (`python -m MODULE ...` or `python SCRIPT.py ...`), forked from this test worker's warm interpreter where that
    cannot change what the command does."""
    if not WARM.can_run(args, env):
        return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return WARM.run(args, Path(cwd or os.getcwd()), env, timeout)


def stop() -> None:
    """Stop this worker's warm interpreter (at the end of the test session)."""
    WARM.stop()


def differs_only_in_safe_keys(env: dict[str, str], base: dict[str, str]) -> bool:
    """`env` is `base` but for the keys SAFE_PREFIXES and SAFE_KEYS allow."""
    changed = {key for key in env.keys() | base.keys() if env.get(key) != base.get(key)}
    return all(key.startswith(SAFE_PREFIXES) or key in SAFE_KEYS for key in changed)


class Warm:
    """The warm process of this test worker, started on first use and stopped at the session's end."""

    def __init__(self):
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.folder: Path | None = None
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return str(self.folder / "socket")

    def start(self) -> bool:
        """Start the warm process (once) and wait until it listens; False when it cannot."""
        if self.process is None:
            self.folder = Path(tempfile.mkdtemp(prefix="fairaudit-warm-"))
            with open(self.folder / "log", "wb") as log:
                self.process = subprocess.Popen([sys.executable, __file__, self.address], env=self.env,
                                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not os.path.exists(self.address):
            if self.process.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        """Stop the warm process and remove its folder."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            shutil.rmtree(self.folder, ignore_errors=True)
            self.process = None

    def can_run(self, args: list[str], env: dict[str, str]) -> bool:
        """The command is this Python running a module or a script, in an environment the warm process can take."""
        runs_code = len(args) > 2 and (args[1] == "-m" or args[1].endswith(".py"))
        return (os.environ.get("FAIRAUDIT_TEST_COLD") != "1" and args[0] == sys.executable and runs_code
                and differs_only_in_safe_keys(env, self.env) and self.start())

    def run(self, args: list[str], cwd: Path, env: dict[str, str],
            timeout: float | None) -> subprocess.CompletedProcess:
        """The command forked from the warm process, as `subprocess.run(..., capture_output=True, text=True)`."""
        with tempfile.TemporaryDirectory(prefix="fairaudit-warm-run-") as out:
            request = {"argv": args[1:], "cwd": str(cwd), "env": env, "stdout": f"{out}/stdout",
                       "stderr": f"{out}/stderr"}
            returncode = self.exchange(request, timeout, args)
            stdout, stderr = (as_text(Path(out, name).read_bytes()) for name in ("stdout", "stderr"))
        return subprocess.CompletedProcess(args, returncode, stdout, stderr)

    def exchange(self, request: dict, timeout: float | None, args: list[str]) -> int:
        """Send one run to the warm process; its return code as subprocess gives it (-N for signal N)."""
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(self.address)
            conn.sendall(json.dumps(request).encode() + b"\n")
            replies = conn.makefile("r")
            pid = json.loads(replies.readline())["pid"]
            conn.settimeout(timeout)
            try:
                return json.loads(replies.readline())["returncode"]
            except (socket.timeout, TimeoutError):
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(args, timeout) from None


WARM = Warm()  # this test worker's, started by its first run


def as_text(data: bytes) -> str:
    """Bytes decoded as `subprocess.run(text=True)` decodes them (the locale's encoding, universal newlines)."""
    return io.TextIOWrapper(io.BytesIO(data), encoding=locale.getpreferredencoding(False)).read()


# The warm process itself.

def serve(address: str) -> dict:
    """Accept runs forever; return (in the forked run only) the request that run is to carry out."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the waiters are reaped as they exit
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(address + ".new")
    listener.listen(64)
    os.rename(address + ".new", address)
    while True:
        conn, _ = listener.accept()
        sys.stdout.flush(), sys.stderr.flush()
        if os.fork() == 0:
            listener.close()
            return fork_run(conn)
        conn.close()


def fork_run(conn: socket.socket) -> dict:
    """In a waiter: read the request and fork the run, which returns the request; the waiter reports the run's pid,
    then its return code, and exits."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        request = json.loads(conn.makefile("r").readline())
        pid = os.fork()
    except BaseException:
        os._exit(1)
    if pid == 0:
        conn.close()
        return request
    try:
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        status = os.waitpid(pid, 0)[1]
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        conn.sendall(json.dumps({"returncode": code}).encode() + b"\n")
    finally:
        os._exit(0)


def become(request: dict) -> None:
    """Turn the forked process into `python -m MODULE ARGV...` started in the request's folder and environment."""
    import runpy

    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    first, *rest = request["argv"]
    # `python -m` puts the working folder first on the path, `python SCRIPT` the script's folder; then PYTHONPATH
    sys.path[:] = [os.getcwd() if first == "-m" else os.path.dirname(os.path.abspath(first)),
                   *entries(request["env"].get("PYTHONPATH")), *LIBRARY_PATH]
    if first == "-m":
        sys.argv = ["-m", *rest[1:]]
        runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = [first, *rest]
        runpy.run_path(first, run_name="__main__")


def entries(pythonpath: str | None) -> list[str]:
    """The folders a PYTHONPATH value puts on the path."""
    return [os.path.abspath(entry) for entry in (pythonpath or "").split(os.pathsep) if entry]


if __name__ == "__main__":
    import importlib

    # the path a new interpreter builds after its first folder and PYTHONPATH: the standard library, site-packages
    LIBRARY_PATH = [entry for entry in sys.path[1:] if entry not in entries(os.environ.get("PYTHONPATH"))]
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional part of a library this environment lacks: the run imports what it has
            pass
    become(serve(sys.argv[1]))
