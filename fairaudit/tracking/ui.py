"""Where to see a run: its URL in the MLflow UI's Model training view, and the command that serves a local store."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from fairaudit.errors.secrets import redact

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
    """The lines that say where to look: (for a local store) the command that serves the UI, then the URL."""
    command = ui_command(uri)
    url = run_url(uri, experiment_id, run_id)
    return [f"start the MLflow UI with: {command}", f"then open: {url}"] if command else [f"open: {url}"]


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


def save_sweep_view(client, experiment_id: str, parent_id: str, name: str, state: dict) -> str:
    """A sweep's view (`sweep_view_state`) saved on its experiment, which MLflow lists among its saved views by
    `name`; returns its key, which `view_url` opens."""
    import json
    import time

    now = int(time.time() * 1000)
    envelope = {"name": name, "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
    client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + parent_id, json.dumps(envelope))
    return parent_id


def view_url(uri: str, experiment_id: str, key: str) -> str:
    """The runs page of an experiment in a saved view, as charts (the parallel-coordinates chart first)."""
    base = uri.rstrip("/") if served(uri) else UI_ADDRESS
    return f"{base}/#/experiments/{experiment_id}/runs{VIEW}&viewStateShareKey={key}&compareRunsMode=CHART"
