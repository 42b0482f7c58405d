"""The `fairaudit` command run in a forked child of a process that imported the app once: its real exit code, stdout
and stderr, in a fraction of a second where a fresh `python -m fairaudit` spends seconds importing torch,
transformers and MLflow. For commands that stop before any model loads (the child must not run torch: a fork
inherits no usable thread pool)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

PRELOAD = ("fairaudit.cli.main", "fairaudit.job.__main__", "fairaudit.job.run", "fairaudit.job.sweep",
           "fairaudit.terminal.task", "fairaudit.report.__main__", "fairaudit.report.app", "fairaudit.store.cli",
           "fairaudit.data.fetch", "torch", "mlflow", "mlflow.tracking", "transformers", "gguf",
           "sqlalchemy")


def preload() -> None:
    import importlib

    for module in PRELOAD:
        importlib.import_module(module)


def fairaudit(argv: list[str], cwd: Path, env: dict[str, str] | None = None,
              timeout: float = 300) -> subprocess.CompletedProcess:
    """`fairaudit ARGV` from `cwd` with `env` added to the environment, in a forked child."""
    preload()
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        gc.freeze()  # this process's objects out of the child's collections: a full one would copy their pages
        pid = os.fork()
        if pid == 0:
            _child(argv, cwd, env or {}, out.fileno(), err.fileno())
        gc.unfreeze()
        code = _wait(pid, timeout)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(["fairaudit", *argv], code, out.read(), err.read())


def _wait(pid: int, timeout: float) -> int:
    """The child's exit code (killed after `timeout` seconds)."""
    import signal
    import time

    deadline = time.time() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.time() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise TimeoutError(f"fairaudit did not finish within {timeout} s")
        time.sleep(0.02)


def _child(argv: list[str], cwd: Path, env: dict[str, str], out: int, err: int) -> None:
    code = 1
    try:
        from hydra.core.global_hydra import GlobalHydra

        from fairaudit.cli import main as cli

        GlobalHydra.instance().clear()
        os.chdir(cwd)
        os.environ.update({"TOKENIZERS_PARALLELISM": "false", **env})
        os.dup2(out, 1)
        os.dup2(err, 2)
        sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)  # not pytest's capture
        sys.argv = ["fairaudit", *argv]
        code = cli.main(argv)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)
