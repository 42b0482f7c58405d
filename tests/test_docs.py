"""The README and docs/ stay true: links resolve inside the repository, every command they show composes, the
blocks marked runnable run (on the tiny model), and `make run` prints what the README says it prints."""

from __future__ import annotations

import itertools
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA_ROOT, REPO
from fairaudit.cli.main import COMMANDS
from fairaudit.cli.overrides import check
from fairaudit.data.fetch import DATASETS
from warm import run_python

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 250
FENCE = re.compile(r"^```(\S*)([^\n]*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SETTING = re.compile(r"[A-Za-z_]\w*=.*")  # a shell word that sets a variable for the command after it
TINY = ["model=tiny_qwen3", "dataset.n=2", "model.max_think_tokens=8"]  # appended to every runnable audit command


def blocks(page: Path) -> list[tuple[str, str, str]]:
    """(language, the rest of the info string, body) of every fenced block."""
    return [(m.group(1), m.group(2).strip(), m.group(3)) for m in FENCE.finditer(page.read_text())]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", text))


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"^#{1,6} ", line)}


def test_the_readme_is_the_first_screen_and_every_docs_page_is_linked_from_it():
    readme = (REPO / "README.md").read_text()
    assert readme.count("\n") <= README_MAX_LINES
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in readme, page.name


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_resolve_inside_the_repository(page):
    dead = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.is_relative_to(REPO) or not resolved.exists():
            dead.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            dead.append(target)
    assert dead == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_nothing_points_outside_the_repository(page):
    text = page.read_text()
    assert "../shared" not in text and "/work/" not in text


def commands(body: str) -> list[str]:
    """The command lines of a shell block: continuations joined, comments and prompts dropped."""
    lines = body.replace("\\\n", " ").splitlines()
    return [line.strip().removeprefix("$ ") for line in lines if line.strip() and not line.strip().startswith("#")]


def fairaudit_args(line: str) -> tuple[str, list[str]] | None:
    """("audit" | a subcommand, its arguments) of a line that runs fairaudit (also `python -m`, `make run ARGS=`)."""
    words = shlex.split(line, comments=True)
    while words and re.match(r"^\w+=", words[0]):  # leading VAR=value assignments
        words = words[1:]
    if words[:1] == ["make"] and "run" in words:
        args = next((w.split("=", 1)[1] for w in words if w.startswith("ARGS=")), "")
        return "audit", shlex.split(args)
    if words[:1] == ["fairaudit"]:
        words = words[1:]
    elif len(words) > 2 and words[1:3] in (["-m", "fairaudit"], ["-m", "fairaudit.report"]) and "python" in words[0]:
        words = (["report"] if words[2] == "fairaudit.report" else []) + words[3:]
    else:
        return None
    if words and words[0] in COMMANDS:
        return words[0], words[1:]
    return "audit", words


PLACEHOLDER = re.compile(r"\.\.\.|<[^>]+>")  # `...` and `<parent run id>` stand for what the reader fills in


def shown_commands() -> list[tuple[str, str]]:
    return [(page.name, line) for page in PAGES for lang, _, body in blocks(page) if lang in ("bash", "sh", "console")
            for line in commands(body) if not PLACEHOLDER.search(line) and fairaudit_args(line)]


@pytest.mark.parametrize("page, line", shown_commands())
def test_every_command_the_docs_show_still_composes(page, line):
    """A renamed option or key makes a docs command stale: each must compose as the app would."""
    kind, args = fairaudit_args(line)
    if any(a.startswith(("-sc", "--shell-completion", "-h", "--help")) for a in args):
        return
    if kind in ("audit", "report"):
        assert check("config" if kind == "audit" else "report", args) is None, line
    elif kind == "data":
        names = [a for a in args[1:] if not a.startswith("-") and not a.startswith(("/", "~", "."))]
        assert args[0] in ("fetch", "check") and set(names) <= set(DATASETS), line


def shim(folder: Path) -> dict[str, str]:
    """An environment whose `fairaudit` is this checkout's, every audit run on the tiny model (bin/shim.py,
    linked as bin/fairaudit on the PATH)."""
    folder.mkdir()
    script = folder / "shim.py"  # not fairaudit.py: on the path before the package, it would hide it
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom fairaudit.cli.main import COMMANDS, main\n"
                      "args = sys.argv[1:]\n"
                      "if not args or (args[0] not in COMMANDS and (args[0] in ('-m', '--multirun')\n"
                      "                                            or not args[0].startswith('-'))):\n"
                      f"    args += {TINY!r}\nsys.argv[0] = 'fairaudit'\nsys.exit(main(args))\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    (folder / "fairaudit").symlink_to(script)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO),
            "FAIRAUDIT_DATA": str(DATA_ROOT), "FAIRAUDIT_HOME": str(folder.parent), "OMP_NUM_THREADS": "1"}


