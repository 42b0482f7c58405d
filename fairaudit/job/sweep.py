"""A sweep (`-m`, or a study that sweeps): checked whole before its parent run opens, its jobs run one by one, a
failing job recorded without stopping the others, its parent closed with their summary once they end."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from fairaudit.catalog import registry
from fairaudit.errors import AuditError, failure_line, input_error_line, interrupt
from fairaudit.errors.secrets import redact, redact_hydra_files, remember_config
from fairaudit.job import stop
from fairaudit.job.config import Place, resolved
from fairaudit.job.grid import (
    git_commit,
    job_label,
    override_params,
    sweep_jobs,
    sweep_run_name,
    swept_of,
    without_probe,
)
from fairaudit.job.preflight import ends_the_command, exit_on, sweep_problems
from fairaudit.job.run import run
from fairaudit.job.tags import job_run_name, job_tags
from fairaudit.terminal.output import print_error, print_line, print_traceback, quiet_libraries
from fairaudit.tracking import tags as t
from fairaudit.tracking.database import server_problem
from fairaudit.tracking.runs import Tracker, config_key
from fairaudit.tracking.succession import parent_run_id
from fairaudit.tracking.sweeps import Sweep, close_parent, open_parent


class SweepCallback(Callback):
    """Hydra callback: a parent MLflow run for each multirun, its jobs become children.

    Before the parent opens, the whole grid is checked (tracking, every job's values, data and models): a problem
    anywhere is its one line and exit code 2, with nothing opened. The parent ends FAILED, with a summary of the
    failed jobs as tag and description, when any child did not finish; the process then exits 1. A parent a killed
    sweep left RUNNING is closed KILLED by the next run of the same sweep (same overrides).
    """

    @ends_the_command
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)  # so ${hydra:runtime.cwd} in tracking.uri resolves
        quiet_libraries()
        remember_config(config)  # the parent's tags, params and overrides.txt are logged with passwords hidden
        exit_on(sweep_problems(config))
        stop.watch(config)  # a signal to this process stops the jobs a parallel launcher runs elsewhere
        if config.get("dry_run"):
            return  # a dry run logs nothing: no parent run either
        try:
            open_parent(sweep_of(config))
        except AuditError as error:
            exit_on([str(error)])

    @ends_the_command
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        stop.settled()
        gone = server_problem(config.tracking.uri)  # a database server that went down mid-sweep: its line, at once
        if gone:
            print_error(gone)
            sys.exit(1)
        family = registry.report_family(registry.names("probe"))  # each job's probe's declared tests
        failed = close_parent(config.tracking.uri, Path(config.hydra.sweep.dir), family)
        if failed:
            print_error(failed)
            sys.exit(1)


def sweep_of(config: DictConfig) -> Sweep:
    """The parent run a sweep opens, from its composed config (with its `hydra` node)."""
    hydra, (uri, experiment) = config.hydra, (config.tracking.uri, config.tracking.experiment)
    overrides = redact(OmegaConf.to_container(hydra.overrides.task, resolve=False))
    swept, chosen = swept_of(hydra), hydra.runtime.choices.get("probe")
    return Sweep(uri, experiment, Path(hydra.sweep.dir), sweep_run_name(swept, probe=chosen),
                 key=config_key("sweep", overrides, experiment), study=config_key("study", without_probe(overrides),
                                                                                  experiment),
                 probe=swept.get("probe") or chosen or "", overrides=overrides,
                 params=redact(override_params(overrides, swept)),
                 jobs=[job_label(hydra, job) for job in sweep_jobs(hydra)], commit=git_commit(hydra.runtime.cwd),
                 command=interrupt.command_line())


def run_sweep_job(cfg: DictConfig) -> None:
    """One job of a multirun. A failing job never stops the sweep: it is one error line here, naming the job by
    what it varies (a traceback too when it is not bad input), and a FAILED child run carrying that line. A dry
    run's failing job ends the dry run (exit code 2): a dry run records nothing."""
    place = Place.of_hydra()
    try:
        with stop.job_process(place.sweep_dir):
            redact_hydra_files(cfg)
            run(cfg)
    except KeyboardInterrupt as stopped:
        stop_sweep(cfg, place, getattr(stopped, "kept", 0))
    except Exception as error:
        line = input_error_line(error)
        if line is None:
            print_traceback(error)
        line = line or failure_line(error)
        print_error(f"{label_in(place) or 'job'}: {line}")
        if cfg.dry_run:
            sys.exit(2)
        try:
            record_failed_job(cfg, place, line)
        except AuditError:  # the tracking location itself failed, which the job's line says: nothing to record in
            pass


def label_in(place: Place) -> str:
    """A sweep job named by the overrides that set it apart from its siblings (e.g. "dataset=compas")."""
    path = Path(place.sweep_dir) / "multirun.yaml"
    return job_label(OmegaConf.load(path).hydra, place.overrides) if path.exists() else ""


def stop_sweep(cfg: DictConfig, place: Place, kept: int) -> None:
    """Ctrl-C (or SIGTERM, SIGHUP) in a sweep job: its run has closed KILLED; the parent ends KILLED too, one line
    says what is kept (a job in a process of its own says it alone: the sweep's parent closes its run, and says how
    to resume)."""
    if stop.in_own_process():
        print_line(interrupt.job_message(kept, place.num))
        sys.exit(interrupt.exit_code())
    parent = parent_run_id(place.sweep_dir)
    if parent:
        tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment)
        tracker.client.set_tag(parent, t.NOTE_TAG, f"interrupted ({interrupt.cause()}) in job {place.num}")
        tracker.client.set_terminated(parent, status="KILLED")
    print_line(interrupt.message(kept, place.num))
    sys.exit(interrupt.exit_code())


def record_failed_job(cfg: DictConfig, place: Place, line: str) -> None:
    """A FAILED child run for a job that failed before its run opened (one that opened has closed itself)."""
    parent = parent_run_id(place.sweep_dir)
    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment)
    opened = tracker.client.search_runs([tracker.experiment_id], f"tags.`{t.PARENT_TAG}` = '{parent}' AND "
                                        f"tags.`{t.JOB_NUM_TAG}` = '{place.num}'")
    if opened:
        return
    label = label_in(place)  # e.g. "dataset.n=999999": what sets it apart
    try:
        tags = job_tags(resolved(cfg), place)
        name = job_run_name(tags, place.varied)
        name = f"{label} | {name}" if label and " | " not in name else name  # a sweep over keys that are no axis
    except Exception:  # a config that does not even resolve: the failure is still recorded
        tags = {t.KIND_TAG: "job", t.JOB_NUM_TAG: str(place.num), t.JOB_OVERRIDES_TAG: " ".join(place.overrides)}
        name = label or " ".join(place.overrides) or f"job {place.num}"
    tracker.start(name[:250], tags, {}, parent)
    tracker.end(failed=True, error=line)
