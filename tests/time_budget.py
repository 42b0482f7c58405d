"""A test-time budget per file (`--file-budget SECONDS`): each file's setup, call and teardown times are added up
(under pytest-xdist's --dist loadfile, a file's wall time in its worker) and a file over the budget fails the session
with one line naming it, so the change that slows the loop is seen where it lands. The slowest files are listed
either way. `--slow-line SECONDS` (`make test-fast`) also lists the tests not marked `slow` that took that long: the
inner loop leaves out in-process tests of a second or more, and this is where a new one shows. The hooks are
registered by tests/conftest.py."""

from __future__ import annotations

from collections import defaultdict

import pytest

SHOWN = 10  # slowest files listed at the end of a session
_seconds: dict[str, float] = defaultdict(float)
_test_seconds: dict[str, float] = defaultdict(float)  # tests not marked slow


def pytest_addoption(parser):
    parser.addoption("--file-budget", type=float, default=0.0, metavar="SECONDS",
                     help="fail the session when one test file's tests take longer than this in all (0: no budget)")
    parser.addoption("--slow-line", type=float, default=0.0, metavar="SECONDS",
                     help="list the tests not marked slow that took this long or longer (0: none listed)")


def pytest_runtest_logreport(report):
    _seconds[report.nodeid.split("::")[0]] += report.duration
    if "slow" not in report.keywords:
        _test_seconds[report.nodeid] += report.duration


def over_budget(seconds: dict[str, float], budget: float) -> list[str]:
    """One line per file whose tests took longer than `budget` seconds, slowest first."""
    slow = sorted(((s, f) for f, s in seconds.items() if budget and s > budget), reverse=True)
    return [f"{file} took {s:.0f} s, over the {budget:g} s budget per file (--file-budget): make it cheaper, "
            "or split what it checks" for s, file in slow]


def over_line(seconds: dict[str, float], line: float) -> list[str]:
    """One line per test that took `line` seconds or more (setup, call and teardown), slowest first."""
    slow = sorted(((s, test) for test, s in seconds.items() if line and s >= line), reverse=True)
    return [f"{s:8.1f}  {test}" for s, test in slow]


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
    line = config.getoption("slow_line")
    if over := over_line(_test_seconds, line):
        terminalreporter.section(f"{len(over)} tests not marked slow took {line:g} s or more: mark them "
                                 "@pytest.mark.slow, or make them cheaper", yellow=True)
        for found in over:
            terminalreporter.write_line(found)
