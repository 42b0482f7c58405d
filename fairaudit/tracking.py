"""MLflow tracking: one run per job, a parent run per sweep, everything a run needs to be repeated."""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from fairaudit.errors import AuditError

PARENT_ID_FILE = "mlflow_parent_run_id"
REACH_TIMEOUT_S = 5


def check_reachable(uri: str) -> None:
    """An http(s) tracking server answers its health check within a few seconds, else one AuditError."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=REACH_TIMEOUT_S)
    except (urllib.error.URLError, OSError) as error:
        raise AuditError(f"tracking.uri {uri}: the MLflow server does not answer ({getattr(error, 'reason', error)})") from None


def tracking_failure(error: BaseException, uri: str) -> AuditError | None:
    """The one-line error for a tracking server that stopped answering mid-run, or None for other errors."""
    from mlflow.exceptions import MlflowException

    if isinstance(error, MlflowException) and uri.startswith(("http://", "https://")):
        first_line = str(error).strip().splitlines()[0][:300]
        return AuditError(f"tracking.uri {uri} failed mid-run ({first_line}); the results computed so far are in "
                          "the store, a re-run logs them without model calls")
    return None


def flatten(cfg: dict, prefix: str = "") -> dict[str, str]:
    """Nested config as flat dotted params (MLflow values are strings of at most 6000 characters)."""
    flat: dict[str, str] = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:6000]
    return flat


def finite_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Metrics MLflow can store as numbers; the rest (nan, inf) live in metrics.json."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}


class Tracker:
    """One MLflow run, opened after the inputs are validated and closed FINISHED or FAILED."""

    def __init__(self, uri: str, experiment: str):
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(uri)
        self.uri = uri
        self.experiment_id = mlflow.set_experiment(experiment).experiment_id
        self.run = None

    def start(self, run_name: str, tags: dict[str, str], params: dict[str, str], parent_run_id: str | None = None) -> str:
        """Open the job's run (as a child of `parent_run_id` in a sweep) and log tags and params."""
        self.run = self.mlflow.start_run(run_name=run_name, experiment_id=self.experiment_id, parent_run_id=parent_run_id, tags=tags)
        items = list(params.items())
        for start in range(0, len(items), 100):
            self.mlflow.log_params(dict(items[start:start + 100]))
        return self.run.info.run_id

    def log_config(self, cfg: DictConfig, overrides: list[str]) -> None:
        """The resolved config and the command-line overrides, so the run can be repeated exactly."""
        self.mlflow.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config/config.yaml")
        self.mlflow.log_text("\n".join(overrides) + "\n", "config/overrides.txt")

    def log_result(self, metrics: dict[str, float], tables: dict[str, pd.DataFrame], figures: dict[str, Any],
                   records: dict[str, pd.DataFrame]) -> None:
        """Metrics, tables (parquet + MLflow table), figures (PNG) and records (parquet)."""
        self.mlflow.log_metrics(finite_metrics(metrics))
        self.mlflow.log_dict({k: (v if isinstance(v, (int, float)) else str(v)) for k, v in metrics.items()}, "metrics.json")
        with tempfile.TemporaryDirectory() as tmp:
            for name, table in tables.items():
                path = Path(tmp) / f"{name}.parquet"
                table.to_parquet(path)
                self.mlflow.log_artifact(str(path), "tables")
                self.mlflow.log_table(data=table.reset_index() if _has_named_index(table) else table, artifact_file=f"tables/{name}.json")
            for name, frame in records.items():
                path = Path(tmp) / f"{name}.parquet"
                frame.to_parquet(path)
                self.mlflow.log_artifact(str(path), "records")
        for name, figure in figures.items():
            self.mlflow.log_figure(figure, f"figures/{name}.png")

    def end(self, failed: bool = False) -> None:
        """Close the run; closing a failed run is best effort (its server may be the failure)."""
        if self.run is not None:
            self.run = None
            if not failed:
                self.mlflow.end_run(status="FINISHED")
                return
            with contextlib.suppress(Exception):
                self.mlflow.end_run(status="FAILED")


def _has_named_index(table: pd.DataFrame) -> bool:
    return any(name is not None for name in table.index.names)


def parent_run_id(sweep_dir: str | Path) -> str | None:
    """The sweep's parent run, written by SweepCallback when the multirun started."""
    path = Path(sweep_dir) / PARENT_ID_FILE
    return path.read_text().strip() if path.exists() else None


class SweepCallback(Callback):
    """Hydra callback: a parent MLflow run for each multirun, its jobs become children."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.core.hydra_config import HydraConfig
        from mlflow.tracking import MlflowClient

        import mlflow

        from fairaudit.console import run_or_exit

        HydraConfig.instance().set_config(config)  # so ${hydra:runtime.cwd} in tracking.uri resolves
        run_or_exit(check_reachable, config.tracking.uri)
        mlflow.set_tracking_uri(config.tracking.uri)
        experiment = mlflow.set_experiment(config.tracking.experiment)
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        overrides = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
        run = MlflowClient(config.tracking.uri).create_run(
            experiment.experiment_id,
            run_name=f"sweep {sweep_dir.name}",
            tags={"fairaudit.kind": "sweep", "fairaudit.sweep_dir": str(sweep_dir), "fairaudit.overrides": json.dumps(overrides)},
        )
        (sweep_dir / PARENT_ID_FILE).write_text(run.info.run_id)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from mlflow.tracking import MlflowClient

        run_id = parent_run_id(config.hydra.sweep.dir)
        if run_id:
            client = MlflowClient(config.tracking.uri)
            children = client.search_runs(
                [client.get_run(run_id).info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'"
            )
            failed = any(child.info.status != "FINISHED" for child in children)
            client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")
