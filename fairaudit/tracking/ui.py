"""Where to see a run: its URL in the MLflow UI's Model training view, and the command that serves a local store."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from fairaudit.errors.secrets import redact
from fairaudit.tracking.retries import logged_despite_a_race

UI_ADDRESS = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default
VIEW = "?workflowType=machine_learning"  # MLflow 3's Model training view (runs, params, metrics), not its GenAI view


def served(uri: str) -> bool:
    """The tracking URI is a server with its own UI (else a local store that `mlflow ui` serves)."""
    return uri.startswith(("http://", "https://"))


def run_url(uri: str, experiment_id: str, run_id: str | None = None) -> str:
    """The run's page (or the experiment's, without a run) in the Model training view."""
    base = redact(uri).rstrip("/") if served(uri) else UI_ADDRESS
    page = f"#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{base}/{page}{VIEW}"


def mlflow_program() -> str:
    """`mlflow` when it is on PATH, else this interpreter's environment's script (e.g. .venv/bin/mlflow),
    else `python -m mlflow`; a path inside the working folder is shown relative to it."""
    if shutil.which("mlflow"):
        return "mlflow"
    script = Path(sys.executable).parent / "mlflow"
    program = script if script.exists() else None
    if program is None:
        return f"{shlex.quote(sys.executable)} -m mlflow"
    try:
        return str(Path(os.path.relpath(program)) if not os.path.relpath(program).startswith("..") else program)
    except ValueError:  # another drive
        return str(program)


def ui_command(uri: str) -> str | None:
    """The full command that serves a local store's UI (None for a tracking server: it has its own)."""
    if served(uri):
        return None
    return f"{mlflow_program()} ui --backend-store-uri {shlex.quote(redact(uri))}"


def where_lines(uri: str, experiment_id: str, run_id: str | None = None) -> list[str]:
    """The lines that say where to look: (for a local store) the command that serves the UI, then the URL, then the
    experiment's jobs side by side (`jobs_view_state`)."""
    command = ui_command(uri)
    url = run_url(uri, experiment_id, run_id)
    lines = [f"start the MLflow UI with: {command}", f"then open: {url}"] if command else [f"open: {url}"]
    return lines + [f"every job of the experiment, side by side: {view_url(uri, experiment_id, JOBS_VIEW, False)}"]


SHARED_VIEW_TAG = "mlflow.sharedViewState."  # MLflow 3's saved views: an experiment tag each, opened by its key


def sweep_view_state(parent_id: str, axes: list[str], columns: list[str], charted: list[str]) -> dict:
    """The runs page as a sweep is compared (MLflow 3.17's saved-view state): its jobs alone (a search on their
    parent, sorted by name so they are not nested under it), all shown, the axes it varies and the metrics
    `columns` as table columns, and a parallel-coordinates chart over those axes (as params) and the metrics
    `charted`, ahead of the per-metric charts MLflow draws itself."""
    section = "fairaudit-sweep"
    chart = {"uuid": f"fairaudit-parallel-{parent_id}", "type": "PARALLEL", "runsCountToCompare": 100,
             "metricSectionId": section, "deleted": False, "isGenerated": False, "selectedParams": axes,
             "selectedMetrics": charted, "showAllRuns": True}
    return {"searchFilter": f"tags.mlflow.parentRunId = '{parent_id}'", "orderByKey": "tags.`mlflow.runName`",
            "orderByAsc": True, "runsHiddenMode": "SHOW_ALL",
            "selectedColumns": [*(f"params.`{a}`" for a in axes), *(f"metrics.`{m}`" for m in columns)],
            "compareRunCharts": [chart],
            "compareRunSections": [{"uuid": section, "name": "Sweep: its axes and headline metrics", "display": True,
                                    "isReordered": False, "deleted": False, "isGenerated": False, "columns": 1,
                                    "cardHeight": 480}]}  # the chart alone on its row


def save_view_state(client, experiment_id: str, key: str, name: str, state: dict) -> str:
    """A view (`sweep_view_state`, keyed by the sweep's parent id; `jobs_view_state`, keyed JOBS_VIEW) saved on the
    experiment, which MLflow lists among its saved views by `name`; returns its key, which `view_url` opens."""
    import json
    import time

    now = int(time.time() * 1000)
    envelope = {"name": name, "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
    logged_despite_a_race(lambda: client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + key, json.dumps(envelope)))
    return key


JOBS_VIEW = "fairaudit-jobs"  # the experiment's view of its job runs, which every run and sweep prints
RUN_NAME_COLUMN = "attributes.`Run Name`"
NAME_PX = (6.2, 90, 190, 640)  # the run name column: px per character, besides, at least, at most


def jobs_view_state(axes: list[str], metrics: list[str], longest_name: int) -> dict:
    """The runs page as it should open on an experiment (MLflow 3.17's saved-view state): its job runs alone (not
    nested under their sweeps: MLflow nests only runs sorted by start time, so these are sorted by name, which
    leads with what sets each apart), the run names whole, the grid's `axes` (as params) and the headline `metrics`
    as columns, in that order."""
    px, besides, least, most = NAME_PX
    width = int(min(most, max(least, px * longest_name + besides)))
    columns = [*(f"params.`{a}`" for a in axes), *(f"metrics.`{m}`" for m in metrics)]
    return {"searchFilter": "tags.`fairaudit.kind` = 'job'", "orderByKey": "tags.`mlflow.runName`",
            "orderByAsc": True, "selectedColumns": columns, "columnOrder": [RUN_NAME_COLUMN, *columns],
            "columnWidths": {RUN_NAME_COLUMN: width}}


def view_url(uri: str, experiment_id: str, key: str, charts: bool = True) -> str:
    """The runs page of an experiment in a saved view: as charts (a sweep's parallel-coordinates chart first), or
    as its table."""
    base = redact(uri).rstrip("/") if served(uri) else UI_ADDRESS
    return (f"{base}/#/experiments/{experiment_id}/runs{VIEW}&viewStateShareKey={key}"
            + ("&compareRunsMode=CHART" if charts else ""))
