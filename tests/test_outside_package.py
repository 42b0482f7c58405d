"""docs/adding.md's outside package, built from the page alone as a user builds it: the worked examples' files
(`tests/test_adding.py` reads them) at their paths under `my_audits/`, their imports and dotted names changed as
the page says, its `pyproject.toml` block beside them. Installed with fairaudit (this tree, built as a wheel) in a
fresh virtual environment, whose other dependencies are this interpreter's (named by a .pth file, not installed
again), it runs the page's three commands: `fairaudit check` passes its backend, and a sweep over two seeds of its
probe gets a report that prints the probe's main section and a seed summary, with no setting of the report's."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from conftest import DATA_ROOT, REPO
from test_adding import GUIDE, TINY, guide_blocks

pytestmark = [pytest.mark.slow, pytest.mark.long]

PACKAGE = "my_audits"
PACKAGE_BLOCK = re.compile(r"<!-- package file: (\S+)[^>]*-->\n```\w+\n(.*?)```", re.S)
COMMANDS = re.compile(r"```text\n(fairaudit check .*?)```", re.S)


def own_modules(paths) -> set[str]:
    """The worked examples' own modules, by their dotted names under `fairaudit.` (e.g. `probes.yes_rate`)."""
    return {path.removeprefix("fairaudit/").removesuffix(".py").replace("/", ".") for path in paths
            if path.startswith("fairaudit/") and path.endswith(".py")}


def outside(code: str, own: set[str]) -> str:
    """A worked example's code as the page says to write it outside: fairaudit's names imported from `fairaudit.api`,
    the package's own modules named `my_audits.<module>`."""
    def imported(match: re.Match) -> str:
        return f"from {PACKAGE}.{match.group(1)} import" if match.group(1) in own else "from fairaudit.api import"
    code = re.sub(r"from fairaudit\.([\w.]+) import", imported, code)
    return re.sub(r"\bfairaudit\.(" + "|".join(map(re.escape, sorted(own, key=len, reverse=True))) + r")\b",
                  rf"{PACKAGE}.\1", code)


def write_package(root: Path) -> None:
    """The package's folder: each worked example's file at its path under `my_audits/` (`fairaudit/` dropped),
    an empty `__init__.py` in each folder of modules, the page's `pyproject.toml` beside them."""
    blocks = guide_blocks()
    own = own_modules(blocks)
    for path, code in blocks.items():
        target = root / PACKAGE / path.removeprefix("fairaudit/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(outside(code, own))
        for folder in target.parents if target.suffix == ".py" else ():
            if folder == root:
                break
            (folder / "__init__.py").touch()
    written = PACKAGE_BLOCK.findall(GUIDE.read_text())
    assert [path for path, _ in written] == ["pyproject.toml"], written
    for path, code in written:
        (root / path).write_text(code)


def fresh_venv(folder: Path) -> Path:
    """A new virtual environment whose dependencies are this interpreter's (a .pth file names its site-packages,
    after the environment's own); returns its `bin/` folder."""
    venv.create(folder, with_pip=False)
    site = next((folder / "lib").glob("python*/site-packages"))
    deps = next(Path(p) for p in sys.path if p.endswith("site-packages"))
    (site / "dependencies.pth").write_text(f"{deps}\n")
    return folder / "bin"


def page_commands() -> list[list[str]]:
    """The commands the page runs on the installed package, each as its arguments."""
    (block,) = COMMANDS.findall(GUIDE.read_text())
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


def test_the_pages_outside_package_installs_in_a_fresh_venv_passes_check_and_reports_its_seeds(tmp_path):
    source = tmp_path / "my-audits"
    write_package(source)
    bin_dir = fresh_venv(tmp_path / "venv")
    installed = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                                "--no-build-isolation", "--ignore-installed", str(REPO), str(source)],
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    work = tmp_path / "work"
    work.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FAIRAUDIT_PATH")},
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAIRAUDIT_HOME": str(tmp_path / "home"),
           "FAIRAUDIT_DATA": str(DATA_ROOT), "OMP_NUM_THREADS": "1"}
    found = subprocess.run([str(bin_dir / "python"), "-c", f"import fairaudit, {PACKAGE}; "
                            f"print(fairaudit.__file__); print({PACKAGE}.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True)
    site = next((tmp_path / "venv" / "lib").glob("python*/site-packages"))
    assert found.stdout.splitlines() == [str(site / "fairaudit" / "__init__.py"),
                                         str(site / PACKAGE / "__init__.py")], found.stdout + found.stderr

    check, sweep, report = page_commands()
    checked = subprocess.run(check, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
    swept = subprocess.run([*sweep, *TINY[2:]], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert swept.returncode == 0, swept.stderr[-3000:]
    reported = subprocess.run(report, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert reported.returncode == 0, reported.stderr[-3000:]
    assert "Yes rate per side" in reported.stdout, reported.stdout[-3000:]  # its `report.main` section
    assert "Seed summary" in reported.stdout and "yes_rate_alpha" in reported.stdout, reported.stdout[-3000:]
