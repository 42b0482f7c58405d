"""Assemble a study report from a runs frame: which tables, summaries and figures the selection supports.

No MLflow here: records come through a loader callable, so the whole report can be built from
frames in a test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pandas as pd

from fairaudit.analysis import study
from fairaudit.analysis.study_figures import checkpoint_curve_figure, delta_figure
from fairaudit.errors import AuditError
from fairaudit.report import papers, render

RecordsLoader = Callable[[list[str]], Mapping[str, pd.DataFrame]]


@dataclass
class Section:
    """One table of the report: numeric (CSV) and as shown (Markdown, terminal)."""

    name: str                 # file stem of its CSV
    title: str
    table: pd.DataFrame
    shown: pd.DataFrame | None = None   # None: CSV only
    note: str = ""
    pooled_last: bool = False


@dataclass
class Report:
    sections: list[Section] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    main: str | None = None   # name of the section printed in the terminal

    def section(self, name: str) -> Section:
        return next(s for s in self.sections if s.name == name)


def build(runs: pd.DataFrame, load_records: RecordsLoader, cfg) -> Report:
    """Paper tables with a pooled row, seed summaries, the sign test and checkpoint curves, as the runs allow.

    runs: one row per job run (run_id, run_name, status, study.AXES, baseline, metrics...).
    cfg: the report config (tables, seeds, sign_test, curves).
    """
    report = Report()
    add_paper_tables(report, runs, load_records, list(cfg.tables.probes))
    from fairaudit.report.influence_tables import add_influence_tables  # paper 002; imports this module

    add_influence_tables(report, runs, cfg.influence.condition, cfg.influence.rate)
    add_paper_sections(report, runs, load_records, cfg)
    if "seed" in study.varying_axes(runs):
        add_seed_summary(report, runs, list(cfg.seeds.metrics), float(cfg.seeds.level))
    add_sign_test(report, runs, cfg.sign_test.greater, cfg.sign_test.than, cfg.sign_test.alternative)
    if "checkpoint" in study.varying_axes(runs):
        add_checkpoint_curves(report, runs, list(cfg.curves.metrics), cfg.curves.order, float(cfg.seeds.level))
    add_runs(report, runs)
    report.main = next((s.name for s in report.sections if s.name in ("table2", "influence_table3", "seeds")), "runs")
    return report


def table_runs(runs: pd.DataFrame, probes: list[str]) -> pd.DataFrame:
    """Runs of the paired probes that logged contingency cells."""
    if "cell_a" not in runs:
        return runs.iloc[0:0]
    return runs[runs["probe"].isin(probes) & runs["cell_a"].notna()]


def comparison(rows: pd.DataFrame) -> tuple[str, str]:
    """The (treatment, baseline) arms every paired run compares; an AuditError when they differ."""
    arms = rows[["arm", "baseline"]].drop_duplicates()
    if len(arms) > 1 or arms["baseline"].isna().any():
        pairs = [f"{a} vs {b}" for a, b in arms.itertuples(index=False)]
        raise AuditError(f"the paired runs compare different arms ({pairs}); pool one comparison at a time, "
                         "e.g. select.tags.arm=think")
    return tuple(arms.iloc[0])


def add_paper_tables(report: Report, runs: pd.DataFrame, load_records: RecordsLoader, probes: list[str]) -> None:
    """Tables 2, 9, 5 and 7 of paper 000, one row per run and a pooled row from the pooled records."""
    rows = table_runs(runs, probes)
    if rows.empty:
        return
    treatment, baseline = comparison(rows)
    axes = study.cell_axes(rows)
    pooled = study.pooled_metrics(load_records(list(rows["run_id"])), treatment, baseline)
    tables = study.paper_tables(rows, pooled, treatment, baseline, axes)
    headers = render.paper_headers(treatment, baseline)
    captions = {
        "table2": ("Table 2: contingency cells, McNemar's exact test, mean D_disp in cells b and c",
                   f"Cells a-d of {treatment} against {baseline}; McNemar p is exact two-sided on (b, c); "
                   "the pooled row is computed from all runs' records pooled, not from their metrics."),
        "table9": ("Table 9: counterfactual and group disparity per arm",
                   f"D_cf and D_group under {treatment} and {baseline}, Δ = {treatment} − {baseline}."),
        "table5": ("Table 5: directional decomposition of created flips (cell c)",
                   "c α↑: alpha answered Yes and alpha' No under the treatment; δ_c in % of N."),
        "table7": ("Table 7: the asymmetric dual effect per model (Appendix D layout)",
                   f"Same protocol as Table 2; c:b the ratio of created to resolved flips; D_disp at full "
                   f"{treatment} depth within cells c and b."),
    }
    for name, table in tables.items():
        title, note = captions[name]
        report.sections.append(Section(name, title, table, render.display(table, headers), note, pooled_last=True))
    report.figures["disparity_changes"] = delta_figure(tables["table9"], axes, (treatment, baseline))
    report.metrics.update({f"pooled_{k}": v for k, v in pooled.items() if isinstance(v, (int, float))})
    report.metrics["n_table_runs"] = len(rows)


def add_paper_sections(report: Report, runs: pd.DataFrame, load_records: RecordsLoader, cfg) -> None:
    """Paper 000's Tables 3/10/11, 4, 13/14, 6, 12, App. G and Figs. 3, 4, 6; the position-bias paper's Tables 1-4, Figs. 2-4."""
    paired = runs[runs["probe"].isin(papers.PAIRED_PROBES)]
    if not paired.empty:
        sections, figures = papers.paper000_sections(runs, load_records, *comparison(paired), cfg.cdpg)
        report.sections += sections
        report.figures |= figures
    sections, figures = papers.paper001_sections(runs, load_records, dict(cfg.position.pairs))
    report.sections += sections
    report.figures |= figures


def add_seed_summary(report: Report, runs: pd.DataFrame, metrics: list[str], level: float) -> None:
    """Mean, SD (ddof=1) and a Student-t interval across seeds, per cell and metric."""
    axes = study.cell_axes(runs, drop=("seed",))
    summary = study.seed_summary(runs, metrics, axes, level)
    if summary.empty:
        return
    note = (f"Across seeds per cell: mean, SD (ddof=1) and the {level:.0%} Student-t interval "
            "mean ± t(n−1)·SD/√n. Metrics not logged by these runs are left out.")
    report.sections.append(Section("seeds", f"Seed summary ({level:.0%} interval across seeds)", summary,
                                   render.seed_display(summary, axes), note))


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
            f"p = {render.p_from_log10(result['log10_p'])} (log10 p = {result['log10_p']:.3f}).")
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
    """The source runs, so every row of every table can be traced to its MLflow run."""
    columns = ["run_id", "run_name", *study.AXES, "status"]
    table = runs.reindex(columns=columns)
    report.sections.append(Section("runs", f"Source runs ({len(runs)})", table, table.fillna("").astype(str)))

