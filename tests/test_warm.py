"""The warm runner ends a forked run as a new interpreter ends: the same exit code, output and atexit work, whether the
script returns, calls sys.exit with a number, None or a message, leaves a thread running or dies on an exception."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from warm import run_python

SCRIPT = """
import atexit, os, pathlib, sys, threading, time
pathlib.Path("parent").write_text(str(os.getppid()))
atexit.register(lambda: print("atexit ran", flush=False))
print("unflushed", end="")
threading.Thread(target=lambda: (time.sleep(0.3), print(" thread done", end=""))).start()
ending = sys.argv[1]
if ending == "error":
    raise ValueError("boom")
if ending != "return":
    sys.exit(None if ending == "none" else int(ending) if ending.lstrip("-").isdigit() else ending)
"""


@pytest.mark.parametrize("ending", ["return", "none", "0", "3", "143", "-1", "a message", "error"])
def test_a_forked_run_ends_as_a_new_interpreter_does(tmp_path, ending):
    script = tmp_path / "ending.py"
    script.write_text(SCRIPT)
    env = dict(os.environ)  # the test's own: the warm process's too, so the run forks
    cold = subprocess.run([sys.executable, str(script), ending], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    warm = run_python([sys.executable, str(script), ending], env, cwd=tmp_path, timeout=120)
    assert (warm.returncode, warm.stdout) == (cold.returncode, cold.stdout)
    assert warm.stderr.splitlines()[-1:] == cold.stderr.splitlines()[-1:]  # a traceback's paths may differ above
    assert "atexit ran" in warm.stdout and "thread done" in warm.stdout
    assert int((tmp_path / "parent").read_text()) != os.getpid()  # it was forked, not started by this process
