"""A warm interpreter for the tests' `python -m fairaudit` runs: one process per test worker imports the heavy
libraries a run imports (torch, transformers, MLflow, Hydra, pandas, scipy, matplotlib) once, then forks a process
per run, which runs `python -m <module>` as a fresh interpreter would (its argv, environment, folder, stdout and
stderr; exit code or signal). A run spends most of its ~15 s importing; forked, it starts in well under a second.
`run_python` waits for the run as subprocess.run does; `popen_python` hands back a handle with Popen's face, for the
tests that signal a run or watch it while it runs.

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
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
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
# which is put on the forked run's path as a new interpreter would), those that fairaudit sets itself before a run
# (terminal.output.quiet_libraries), which it applies directly to a library already imported, KMP_INIT_AT_FORK,
# which joblib and scikit-learn set in the test worker's own environment when a test imports them (it tells Intel's
# OpenMP what to do at a fork; torch uses GNU OpenMP), and TMPDIR, read again in the forked run; any other
# difference may change what a library did as it was imported, and gets a new interpreter.
SAFE_PREFIXES = ("FAIRAUDIT_", "MLFLOW_", "_MLFLOW_", "PG")
SAFE_KEYS = {"PYTHONUNBUFFERED", "PYTHONPATH", "PYTEST_CURRENT_TEST", "TOKENIZERS_PARALLELISM",
             "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "TORCHINDUCTOR_CACHE_DIR",
             "KMP_INIT_AT_FORK", "TMPDIR"}


def run_python(args: list[str], env: dict[str, str], cwd: Path | str | None = None,
               timeout: float | None = None) -> subprocess.CompletedProcess:
    """`subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)` for a Python command
    (`python -m MODULE ...` or `python SCRIPT.py ...`), forked from this test worker's warm interpreter where that
    cannot change what the command does."""
    if not WARM.can_run(args, env):
        return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    process = WarmProcess(args, Path(cwd or os.getcwd()), env, subprocess.PIPE, subprocess.PIPE)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


def popen_python(args: list[str], env: dict[str, str], cwd: Path | str | None = None, stdout=None, stderr=None,
                 start_new_session: bool = False) -> subprocess.Popen:
    """`subprocess.Popen(args, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=True, start_new_session=...)` for
    a Python command, forked from the warm interpreter where that cannot change what it does: a process with its own
    pid that signals reach, whose exit code or signal `poll`, `wait` and `communicate` give as Popen's do."""
    if not WARM.can_run(args, env):
        return subprocess.Popen(args, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=True,
                                start_new_session=start_new_session)
    return WarmProcess(args, Path(cwd or os.getcwd()), env, stdout, stderr, start_new_session)


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


WARM = Warm()  # this test worker's, started by its first run


