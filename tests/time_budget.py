"""A test-time budget per file (`--file-budget SECONDS`): each file's setup, call and teardown times are added up
(under pytest-xdist's --dist loadfile, a file's wall time in its worker) and a file over the budget fails the session
with one line naming it, so the change that slows the loop is seen where it lands. The slowest files are listed
either way. The hooks are registered by tests/conftest.py."""

from __future__ import annotations

from collections import defaultdict

import pytest

SHOWN = 10  # slowest files listed at the end of a session
_seconds: dict[str, float] = defaultdict(float)


def pytest_addoption(parser):
    parser.addoption("--file-budget", type=float, default=0.0, metavar="SECONDS",
                     help="fail the session when one test file's tests take longer than this in all (0: no budget)")


def pytest_runtest_logreport(report):
    _seconds[report.nodeid.split("::")[0]] += report.duration


def over_budget(seconds: dict[str, float], budget: float) -> list[str]:
    """One line per file whose tests took longer than `budget` seconds, slowest first."""
    slow = sorted(((s, f) for f, s in seconds.items() if budget and s > budget), reverse=True)
    return [f"{file} took {s:.0f} s, over the {budget:g} s budget per file (--file-budget): make it cheaper, "
            "or split what it checks" for s, file in slow]


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    if over_budget(_seconds, session.config.getoption("file_budget")) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    if not _seconds:
        return
    terminalreporter.section(f"slowest {min(SHOWN, len(_seconds))} test files (seconds)")
    for file, seconds in sorted(_seconds.items(), key=lambda item: -item[1])[:SHOWN]:
        terminalreporter.write_line(f"{seconds:8.1f}  {file}")
    for line in over_budget(_seconds, config.getoption("file_budget")):
        terminalreporter.write_line(f"error: {line}", red=True)
