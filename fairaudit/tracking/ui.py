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
    return lines + [f"every job of the experiment, side by side: {view_url(uri, experiment_id, JOBS_VIEW)}"]


SHARED_VIEW_TAG = "mlflow.sharedViewState."  # MLflow 3's saved views: an experiment tag each, opened by its key


def sweep_view_state(parent_id: str, axes: list[str], columns: list[str], charted: list[str],
                     longest_name: int) -> dict:
    """The runs page as a sweep is compared (MLflow 3.17's saved-view state): its jobs alone (a search on their
    parent, sorted by name so they are not nested under it), all shown, laid out as `table_layout` says (whole names,
    the metrics `columns`, then the axes it varies), and, in its charts, a parallel-coordinates chart over those axes
    (as params) and the metrics `charted`, ahead of the per-metric charts MLflow draws itself."""
    section = "fairaudit-sweep"
    chart = {"uuid": f"fairaudit-parallel-{parent_id}", "type": "PARALLEL", "runsCountToCompare": 100,
             "metricSectionId": section, "deleted": False, "isGenerated": False, "selectedParams": axes,
             "selectedMetrics": charted, "showAllRuns": True}
    return {"searchFilter": f"tags.mlflow.parentRunId = '{parent_id}'", "orderByKey": "tags.`mlflow.runName`",
            "orderByAsc": True, "runsHiddenMode": "SHOW_ALL", **table_layout(axes, columns, longest_name),
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
CREATED_COLUMN = "runDateAndNestInfo"  # MLflow 3.17's Created column (its grid field), pinned beside the name
NAME_PX = (5.8, 40, 150, 560)  # the run name column: px per character, besides, at least, at most
CREATED_PX, METRIC_PX = 64, 80  # the Created column's width (its status icon, the time cut) and each metric column's
FIRST_SCREEN_PX = 1070  # the runs table's width in a 1,400 x 900 window, its checkbox column aside


def name_width(longest_name: int) -> int:
    """The run name column's width in px: the longest name whole."""
    px, besides, least, most = NAME_PX
    return int(min(most, max(least, px * longest_name + besides)))


def first_screen(metrics: list[str], name_px: int) -> list[str]:
    """`metrics` in the order the runs table shows them: as many as fit beside the names in a 1,400-px window, the
    P(Yes) gaps among them (the measure that still moves when every answer is the same), then the rest."""
    room = max(0, (FIRST_SCREEN_PX - name_px - CREATED_PX) // METRIC_PX)
    gaps = [m for m in metrics if "p_gap" in m][:room]
    shown = [m for m in metrics if m not in gaps][:room - len(gaps)] + gaps
    return shown + [m for m in metrics if m not in shown]


def table_layout(axes: list[str], metrics: list[str], longest_name: int) -> dict:
    """The runs table's columns in a saved view: the run names whole, the `metrics` the first screen holds
    (`first_screen`), then the rest and the grid's `axes` (as params), which the names already spell out."""
    width = name_width(longest_name)
    columns = [*(f"metrics.`{m}`" for m in first_screen(metrics, width)), *(f"params.`{a}`" for a in axes)]
    return {"selectedColumns": columns, "columnOrder": [RUN_NAME_COLUMN, CREATED_COLUMN, *columns],
            "columnWidths": {RUN_NAME_COLUMN: width, CREATED_COLUMN: CREATED_PX,
                             **{f"metrics.`{m}`": METRIC_PX for m in metrics}}}


def jobs_view_state(axes: list[str], metrics: list[str], longest_name: int) -> dict:
    """The runs page as it should open on an experiment (MLflow 3.17's saved-view state): its job runs alone (not
    nested under their sweeps: MLflow nests only runs sorted by start time, so these are sorted by name, which
    leads with what sets each apart), laid out as `table_layout` says."""
    return {"searchFilter": "tags.`fairaudit.kind` = 'job'", "orderByKey": "tags.`mlflow.runName`",
            "orderByAsc": True, **table_layout(axes, metrics, longest_name)}


def view_url(uri: str, experiment_id: str, key: str, charts: bool = False) -> str:
    """The runs page of an experiment in a saved view: as its table, or as charts (a sweep's parallel-coordinates
    chart first)."""
    base = redact(uri).rstrip("/") if served(uri) else UI_ADDRESS
    return (f"{base}/#/experiments/{experiment_id}/runs{VIEW}&viewStateShareKey={key}"
            + ("&compareRunsMode=CHART" if charts else ""))
