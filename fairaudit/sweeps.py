"""What a sweep's parent run shows at a glance: a dated name, its overrides and commit, and its children's headlines."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from fairaudit.console import console, print_result, summary_frame_table

HEADLINE_TAG = "fairaudit.headline"  # a job's headline metric names (JSON list), set by the job
SHOWN_METRICS = 6  # headline metrics per job in the console's sweep table


def git_commit(cwd: str | Path = ".") -> str:
    """The commit checked out where the sweep was started ("unknown" outside a git checkout)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def swept(overrides: list[str], params: dict | None = None) -> dict[str, str]:
    """The sweep's swept keys and their values ("dataset" -> "adult,compas"), from the command line and hydra.sweeper.params."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = [*overrides, *(f"{key}={value}" for key, value in (params or {}).items())]
    parsed = OverridesParser.create().parse_overrides(lines)
    return {o.key_or_group: o.input_line.split("=", 1)[1] for o in parsed if o.is_sweep_override()}


def swept_of(hydra) -> dict[str, str]:
    """`swept` of a sweep's `hydra` config node (its task overrides and sweeper params)."""
    params = hydra.sweeper.get("params")
    return swept(list(hydra.overrides.task), OmegaConf.to_container(params) if params else None)


def swept_in(sweep_dir: str | Path) -> dict[str, str]:
    """`swept_of` the sweep whose multirun.yaml (written by Hydra before its jobs start) is in `sweep_dir`."""
    path = Path(sweep_dir) / "multirun.yaml"
    return swept_of(OmegaConf.load(path).hydra) if path.exists() else {}


def sweep_run_name(swept_values: dict[str, str], now: datetime | None = None) -> str:
    """e.g. "sweep 2026-11-30 08:41 dataset=adult,compas": the date first, then what the sweep varies."""
    varied = " ".join(f"{key}={value}" for key, value in swept_values.items())
    return f"sweep {(now or datetime.now()):%Y-%m-%d %H:%M} {varied}".strip()[:120]


def override_params(overrides: list[str]) -> dict[str, str]:
    """The sweep's command-line overrides as params, key -> value(s)."""
    pairs = (o.lstrip("+~").split("=", 1) for o in overrides if "=" in o)
    return {f"sweep.{key}": value[:6000] for key, value in pairs}


def children_summary(client, parent_id: str) -> pd.DataFrame:
    """One row per child run (oldest first): run name, status and its headline metrics."""
    experiment = client.get_run(parent_id).info.experiment_id
    children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent_id}'", order_by=["attributes.start_time ASC"])
    rows = []
    for child in children:
        names = json.loads(child.data.tags.get(HEADLINE_TAG, "[]"))
        metrics = child.data.metrics
        rows.append({"run": child.info.run_name, "status": child.info.status,
                     **{name: metrics.get(name, float("nan")) for name in names}})
    return pd.DataFrame(rows)


def log_summary(client, parent_id: str, summary: pd.DataFrame, sweep_dir: Path) -> None:
    """The summary table and multirun.yaml on the parent run, and each child's headline metrics as
    `metric/<what differs>` (e.g. `cell_c/adult`), so the parent's charts compare the grid's cells."""
    if len(summary):
        client.log_table(parent_id, summary, "sweep_summary.json")
    for row in summary.to_dict("records"):
        for name, value in row.items():
            if name not in ("run", "status") and isinstance(value, (int, float)) and value == value:
                client.log_metric(parent_id, metric_key(f"{name}/{row['run'].split(' | ')[0]}"), float(value))
    multirun = sweep_dir / "multirun.yaml"
    if multirun.exists():
        client.log_artifact(parent_id, str(multirun))


def metric_key(name: str) -> str:
    """A name MLflow accepts as a metric key (letters, digits, _ - . / and spaces)."""
    return re.sub(r"[^\w\-./ ]", "_", name)[:250]


def print_summary(summary: pd.DataFrame, parent_id: str, uri: str) -> None:
    """The sweep's jobs as a table on stdout, then (on stderr) the parent run and the report command."""
    if len(summary):
        shown = list(summary.columns[:2 + SHOWN_METRICS])
        print_result(summary_frame_table("sweep jobs (all headline metrics: sweep_summary.json on the parent run)", summary[shown]))
    finished = int((summary["status"] == "FINISHED").sum()) if len(summary) else 0
    console.print(f"sweep parent run [bold]{parent_id}[/bold]: {len(summary)} jobs, {finished} finished", highlight=False)
    console.print(f"report: fairaudit report select.parent={parent_id}", highlight=False, soft_wrap=True)
    console.print(f"browse: mlflow ui --backend-store-uri {uri}", highlight=False, soft_wrap=True)

