"""A sweep's parent run: opened with a dated name, its overrides and commit before its jobs start; closed with its
children's headlines (a summary table, metrics by step, a compare view) and its verdict once they end."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fairaudit.analysis.numbers import format_number, is_p_value, log10_sibling
from fairaudit.errors.secrets import redact, redact_yaml_file
from fairaudit.terminal.output import console
from fairaudit.terminal.results import print_result, print_verdict, summary_frame_table
from fairaudit.tracking import tags as t
from fairaudit.tracking.database import open_tracking
from fairaudit.tracking.notes import table_notes, warning_lines
from fairaudit.tracking.scratch import scratch
from fairaudit.tracking.succession import close_stale_runs, parent_run_id, process_tags, supersede_ended
from fairaudit.tracking.ui import save_view_state, sweep_view_state, view_url, where_lines

SHOWN_METRICS = 6  # headline metrics per job in the console's sweep table, the P(Yes) gaps besides
STEP_AXES = ("checkpoint", "seed")  # axes a parent run draws as MLflow steps
SUMMARY_KEYS = ("run", "status", "job", *t.AXIS_TAGS)  # the sweep summary's columns that are not metrics


@dataclass(frozen=True)
class Sweep:
    """What a sweep's parent run is opened with, read from its Hydra config by the job layer."""

    uri: str                  # tracking.uri
    experiment: str           # tracking.experiment
    folder: Path              # Hydra's sweep folder
    name: str                 # the parent run's name
    key: str                  # the sweep's key (its overrides): a re-run of the same sweep closes a killed parent
    study: str                # the key of its overrides but the probe's
    probe: str                # the probe(s) it runs
    overrides: list[str]      # its command-line overrides, passwords hidden
    params: dict[str, str]    # its swept keys as params
    jobs: list[str]           # each job named by what it varies, by job number
    commit: str               # the git commit it was started from
    command: str              # the command that started it (and resumes it)


def open_parent(sweep: Sweep) -> str:
    """The sweep's parent run, opened RUNNING (one of the same sweep a killed process left RUNNING closed KILLED),
    its id written into the sweep's folder for its jobs; returns the id."""
    client, experiment = open_tracking(sweep.uri, sweep.experiment)
    sweep.folder.mkdir(parents=True, exist_ok=True)
    run = client.create_run(experiment, run_name=redact(sweep.name), tags={
        t.KIND_TAG: "sweep", t.SWEEP_DIR_TAG: str(sweep.folder), t.OVERRIDES_TAG: json.dumps(redact(sweep.overrides)),
        "mlflow.source.git.commit": sweep.commit, t.KEY_TAG: sweep.key, t.PROBE_TAG: sweep.probe,
        t.STUDY_TAG: sweep.study, **process_tags()})
    run_id = run.info.run_id
    killed = close_stale_runs(client, experiment, sweep.key, run_id)
    if killed:
        client.set_tag(run_id, t.RESUMES_TAG, ",".join(killed))
    (sweep.folder / t.PARENT_ID_FILE).write_text(run_id)
    jobs = json.dumps(redact(sweep.jobs))
    if len(jobs) <= t.MAX_TAG:  # so a report on a sweep cut short names the jobs that did not finish ...
        client.set_tag(run_id, t.JOBS_TAG, jobs)
    client.set_tag(run_id, t.COMMAND_TAG, redact(sweep.command)[:t.MAX_TAG])  # ... and how to resume it
    for name, value in redact(sweep.params).items():
        client.log_param(run_id, name, value)
    client.log_text(run_id, "\n".join(redact(sweep.overrides)) + "\n", "config/overrides.txt")
    return run_id


