"""MLflow runs: one per job, which the run meets at three stages: opened with its config and params once its inputs
are checked (`Tracker.open`), its outcome logged (`Tracker.content`, a `RunContent`), and closed: FINISHED, or
FAILED or KILLED with its one line (`Tracker.end`). A run holds everything it needs to be repeated, and a run a
killed process left RUNNING is closed by the next of its job."""

from __future__ import annotations

import contextlib
import hashlib
import json
from typing import Any, Mapping

from fairaudit.errors.secrets import redact
from fairaudit.tracking.content import RunContent
from fairaudit.tracking.database import close_on_a_full_disk, open_tracking
from fairaudit.tracking.http import one_try
from fairaudit.tracking.retries import despite_a_lock, logged_despite_a_race
from fairaudit.tracking.succession import close_stale_runs, parent_run_id, process_tags, supersede_ended
from fairaudit.tracking.tags import (
    ERROR_TAG,
    EXPERIMENT_KIND_TAG,
    KEY_TAG,
    MAX_TAG,
    MODEL_TRAINING_KIND,
    NOTE_TAG,
    RESUMES_TAG,
)


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


def config_key(*parts: Any) -> str:
    """A stable hash naming a job (its resolved config and overrides) or a sweep (its overrides); computed with
    passwords hidden, so a job is the same job whatever its password (and the hash reveals nothing of it)."""
    return hashlib.sha256(json.dumps(redact(list(parts)), sort_keys=True, default=str).encode()).hexdigest()[:20]


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
        self.content = RunContent(mlflow)  # what the run holds, logged as it finishes

    @classmethod
    def open(cls, tracking: tuple[str, str], run_name: str, tags: dict[str, str], params: dict[str, str],
             sweep_dir: str | None, config: Mapping) -> "Tracker":
        """The job's run opened on `tracking` (its uri and experiment): a child of its sweep's parent run when
        `sweep_dir` names a sweep's folder, its tags and params logged, the resolved `config` flattened among them."""
        tracker = cls(*tracking)
        tracker.start(run_name, tags, params, parent_run_id(sweep_dir) if sweep_dir else None, config)
        return tracker

    def start(self, run_name: str, tags: dict[str, str], params: dict[str, str],
              parent: str | None = None, config: Mapping | None = None) -> str:
        """Open a run (a child of run `parent` in a sweep) and log tags and params, the resolved `config` flattened
        among them."""
        self.key = tags.get(KEY_TAG)
        params = {**params, **flatten(dict(config or {}))}
        tags, params = redact(tags, by_name=False), redact(params)  # a param is named by its config key
        self.run = self.mlflow.start_run(run_name=redact(run_name), experiment_id=self.experiment_id,
                                         parent_run_id=parent, tags={**tags, **process_tags()})
        run_id = self.run.info.run_id
        if self.key:
            killed = close_stale_runs(self.client, self.experiment_id, self.key, run_id)
            if killed:
                self.mlflow.set_tag(RESUMES_TAG, ",".join(killed))
        items = list(params.items())
        for start in range(0, len(items), 100):
            self.mlflow.log_params(dict(items[start:start + 100]))
        return run_id

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
