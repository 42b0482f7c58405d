"""What a sweep's parent run shows at a glance: a dated name, its overrides and commit, and its children's headlines."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from fairaudit.console import console, print_result, summary_frame_table
from fairaudit.scratch import scratch

ERROR_TAG = "fairaudit.error"  # a failed run's error line
HEADLINE_TAG = "fairaudit.headline"  # a job's headline metric names (JSON list), set by the job
SHOWN_METRICS = 6  # headline metrics per job in the console's sweep table, the P(Yes) gaps besides


def git_commit(cwd: str | Path = ".") -> str:
    """The commit checked out where the sweep was started ("unknown" outside a git checkout)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def swept(overrides: list[str], params: dict | None = None) -> dict[str, str]:
    """The sweep's swept keys and their values ("dataset" -> "adult,compas"), from the command line and
    hydra.sweeper.params."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = [*overrides, *(f"{key}={value}" for key, value in (params or {}).items())]
    parsed = OverridesParser.create().parse_overrides(lines)
    return {o.key_or_group: o.input_line.split("=", 1)[1] for o in parsed if o.is_sweep_override()}


def swept_of(hydra) -> dict[str, str]:
    """`swept` of a sweep's `hydra` config node (its task overrides and sweeper params)."""
    params = hydra.sweeper.get("params")
    return swept(list(hydra.overrides.task), OmegaConf.to_container(params) if params else None)


def swept_in(sweep_dir: str | Path) -> dict[str, str]:
    """`swept_of` the sweep whose multirun.yaml (written by Hydra before its jobs start) is in `sweep_dir`."""
    path = Path(sweep_dir) / "multirun.yaml"
    return swept_of(OmegaConf.load(path).hydra) if path.exists() else {}


def sweep_jobs(hydra) -> list[list[str]]:
    """Each job's overrides, as Hydra's basic sweeper launches them from a sweep's `hydra` node
    (hydra.sweeper.params first, then the command line)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = hydra.sweeper.get("params") or {}
    lines = [f"{key}={value}" for key, value in params.items()] + list(hydra.overrides.task)
    parsed = OverridesParser.create().parse_overrides(lines)
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


DATA_KEYS = ("dataset", "+dataset", "data.", "+experiment", "experiment")  # overrides that can change what is read
MODEL_KEYS = ("model", "+model", "backend", "+backend", "+experiment", "experiment")  # ... which model files


def grid_problems(config, keys: tuple[str, ...], problem, named: bool = True) -> list[str]:
    """One line per distinct problem across the sweep's jobs, found before any job starts: each distinct job config
    that the overrides starting with `keys` set is composed once and `problem(job config)` asked (a line or None);
    `named`: the line leads with the first job it hits, by number and what it varies. Not for a SLURM sweep: its
    jobs run on nodes that may mount data, models and caches where this host does not (each job still checks them
    before its run opens)."""
    from hydra.core.global_hydra import GlobalHydra

    if "submitit" in str(config.hydra.launcher.get("_target_", "")):
        return []
    loader, seen, problems = GlobalHydra.instance().config_loader(), set(), {}
    for num, overrides in enumerate(sweep_jobs(config.hydra)):
        key = tuple(o for o in overrides if o.startswith(keys))
        if key in seen:
            continue
        seen.add(key)
        job = loader.load_sweep_config(config, list(overrides))
        line = problem(job)
        if line:
            label = job_label(config.hydra, overrides) or f"dataset={job.dataset.name}"
            problems.setdefault(line, f"job {num} ({label}): {line}" if named else line)
    return list(problems.values())


def data_problem(job) -> str | None:
    """The one line for a job config whose data files are missing or corrupt (no rows read)."""
    from hydra.utils import instantiate

    from fairaudit.errors import input_error_line

    try:
        instantiate(job.dataset).check_files()
    except Exception as error:
        line = input_error_line(error)
        if line is None:
            raise
        return line
    return None


def grid_data_problems(config) -> list[str]:
    """One line per distinct missing or corrupt data file of the grid (`grid_problems`)."""
    return grid_problems(config, DATA_KEYS, data_problem)


def grid_model_problems(config) -> list[str]:
    """One line per distinct model of the grid whose files are neither here nor on the hub (a metadata query:
    nothing downloaded), saying how to get them; a dry run needs only the files that render prompts."""
    from fairaudit.models import model_problem

    return grid_problems(config, MODEL_KEYS, lambda job: model_problem(job, weights=not job.get("dry_run")),
                         named=False)


def job_label(hydra, overrides: list[str]) -> str:
    """A job named by the overrides that set it apart from its sweep's other jobs, e.g. "dataset=compas"."""
    varied = set(swept_of(hydra))
    return " ".join(o for o in overrides if o.lstrip("+~").split("=", 1)[0] in varied)


def sweep_run_name(swept_values: dict[str, str], now: datetime | None = None, probe: str | None = None) -> str:
    """e.g. "sweep 2026-11-30 08:41 counterfactual dataset=adult,compas": the date, the probe (unless the sweep
    varies it), then what the sweep varies."""
    varied = " ".join(f"{key}={value}" for key, value in swept_values.items())
    shown = probe if probe and "probe" not in swept_values else ""
    return " ".join(part for part in ("sweep", f"{(now or datetime.now()):%Y-%m-%d %H:%M}", shown, varied)
                    if part)[:120]