def close_parent(uri: str, folder: Path, family: dict) -> str | None:
    """The sweep's parent run closed once its jobs ended: its summary, metrics by step, verdict (first the `family`
    of tests of conf/report.yaml counted, the top of the run's page) and compare view logged and printed; FINISHED,
    or FAILED when a job did not finish. Returns the failed jobs' summary line, None when all finished (or no
    parent was opened)."""
    from mlflow.tracking import MlflowClient

    run_id = parent_run_id(folder)
    if not run_id:
        return None
    client = MlflowClient(uri)
    parent = client.get_run(run_id)
    children = sweep_children(client, run_id)
    summary = children_summary(client, run_id, children)
    counted = family_verdict(children, run_id, family)
    verdict = (counted[0] if counted else []) + sweep_verdict(summary, children) + warning_lines(children)
    redact_yaml_file(folder / "multirun.yaml")  # Hydra's copy of the sweep, logged below
    log_summary(client, run_id, summary, folder, verdict, counted and counted[1])
    failed = failure_summary(children) if any(c.info.status != "FINISHED" for c in children) else None
    client.set_tag(run_id, t.NOTE_TAG, "\n\n".join(verdict + ([failed] if failed else []))[:t.MAX_TAG])
    view = save_view(client, parent, summary)
    if failed:
        client.set_tag(run_id, t.FAILED_JOBS_TAG, failed[:t.MAX_TAG])
    client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")
    if not failed and t.KEY_TAG in parent.data.tags:
        supersede_ended(client, parent.info.experiment_id, parent.data.tags[t.KEY_TAG], run_id)
    print_summary(summary, verdict, run_id, parent.info.experiment_id, uri, view, children)
    return failed


def close_stopped(uri: str, folder: Path, note: str) -> int:
    """A stopped sweep's parent closed KILLED with `note`, and each child run its job's process left RUNNING (killed
    before it could close it) KILLED too; returns how many children were left RUNNING."""
    from mlflow.tracking import MlflowClient

    run_id = parent_run_id(folder)
    if not run_id:
        return 0
    client = MlflowClient(uri)
    left = [child for child in sweep_children(client, run_id) if child.info.status == "RUNNING"]
    for child in left:
        line = f"{note}: its job's process was killed before it closed this run"
        client.set_tag(child.info.run_id, t.ERROR_TAG, line)
        client.set_tag(child.info.run_id, t.NOTE_TAG, line)
        client.set_terminated(child.info.run_id, status="KILLED")
    client.set_tag(run_id, t.NOTE_TAG, note)
    client.set_terminated(run_id, status="KILLED")
    return len(left)


def sweep_children(client, parent_id: str) -> list:
    """The parent's child runs, oldest first."""
    experiment = client.get_run(parent_id).info.experiment_id
    return client.search_runs([experiment], f"tags.`{t.PARENT_TAG}` = '{parent_id}'",
                              order_by=["attributes.start_time ASC"])


def children_summary(client, parent_id: str, children: list | None = None) -> pd.DataFrame:
    """One row per child run (oldest first): run name, status, job number, its grid axes and its headline metrics,
    with the log10 twin of each headline p-value (a p below the smallest double is NaN; its log10 is not)."""
    rows = []
    for child in sweep_children(client, parent_id) if children is None else children:
        names = json.loads(child.data.tags.get(t.HEADLINE_TAG, "[]"))
        metrics = child.data.metrics
        twins = [log10_sibling(name) for name in names if log10_sibling(name) in metrics]  # a p's log10, always there
        rows.append({"run": child.info.run_name, "status": child.info.status,
                     "job": int(child.data.tags.get(t.JOB_NUM_TAG) or -1),
                     **{axis: child.data.tags.get(axis, "") for axis in t.AXIS_TAGS},
                     **{name: metrics.get(name, float("nan")) for name in [*names, *twins]}})
    return pd.DataFrame(rows)


def training_steps(labels: pd.Series) -> pd.Series:
    """A step per checkpoint label: its last number (step1000 -> 1000) when every label has a distinct one,
    else its rank in natural order (base, step30, step200)."""
    from fairaudit.analysis.study import natural_key

    numbers = labels.astype(str).str.extract(r"(\d+)\D*$")[0]
    distinct = labels.astype(str).unique()
    if numbers.notna().all() and numbers.groupby(numbers).ngroups == len(distinct):
        return numbers.astype(int)
    rank = {label: i for i, label in enumerate(sorted(distinct, key=natural_key))}
    return labels.astype(str).map(rank)


def step_axis(summary: pd.DataFrame) -> str | None:
    """The axis a parent run's metrics are logged against: the checkpoint or the seed when its finished jobs vary
    it, else None (the job number)."""
    finished = summary[summary["status"] == "FINISHED"] if len(summary) else summary
    return next((a for a in STEP_AXES if a in finished and finished[a].nunique() > 1), None)


STEP_MEANING = {"checkpoint": "the checkpoint's training step", "seed": "the seed", None: "the job's number"}


