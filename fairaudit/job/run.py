"""The job: read its config once, load the model, run the probe through the store, log the run to MLflow."""

from __future__ import annotations

from omegaconf import DictConfig

from fairaudit.errors import AuditError, failure_line, interrupt
from fairaudit.errors.disk import artifacts_full
from fairaudit.errors.interrupt import Interrupted
from fairaudit.job.config import Job, open_client, read_job
from fairaudit.job.dry_run import preview
from fairaudit.job.tags import run_identity
from fairaudit.job.workers import helpers
from fairaudit.probes import AuditContext, ProbeResult
from fairaudit.store.results import Store
from fairaudit.terminal.output import console
from fairaudit.terminal.results import print_result, print_verdict, summary_table
from fairaudit.tracking.database import database_full, tracking_fault
from fairaudit.tracking.jobs_view import refresh_jobs_view
from fairaudit.tracking.runs import Tracker, tracking_failure
from fairaudit.tracking.ui import where_lines


def run(cfg: DictConfig) -> ProbeResult | None:
    """The job `cfg` describes: every cheap check first (`read_job`), then the model, the probe and the run."""
    job = read_job(cfg)
    return preview(job) if job.dry_run else audit(job)


def audit(job: Job) -> ProbeResult:
    """Load the job's model behind the store, run its probe and log the run; its verdict and metrics printed. The run
    meets tracking at three stages: its run opened (`Tracker.start`), its outcome logged and the run closed
    (`Tracker.finish`), or the run closed KILLED or FAILED with its one line (`Tracker.end`)."""
    store, backend, client = open_client(job)
    run_name, tags, params, parent = run_identity(job, backend)
    tracker = Tracker(*job.tracking)
    run_id = tracker.start(run_name, tags, params, parent, job.settings)
    ended = False
    try:
        with helpers(job) as others:
            result = job.probe.run(AuditContext(client, backend.tokenizer, job.spec, job.dataset, job.arm))
        result.metrics.update(client.metrics())
        if others:
            log_workers(tracker, result, client.model_calls, others.calls)
        verdict = job.probe.verdict(result)
        title_figures(result.figures, f"{job.spec.name}, {job.dataset.name}: {' vs '.join(a.name for a in job.arms)}")
        tracker.finish(job.settings, job.place.overrides, (job.dataset.name, data_source(job.dataset)), result,
                       job.probe.samples, verdict, run_name)
        ended = True
    except BaseException as error:
        stop = stopped(error, client.model_calls, store, tracker)
        killed = isinstance(stop, Interrupted)
        line = interrupted_line(stop.kept) if killed else failure_line(stop)
        closed = tracker.end(killed=killed, failed=not killed, error=line)
        if killed:
            raise stop from None
        if not closed and isinstance(stop, AuditError):  # the line still ends with the re-run
            stop = AuditError(f"its MLflow run {run_id} could not be marked FAILED and shows RUNNING until the "
                              f"re-run closes it KILLED; {stop}")
        raise stop
    finally:
        store.close(release=ended)  # the write-ahead log folded into the file a user may copy
    refresh_jobs_view(tracker.client, tracker.experiment_id)  # the experiment's page opens on its jobs side by side
    print_summary(run_name, result, verdict, run_id, tracker.experiment_id, job.tracking[0])
    return result


def interrupted_line(kept: int) -> str:
    """The error line of a run the user stopped."""
    return f"interrupted ({interrupt.cause()}) after {kept} new results, all kept in the store"


def stopped(error: BaseException, kept: int, store: Store, tracker: Tracker) -> BaseException:
    """What a run that stopped raises: `Interrupted` for Ctrl-C (SIGTERM, SIGHUP), a failed resource's one line
    (`fault_of`), else the error itself."""
    if isinstance(error, KeyboardInterrupt):
        return Interrupted(kept)
    return fault_of(error, tracker.uri, store, tracker) or error


def log_workers(tracker: Tracker, result: ProbeResult, own: int, helpers_calls: list[int]) -> None:
    """A job run over several processes: `model_calls` counts every process's computed calls, `workers` how many
    processes ran it, and `worker_model_calls` each one's (its step the worker's number, 0 for this process)."""
    result.metrics["model_calls"] = own + sum(helpers_calls)
    result.metrics["workers"] = 1 + len(helpers_calls)
    tracker.log_steps("worker_model_calls", [own, *helpers_calls])


def fault_of(error: BaseException, uri: str, store: Store, tracker: Tracker) -> AuditError | None:
    """The one-line error for a resource that failed mid-run: the store (its server gone, frozen or locked, its file
    locked or damaged), the tracking server or database (gone, locked, damaged, full), the artifacts' disk full; None
    for anything else."""
    return (store.fault(error) or tracking_failure(error, uri) or database_full(error, uri)
            or tracking_fault(error, uri) or artifacts_full(error, tracker.run.info.artifact_uri, tracker.writing))


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