class WarmProcess:
    """A run forked from the warm process, with the face of subprocess.Popen(text=True): `pid`, `args`,
    `returncode`, `stdout`/`stderr` (text pipes where PIPE was asked), `poll`, `wait`, `communicate`, `send_signal`,
    `terminate`, `kill`. Its output goes straight to the descriptors given (passed over the warm process's socket),
    and its exit code (or -N for signal N) comes back on that socket."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str], stdout=None, stderr=None,
                 start_new_session: bool = False):
        self.args, self.returncode, self._readers = args, None, None
        ours, theirs = zip(*(descriptor(target, fd) for fd, target in ((1, stdout), (2, stderr))))
        self.stdout, self.stderr = ours
        self._conn = socket.socket(socket.AF_UNIX)
        self._conn.connect(WARM.address)
        stdin = os.open(os.devnull, os.O_RDONLY)
        try:
            socket.send_fds(self._conn, [b"F"], [stdin, *theirs])
            request = {"argv": args[1:], "cwd": str(cwd), "env": env, "session": start_new_session}
            self._conn.sendall(json.dumps(request).encode() + b"\n")
        finally:
            for fd in (stdin, *theirs):
                os.close(fd)
        # unbuffered, so that a reply not read yet stays in the socket where `poll`'s select sees it (a buffered
        # reader could take the exit's line along with the pid's, for a run that ends at once)
        self._replies = self._conn.makefile("rb", buffering=0)
        self.pid = json.loads(self._replies.readline())["pid"]

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self._read_exit()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._conn.settimeout(timeout)
            try:
                self._read_exit()
            except (socket.timeout, TimeoutError):
                raise subprocess.TimeoutExpired(self.args, timeout) from None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        """Everything the run writes to its pipes until it ends, then its end (TimeoutExpired past `timeout`: call
        again to go on reading)."""
        if self._readers is None:
            self._readers = [Reader(stream) for stream in (self.stdout, self.stderr)]
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers:
            reader.join(None if deadline is None else max(deadline - time.monotonic(), 0))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(deadline - time.monotonic(), 0))
        return self._readers[0].text, self._readers[1].text

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read_exit(self) -> None:
        line = self._replies.readline()
        self.returncode = json.loads(line)["returncode"] if line else -signal.SIGKILL  # its waiter was killed
        self._conn.close()


def descriptor(target, fd: int) -> tuple[io.TextIOWrapper | None, int]:
    """For a run's stdout (fd 1) or stderr (fd 2) given as Popen takes it: (the test's end of a PIPE, else None;
    a descriptor of the caller's for the run to write to, which the caller closes once it is sent)."""
    if target == subprocess.PIPE:
        read, write = os.pipe()
        return io.TextIOWrapper(io.FileIO(read, "r"), encoding=locale.getpreferredencoding(False)), write
    if target == subprocess.DEVNULL:
        return None, os.open(os.devnull, os.O_WRONLY)
    if target == subprocess.STDOUT:
        raise ValueError("stderr=STDOUT: give the run's stderr a pipe or a file of its own")
    return None, os.dup(fd if target is None else target if isinstance(target, int) else target.fileno())


class Reader(threading.Thread):
    """A pipe read to its end on a thread of its own (`text`; None where there is no pipe)."""

    def __init__(self, stream: io.TextIOWrapper | None):
        super().__init__(daemon=True)
        self.stream, self.text = stream, None
        self.start()

    def run(self) -> None:
        if self.stream is not None:
            with self.stream:
                self.text = self.stream.read()


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
    """In a waiter: read the request (its stdin, stdout and stderr come as descriptors) and fork the run, which
    returns the request; the waiter reports the run's pid, then its return code, and exits."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        _, fds, _, _ = socket.recv_fds(conn, 1, 3)
        request = {**json.loads(conn.makefile("r").readline()), "fds": fds}
        pid = os.fork()
    except BaseException:
        os._exit(1)
    if pid == 0:
        conn.close()
        return request
    for fd in fds:  # the run's alone now, so that a pipe ends when the run does
        os.close(fd)
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

    tempfile.tempdir = None  # read again from TMPDIR, as a new interpreter would
    if request["session"]:
        os.setsid()
    for fd, given in enumerate(request["fds"]):
        os.dup2(given, fd)
        os.close(given)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    first, *rest = request["argv"]
    # `python -m` puts the working folder first on the path, `python SCRIPT` the script's folder; then PYTHONPATH
    sys.path[:] = [os.getcwd() if first == "-m" else os.path.dirname(os.path.abspath(first)),
                   *entries(request["env"].get("PYTHONPATH")), *LIBRARY_PATH]
    try:
        if first == "-m":
            sys.argv = ["-m", *rest[1:]]
            runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
        else:
            sys.argv = [first, *rest]
            runpy.run_path(first, run_name="__main__")
    except SystemExit as stop:
        exit_as_an_interpreter(stop.code)
    exit_as_an_interpreter(0)


def exit_as_an_interpreter(code) -> None:
    """End the run as a new interpreter ends on `sys.exit(code)`: its threads joined, its atexit handlers run, its
    standard streams flushed, the code (None 0, a message printed and 1). Not the freeing of every object that a
    finalizing interpreter does last: most are the warm process's (copied pages, seconds). The one difference a run
    could show: a file it leaves open and unflushed at exit loses what it buffered here (FAIRAUDIT_TEST_COLD=1
    runs every run in a new interpreter). An uncaught exception is left to the interpreter (traceback, exit code)."""
    import atexit

    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    threading._shutdown()  # what Py_FinalizeEx does first, then atexit's handlers
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a reader that went away
            pass
    os._exit((code or 0) & 0xFF)


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
    import gc

    gc.freeze()  # the libraries' objects out of every collection a run makes: a full one would copy their pages
    become(serve(sys.argv[1]))
