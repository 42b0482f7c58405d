"""The report's MLflow side: select job runs, read their tags, metrics and records, log the report run."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from fairaudit.analysis.study import AXES
from fairaudit.errors import AuditError
from fairaudit.errors.interrupt import environment_note
from fairaudit.report.studies import study_logging_to
from fairaudit.tracking import tags as t
from fairaudit.tracking.content import finite_metrics
from fairaudit.tracking.scratch import scratch
from fairaudit.tracking.succession import parent_run_id

BASELINE_PARAM = "probe.baseline_arm.name"
SETTING_PARAMS = ("probe.", "engine.")  # params kept as columns: a probe's settings and what its engine computed with


@dataclass
class Selection:
    """The runs a report covers and how they were chosen."""

    runs: pd.DataFrame   # one row per job run: run_id, run_name, experiment_id, status, AXES, baseline, metrics
    filter_string: str
    experiment_ids: list[str]
    parent: str | None = None
    left_out: pd.DataFrame = field(default_factory=pd.DataFrame)  # matching runs dropped: status, KILLED, superseded
    parents: list[str] = field(default_factory=list)  # each sweep selected (a study: one per probe); parent: the newest
    unfinished: list[str] = field(default_factory=list)  # per selected sweep that did not finish: its jobs left, resume


def _quote(value: Any) -> str:
    return "'" + str(value).replace("'", "\\'") + "'"


def experiment_ids(client, names: str | list[str] | None) -> list[str]:
    """Ids of the named experiments (all experiments when `names` is null)."""
    if names is None:
        return [e.experiment_id for e in client.search_experiments()]
    ids = []
    for name in [names] if isinstance(names, str) else list(names):
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            known = sorted(e.name for e in client.search_experiments())
            study = study_logging_to(name)
            ran = f" (study {study}'s runs go there, and none has run: fairaudit +experiment={study} runs it)" \
                if study else ""
            raise AuditError(f"select.experiment: no MLflow experiment {name!r} in {client.tracking_uri}{ran}; "
                             f"experiments: {known}")
        ids.append(experiment.experiment_id)
    return ids


def latest_study(client, exp_ids: list[str]) -> list[str]:
    """The latest study's sweeps, newest first: the newest sweep and, for each other probe, the newest sweep of
    the same grid (same overrides but the probe's, tag fairaudit.study) that ran it."""
    order = ["attributes.start_time DESC"]
    found = client.search_runs(exp_ids, f"tags.`{t.KIND_TAG}` = 'sweep'", max_results=1, order_by=order)
    if not found:
        raise AuditError(f"no sweep run in {client.tracking_uri}; run a study with -m first, or pass "
                         "select.parent=null to select runs by select.experiment / select.tags / select.filter alone")
    study = found[0].data.tags.get(t.STUDY_TAG)
    if not study:  # a sweep logged before studies were tagged
        return [found[0].info.run_id]
    sweeps = client.search_runs([found[0].info.experiment_id], f"tags.`{t.KIND_TAG}` = 'sweep' AND "
                                f"tags.`{t.STUDY_TAG}` = {_quote(study)}", order_by=order)
    chosen: dict[str, str] = {}
    for sweep in sweeps:
        chosen.setdefault(sweep.data.tags.get(t.PROBE_TAG, sweep.info.run_id), sweep.info.run_id)
    return list(chosen.values())


def resolve_parents(client, select, exp_ids: list[str]) -> list[str]:
    """The parent runs to restrict to: select.sweep_dir's, select.parent, the latest study's (`latest`) or none."""
    if select.sweep_dir:
        parent = parent_run_id(select.sweep_dir)
        if parent is None:
            raise AuditError(f"select.sweep_dir {select.sweep_dir!r} holds no mlflow_parent_run_id: "
                             "not a fairaudit multirun folder")
        return [parent]
    if select.parent == "latest":
        return latest_study(client, exp_ids)
    return [select.parent] if select.parent else []


def filter_string(select, parent: str | None) -> str:
    """MLflow search filter: job runs, under `parent`, with the selected tags, ANDed with select.filter."""
    clauses = [f"tags.`{t.KIND_TAG}` = 'job'"]
    if parent:
        clauses.append(f"tags.`{t.PARENT_TAG}` = {_quote(parent)}")
    for key, value in (select.tags or {}).items():
        if value is not None:
            clauses.append(f"tags.`{key}` = {_quote(value)}")
    if select.filter:
        clauses.append(select.filter)
    return " AND ".join(clauses)


def search_all(client, exp_ids: list[str], filter_str: str) -> list:
    """Every run matching the filter, oldest first (all pages)."""
    runs, token = [], None
    while True:
        page = client.search_runs(exp_ids, filter_str, max_results=1000, order_by=["attributes.start_time ASC"],
                                  page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def runs_frame(runs: Iterable) -> pd.DataFrame:
    """One row per run: ids, status, the grid axes from tags, the baseline arm and the probe.* and engine.* settings
    from params (as strings, named by their dotted keys), every metric."""
    rows = []
    for run in runs:
        tags = run.data.tags
        row = {"run_id": run.info.run_id, "run_name": tags.get("mlflow.runName", ""),
               "experiment_id": run.info.experiment_id, "status": run.info.status, "start_time": run.info.start_time}
        row.update({axis: tags.get(axis, "") for axis in AXES})
        row["baseline"] = run.data.params.get(BASELINE_PARAM)
        row.update({k: v for k, v in run.data.params.items() if k.startswith(SETTING_PARAMS)})
        row["superseded_by"] = tags.get(t.SUPERSEDED_TAG)
        row["headline"] = tags.get(t.HEADLINE_TAG)
        row["warnings"], row["undefined"] = tags.get(t.WARNINGS_TAG, ""), tags.get(t.UNDEFINED_TAG, "")
        row.update(run.data.metrics)
        rows.append(row)
    return pd.DataFrame(rows)


def parent_run(client, run_id: str):
    """The sweep's parent run that select.parent names; one line when there is no such run or it is a job's."""
    try:
        run = client.get_run(run_id)
    except Exception as error:  # mlflow raises MlflowException for unknown ids
        raise AuditError(f"select.parent: no run {run_id!r} in {client.tracking_uri}") from error
    if run.data.tags.get(t.KIND_TAG) == "job":
        sweep = run.data.tags.get(t.PARENT_TAG)
        fix = f"its sweep is select.parent={sweep}" if sweep else \
            "a single job is not reported; select.parent=latest reports the latest sweep"
        raise AuditError(f"select.parent={run_id} is a job's run, not a sweep's: select.parent takes the run id a "
                         f"sweep prints for its parent; {fix}")
    return run


def select_runs(client, select) -> Selection:
    """Job runs chosen by select.{experiment, parent, sweep_dir, tags, filter, status}."""
    exp_ids = experiment_ids(client, select.experiment)
    parents = resolve_parents(client, select, exp_ids)
    if parents:
        exp_ids = [parent_run(client, parents[0]).info.experiment_id]
    filters = [filter_string(select, parent) for parent in parents or [None]]
    filter_str = " OR ".join(f"({f})" for f in filters) if len(filters) > 1 else filters[0]
    try:
        frame = runs_frame([run for f in filters for run in search_all(client, exp_ids, f)])
    except Exception as error:
        raise AuditError(f"MLflow search failed for filter {filter_str!r}: {error}") from error
    unfinished = [line for line in (unfinished_sweep(client, parent) for parent in parents) if line]
    narrowed = bool(select.filter) or any(v is not None for v in (select.tags or {}).values())
    why = "" if narrowed or not unfinished else "; ".join(unfinished)  # the sweep's own jobs, not a filter, are why
    if frame.empty:
        raise AuditError(why or f"no job runs match {filter_str!r} in {client.tracking_uri}")
    keep = frame["status"] == select.status if select.status else pd.Series(True, index=frame.index)
    keep &= (frame["status"] != "KILLED") & frame["superseded_by"].isna()  # a later run of the same job replaced them
    if not keep.any():
        raise AuditError(why or f"{len(frame)} job runs match {filter_str!r} but none has status "
                         f"{select.status or 'other than KILLED'} without being superseded by a later run of the "
                         "same job")
    kept, dropped = frame[keep].reset_index(drop=True), frame[~keep].reset_index(drop=True)
    return Selection(kept, filter_str, exp_ids, parents[0] if parents else None, dropped, parents, unfinished)


def selection_line(client, selection: Selection, latest: bool) -> str:
    """Which runs the report reads, in one line: "report on 5 finished runs of sweep 'sweep 2026-12-03 11:02 seed'
    (eccaa1b2...) in experiment 'seed_sweep', the latest study (select.parent=latest); 2 left out: ..."."""
    names = {e.experiment_id: e.name for e in (client.get_experiment(i) for i in selection.experiment_ids)}
    where = ", ".join(repr(names[i]) for i in selection.experiment_ids)
    sweeps = [client.get_run(parent) for parent in selection.parents]
    what = (f"sweep{'s' if len(sweeps) > 1 else ''} " + ", ".join(f"{run.info.run_name!r} ({run.info.run_id})"
                                                                 for run in sweeps) if sweeps else
            f"runs matching {selection.filter_string!r}")
    line = (f"report on {len(selection.runs)} runs of {what} in experiment{'s' if len(names) > 1 else ''} {where}"
            + (", the latest study (select.parent=latest; select.parent=ID chooses another)" if latest else ""))
    if not selection.left_out.empty:
        line += f"; left out: {left_out_summary(selection.left_out)}"
    return line


def unfinished_sweep(client, parent_id: str) -> str | None:
    """For a sweep that did not finish (Ctrl-C, a kill, failed jobs): which of its jobs did not finish, named by
    what they vary, and the command that resumes it (finished jobs' results come from the store); else None."""
    import json
    import shlex

    parent = client.get_run(parent_id)
    if parent.info.status == "FINISHED":
        return None
    children = client.search_runs([parent.info.experiment_id], f"tags.`{t.PARENT_TAG}` = {_quote(parent_id)}")
    status = {run.data.tags.get(t.JOB_NUM_TAG): run.info.status for run in children
              if t.SUPERSEDED_TAG not in run.data.tags}
    jobs = json.loads(parent.data.tags.get(t.JOBS_TAG, "[]"))
    left = [f"{label or f'job {num}'} ({status.get(str(num), 'not started')})" for num, label in enumerate(jobs)
            if status.get(str(num)) != "FINISHED"]
    if not jobs:  # a sweep logged before its jobs were tagged: the runs it opened
        left = [f"job {num} ({state})" for num, state in sorted(status.items()) if state != "FINISHED"]
    if not left:
        return None
    overrides = json.loads(parent.data.tags.get(t.OVERRIDES_TAG, "[]"))
    command = parent.data.tags.get(t.COMMAND_TAG) or " ".join(["fairaudit", *map(shlex.quote, overrides), "-m"])
    ended = "has not ended (it runs, or its process died)" if parent.info.status == "RUNNING" else \
        f"ended {parent.info.status}"
    return (f"sweep {parent.info.run_name!r} ({parent_id}) {ended}: {len(left)} of {len(jobs) or len(status)} jobs "
            f"did not finish: {', '.join(left)}; resume it{environment_note(command)} with: {command}")


def left_out_summary(left_out: pd.DataFrame) -> str:
    """'2 superseded by a later run of the same job, 1 KILLED' for the runs a selection dropped."""
    reasons = left_out["status"].where(left_out["superseded_by"].isna(), "superseded by a later run of the same job")
    return ", ".join(f"{n} {reason}" for reason, n in reasons.value_counts().items())


def load_records(client, run_ids: Iterable[str], name: str = "records") -> dict[str, pd.DataFrame]:
    """Each run's records/{name}.parquet artifact (records, depth_records, continuations)."""
    records = {}
    artifact = f"records/{name}.parquet"
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    with scratch() as tmp:
        for run_id in run_ids:
            try:
                path = client.download_artifacts(run_id, artifact, str(Path(tmp) / run_id))
            except Exception as error:
                raise AuditError(f"run {run_id} has no {artifact} artifact to pool: {error}") from error
            records[run_id] = pd.read_parquet(path)
    return records


def log_report(client, experiment_id: str, name: str, out_dir: Path, files: list[Path], tags: dict[str, str],
               params: dict[str, str], metrics: dict[str, float], tables: dict[str, pd.DataFrame]) -> str:
    """The report as an MLflow run: its files as artifacts, tags linking the source runs, headline metrics."""
    from mlflow.entities import Metric, Param

    run = client.create_run(experiment_id, run_name=name, tags={k: v[:t.MAX_TAG] for k, v in tags.items()})
    run_id = run.info.run_id
    try:
        items = [Param(k, v[:6000]) for k, v in params.items()]
        for start in range(0, len(items), 100):
            client.log_batch(run_id, params=items[start:start + 100])
        timestamp = run.info.start_time
        values = [Metric(k, v, timestamp, 0) for k, v in finite_metrics(metrics).items()]
        for start in range(0, len(values), 500):
            client.log_batch(run_id, metrics=values[start:start + 500])
        for path in files:
            folder = path.parent.relative_to(out_dir).as_posix()
            client.log_artifact(run_id, str(path), None if folder == "." else folder)
        for table_name, table in tables.items():
            client.log_table(run_id, table, f"tables/{table_name}.json")
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id)
    return run_id


def source_tags(selection: Selection) -> dict[str, str]:
    """Tags that link the report run to what it was built from."""
    ids = list(selection.runs["run_id"])
    joined = ",".join(ids)
    tags = {
        t.KIND_TAG: "report",
        t.SELECTION_TAG: selection.filter_string,
        t.N_SOURCE_RUNS_TAG: str(len(ids)),
        t.SOURCE_RUNS_TAG: joined if len(joined) <= t.MAX_TAG else "see runs.csv (too many for a tag)",
    }
    if selection.parent:
        tags[t.SOURCE_PARENT_TAG] = selection.parent
    if len(selection.parents) > 1:
        tags[t.SOURCE_PARENTS_TAG] = ",".join(selection.parents)
    return tags
