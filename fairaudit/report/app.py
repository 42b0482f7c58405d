"""The report job: select runs, build the study's tables and figures, write them, print the main one, log a run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from rich.markup import escape

from fairaudit import __version__
from fairaudit.errors.secrets import redact
from fairaudit.report.build import Report, build
from fairaudit.report.runs import (
    Selection,
    left_out_summary,
    load_records,
    log_report,
    select_runs,
    selection_line,
    source_tags,
)
from fairaudit.terminal.output import console, out
from fairaudit.terminal.results import print_result, print_verdict
from fairaudit.tracking.content import finite_metrics
from fairaudit.tracking.location import validate_tracking
from fairaudit.tracking.runs import flatten
from fairaudit.tracking.tags import MAX_TAG, NOTE_TAG, VERSION_TAG
from fairaudit.tracking.ui import where_lines
from fairaudit.views import render


@dataclass
class ReportResult:
    report: Report
    selection: Selection
    out_dir: Path
    files: list[Path]
    run_id: str | None


def run(cfg: DictConfig) -> ReportResult:
    """Select, build, write, print and (unless log_to_mlflow=false) log the report."""
    from mlflow import MlflowClient

    validate_tracking(cfg.tracking.uri, cfg.tracking.experiment)  # one line, not a 5-minute retry, for a bad URI
    client = MlflowClient(cfg.tracking.uri)
    selection = select_runs(client, cfg.select)
    latest = cfg.select.parent == "latest" and not cfg.select.sweep_dir
    console.print(selection_line(client, selection, latest), highlight=False, soft_wrap=True)
    report = build(selection.runs, lambda ids, name="records": load_records(client, ids, name), cfg)
    settings = redact(OmegaConf.to_container(cfg, resolve=True))  # report.yaml and the run's params
    out_dir = Path(settings.pop("output_dir"))
    files = write(report, selection, out_dir, OmegaConf.to_yaml(settings), cfg.tracking.uri)
    show(report, selection)
    run_id = None
    if cfg.log_to_mlflow:
        run_id = log(client, report, selection, out_dir, files, settings, cfg.tracking.experiment)
        log_on_parent(client, selection.parent, report.parent_metrics)
    console.print(f"wrote {len(files)} files to {out_dir}", highlight=False, soft_wrap=True)
    experiment = client.get_run(run_id).info.experiment_id if run_id else str(selection.runs["experiment_id"].iloc[0])
    for line in where_lines(cfg.tracking.uri, experiment, run_id):
        console.print(line, highlight=False, soft_wrap=True)
    return ReportResult(report, selection, out_dir, files, run_id)


def log(client, report: Report, selection: Selection, out_dir: Path, files: list[Path], settings: dict,
        fallback_experiment: str) -> str:
    """The report as an MLflow run in its sources' experiment, tagged with them, its config as params."""
    tags = {**source_tags(selection), VERSION_TAG: __version__, NOTE_TAG: run_note(report)}
    main = {report.main: report.section(report.main).table}
    run_id = log_report(client, report_experiment(client, selection, fallback_experiment), report_name(selection),
                        out_dir, files, tags, flatten(settings), report.metrics, main)
    console.print(f"MLflow report run [bold]{run_id}[/bold] (tag fairaudit.kind=report)")
    return run_id


def log_on_parent(client, parent: str | None, metrics: dict[str, float]) -> None:
    """Metrics a report keeps with the study itself (e.g. the engine spreads) on its parent (sweep) run."""
    from mlflow.entities import Metric

    if parent and metrics:
        now = int(time.time() * 1000)
        client.log_batch(parent, metrics=[Metric(k, v, now, 0) for k, v in finite_metrics(metrics).items()])


def run_note(report: Report) -> str:
    """The main table as the report run's description in the MLflow UI (report.md holds everything)."""
    main = report.section(report.main)
    note = (f"**{main.title}**\n\n{main.note}\n\n{render.markdown(main.shown)}\n\n"
            "All tables: report.md in the artifacts.")
    if len(note) > MAX_TAG:
        return f"**{main.title}**: too large for a description; see report.md in the artifacts."
    return note


