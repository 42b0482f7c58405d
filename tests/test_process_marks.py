"""The `process` mark (tests/process_marks.py) finds the tests that start a process, however indirectly, and only
those, so that `make test-fast` leaves them out."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

DIRECT = "tests/test_end_to_end.py::test_default_job_logs_metrics_tables_figure_and_records"   # run_app itself
BY_FIXTURE = "tests/test_end_to_end.py::test_second_identical_run_makes_no_model_call"       # tiny_run runs it
IN_PROCESS = "tests/test_contingency.py"


def collected(mark: str, *paths: str) -> set[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m",
                           mark, *paths], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:]  # every file collected, none with an error
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_tests_that_start_a_process_directly_or_through_a_fixture_are_marked_and_in_process_ones_are_not():
    """One collection (each costs seconds): of the three files' tests, those marked are the two that start one."""
    marked = collected("process", DIRECT, BY_FIXTURE, IN_PROCESS)
    assert marked == {DIRECT, BY_FIXTURE}
    assert "\ndef test_" in (REPO / IN_PROCESS).read_text()  # it has tests, none of them marked
