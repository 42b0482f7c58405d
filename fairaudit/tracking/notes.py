"""What qualifies a run's numbers, read back from its tags wherever its numbers are shown again (a sweep's table and
verdict, the report): its verdict's warnings and why each of its n/a metrics is undefined."""

from __future__ import annotations

import json

from fairaudit.analysis.degenerate import WARNING
from fairaudit.tracking import tags as t


def run_warnings(run) -> list[str]:
    """The run's verdict warnings (WARNINGS_TAG), without their `warning: ` prefix."""
    return [line for line in run.data.tags.get(t.WARNINGS_TAG, "").splitlines() if line]


def run_undefined(run) -> dict[str, str]:
    """metric -> why it is n/a, from the run's UNDEFINED_TAG (a tag cut short at MLflow's limit reads as none)."""
    try:
        grouped = json.loads(run.data.tags.get(t.UNDEFINED_TAG, "{}"))
    except ValueError:
        return {}
    return {name: text for text, names in grouped.items() for name in names}


def run_unbounded(run) -> dict[str, str]:
    """metric -> "+inf" or "-inf", from the run's UNBOUNDED_TAG ("c_b_ratio=+inf, ... (unbounded; ...)")."""
    listed = run.data.tags.get(t.UNBOUNDED_TAG, "").split(" (")[0]
    return dict(item.split("=", 1) for item in listed.split(", ") if "=" in item)


def jobs_phrase(nums: list[str]) -> str:
    """"job 2" or "jobs 0, 1, 2"."""
    return f"job{'s' if len(nums) > 1 else ''} {', '.join(nums)}"


def grouped_warnings(runs: list, key) -> dict[str, list[str]]:
    """warning text -> the `key(run)` of every run that gave it, in the runs' order."""
    grouped: dict[str, list[str]] = {}
    for run in runs:
        for line in run_warnings(run):
            grouped.setdefault(line, []).append(key(run))
    return grouped


def job_num(run) -> str:
    return run.data.tags.get(t.JOB_NUM_TAG, "?")


def warning_lines(children: list) -> list[str]:
    """The sweep's warnings as verdict lines, each once with the jobs it qualifies, e.g. "warning: jobs 0, 1, 2:
    every answer (8 of 8, think and nothink) is Yes: ..."."""
    return [f"{WARNING}{jobs_phrase(nums)}: {text}" for text, nums in grouped_warnings(children, job_num).items()]


def table_notes(children: list, columns: list[str]) -> tuple[dict[str, str], list[str]]:
    """For a table of the children with these metric `columns`: each child's warning marks ("W1, W2") by run id, and
    the lines under the table: each warning once with its mark and jobs, then why each n/a is undefined."""
    grouped = grouped_warnings(children, job_num)
    marks = {text: f"W{i}" for i, text in enumerate(grouped, 1)}
    by_run = {run.info.run_id: ", ".join(marks[text] for text in run_warnings(run)) for run in children}
    lines = [f"{WARNING}{marks[text]} ({jobs_phrase(nums)}): {text}" for text, nums in grouped.items()]
    return by_run, lines + na_lines(children, columns)


def na_lines(children: list, columns: list[str]) -> list[str]:
    """Why each n/a of the children's `columns` is undefined, a line per reason naming the metrics and jobs; jobs
    that did not finish have no metrics, a line per status."""
    why: dict[str, dict[str, list[str]]] = {}
    unfinished: dict[str, list[str]] = {}
    for run in children:
        if run.info.status != "FINISHED":
            unfinished.setdefault(run.info.status, []).append(job_num(run))
            continue
        undefined, infinite = run_undefined(run), run_unbounded(run)
        for name in (c for c in columns if c not in run.data.metrics):
            text = undefined.get(name) or (f"{infinite[name]} (MLflow keeps finite numbers only; metrics.json holds "
                                           "it as null)" if name in infinite else "not a metric of this job's probe")
            why.setdefault(text, {}).setdefault(name, []).append(job_num(run))
    lines = [f"n/a: {'; '.join(f'{name} ({jobs_phrase(nums)})' for name, nums in names.items())}: {text}"
             for text, names in why.items()]
    return lines + [f"n/a: {jobs_phrase(nums)} ended {status}: no metrics" for status, nums in unfinished.items()]
