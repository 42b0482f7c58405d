"""The job: read its config once, load the model, run the probe through the store, log the run to MLflow; and how a
Hydra task ends (`run_or_exit`): bad input is one `error:` line and exit code 2 (its empty output folder removed),
Ctrl-C (SIGTERM, SIGHUP) one line saying what is kept and how to resume; anything else its traceback and its line."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

from omegaconf import DictConfig

from fairaudit.errors import AuditError, failure_line, interrupt
from fairaudit.errors.disk import artifacts_full
from fairaudit.errors.interrupt import Interrupted
from fairaudit.errors.secrets import redact_hydra_files
from fairaudit.job.config import Job, build_backend, model_folder, read_job
from fairaudit.job.dry_run import preview
from fairaudit.job.tags import engine_label, engine_params, job_run_name, job_tags
from fairaudit.probes import AuditContext, ProbeResult
from fairaudit.store.client import CachingClient
from fairaudit.store.results import Store
from fairaudit.terminal.output import console, print_failure, print_line, quiet_libraries
from fairaudit.terminal.results import print_result, print_verdict, summary_table
from fairaudit.tracking import tags as t
from fairaudit.tracking.database import database_full, tracking_fault
from fairaudit.tracking.jobs_view import refresh_jobs_view
from fairaudit.tracking.runs import Tracker, flatten, parent_run_id, tracking_failure
from fairaudit.tracking.ui import where_lines


def run(cfg: DictConfig) -> ProbeResult | None:
    """The job `cfg` describes: every cheap check first (`read_job`), then the model, the probe and the run."""
    job = read_job(cfg)
    return preview(job) if job.dry_run else audit(job)


def audit(job: Job) -> ProbeResult:
    """Load the job's model behind the store, run its probe and log the run; its verdict and metrics printed."""
    model_dir = model_folder(job)  # its files checked before anything opens
    store = Store(job.store_url)  # a database server that refuses: one line before the backend reads the model
    backend = build_backend(job, model_dir)
    client = CachingClient(backend, store, chunk_size=job.model["batch_size"])
    uri, experiment = job.tracking
    tracker = Tracker(uri, experiment)
    batch_size = job.model["batch_size"]
    tags = {**job_tags(job.settings, job.place), t.ENGINE_TAG: engine_label(backend, batch_size)}
    run_name = job_run_name(tags, job.place.varied)
    axes = {axis: tags[axis] for axis in t.AXIS_TAGS}  # short params, so Compare can plot against the grid's axes
    parent = parent_run_id(job.place.sweep_dir) if job.place.sweep_dir else None
    params = {**axes, **engine_params(backend, batch_size), **flatten(job.settings)}
    run_id = tracker.start(run_name, tags, params, parent)
    ended = False
    try:
        result = job.probe.run(AuditContext(client, backend.tokenizer, job.spec, job.dataset, job.arm))
        result.metrics.update(client.metrics())
        verdict = job.probe.verdict(result)
        log_run(tracker, job, result, verdict, run_name)
        ended = True
    except KeyboardInterrupt:
        tracker.end(killed=True, error=f"interrupted ({interrupt.cause()}) after {client.model_calls} new results, "
                                       "all kept in the store")
        raise Interrupted(client.model_calls) from None
    except BaseException as error:
        failure = fault_of(error, uri, store, tracker)
        if not tracker.end(failed=True, error=failure_line(failure or error)) and failure is not None:
            failure = AuditError(f"its MLflow run {run_id} could not be marked FAILED and shows RUNNING until the "
                                 f"re-run closes it KILLED; {failure}")  # the line still ends with the re-run
        raise failure or error
    finally:
        store.close(release=ended)  # the write-ahead log folded into the file a user may copy
    tracker.end()
    refresh_jobs_view(tracker.client, tracker.experiment_id)  # the experiment's page opens on its jobs side by side
    print_summary(run_name, result, verdict, run_id, tracker.experiment_id, uri)
    return result