def step_series(summary: pd.DataFrame) -> list[tuple[str, float, int]]:
    """(metric key, value, step) of each finished job's headline metrics, for the sweep's parent run, so MLflow's
    own charts on it draw each metric: against training step (mean over seeds at each checkpoint; a p-value's
    seeds combined, never averaged: `step_values`) or seed in a checkpoint or seed study, where other axes that vary
    split the curves (`metric/<their values>`); else at step = the job's number."""
    finished = summary[summary["status"] == "FINISHED"] if len(summary) else summary
    metrics = [c for c in finished.columns if c not in SUMMARY_KEYS and pd.api.types.is_numeric_dtype(finished[c])]
    axis = step_axis(summary)
    if axis is None:
        jobs = finished["job"] if "job" in finished else pd.Series(range(len(finished)), index=finished.index)
        return [(metric_key(m), float(row[m]), int(job)) for job, row in zip(jobs, finished.to_dict("records"))
                for m in metrics if row[m] == row[m]]
    varied = [a for a in t.AXIS_TAGS if a in finished and finished[a].nunique() > 1]
    steps = training_steps(finished[axis]) if axis == "checkpoint" else finished[axis].astype(int)
    cells = [a for a in varied if a not in STEP_AXES]
    series = []
    for key, group in finished.assign(step=steps.to_numpy()).groupby([*cells, "step"], sort=True):
        key = key if isinstance(key, tuple) else (key,)
        suffix = [str(value) for value in key[:-1]]
        series += [(metric_key("/".join([m, *suffix, *([label] if label else [])])), value, int(key[-1]))
                   for m, label, value in step_values(group, metrics) if value == value]
    return series


def step_values(group: pd.DataFrame, metrics: list[str]) -> list[tuple[str, str, float]]:
    """(metric, replicate label or "", value) of the runs at one step of one cell: each metric's mean over them, but
    never a p-value's: a log10 p metric is their combined p (`multiplicity.combined_log10_p`, K/ceil(K/2) x their
    median, a p-value) and, with several runs, each run's own log10 p labelled `seed <seed>`; a p metric is the
    combined p: from its log10 twin where the runs logged one (so a run whose p underflowed to NaN still counts),
    else from its own values."""
    from fairaudit.analysis.multiplicity import combined_log10_p
    from fairaudit.analysis.stats import p_value

    logs = [m for m in metrics if "log10_p" in m]
    ps = [m for m in metrics if is_p_value(m) and m not in logs]
    twins = {m: log10_sibling(m) if log10_sibling(m) in metrics else None for m in ps}
    out = [(m, "", float(group[m].mean())) for m in metrics if m not in twins and m not in logs]
    labels = [f"seed {seed}" if group["seed"].nunique() == len(group) else f"job {job}"
              for seed, job in zip(group["seed"], group["job"])] if len(group) > 1 else []
    for m in logs:
        out += [(m, "", combined_log10_p(group[m])), *((m, label, float(v)) for label, v in zip(labels, group[m]))]
    with np.errstate(divide="ignore"):
        out += [(m, "", p_value(combined_log10_p(group[twin] if twin else np.log10(group[m].astype(float)))))
                for m, twin in twins.items()]
    return out


def family_verdict(children: list, parent_id: str, family: dict) -> tuple[list[str], dict[str, float]] | None:
    """The sweep's verdict on its family of tests (`family` of conf/report.yaml, by default every McNemar test), one
    test per hypothesis with its seeds and engines combined (`multiplicity.family`): a line counting those
    significant raw and after Holm and Benjamini-Hochberg, then a line per test with its p, Holm p and BH p; those
    counts (`family_*`) and each test's p's (`family/<metric>[_holm|_bh]/<hypothesis>`) as metrics. None when no
    job logged one of the family's metrics."""
    from fairaudit.analysis import multiplicity, study

    metrics, alpha = multiplicity.family_settings(family)
    finished = [child for child in children if child.info.status == "FINISHED"]
    runs = pd.DataFrame([{"run_id": child.info.run_id, **{a: child.data.tags.get(a, "") for a in study.AXES},
                          **child.data.metrics} for child in finished])
    tests = multiplicity.family(runs, metrics, study.cell_axes(runs)) if len(runs) else pd.DataFrame()
    if tests.empty:
        return None
    counts = multiplicity.significant(tests, alpha)
    line = multiplicity.counts_sentence(counts, alpha, f"tests ({', '.join(metrics)}: "
                                        f"{multiplicity.family_phrase(runs, tests)}) across the sweep's "
                                        f"{len(finished)} finished jobs")
    lines = [f"{line}; the family: fairaudit report select.parent={parent_id} (its `family` section).",
             *multiplicity.family_lines(tests)]
    return lines, {**{f"family_{name}": value for name, value in counts.items()}, **multiplicity.family_metrics(tests)}


