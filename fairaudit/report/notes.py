"""What qualifies a report's numbers, beside them: the source runs' verdict warnings (a mark per cell in the seed
summary, the runs table and each table whose rows are runs, each warning told once with the runs it holds for) and
why each n/a is undefined."""

from __future__ import annotations

import json

import pandas as pd

from fairaudit.analysis.degenerate import WARNING
from fairaudit.analysis.study import AXES
from fairaudit.views.sections import Report, Section

WARNINGS = "warnings"    # the runs frame's column of each run's warning lines (report.runs.runs_frame)
UNDEFINED = "undefined"  # ... and of why its n/a metrics are undefined (JSON: reason -> metrics)


def run_lines(runs: pd.DataFrame) -> list[list[str]]:
    """Each run's warning lines, in the frame's order."""
    column = runs[WARNINGS] if WARNINGS in runs else pd.Series("", index=runs.index)
    return [[line for line in str(text or "").splitlines() if line] for text in column]


NAMED_AXES = ("seed", "checkpoint", "engine")  # shown with their name: "seed 0", not a bare "0"


def cell_name(row: pd.Series, axes: list[str]) -> str:
    """e.g. "smollm2 adult seed 3": the row's values of `axes`."""
    return " ".join(f"{a} {row[a]}" if a in NAMED_AXES else str(row[a]) for a in axes
                    if a in row and str(row[a]) not in ("", "nan", "None"))


def marks_of(runs: pd.DataFrame) -> tuple[dict[str, str], list[str]]:
    """text -> its mark (W1, W2, ...) in order of first appearance, and each run's marks ("W1, W2"), by position."""
    lines = run_lines(runs)
    marks: dict[str, str] = {}
    for found in lines:
        for text in found:
            marks.setdefault(text, f"W{len(marks) + 1}")
    return marks, [", ".join(marks[text] for text in found) for found in lines]


def warning_lines(runs: pd.DataFrame, axes: list[str]) -> list[str]:
    """Each warning once, with its mark and the runs it holds for: "warning: W1 (5 of 5 runs: smollm2 adult seed 0,
    ...): every answer ... is Yes: ..."."""
    marks, _ = marks_of(runs)
    holders: dict[str, list[str]] = {text: [] for text in marks}
    for (_, row), found in zip(runs.iterrows(), run_lines(runs)):
        for text in found:
            holders[text].append(cell_name(row, axes) or str(row.get("run_name", "")))
    return [f"{WARNING}{marks[text]} ({len(who)} of {len(runs)} runs: {', '.join(who)}): {text}"
            for text, who in holders.items()]


def add_warnings(report: Report, runs: pd.DataFrame, axes: list[str]) -> None:
    """The runs' warnings as a section (a row per run and warning) and as the report's warning lines."""
    rows = [{"run_id": row["run_id"], "run_name": row.get("run_name", ""), **{a: row.get(a, "") for a in axes},
             "warning": text} for (_, row), found in zip(runs.iterrows(), run_lines(runs)) for text in found]
    if not rows:
        return
    report.warnings = warning_lines(runs, axes)
    table = pd.DataFrame(rows)
    note = ("What the source runs' verdicts warn of; the seed summary, the runs table and each table whose rows are "
            "runs (Table 2, ...) mark each cell with its warnings (W1, ...), since a warned run's numbers may not mean "
            "what they seem:\n"
            + "\n".join(line[len(WARNING):] for line in report.warnings))
    report.sections.append(Section("warnings", "Warnings on the source runs", table, table.astype(str), note))


def mark_rows(report: Report, runs: pd.DataFrame) -> None:
    """A warnings column, after the axes, in each shown table whose rows are runs (`Section.row_runs`): the marks
    (W1, ...) of each row's run, as in the seed summary; none where no row's run warns."""
    _, marks = marks_of(runs)
    by_run = dict(zip(runs["run_id"], marks))
    for section in report.sections:
        if section.row_runs is None or section.shown is None:
            continue
        column = [by_run.get(run, "") if run else "" for run in section.row_runs]
        if any(column):
            axes = next((i for i, name in enumerate(section.shown.columns) if name not in AXES),
                        len(section.shown.columns))
            section.shown.insert(axes, WARNINGS, column)
            section.note += " warnings: what the row's run warns of (the warnings section tells each)."


def undefined_of(runs: pd.DataFrame) -> list[dict[str, str]]:
    """Each run's metric -> why it is n/a (its UNDEFINED tag), by position."""
    column = runs[UNDEFINED] if UNDEFINED in runs else pd.Series("", index=runs.index)
    out = []
    for text in column:
        try:
            grouped = json.loads(text) if isinstance(text, str) and text else {}
        except ValueError:
            grouped = {}
        out.append({name: why for why, names in grouped.items() for name in names})
    return out


def na_lines(summary: pd.DataFrame, runs: pd.DataFrame, axes: list[str]) -> list[str]:
    """Why the seed summary's n/a entries are n/a: a mean undefined in every seed (the runs' own reasons), an SD and
    interval that need two seeds."""
    reasons = undefined_of(runs)
    lines: dict[str, list[str]] = {}
    for _, row in summary.iterrows():
        cell = (runs[axes] == row[axes].to_numpy()).all(axis=1).to_numpy() if axes else [True] * len(runs)
        where = f"{row['metric']} ({cell_name(row, axes)})" if axes else row["metric"]
        if row["n"] == 0:
            why = sorted({r.get(row["metric"], "not logged by these runs") for r, hit in zip(reasons, cell) if hit})
            lines.setdefault("; ".join(why), []).append(where)
        elif row["n"] == 1:
            lines.setdefault("one seed only: an SD and an interval need two", []).append(where)
    return [f"n/a: {', '.join(names)}: {why}" for why, names in lines.items()]


def left_out_lines(summary: pd.DataFrame, axes: list[str]) -> list[str]:
    """Which seeds' values the seed summary left out of a mean, SD and interval, and why: infinite (a ratio over an
    empty cell) or missing (NaN), for each cell and metric where some seeds had a finite value."""
    lines = []
    for _, row in summary[(summary["n"] > 0) & (summary["n_infinite"] + summary["n_missing"] > 0)].iterrows():
        where = f"{row['metric']} ({cell_name(row, axes)})" if axes else row["metric"]
        kinds = [f"{count} {kind}" for count, kind in ((row["n_infinite"], "infinite"), (row["n_missing"], "NaN"))
                 if count]
        total = row["n"] + row["n_infinite"] + row["n_missing"]
        lines.append(f"left out: {where}: {' and '.join(kinds)} of {total} seeds; the rest summarised")
    return lines


SHOWN_NAMES = 6  # metric names a legend line lists before "and N more"


def na_legend(runs: pd.DataFrame) -> list[str]:
    """Why the report's n/a entries are n/a: each reason the source runs give, once, with the metrics it explains
    and how many runs give it ("n/a: d_disp_c_think, asym_c (2 of 2 runs): no pair in cell c (...)")."""
    grouped: dict[str, dict[str, int]] = {}
    for reasons in undefined_of(runs):
        for name, why in reasons.items():
            counted = grouped.setdefault(why, {})
            counted[name] = counted.get(name, 0) + 1
    lines = []
    for why, names in grouped.items():
        listed = list(names)
        shown = ", ".join(listed[:SHOWN_NAMES]) + (f" and {len(listed) - SHOWN_NAMES} more" if len(listed) >
                                                   SHOWN_NAMES else "")
        lines.append(f"n/a: {shown} ({max(names.values())} of {len(runs)} runs): {why}")
    return lines