def without_probe(overrides: list[str]) -> list[str]:
    """A sweep's overrides less those that choose or set the probe: what sweeps of one study share."""
    return sorted(o for o in overrides if not o.lstrip("+~").split("=", 1)[0].split(".")[0] == "probe")


def override_params(overrides: list[str]) -> dict[str, str]:
    """The sweep's command-line overrides as params, key -> value(s)."""
    pairs = (o.lstrip("+~").split("=", 1) for o in overrides if "=" in o)
    return {f"sweep.{key}": value[:6000] for key, value in pairs}


AXIS_TAGS = ("model", "dataset", "probe", "arm", "seed", "checkpoint")  # a job's grid axes, as tagged on its run
STEP_AXES = ("checkpoint", "seed")  # axes a parent run draws as MLflow steps


SUMMARY_KEYS = ("run", "status", "job", *AXIS_TAGS)  # the sweep summary's columns that are not metrics


def sweep_children(client, parent_id: str) -> list:
    """The parent's child runs, oldest first."""
    experiment = client.get_run(parent_id).info.experiment_id
    return client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent_id}'",
                              order_by=["attributes.start_time ASC"])


def children_summary(client, parent_id: str, children: list | None = None) -> pd.DataFrame:
    """One row per child run (oldest first): run name, status, job number, its grid axes and its headline metrics."""
    rows = []
    for child in sweep_children(client, parent_id) if children is None else children:
        names = json.loads(child.data.tags.get(HEADLINE_TAG, "[]"))
        metrics = child.data.metrics
        rows.append({"run": child.info.run_name, "status": child.info.status,
                     "job": int(child.data.tags.get("fairaudit.job_num") or -1),
                     **{axis: child.data.tags.get(axis, "") for axis in AXIS_TAGS},
                     **{name: metrics.get(name, float("nan")) for name in names}})
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
    own charts on it draw each metric: against training step (mean over seeds at each checkpoint) or seed in a
    checkpoint or seed study, where other axes that vary split the curves (`metric/<their values>`); else at
    step = the job's number."""
    finished = summary[summary["status"] == "FINISHED"] if len(summary) else summary
    metrics = [c for c in finished.columns if c not in SUMMARY_KEYS and pd.api.types.is_numeric_dtype(finished[c])]
    axis = step_axis(summary)
    if axis is None:
        jobs = finished["job"] if "job" in finished else pd.Series(range(len(finished)), index=finished.index)
        return [(metric_key(m), float(row[m]), int(job)) for job, row in zip(jobs, finished.to_dict("records"))
                for m in metrics if row[m] == row[m]]
    varied = [a for a in AXIS_TAGS if a in finished and finished[a].nunique() > 1]
    steps = training_steps(finished[axis]) if axis == "checkpoint" else finished[axis].astype(int)
    cells = [a for a in varied if a not in STEP_AXES]
    means = finished.assign(step=steps.to_numpy()).groupby([*cells, "step"])[metrics].mean().reset_index()
    series = []
    for row in means.to_dict("records"):
        suffix = "/".join(str(row[a]) for a in cells)
        series += [(metric_key(f"{m}/{suffix}" if suffix else m), float(row[m]), int(row["step"]))
                   for m in metrics if row[m] == row[m]]
    return series


def family_verdict(children: list, parent_id: str) -> tuple[str, dict[str, int]] | None:
    """The sweep's verdict on its family of tests (`family` of conf/report.yaml, by default every McNemar test):
    how many of its finished jobs' tests are significant raw and after Holm and Benjamini-Hochberg, and those
    counts as `family_*` metrics; None when no job logged one of the family's metrics."""
    from fairaudit.analysis import multiplicity
    from fairaudit.registry import report_defaults

    metrics, alpha = multiplicity.family_settings(report_defaults()["family"])
    finished = [child for child in children if child.info.status == "FINISHED"]
    runs = pd.DataFrame([{"run_id": child.info.run_id, **child.data.metrics} for child in finished])
    tests = multiplicity.family(runs, metrics, []) if len(runs) else pd.DataFrame()
    if tests.empty:
        return None
    counts = multiplicity.significant(tests, alpha)
    line = multiplicity.counts_sentence(counts, alpha, f"tests ({', '.join(metrics)}) across the sweep's "
                                        f"{len(finished)} finished jobs")
    return (f"{line}; each test's adjusted p: fairaudit report select.parent={parent_id} (its `family` section).",
            {f"family_{name}": value for name, value in counts.items()})