def run_line(line: str, folder: Path, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    """A shell line run in `folder` as bash runs it. A Python command, or `fairaudit` where `env` has the shim, with
    no shell syntax but leading NAME=value settings, runs the command itself: forked from the warm interpreter where
    it can be (tests/warm.py)."""
    command = re.split(r"\s#", line, maxsplit=1)[0]  # a comment, at the start of a word, may hold any character
    words = [] if re.search(r"[|&;<>$`*?(){}\[\]~]", command) else shlex.split(command)
    settings = dict(word.split("=", 1) for word in itertools.takewhile(SETTING.fullmatch, words))
    words = words[len(settings):]
    shimmed = Path(env["PATH"].split(os.pathsep)[0]) / "shim.py"
    if words[:1] == ["fairaudit"] and shimmed.exists():
        words = [sys.executable, str(shimmed), *words[1:]]
    if words[:1] == [sys.executable]:
        return run_python(words, {**env, **settings, "PATH": os.environ["PATH"]}, cwd=folder, timeout=timeout)
    return subprocess.run(["bash", "-c", line], cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)


RUNNABLE = [(page.name, i, body) for page in PAGES for i, (lang, info, body) in enumerate(blocks(page))
            if lang == "bash" and "runnable" in info.split()]


@pytest.mark.slow
@pytest.mark.long  # minutes: sweeps and reports, one block after another
@pytest.mark.parametrize("page, index, body", RUNNABLE, ids=[f"{p}-{i}" for p, i, _ in RUNNABLE])
def test_blocks_marked_runnable_run_on_the_tiny_model(tmp_path, page, index, body):
    env = shim(tmp_path / "bin")
    for line in commands(body):
        line = re.sub(r"^(\S*python\S*) -m fairaudit(\.report)?",
                      lambda m: "fairaudit" + (" report" if m.group(2) else ""), line)
        done = run_line(line, tmp_path, env)
        assert done.returncode == 0, f"{page}: {line}\n{done.stderr[-3000:]}"


def test_runnable_blocks_exist():
    assert {page for page, _, _ in RUNNABLE} >= {"README.md", "studies.md"}


def readme_output() -> list[str]:
    """The lines of the README's block that shows what `make run` prints."""
    body = next(body for lang, info, body in blocks(REPO / "README.md")
                if lang == "text" and "make-run" in info.split())
    return body.splitlines()


@pytest.mark.slow
@pytest.mark.long
def test_make_run_prints_the_verdict_the_gap_and_the_url_as_the_readme_shows(tmp_path):
    """`make run`'s own recipe (read with make -n), run in a fresh folder: what the README's worked result shows."""
    recipe = make_n(f"PY={sys.executable}")
    assert [line.split(" -m ", 1)[1].strip() for line in recipe] == ["fairaudit data fetch --missing adult",
                                                                     "fairaudit"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "FAIRAUDIT_DATA": str(DATA_ROOT), "FAIRAUDIT_HOME": str(tmp_path)}
    out = ""
    for line in recipe:
        done = run_line(line, tmp_path, env, timeout=1800)
        assert done.returncode == 0, done.stderr[-3000:]
        out, err = done.stdout, done.stderr
    shown = readme_output()
    verdict = [line for line in out.splitlines()
               if line and not line.startswith(("┏", "┃", "┡", "│", "└", " "))]
    assert verdict[0] == shown[0]  # counts: the same on every machine
    assert [v for v in verdict if v.startswith("warning:")] == [s for s in shown if s.startswith("warning:")]
    assert verdict[1].startswith("P(Yes) gap") and "[" in verdict[1]
    assert re.search(r"then open: http://127\.0\.0\.1:5000/#/experiments/\d+/runs/\w+"
                     r"\?workflowType=machine_learning", err)
    assert "start the MLflow UI with: " in err and f"ui --backend-store-uri sqlite:///{tmp_path}/mlflow.db" in err


def make_n(*args: str) -> list[str]:
    """The commands `make run` would run (the venv taken as built), without running them."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "ARGS")}  # from
    # `make test ARGS=...`, whose command-line variables reach this make through its environment
    done = subprocess.run(["make", "-s", "-n", "-o", ".venv/.installed", "run", *args], cwd=REPO, capture_output=True,
                          text=True, check=True, env=env)
    return done.stdout.splitlines()


def test_make_run_fetches_the_data_sets_its_args_name_before_it_runs():
    # the audit is marked as make run's own (FAIRAUDIT_MAKE_RUN), which turns on its hint for the sweep form
    assert make_n("PY=py") == ["py -m fairaudit data fetch --missing adult", "FAIRAUDIT_MAKE_RUN=1 py -m fairaudit "]
    assert (make_n("PY=py", "ARGS=probe=cdpg -m dataset=adult,compas")[0]
            == "py -m fairaudit data fetch --missing adult compas")


def test_ci_runs_the_readmes_test_command_on_a_clean_checkout():
    first = next(body for lang, _, body in blocks(REPO / "README.md") if lang == "bash")
    assert [line.split("#")[0].strip() for line in commands(first)] == ["make run", "make test"]
    assert 'step "make test" make test' in (REPO / ".ci" / "run").read_text().splitlines()  # timed, as CI prints