def sweep_verdict(summary: pd.DataFrame, children: list) -> list[str]:
    """What the sweep found, one line each (the parent run's description; others append lines): what ran and at
    which step its metrics are logged, then per job, by what it varies, its verdict's first line and P(Yes) gap."""
    finished = int((summary["status"] == "FINISHED").sum()) if len(summary) else 0
    lines = [f"{len(summary)} jobs, {finished} finished; each job's headline metrics are on this run at step = "
             f"{STEP_MEANING[step_axis(summary)]} (tables/sweep_summary.parquet holds them all)."]
    for child in sorted(children, key=lambda run: int(run.data.tags.get(t.JOB_NUM_TAG) or -1)):
        tags, cell = child.data.tags, child.info.run_name.split(" | ")[0]
        head = f"job {tags.get(t.JOB_NUM_TAG, '?')} · {cell}: "
        if child.info.status != "FINISHED":
            lines.append(head + f"{child.info.status}: {tags.get(t.ERROR_TAG, 'no error recorded')}")
            continue
        found = tags.get(t.NOTE_TAG, "").split("\n\n")[0]
        gap = gap_text(child.data.metrics)
        lines.append(head + found + (f" {gap}" if gap else ""))
    return lines


def gap_text(metrics: dict[str, float]) -> str:
    """"P(Yes) gap think 0.007 [0.0066, 0.0074] vs nothink 0.0016 [...], difference 0.0054 [...]." from a paired
    run's metrics (p_gap_<arm>, delta_p_gap and their _ci_low/_ci_high); "" for a probe without a P(Yes) gap."""
    def shown(name: str) -> str:
        low, high = metrics.get(f"{name}_ci_low"), metrics.get(f"{name}_ci_high")
        interval = f" [{format_number(low)}, {format_number(high)}]" if low is not None and high is not None else ""
        return format_number(metrics[name]) + interval

    arms = [name[len("p_gap_"):] for name in metrics if re.fullmatch(r"p_gap_[a-z0-9]+", name)]
    if not arms:
        return ""
    text = "P(Yes) gap " + " vs ".join(f"{arm} {shown(f'p_gap_{arm}')}" for arm in arms)
    return text + (f", difference {shown('delta_p_gap')}." if "delta_p_gap" in metrics else ".")


def log_summary(client, parent_id: str, summary: pd.DataFrame, sweep_dir: Path, verdict: list[str] = (),
                counts: dict[str, float] | None = None) -> None:
    """The summary table (sweep_summary.json, tables/sweep_summary.parquet) and multirun.yaml on the parent
    run; for a checkpoint or seed study, the headline metrics by step (`step_series`); the sweep's verdict as
    verdict.txt and the family's counts and each test's p's (`family_verdict`) as metrics."""

    from mlflow.entities import Metric

    if len(summary):
        client.log_table(parent_id, summary, "sweep_summary.json")
        with scratch() as tmp:
            path = Path(tmp) / "sweep_summary.parquet"
            summary.to_parquet(path)
            client.log_artifact(parent_id, str(path), "tables")
    timestamp = client.get_run(parent_id).info.start_time
    values = [Metric(key, value, timestamp, step) for key, value, step in step_series(summary)]
    if verdict:
        client.log_text(parent_id, "\n".join(verdict) + "\n", "verdict.txt")
    values += [Metric(metric_key(key), value, timestamp, 0) for key, value in (counts or {}).items()]
    for start in range(0, len(values), 500):
        client.log_batch(parent_id, metrics=values[start:start + 500])
    multirun = sweep_dir / "multirun.yaml"
    if multirun.exists():
        client.log_artifact(parent_id, str(multirun))


def shown_metrics(metrics: list[str]) -> list[str]:
    """The sweep table's metric columns: the first SHOWN_METRICS headline metrics, then the P(Yes) gaps (p_gap_<arm>,
    delta_p_gap), the measure that still moves when every answer is the same."""
    gaps = [m for m in metrics if re.fullmatch(r"(p_gap_[a-z0-9]+|delta_p_gap)", m)]
    return [m for m in metrics if m not in gaps][:SHOWN_METRICS] + gaps