def report_experiment(client, selection: Selection, fallback: str) -> str:
    """The source runs' experiment when they share one, else `fallback` (created if missing)."""
    ids = selection.runs["experiment_id"].unique()
    if len(ids) == 1:
        return str(ids[0])
    experiment = client.get_experiment_by_name(fallback)
    return experiment.experiment_id if experiment else client.create_experiment(fallback)


def report_name(selection: Selection) -> str:
    return f"report {selection.parent[:8]}" if selection.parent else f"report {len(selection.runs)} runs"


def write(report: Report, selection: Selection, out_dir: Path, settings_yaml: str, uri: str) -> list[Path]:
    """report.md, one CSV per section, figures/*.png and the report's config; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for section in report.sections:
        path = out_dir / f"{section.name}.csv"
        section.table.to_csv(path, index=False)
        files.append(path)
    (out_dir / "figures").mkdir(exist_ok=True)
    for name, figure in report.figures.items():
        path = out_dir / "figures" / f"{name}.png"
        figure.savefig(path, dpi=150)
        files.append(path)
    md = out_dir / "report.md"
    md.write_text(markdown_report(report, selection, uri))
    config = out_dir / "report.yaml"
    config.write_text(settings_yaml)
    return [md, config, *files]


def markdown_report(report: Report, selection: Selection, uri: str) -> str:
    """Every shown section as a Markdown table with its caption, figures linked."""
    lines = ["# Study report", "",
             f"{len(selection.runs)} runs from `{redact(uri)}` selected by `{selection.filter_string}`."]
    if selection.parents:
        lines.append(f"Parent (sweep) run{'s' if len(selection.parents) > 1 else ''}: "
                     + ", ".join(f"`{p}`" for p in selection.parents) + ".")
    if not selection.left_out.empty:
        lines.append(f"Left out: {left_out_summary(selection.left_out)}.")
    lines += [f"Not finished: {line}." for line in selection.unfinished]
    lines += ["", *(f"- {line}" for line in report.warnings + report.na)] if report.warnings or report.na else []
    lines += [f"Not in this report: {line}." for line in report.missing]
    for section in report.sections:
        if section.shown is None and not section.note:
            continue
        lines += ["", f"## {section.title}", ""]
        if section.note:
            lines += [section.note, ""]
        if section.shown is not None:
            lines.append(render.markdown(section.shown))
    if report.figures:
        lines += ["", "## Figures", ""]
        lines += [f"![{name}](figures/{name}.png)" for name in report.figures]
    return "\n".join(lines) + "\n"


def show(report: Report, selection: Selection) -> None:
    """On stdout, the headline tables (each reported probe's `report.main` sections, the seed summary, the engines';
    else the main one) and the verdicts of the
    family of tests and the sign test; on stderr, one line per table the selection could not fill and the runs it
    left out."""
    printed = [report.section(name) for name in report.headlines] or [report.section(report.main)]
    for section in printed:
        print_result(render.rich_table(section.shown, section.title, section.pooled_last))
        if section.note:
            out.print(section.note, style="dim", highlight=False, soft_wrap=True)
    for name in ("family", "sign_test"):
        if any(s.name == name for s in report.sections):
            out.print(report.section(name).note, highlight=False, soft_wrap=True)
    print_verdict(report.na + report.warnings)  # why each n/a is n/a; what the runs warn of, with the runs it holds for
    for line in report.missing:
        console.print(f"[yellow]not in this report:[/yellow] {line}", highlight=False, soft_wrap=True)
    if not selection.left_out.empty:
        console.print(f"[yellow]matching runs left out: {left_out_summary(selection.left_out)}[/yellow]",
                      highlight=False, soft_wrap=True)
    for line in selection.unfinished:
        console.print(f"[yellow]not finished:[/yellow] {escape(line)}", highlight=False, soft_wrap=True)
