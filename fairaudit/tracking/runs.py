"""MLflow runs: one per job, opened after its inputs are checked and closed FINISHED, FAILED or KILLED, holding
everything the run needs to be repeated; a run a killed process left RUNNING is closed by the next of its job."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from fairaudit.analysis.degenerate import WARNING
from fairaudit.analysis.undefined import reasons_by_text, why_undefined
from fairaudit.errors import AuditError
from fairaudit.errors.disk import size_of
from fairaudit.errors.interrupt import command_line
from fairaudit.errors.locks import is_locked
from fairaudit.errors.secrets import redact
from fairaudit.processes import identity, is_gone
from fairaudit.tracking.database import (
    close_on_a_full_disk,
    create_experiment,
    logged_despite_a_race,
    prepare_tracking,
    server_problem,
    tracking_fault,
)
from fairaudit.tracking.http import bound_requests, one_try
from fairaudit.tracking.scratch import scratch
from fairaudit.tracking.tags import (
    ERROR_TAG,
    EXPERIMENT_KIND_TAG,
    HEADLINE_TAG,
    KEY_TAG,
    MAX_TAG,
    MODEL_TRAINING_KIND,
    NOTE_TAG,
    PARENT_ID_FILE,
    PROCESS_TAGS,
    RESUMES_TAG,
    SUPERSEDED_TAG,
    UNBOUNDED_TAG,
    UNDEFINED_TAG,
    WARNINGS_TAG,
)


def tracking_failure(error: BaseException, uri: str) -> AuditError | None:
    """The one-line error for a tracking server that stopped answering mid-run, or None for other errors."""
    from mlflow.exceptions import MlflowException

    if isinstance(error, MlflowException) and uri.startswith(("http://", "https://")):
        first_line = str(error).strip().splitlines()[0][:300]
        return AuditError(f"tracking.uri {redact(uri)} failed mid-run ({first_line}); the results computed so "
                          f"far are in the store, once the server answers the same command logs them without model "
                          f"calls: {command_line()}")
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
    """Metrics MLflow can store as numbers, as they are (a p of 2.2e-46 too); the rest (nan, inf, a p below the
    smallest double, which is NaN beside its `*_log10_p`) live in metrics.json."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def unbounded_note(metrics: dict[str, Any]) -> str | None:
    """The note a run carries (tag UNBOUNDED_TAG) for metrics that are infinite, e.g. an interval unbounded above:
    MLflow stores finite numbers only, so they are absent from its metrics and null in metrics.json."""
    names = sorted(k for k, v in metrics.items() if isinstance(v, float) and math.isinf(v))
    if not names:
        return None
    return ", ".join(f"{k}={'+' if metrics[k] > 0 else '-'}inf" for k in names) + " (unbounded; not logged as metrics)"


def json_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Metrics as strict JSON values: numbers, null for nan/inf (JSON has neither), strings for the rest."""
    def value(v: Any) -> Any:
        if isinstance(v, (int, float)):
            return v if math.isfinite(v) else None
        return str(v)
    return {k: value(v) for k, v in metrics.items()}


def experiment_id(client, name: str) -> str:
    """The id of experiment `name`, created if missing (a concurrent creator may win the race)."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return create_experiment(client, name)
        except Exception:
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if experiment.lifecycle_stage == "deleted":
        raise AuditError(f"tracking.experiment {name!r} is deleted in {client.tracking_uri}; "
                         "restore it (mlflow experiments restore) or choose another name")
    return experiment.experiment_id


def config_key(*parts: Any) -> str:
    """A stable hash naming a job (its resolved config and overrides) or a sweep (its overrides); computed with
    passwords hidden, so a job is the same job whatever its password (and the hash reveals nothing of it)."""
    return hashlib.sha256(json.dumps(redact(list(parts)), sort_keys=True, default=str).encode()).hexdigest()[:20]


def process_tags() -> dict[str, str]:
    """Which process owns a run, so a later run can tell that it died without closing it."""
    return dict(zip(PROCESS_TAGS, identity()))