def metric_key(name: str) -> str:
    """A name MLflow accepts as a metric key (letters, digits, _ - . / and spaces)."""
    return re.sub(r"[^\w\-./ ]", "_", name)[:250]


CHARTED = 6  # metrics on the compare view's parallel-coordinates chart


def save_view(client, parent, summary: pd.DataFrame) -> str | None:
    """The sweep's compare view saved on its experiment (`ui.sweep_view_state`): its jobs' whole names, the console
    table's metrics as columns, the axes it varies, and the metrics that differ between its jobs, P(Yes) gaps last,
    on a parallel-coordinates chart. Its key, or None for a sweep without a finished job."""
    finished = summary[summary["status"] == "FINISHED"] if len(summary) else summary
    if finished.empty:
        return None
    axes = [a for a in t.AXIS_TAGS if a in finished and finished[a].nunique() > 1]
    columns = shown_metrics([c for c in finished.columns if c not in SUMMARY_KEYS and finished[c].notna().any()])
    differ = [m for m in columns if finished[m].nunique() > 1] or columns
    gaps = [m for m in differ if "p_gap" in m]  # last, delta_p_gap the very last: MLflow colours the lines by it
    charted = [m for m in differ if m not in gaps][:max(0, CHARTED - len(gaps))] + gaps
    longest = int(finished["run"].fillna("").str.len().max())
    state = sweep_view_state(parent.info.run_id, axes, columns, charted, longest)
    return save_view_state(client, parent.info.experiment_id, parent.info.run_id, parent.info.run_name, state)


def print_summary(summary: pd.DataFrame, verdict: list[str], parent_id: str, experiment_id: str, uri: str,
                  view: str | None = None, children: list = ()) -> None:
    """The sweep's verdict and its jobs as a table on stdout (each job's warnings marked beside its numbers and told
    under the table, with why each n/a is undefined), then (on stderr) the parent run, where to see it, the view
    that compares its jobs and, when a job finished, the report command."""
    print_verdict(verdict)
    if len(summary):
        metrics = shown_metrics([c for c in summary.columns if c not in SUMMARY_KEYS])
        marks, notes = table_notes(sorted(children, key=lambda run: run.info.start_time), metrics)
        by_job = {int(run.data.tags.get(t.JOB_NUM_TAG) or -1): marks[run.info.run_id] for run in children}
        shown = summary[["run", "status", *metrics]].copy()
        shown.insert(2, "warnings", [by_job.get(num, "") for num in summary["job"]])
        print_result(summary_frame_table("sweep jobs (all headline metrics: sweep_summary.json on the parent run)",
                                         shown, notes))
    finished = int((summary["status"] == "FINISHED").sum()) if len(summary) else 0
    console.print(f"sweep parent run [bold]{parent_id}[/bold]: {len(summary)} jobs, {finished} finished",
                  highlight=False)
    if finished:
        console.print(f"report: fairaudit report select.parent={parent_id}", highlight=False, soft_wrap=True)
    for line in where_lines(uri, experiment_id, parent_id):
        console.print(line, highlight=False, soft_wrap=True)
    if view:
        console.print(f"compare its jobs: {view_url(uri, experiment_id, view)}", highlight=False, soft_wrap=True)
        console.print(f"its jobs on a parallel-coordinates chart: {view_url(uri, experiment_id, view, charts=True)}",
                      highlight=False, soft_wrap=True)


def failure_summary(children: list) -> str:
    """'2 of 3 jobs failed: #1 dataset.n=999999: <error>; ...' in job order, each job named by the
    overrides that set it apart from the sweep's other jobs."""
    overrides = {run.info.run_id: run.data.tags.get(t.JOB_OVERRIDES_TAG, "").split() for run in children}
    shared = set.intersection(*(set(o) for o in overrides.values()))
    failed = sorted((run for run in children if run.info.status != "FINISHED"),
                    key=lambda run: int(run.data.tags.get(t.JOB_NUM_TAG, "0") or 0))

    def describe(run) -> str:
        own = " ".join(o for o in overrides[run.info.run_id] if o not in shared)
        error = run.data.tags.get(t.ERROR_TAG) or f"ended {run.info.status}"
        return f"#{run.data.tags.get(t.JOB_NUM_TAG, '?')} {own}: {error}"

    return f"{len(failed)} of {len(children)} jobs failed: " + "; ".join(describe(run) for run in failed)