def sweep_verdict(summary: pd.DataFrame, children: list) -> list[str]:
    """What the sweep found, one line each (the parent run's description; others append lines): what ran and at
    which step its metrics are logged, then per job, by what it varies, its verdict's first line and P(Yes) gap."""
    finished = int((summary["status"] == "FINISHED").sum()) if len(summary) else 0
    lines = [f"{len(summary)} jobs, {finished} finished; each job's headline metrics are on this run at step = "
             f"{STEP_MEANING[step_axis(summary)]} (tables/sweep_summary.parquet holds them all)."]
    for child in sorted(children, key=lambda run: int(run.data.tags.get("fairaudit.job_num") or -1)):
        tags, cell = child.data.tags, child.info.run_name.split(" | ")[0]
        head = f"job {tags.get('fairaudit.job_num', '?')} · {cell}: "
        if child.info.status != "FINISHED":
            lines.append(head + f"{child.info.status}: {tags.get(ERROR_TAG, 'no error recorded')}")
            continue
        found = tags.get("mlflow.note.content", "").split("\n\n")[0]
        gap = gap_text(child.data.metrics)
        lines.append(head + found + (f" {gap}" if gap else ""))
    return lines


def gap_text(metrics: dict[str, float]) -> str:
    """"P(Yes) gap think 0.007 [0.0066, 0.0074] vs nothink 0.0016 [...], difference 0.0054 [...]." from a paired
    run's metrics (p_gap_<arm>, delta_p_gap and their _ci_low/_ci_high); "" for a probe without a P(Yes) gap."""
    from fairaudit.console import format_number

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
                counts: dict[str, int] | None = None) -> None:
    """The summary table (sweep_summary.json, tables/sweep_summary.parquet) and multirun.yaml on the parent
    run; for a checkpoint or seed study, the headline metrics by step (`step_series`); the sweep's verdict as
    verdict.txt and the family's counts (`family_verdict`) as metrics."""

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
    values += [Metric(key, value, timestamp, 0) for key, value in (counts or {}).items()]
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
    """The sweep's compare view saved on its experiment (`mlflow_ui.sweep_view_state`): the axes it varies, the
    console table's metrics as columns, and those that differ between its jobs, P(Yes) gaps first, on a
    parallel-coordinates chart. Its key, or None for a sweep without a finished job."""
    from fairaudit.mlflow_ui import save_sweep_view, sweep_view_state

    finished = summary[summary["status"] == "FINISHED"] if len(summary) else summary
    if finished.empty:
        return None
    axes = [a for a in AXIS_TAGS if a in finished and finished[a].nunique() > 1]
    columns = shown_metrics([c for c in finished.columns if c not in SUMMARY_KEYS and finished[c].notna().any()])
    differ = [m for m in columns if finished[m].nunique() > 1] or columns
    gaps = [m for m in differ if "p_gap" in m]  # last, delta_p_gap the very last: MLflow colours the lines by it
    charted = [m for m in differ if m not in gaps][:max(0, CHARTED - len(gaps))] + gaps
    state = sweep_view_state(parent.info.run_id, axes, columns, charted)
    return save_sweep_view(client, parent.info.experiment_id, parent.info.run_id, parent.info.run_name, state)


def print_summary(summary: pd.DataFrame, verdict: list[str], parent_id: str, experiment_id: str, uri: str,
                  view: str | None = None) -> None:
    """The sweep's verdict and its jobs as a table on stdout, then (on stderr) the parent run, where to see it, the
    view that compares its jobs and, when a job finished, the report command."""
    from fairaudit.console import print_verdict
    from fairaudit.mlflow_ui import view_url, where_lines

    print_verdict(verdict)
    if len(summary):
        shown = ["run", "status", *shown_metrics([c for c in summary.columns if c not in SUMMARY_KEYS])]
        print_result(summary_frame_table("sweep jobs (all headline metrics: sweep_summary.json on the parent run)",
                                         summary[shown]))
    finished = int((summary["status"] == "FINISHED").sum()) if len(summary) else 0
    console.print(f"sweep parent run [bold]{parent_id}[/bold]: {len(summary)} jobs, {finished} finished",
                  highlight=False)
    if finished:
        console.print(f"report: fairaudit report select.parent={parent_id}", highlight=False, soft_wrap=True)
    for line in where_lines(uri, experiment_id, parent_id):
        console.print(line, highlight=False, soft_wrap=True)
    if view:
        console.print(f"compare its jobs: {view_url(uri, experiment_id, view)}", highlight=False, soft_wrap=True)


def failure_summary(children: list) -> str:
    """'2 of 3 jobs failed: #1 dataset.n=999999: <error>; ...' in job order, each job named by the
    overrides that set it apart from the sweep's other jobs."""
    overrides = {run.info.run_id: run.data.tags.get("fairaudit.job_overrides", "").split() for run in children}
    shared = set.intersection(*(set(o) for o in overrides.values()))
    failed = sorted((run for run in children if run.info.status != "FINISHED"),
                    key=lambda run: int(run.data.tags.get("fairaudit.job_num", "0") or 0))

    def describe(run) -> str:
        own = " ".join(o for o in overrides[run.info.run_id] if o not in shared)
        error = run.data.tags.get(ERROR_TAG) or f"ended {run.info.status}"
        return f"#{run.data.tags.get('fairaudit.job_num', '?')} {own}: {error}"

    return f"{len(failed)} of {len(children)} jobs failed: " + "; ".join(describe(run) for run in failed)
