"""The report job: select runs, build the study's tables and figures, write them, print the main one, log a run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from fairaudit import __version__
from fairaudit.console import console
from fairaudit.report import render
from fairaudit.report.build import Report, build
from fairaudit.report.runs import (MAX_TAG, Selection, left_out_summary, load_records, log_report, select_runs,
                                   source_tags)
from fairaudit.tracking import flatten
from fairaudit.validate import validate_tracking


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
    report = build(selection.runs, lambda ids, name="records": load_records(client, ids, name), cfg)
    settings = OmegaConf.to_container(cfg, resolve=True)
    out_dir = Path(settings.pop("output_dir"))
    files = write(report, selection, out_dir, OmegaConf.to_yaml(settings), cfg.tracking.uri)
    show(report, selection)
    run_id = None
    if cfg.log_to_mlflow:
        run_id = log(client, report, selection, out_dir, files, settings, cfg.tracking.experiment)
    console.print(f"wrote {len(files)} files to {out_dir}")
    console.print(f"see it with: mlflow ui --backend-store-uri {cfg.tracking.uri}")
    return ReportResult(report, selection, out_dir, files, run_id)


def log(client, report: Report, selection: Selection, out_dir: Path, files: list[Path], settings: dict,
        fallback_experiment: str) -> str:
    """The report as an MLflow run in its sources' experiment, tagged with them, its config as params."""
    tags = {**source_tags(selection), "fairaudit.version": __version__, "mlflow.note.content": run_note(report)}
    main = {report.main: report.section(report.main).table}
    run_id = log_report(client, report_experiment(client, selection, fallback_experiment), report_name(selection),
                        out_dir, files, tags, flatten(settings), report.metrics, main)
    console.print(f"MLflow report run [bold]{run_id}[/bold] (tag fairaudit.kind=report)")
    return run_id


def run_note(report: Report) -> str:
    """The main table as the report run's description in the MLflow UI (report.md holds everything)."""
    main = report.section(report.main)
    note = f"**{main.title}**\n\n{main.note}\n\n{render.markdown(main.shown)}\n\nAll tables: report.md in the artifacts."
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
             f"{len(selection.runs)} runs from `{uri}` selected by `{selection.filter_string}`."]
    if selection.parent:
        lines.append(f"Parent (sweep) run: `{selection.parent}`.")
    if not selection.left_out.empty:
        lines.append(f"Left out: {left_out_summary(selection.left_out)}.")
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
    """The main tables in the terminal (Table 2, the seed summary; else the runs) and the sign test's verdict."""
    printed = [s for s in report.sections if s.name in ("table2", "seeds")] or [report.section(report.main)]
    for section in printed:
        print_table(render.rich_table(section.shown, section.title, section.pooled_last))
        if section.note:
            console.print(section.note, style="dim", highlight=False)
    if any(s.name == "sign_test" for s in report.sections):
        console.print(report.section("sign_test").note, highlight=False)
    if not selection.left_out.empty:
        console.print(f"[yellow]matching runs left out: {left_out_summary(selection.left_out)}[/yellow]")


def print_table(table) -> None:
    """A rich table; off a terminal (a pipe, a log file) at its natural width rather than folded into 80 columns."""
    if console.is_terminal:
        console.print(table)
        return
    width = console.width
    console.width = max(width, console.measure(table, options=console.options.update_width(1000)).maximum)
    console.print(table)
    console.width = width
