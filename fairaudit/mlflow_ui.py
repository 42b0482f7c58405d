"""Where to see a run: its URL in the MLflow UI's Model training view, and the command that serves a local store."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from fairaudit.redact import hide_password

UI_ADDRESS = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default
VIEW = "?workflowType=machine_learning"  # MLflow 3's Model training view (runs, params, metrics), not its GenAI view


def served(uri: str) -> bool:
    """The tracking URI is a server with its own UI (else a local store that `mlflow ui` serves)."""
    return uri.startswith(("http://", "https://"))


def run_url(uri: str, experiment_id: str, run_id: str | None = None) -> str:
    """The run's page (or the experiment's, without a run) in the Model training view."""
    base = hide_password(uri).rstrip("/") if served(uri) else UI_ADDRESS
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
    return f"{mlflow_program()} ui --backend-store-uri {shlex.quote(hide_password(uri))}"


def where_lines(uri: str, experiment_id: str, run_id: str | None = None) -> list[str]:
    """The lines that say where to look: (for a local store) the command that serves the UI, then the URL."""
    command = ui_command(uri)
    url = run_url(uri, experiment_id, run_id)
    return [f"start the MLflow UI with: {command}", f"then open: {url}"] if command else [f"open: {url}"]
