"""Assemble a study report from a runs frame: the sections each probe registers, then the family of tests
corrected for multiple comparisons, seed summaries, the sign test, checkpoint curves and the source runs, as the
runs allow.

A probe registers its sections under `report:` in its `conf/probe/<name>.yaml`: `sections`, dotted
names of functions `(report, runs, load_records, settings) -> None` that add sections, figures and
metrics, and `settings`, the report config's `probes.<name>` node. Each function is handed the runs
of the probes that list it and those probes' settings ({probe: settings}); `report.selection` picks
among them. No MLflow here: records come through a loader callable, so the whole report can be
built from frames in a test.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from fairaudit.analysis import study
from fairaudit.analysis.numbers import format_p
from fairaudit.analysis.study_figures import checkpoint_curve_figure
from fairaudit.catalog.registry import declared, declared_sign_test, report_builders
from fairaudit.report.engines import add_engine_sensitivity
from fairaudit.report.family import add_family
from fairaudit.report.notes import add_warnings, left_out_lines, mark_rows, marks_of, na_legend, na_lines
from fairaudit.views import render
from fairaudit.views.sections import RecordsLoader, Report, Section
from fairaudit.views.selection import runs_of


def build(runs: pd.DataFrame, load_records: RecordsLoader, cfg) -> Report:
    """The probes' sections, the multiple-comparison family, seed summaries, the sign test and checkpoint curves,
    as the runs allow.

    runs: one row per job run (run_id, run_name, status, study.AXES, baseline, metrics...).
    cfg: the report config (family, seeds, sign_test, curves, and each probe's settings under probes).
    """
    report, probes = Report(), list(runs["probe"].dropna().unique()) if "probe" in runs else []
    for add_sections, listing in report_builders(probes).items():
        add_sections(report, runs_of(runs, listing), load_records, {probe: cfg.probes[probe] for probe in listing})
    if "engine" in study.varying_axes(runs):
        add_engine_sensitivity(report, runs, load_records, cfg)
    add_family(report, runs, {"metrics": chosen(cfg.family.metrics, probes, "family"), "alpha": cfg.family.alpha})
    if "seed" in study.varying_axes(runs):
        add_seed_summary(report, runs, chosen(cfg.seeds.metrics, probes, "summaries"), float(cfg.seeds.level))
    sign = {**declared_sign_test(probes), **{k: v for k, v in cfg.sign_test.items() if v is not None}}
    if sign.get("greater") is not None:
        add_sign_test(report, runs, sign["greater"], sign.get("than"), sign.get("alternative") or "greater")
    if "checkpoint" in study.varying_axes(runs):
        add_checkpoint_curves(report, runs, chosen(cfg.curves.metrics, probes, "curves"), cfg.curves.order,
                              float(cfg.seeds.level))
    add_warnings(report, runs, study.cell_axes(runs))
    mark_rows(report, runs)
    report.na = na_legend(runs)
    add_runs(report, runs)
    wanted = {*declared(probes, "main"), "seeds", "engines"}  # the probes' headlines and the shared ones
    report.headlines = [s.name for s in report.sections if s.name in wanted]
    report.main = next((s.name for s in report.sections if s.main), (report.headlines or ["runs"])[0])
    return report


def chosen(setting, probes: list[str], key: str) -> list[str]:
    """The report's setting when given, else what the reported probes declare under `report.<key>`."""
    return list(setting) if setting is not None else declared(probes, key)


def add_seed_summary(report: Report, runs: pd.DataFrame, metrics: list[str], level: float) -> None:
    """Mean, SD (ddof=1) and a Student-t interval across seeds, per cell and metric."""
    axes = study.cell_axes(runs, drop=("seed",))
    summary = study.seed_summary(runs, metrics, axes, level)
    if summary.empty:
        return
    note = (f"Across seeds per cell: mean, SD (ddof=1) and the {level:.0%} Student-t interval "
            "mean ± t(n−1)·SD/√n, cut to the values the metric can take (counts ≥ 0; rates, shares and P(Yes) "
            "gaps in [0, 1]; their differences in [−1, 1]; log10 p ≤ 0; as the module defining each metric "
            "declares it), which keeps its coverage and never passes the mean; a metric nothing declares is not cut. "
            "A p-value is never averaged: its row shows the seeds' combined p as the family combines them "
            "(K/ceil(K/2) × their median p). n: the seeds with a finite value (n of all when some were infinite or "
            "missing, said below). Metrics not logged by these runs are left out.")
    shown = render.seed_display(summary, axes)
    marks = cell_marks(runs, axes)
    if any(marks.values()):
        shown.insert(len(axes), "warnings", [marks[key] for key in cell_keys(summary, axes)])
        note += " warnings: what the cell's runs warn of (the warnings section tells each)."
    note = "\n".join([note, *left_out_lines(summary, axes), *na_lines(summary, runs, axes)])
    report.sections.append(Section("seeds", f"Seed summary ({level:.0%} interval across seeds)", summary,
                                   shown, note, main=True))


def cell_keys(frame: pd.DataFrame, axes: list[str]) -> list[tuple]:
    """Each row's cell: its values of `axes`, as strings."""
    return [tuple(str(v) for v in row) for row in frame[axes].itertuples(index=False)] if axes else \
        [()] * len(frame)


def cell_marks(runs: pd.DataFrame, axes: list[str]) -> dict[tuple, str]:
    """cell -> the marks (W1, ...) of its runs' warnings, each once."""
    _, by_run = marks_of(runs)
    cells: dict[tuple, list[str]] = {}
    for key, marks in zip(cell_keys(runs, axes), by_run):
        found = cells.setdefault(key, [])
        found += [m for m in marks.split(", ") if m and m not in found]
    return {key: ", ".join(found) for key, found in cells.items()}


def add_sign_test(report: Report, runs: pd.DataFrame, greater: str, than: Any, alternative: str) -> None:
    """Exact sign test of `greater` > `than` over cells (runs), with the count per cell group."""
    numeric_than = study.is_number(than)
    if greater not in runs or (not numeric_than and than not in runs):
        return
    comparisons = study.sign_comparisons(runs, greater, than)
    if comparisons.empty:
        return
    result = study.sign_test(comparisons, alternative)
    axes = study.cell_axes(runs, drop=("seed",))
    counts = study.sign_counts(comparisons, axes)
    total = {a: "" for a in axes}
    if axes:
        total[axes[0]] = "All cells"
    counts = pd.concat([counts, pd.DataFrame([{**total, "successes": result["successes"], "n": result["n"],
                                                "ties": result["n_ties"]}])], ignore_index=True)
    shown = counts[axes].astype(str).copy()
    shown[f"{greater} > {than}"] = [f"{s}/{n}" for s, n in zip(counts["successes"], counts["n"])]
    shown["ties"] = counts["ties"].astype(int).astype(str)
    sided = "one-sided" if alternative == "greater" else "two-sided"
    note = (f"{greater} > {than} in {result['successes']} of {result['n']} non-tied cells "
            f"({result['n_ties']} ties dropped); exact sign test, {sided}: "
            f"p = {format_p(result['log10_p'])} (log10 p = {result['log10_p']:.3f}).")
    report.sections.append(Section("sign_test", "Sign test over cells", counts, shown, note, pooled_last=True))
    cells = comparisons[[*study.cell_axes(runs), "run_id", "greater", "than", "outcome"]]
    report.sections.append(Section("sign_test_cells", "Sign test: every cell", cells))
    report.metrics.update({"sign_test_successes": result["successes"], "sign_test_n": result["n"],
                           "sign_test_ties": result["n_ties"], "sign_test_log10_p": result["log10_p"]})


def add_checkpoint_curves(report: Report, runs: pd.DataFrame, metrics: list[str], order, level: float) -> None:
    """Each metric against checkpoint order, one line per cell, seeds averaged with their interval."""
    line_axes = study.cell_axes(runs, drop=("seed", "checkpoint"))
    order = list(order) if order is not None else None
    curves = []
    for metric in metrics:
        if metric not in runs or runs[metric].isna().all():
            continue
        curve = study.checkpoint_curve(runs, metric, line_axes, order, level)
        report.figures[f"checkpoint_{metric}"] = checkpoint_curve_figure(curve, metric, line_axes)
        curves.append(curve.assign(metric=metric))
    if curves:
        table = pd.concat(curves, ignore_index=True)
        table = table[["metric", *[c for c in table.columns if c != "metric"]]]
        note = "Figures: " + ", ".join(f"figures/checkpoint_{m}.png" for m in table["metric"].unique())
        report.sections.append(Section("checkpoint_curves", "Checkpoint curves", table, None, note))


def add_runs(report: Report, runs: pd.DataFrame) -> None:
    """The source runs, so every row of every table can be traced to its MLflow run, each with its warnings' marks."""
    columns = ["run_id", "run_name", *study.AXES, "status"]
    table = runs.reindex(columns=columns)
    _, marks = marks_of(runs)
    if any(marks):
        table["warnings"] = marks
    report.sections.append(Section("runs", f"Source runs ({len(runs)})", table, table.fillna("").astype(str)))