def fault_of(error: BaseException, uri: str, store: Store, tracker: Tracker) -> AuditError | None:
    """The one-line error for a resource that failed mid-run: the store (its server gone, frozen or locked, its file
    locked or damaged), the tracking server or database (gone, locked, damaged, full), the artifacts' disk full; None
    for anything else."""
    return (store.fault(error) or tracking_failure(error, uri) or database_full(error, uri)
            or tracking_fault(error, uri) or artifacts_full(error, tracker.run.info.artifact_uri, tracker.writing))


def log_run(tracker: Tracker, job: Job, result: ProbeResult, verdict: list[str], run_name: str) -> None:
    """Everything a finished probe logs: config, data set input, metrics, tables, figures, records, the
    per-sample views, and the verdict (as verdict.txt and the run's description)."""
    title_figures(result.figures, f"{job.spec.name}, {job.dataset.name}: {' vs '.join(a.name for a in job.arms)}")
    tracker.log_config(job.settings, job.place.overrides)
    view = job.probe.samples
    tracker.log_dataset(result.records[view.frame], job.dataset.name, data_source(job.dataset))
    tracker.log_result(result.metrics, result.tables, result.figures, result.records)
    tracker.log_samples(result.records[view.frame], view.layout, run_name)
    tracker.log_verdict(verdict, result.metrics)  # verdict.txt, warnings.txt, the description and warning tags
    tracker.set_tags({t.HEADLINE_TAG: json.dumps(result.headline)})


def data_source(dataset) -> str:
    """Where a data set was read from: its file (MCQ sets), else its data root (tabular sets)."""
    return str(getattr(dataset, "path", None) or getattr(dataset, "root", None) or dataset.name)


def title_figures(figures: dict, title: str) -> None:
    """Every figure of a run names its model, dataset and arms above its panels (wrapped, so never clipped)."""
    for figure in figures.values():
        figure.suptitle(title, fontsize="medium", wrap=True)


def print_summary(title: str, result: ProbeResult, verdict: list[str], run_id: str, experiment_id: str,
                  uri: str) -> None:
    """The verdict and the headline metrics on stdout; the run id and where to see it on stderr."""
    print_verdict(verdict)
    print_result(summary_table(title, result.metrics, result.headline + ["model_calls"]))
    console.print(f"MLflow run [bold]{run_id}[/bold]")
    for line in where_lines(uri, experiment_id, run_id):
        console.print(line, highlight=False, soft_wrap=True)


def run_or_exit(job: Callable[[Any], object], cfg: Any) -> None:
    """Run a Hydra task; bad input (an AuditError, also inside Hydra's instantiate) becomes one
    `error:` line and exit code 2; Ctrl-C (SIGTERM, SIGHUP) one line saying what is kept and how to resume, exit
    code 128 + the signal. Anything else is a bug: its traceback, then its one `error:` line, exit code 1 (secrets
    hidden in both; the task never raises, so Hydra never prints its own line, which repeats the command line)."""
    quiet_libraries()
    try:
        redact_hydra_files(cfg)
        job(cfg)
    except KeyboardInterrupt as stop:
        print_line(interrupt.message(getattr(stop, "kept", 0)))
        sys.exit(interrupt.exit_code())
    except Exception as error:
        code = print_failure(error)
        if code == 2:
            discard_output_dir()
        sys.exit(code)


def discard_output_dir() -> None:
    """A rejected run's Hydra output folder removed when it holds only Hydra's own files (.hydra/, the job's log),
    with the dated folders above it that this leaves empty, up to the working folder: a typo leaves nothing."""
    import os
    import shutil
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.get()
    folder, cwd = Path(hydra_cfg.runtime.output_dir), Path(os.getcwd())
    own = {".hydra", f"{hydra_cfg.job.name}.log"}
    if folder == cwd or not folder.is_dir() or any(p.name not in own for p in folder.iterdir()):
        return
    shutil.rmtree(folder)
    for parent in folder.parents:
        if parent == cwd or not parent.is_relative_to(cwd) or any(parent.iterdir()):
            break
        parent.rmdir()