def owner_is_dead(tags: dict[str, str]) -> bool:
    """The run's process is gone (`processes.is_gone`); runs owned by another host are left alone."""
    return is_gone(*(tags.get(name) for name in PROCESS_TAGS))


def close_stale_runs(client, experiment: str, key: str, successor: str) -> list[str]:
    """Runs of the same job (or sweep) left RUNNING by a dead process: closed KILLED, linked to `successor`."""
    stale = [run for run in client.search_runs([experiment],
                                               f"tags.`{KEY_TAG}` = '{key}' AND attributes.status = 'RUNNING'")
             if run.info.run_id != successor and owner_is_dead(run.data.tags)]
    for run in stale:
        client.set_tag(run.info.run_id, SUPERSEDED_TAG, successor)
        client.set_terminated(run.info.run_id, status="KILLED")
    return [run.info.run_id for run in stale]


def supersede_ended(client, experiment: str, key: str, successor: str) -> None:
    """Earlier ended runs (FINISHED or FAILED) of the job that `successor` just finished are marked
    replaced by it; the report skips them."""
    for run in client.search_runs([experiment], f"tags.`{KEY_TAG}` = '{key}' AND attributes.status != 'RUNNING'"):
        if run.info.run_id != successor and SUPERSEDED_TAG not in run.data.tags:
            client.set_tag(run.info.run_id, SUPERSEDED_TAG, successor)


def open_tracking(uri: str, experiment: str):
    """A client on a ready tracking store and the experiment's id; a server that is down or a local database kept
    locked is one AuditError line."""
    import mlflow
    from mlflow.tracking import MlflowClient

    bound_requests(uri)  # an HTTP server's requests: seconds each, not MLflow's minutes of retries
    problem = server_problem(uri)  # a server that is down: one line in seconds, not MLflow's minutes of retries
    if problem:
        raise AuditError(problem)
    try:
        prepare_tracking(uri)
        mlflow.set_tracking_uri(uri)
        client = MlflowClient(uri)
        return client, experiment_id(client, experiment)
    except Exception as error:
        fault = None if isinstance(error, AuditError) else tracking_fault(error, uri, mlflow_only=False)
        if fault is None:
            raise
        raise fault from None


