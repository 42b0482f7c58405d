"""The per-file test-time budget (tests/time_budget.py): a file over it fails the session, by name."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO
from time_budget import over_budget


def test_only_the_files_over_the_budget_are_named_slowest_first():
    seconds = {"tests/a.py": 12.0, "tests/b.py": 30.5, "tests/c.py": 9.9}
    assert [line.split(" took ")[0] for line in over_budget(seconds, 10)] == ["tests/b.py", "tests/a.py"]
    assert over_budget(seconds, 10)[0].startswith("tests/b.py took 30 s, over the 10 s budget per file")
    assert over_budget(seconds, 0) == [] and over_budget(seconds, 31) == []


def test_a_session_with_a_file_over_its_budget_fails_and_lists_its_slowest_files(tmp_path):
    (tmp_path / "test_slow.py").write_text("import time\n\ndef test_sleeps():\n    time.sleep(0.3)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}
    command = [sys.executable, "-m", "pytest", "-p", "time_budget", "-p", "no:cacheprovider", "-q", "test_slow.py"]
    over = subprocess.run([*command, "--file-budget", "0.1"], cwd=tmp_path, env=env, capture_output=True, text=True)
    within = subprocess.run([*command, "--file-budget", "60"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert over.returncode == 1 and "1 passed" in over.stdout
    assert "error: test_slow.py took 0 s, over the 0.1 s budget per file" in over.stdout
    assert within.returncode == 0 and "slowest 1 test files (seconds)" in within.stdout
