"""The job: read its config once, load the model, run the probe through the store, log the run to MLflow."""

from __future__ import annotations

from omegaconf import DictConfig

from fairaudit.errors import AuditError, failure_line, interrupt
from fairaudit.errors.disk import artifacts_full
from fairaudit.errors.interrupt import Interrupted
from fairaudit.job.client import open_client
from fairaudit.job.config import Job, read_job
from fairaudit.job.dry_run import preview
from fairaudit.job.tags import run_identity
from fairaudit.job.workers import helpers
from fairaudit.probes import AuditContext, ProbeResult
from fairaudit.store.results import Store
from fairaudit.terminal.output import console
from fairaudit.terminal.results import print_result, print_verdict, summary_table
from fairaudit.tracking.database import failure_of
from fairaudit.tracking.jobs_view import refresh_jobs_view
from fairaudit.tracking.runs import Tracker
from fairaudit.tracking.ui import where_lines


def run(cfg: DictConfig) -> ProbeResult | None:
    """The job `cfg` describes: every cheap check first (`read_job`), then the model, the probe and the run."""
    job = read_job(cfg)
    return preview(job) if job.dry_run else audit(job)


def audit(job: Job) -> ProbeResult:
    """Load the job's model behind the store, run its probe and log the run; its verdict and metrics printed. The run
    meets tracking at three stages: its run opened with its config and params (`Tracker.open`), its outcome logged
    (`RunContent.log_all`), its run closed: FINISHED, or KILLED or FAILED with its one line (`Tracker.end`)."""
    store, backend, client = open_client(job)
    run_name, tags, params = run_identity(job, backend)
    tracker = Tracker.open(job.tracking, run_name, tags, params, job.place.sweep_dir, job.settings)
    run_id = tracker.run.info.run_id
    ended = False
    try:
        with helpers(job) as others:
            result = job.probe.run(AuditContext(client, backend.tokenizer, job.spec, job.dataset, job.arm))
        result.metrics.update(client.metrics())
        steps = others.counted(result.metrics, client.model_calls) if others else {}
        verdict = job.probe.verdict(result)
        title_figures(result.figures, f"{job.spec.name}, {job.dataset.name}: {' vs '.join(a.name for a in job.arms)}")
        tracker.content.log_all(job.settings, job.place.overrides, (job.dataset.name, data_source(job.dataset)),
                                result, job.probe.samples, verdict, run_name, steps)
        tracker.end()
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
    """What a run that stopped raises: `Interrupted` for Ctrl-C (SIGTERM, SIGHUP), the one line of a resource that
    failed mid-run (the store: its server gone, frozen or locked, its file locked or damaged; tracking: its server
    or database gone, locked, damaged or full, the artifacts' disk full), else the error itself."""
    if isinstance(error, KeyboardInterrupt):
        return Interrupted(kept)
    return (store.fault(error) or failure_of(error, tracker.uri)
            or artifacts_full(error, tracker.run.info.artifact_uri, tracker.content.writing) or error)


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
