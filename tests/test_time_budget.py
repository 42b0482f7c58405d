"""The per-file test-time budget (tests/time_budget.py): a file over it fails the session, by name."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO
from time_budget import over_budget, over_line


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


def test_the_tests_over_the_slow_line_are_listed_slowest_first_and_the_marked_ones_not(tmp_path):
    seconds = {"t.py::a": 0.4, "t.py::b": 2.5, "t.py::c": 1.0}
    assert over_line(seconds, 1.0) == ["     2.5  t.py::b", "     1.0  t.py::c"]
    assert over_line({"t.py::a": 3.0}, 0) == []
    (tmp_path / "test_line.py").write_text("import time\n\nimport pytest\n\ndef test_sleeps():\n    time.sleep(0.3)\n\n"
                                           "@pytest.mark.slow\ndef test_marked():\n    time.sleep(0.3)\n\n"
                                           "def test_quick():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "time_budget", "-p", "no:cacheprovider", "-q",
                           "-W", "ignore::pytest.PytestUnknownMarkWarning", "test_line.py", "--slow-line", "0.2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "3 passed" in done.stdout
    listed = done.stdout.split("1 tests not marked slow took 0.2 s or more")[1].splitlines()
    assert [line.split()[-1] for line in listed[1:] if "test_line.py" in line] == ["test_line.py::test_sleeps"]
