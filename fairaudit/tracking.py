"""MLflow tracking: one run per job, a parent run per sweep, everything a run needs to be repeated."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from fairaudit import sweeps
from fairaudit.console import quiet_libraries

PARENT_ID_FILE = "mlflow_parent_run_id"


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


def json_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Metrics as strict JSON values: numbers, null for nan/inf (JSON has neither), strings for the rest."""
    def value(v: Any) -> Any:
        if isinstance(v, (int, float)):
            return v if math.isfinite(v) else None
        return str(v)
    return {k: value(v) for k, v in metrics.items()}


class Tracker:
    """One MLflow run, opened after the inputs are validated and closed FINISHED or FAILED."""

    def __init__(self, uri: str, experiment: str):
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(uri)
        self.uri = uri
        self.experiment_id = mlflow.set_experiment(experiment).experiment_id
        # MLflow 3's UI opens an experiment of this kind in its "Model training" view (runs, params, metrics)
        mlflow.MlflowClient(uri).set_experiment_tag(self.experiment_id, "mlflow.experimentKind", "custom_model_development")
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
        self.mlflow.log_dict(json_metrics(metrics), "metrics.json")
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

    def set_tags(self, tags: dict[str, str]) -> None:
        self.mlflow.set_tags(tags)

    def log_texts(self, texts: dict[str, str]) -> None:
        """Text artifacts by file name (e.g. samples.html, samples.jsonl)."""
        for name, text in texts.items():
            self.mlflow.log_text(text, name)

    def end(self, failed: bool = False) -> None:
        if self.run is not None:
            self.mlflow.end_run(status="FAILED" if failed else "FINISHED")
            self.run = None


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

        HydraConfig.instance().set_config(config)  # so ${hydra:runtime.cwd} in tracking.uri resolves
        quiet_libraries()
        mlflow.set_tracking_uri(config.tracking.uri)
        experiment = mlflow.set_experiment(config.tracking.experiment)
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        overrides = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
        client = MlflowClient(config.tracking.uri)
        run = client.create_run(
            experiment.experiment_id,
            run_name=sweeps.sweep_run_name(sweeps.swept_of(config.hydra)),
            tags={"fairaudit.kind": "sweep", "fairaudit.sweep_dir": str(sweep_dir), "fairaudit.overrides": json.dumps(overrides),
                  "mlflow.source.git.commit": sweeps.git_commit(config.hydra.runtime.cwd)},
        )
        (sweep_dir / PARENT_ID_FILE).write_text(run.info.run_id)
        for key, value in sweeps.override_params(overrides).items():
            client.log_param(run.info.run_id, key, value)
        client.log_text(run.info.run_id, "\n".join(overrides) + "\n", "config/overrides.txt")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from mlflow.tracking import MlflowClient

        run_id = parent_run_id(config.hydra.sweep.dir)
        if run_id:
            client = MlflowClient(config.tracking.uri)
            children = client.search_runs(
                [client.get_run(run_id).info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'"
            )
            failed = any(child.info.status != "FINISHED" for child in children)
            summary = sweeps.children_summary(client, run_id)
            sweeps.log_summary(client, run_id, summary, Path(config.hydra.sweep.dir))
            client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")
            sweeps.print_summary(summary, run_id, config.tracking.uri)