class Tracker:
    """One MLflow run, opened after the inputs are validated and closed FINISHED or FAILED.

    A run tagged with a job key closes the runs of the same job that a killed process left RUNNING
    (KILLED, superseded by this one) and, when it finishes, supersedes earlier ended runs of that job.
    """

    def __init__(self, uri: str, experiment: str):
        import mlflow

        self.mlflow = mlflow
        self.uri = uri
        self.client, self.experiment_id = open_tracking(uri, experiment)
        # the kind of experiment this is; MLflow 3.17's UI opens the GenAI view anyway, so the printed run URL
        # carries ?workflowType=machine_learning (mlflow_ui.VIEW) to open "Model training" (runs, params, metrics)
        logged_despite_a_race(lambda: self.client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND_TAG,
                                                                       MODEL_TRAINING_KIND))
        self.run = None
        self.key: str | None = None
        self.writing = ("", 0)  # the artifact being logged and its bytes, named when its disk fills

    def start(self, run_name: str, tags: dict[str, str], params: dict[str, str],
              parent_run_id: str | None = None, config: Mapping | None = None) -> str:
        """Open the job's run (as a child of `parent_run_id` in a sweep) and log tags and params, the resolved
        `config` flattened among them."""
        self.key = tags.get(KEY_TAG)
        params = {**params, **flatten(dict(config or {}))}
        tags, params = redact(tags, by_name=False), redact(params)  # a param is named by its config key
        self.run = self.mlflow.start_run(run_name=redact(run_name), experiment_id=self.experiment_id,
                                         parent_run_id=parent_run_id, tags={**tags, **process_tags()})
        run_id = self.run.info.run_id
        if self.key:
            killed = close_stale_runs(self.client, self.experiment_id, self.key, run_id)
            if killed:
                self.mlflow.set_tag(RESUMES_TAG, ",".join(killed))
        items = list(params.items())
        for start in range(0, len(items), 100):
            self.mlflow.log_params(dict(items[start:start + 100]))
        return run_id

    def finish(self, config: Mapping, overrides: list[str], dataset: tuple[str, str], result, samples,
               verdict: list[str], title: str) -> None:
        """Everything a finished job logs, then its run closed FINISHED: its config and overrides, its data set as an
        input (`dataset`: its name and where it was read), the result's metrics, tables, figures and records (a
        `ProbeResult`), the per-sample pages of its records in the probe's layout (`samples`: a `SampleView`), its
        verdict, its headline."""
        frame = result.records[samples.frame]
        self.log_config(config, overrides)
        self.log_dataset(frame, *dataset)
        self.log_result(result.metrics, result.tables, result.figures, result.records)
        self.log_samples(frame, samples.layout, title)
        self.log_verdict(verdict, result.metrics)  # verdict.txt, warnings.txt, the description and warning tags
        self.set_tags({HEADLINE_TAG: json.dumps(result.headline)})
        self.end()

    def log_config(self, settings: Mapping, overrides: list[str]) -> None:
        """The resolved config and the command-line overrides, so the run can be repeated exactly."""
        from omegaconf import OmegaConf

        config = OmegaConf.to_yaml(OmegaConf.create(redact(dict(settings))))
        self.writing = ("config/config.yaml", len(config.encode()))
        self.mlflow.log_text(config, "config/config.yaml")
        self.mlflow.log_text("\n".join(redact(list(overrides))) + "\n", "config/overrides.txt")

    def log_result(self, metrics: dict[str, float], tables: dict[str, pd.DataFrame], figures: dict[str, Any],
                   records: dict[str, pd.DataFrame]) -> None:
        """Metrics, tables (parquet + MLflow table), figures (PNG) and records (parquet)."""
        self.mlflow.log_metrics(finite_metrics(metrics))
        self.mlflow.log_dict(json_metrics(metrics), "metrics.json")
        note = unbounded_note(metrics)
        if note:
            self.mlflow.set_tag(UNBOUNDED_TAG, note[:MAX_TAG])
        with scratch() as tmp:  # one a killed job left is removed
            for name, table in tables.items():
                path = Path(tmp) / f"{name}.parquet"
                table.to_parquet(path)
                self.writing = (f"tables/{path.name}", path.stat().st_size)
                self.mlflow.log_artifact(str(path), "tables")
                self.mlflow.log_table(data=table.reset_index() if _has_named_index(table) else table,
                                      artifact_file=f"tables/{name}.json")
            for name, frame in records.items():
                path = Path(tmp) / f"{name}.parquet"
                frame.to_parquet(path)
                self.writing = (f"records/{path.name}", path.stat().st_size)
                self.mlflow.log_artifact(str(path), "records")
        for name, figure in figures.items():
            self.mlflow.log_figure(figure, f"figures/{name}.png")

    def log_steps(self, name: str, values: list[float]) -> None:
        """One metric's values as its steps 0, 1, ... (e.g. each worker's computed calls)."""
        for step, value in enumerate(values):
            self.mlflow.log_metric(name, value, step=step)

    def set_tags(self, tags: dict[str, str]) -> None:
        self.mlflow.set_tags(redact(tags, by_name=False))

    def log_dataset(self, frame: pd.DataFrame, name: str, source: str) -> None:
        """The job's data set as an MLflow input (the runs table's Dataset column): its sampled rows' digest,
        schema and size, named `name`, its source the file or data root it was read from."""
        import warnings

        import mlflow.data

        with warnings.catch_warnings():  # its schema inference (as it is built and logged) warns about integer
            warnings.simplefilter("ignore")  # columns, which records never null
            dataset = mlflow.data.from_pandas(frame, source=source, name=name)
            logged_despite_a_race(lambda: self.mlflow.log_input(dataset, context="audit"))

    def log_verdict(self, verdict: list[str], metrics: Mapping[str, Any]) -> None:
        """The verdict as verdict.txt and the run's description; its warnings (the lines that start `warning: `) as
        warnings.txt and the WARNINGS_TAG, so every table that shows this run's numbers can show them beside; why
        each undefined metric is n/a as the UNDEFINED_TAG (JSON: reason -> metrics)."""
        warnings = [line[len(WARNING):] for line in verdict if line.startswith(WARNING)]
        texts = {"verdict.txt": "\n".join(verdict) + "\n"}
        tags = {NOTE_TAG: "\n\n".join(verdict)[:MAX_TAG]}
        if warnings:
            texts["warnings.txt"] = "\n".join(warnings) + "\n"
            tags[WARNINGS_TAG] = "\n".join(warnings)[:MAX_TAG]
        undefined = reasons_by_text(why_undefined(metrics))
        if undefined:
            tags[UNDEFINED_TAG] = json.dumps(undefined)[:MAX_TAG]
        self.log_texts(texts)
        self.set_tags(tags)

    def log_texts(self, texts: dict[str, str]) -> None:
        """Text artifacts by file name (e.g. samples.html, samples.jsonl)."""
        for name, text in texts.items():
            self.mlflow.log_text(redact(text), name)

    def log_samples(self, records: pd.DataFrame, layout, title: str) -> None:
        """The per-sample pages and samples.jsonl of `records` in `layout` (a `fairaudit.views.pages.Layout`),
        written to a temporary folder a page at a time and logged as the run's top-level artifacts."""
        from fairaudit.tracking import samples

        with scratch() as tmp:  # one a killed job left is removed
            samples.write(records, layout, title, tmp)
            self.writing = ("the samples pages and samples.jsonl", size_of(tmp))
            self.mlflow.log_artifacts(str(tmp))

    def end(self, failed: bool = False, error: str | None = None, killed: bool = False) -> bool:
        """Close the run (KILLED when `killed`: stopped by the user); `error` (one line) becomes its error tag
        and description. Closing a failed or killed run is best effort, one try: its tracking server may be the
        failure. Returns whether the run was closed (or none was open)."""
        if self.run is None:
            return True
        run_id = self.run.info.run_id
        self.run = None
        error = redact(error) if error else error
        if not failed and not killed:
            self.mlflow.end_run(status="FINISHED")
            if self.key:
                supersede_ended(self.client, self.experiment_id, self.key, run_id)
            return True
        line = (error or ("interrupted" if killed else ""))[:MAX_TAG]

        def close() -> None:
            if line:
                self.mlflow.set_tags({ERROR_TAG: line, NOTE_TAG: line})
            self.mlflow.end_run(status="KILLED" if killed else "FAILED")
        with one_try(self.uri):
            closed = close_on_a_full_disk(self.uri, lambda: despite_a_lock(close))
            if not closed:  # the run leaves MLflow's active runs, so nothing tries again at exit
                with contextlib.suppress(Exception):
                    self.mlflow.end_run(status="KILLED" if killed else "FAILED")
        return closed


def despite_a_lock(write, tries: int = 5) -> None:
    """write(), again after a pause when sqlite refused it at once as "database is locked": two processes writing
    one MLflow database at the same instant (a stopped sweep's jobs closing their runs together) can each hold a
    read lock the other's write waits on, and sqlite then fails one of them without waiting its busy timeout."""
    import time

    for attempt in range(tries):
        try:
            write()
            return
        except Exception as error:
            if attempt == tries - 1 or not is_locked(error):
                raise
            time.sleep(0.2 * (attempt + 1))


def _has_named_index(table: pd.DataFrame) -> bool:
    return any(name is not None for name in table.index.names)


def parent_run_id(sweep_dir: str | Path) -> str | None:
    """The sweep's parent run, written by SweepCallback when the multirun started."""
    path = Path(sweep_dir) / PARENT_ID_FILE
    return path.read_text().strip() if path.exists() else None


