"""One job over several processes (`job.workers`): helpers that compute the job's model calls beside it.

A job's calls go through the result store, whose claims let each call be computed once whoever asks
(`store.claims`). A worker is the same job's probe run in another process on the same store, with no MLflow run
and no output: its calls land in the store, where the job reads them as they come. The job itself is a worker
too; once its probe has every result it asked for (so every call is in), the helpers are stopped, each reports
how many calls it computed, and the job alone computes its metrics and logs its one run. A helper that dies
leaves its claims to the others (at once on this host, after the lease elsewhere); a re-run reads everything.

Helpers run as local processes (`job.workers_on=local`) or as Ray tasks (`ray`: the cluster `RAY_ADDRESS`
names, each task with the job's `job.worker_resources`). The job's config reaches a helper on its standard
input or as a task argument, never on a command line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from fairaudit.errors import AuditError, interrupt
from fairaudit.terminal.output import console

STOP_WAIT_S = 30.0  # a helper asked to stop gets this long to report before it is killed
WORKERS_LOG = "workers"  # the folder of the helpers' logs, in the job's output folder


@dataclass
class Helpers:
    """The helpers of one job: how many there are and how to stop them, each reporting its calls."""

    count: int
    stop: Callable[[], list[int]]  # stops every helper; returns each one's computed calls
    calls: list[int] = field(default_factory=list)  # filled by `stop`: each helper's computed calls

    @property
    def total(self) -> int:
        return sum(self.calls)

    def counted(self, metrics: dict, own: int) -> dict[str, list[float]]:
        """The job's calls over its processes: `model_calls` set to every process's computed calls (`own`: this
        process's), `workers` to how many processes ran it; returns `worker_model_calls`, each one's by step (the
        worker's number, 0 for this process)."""
        metrics["model_calls"] = own + self.total
        metrics["workers"] = 1 + len(self.calls)
        return {"worker_model_calls": [own, *self.calls]}


def spec_of(job, index: int) -> dict:
    """What a helper needs to run `job`'s probe: its resolved settings and its place, as plain values."""
    return {"settings": job.settings, "place": asdict(job.place), "index": index}


@contextmanager
def helpers(job) -> Iterator[Helpers | None]:
    """Start `job.workers - 1` helpers beside this process while the body runs, then stop them (their calls are
    all in by then) and count what each computed. None when the job runs in one process."""
    count = int(job.settings.get("job", {}).get("workers", 1)) - 1
    if count < 1:
        yield None
        return
    log_dir = output_folder() / WORKERS_LOG
    where = job.settings["job"].get("workers_on", "local")
    started = start_ray(job, count) if where == "ray" else start_local(job, count, log_dir)
    kind = "Ray task" if where == "ray" else "process"
    logs = "" if where == "ray" else f" (logs in {log_dir})"
    console.print(f"[dim]{count} more {kind}{'es' if kind == 'process' and count > 1 else 's' * (count > 1)} "
                  f"computing this job's calls beside it{logs}[/dim]", highlight=False)
    try:
        yield started
    finally:
        started.calls = started.stop()


def output_folder() -> Path:
    """This job's Hydra output folder (a temporary one outside a Hydra run)."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    import tempfile

    return Path(tempfile.mkdtemp(prefix="fairaudit-job-"))


def start_local(job, count: int, log_dir: Path) -> Helpers:
    """`count` helper processes on this host, each fed its spec on standard input, logging to `log_dir`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for index in range(1, count + 1):
        log = open(log_dir / f"worker-{index}.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "fairaudit.job.workers"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        with proc.stdin:
            proc.stdin.write(json.dumps(spec_of(job, index)))
        proc.stdin = None  # written and closed: `communicate` reads its output alone
        procs.append((proc, log))
    return Helpers(count, lambda: [stop_local(proc, log) for proc, log in procs])


def stop_local(proc: subprocess.Popen, log) -> int:
    """Ask one helper to stop (SIGTERM: it commits and reports), kill it past STOP_WAIT_S; its computed calls."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    log.close()
    return reported_calls(out)


def reported_calls(out: str | None) -> int:
    """The calls a helper said it computed (its last line of standard output), 0 when it said nothing."""
    lines = (out or "").strip().splitlines()
    try:
        return int(json.loads(lines[-1])["model_calls"]) if lines else 0
    except (ValueError, KeyError, TypeError):
        return 0


def start_ray(job, count: int) -> Helpers:
    """`count` helpers as Ray tasks on the cluster `RAY_ADDRESS` names (a local one started when none does)."""
    import ray

    from fairaudit.job.ray_tasks import connect

    connect()
    resources = dict(job.settings["job"].get("worker_resources") or {})
    task = ray.remote(**resources)(work) if resources else ray.remote(work)
    refs = [task.remote(spec_of(job, index)) for index in range(1, count + 1)]
    return Helpers(count, lambda: stop_ray(refs))


def stop_ray(refs: list) -> list[int]:
    """Cancel the helpers' Ray tasks (each then reports as a local helper does); their computed calls."""
    import ray

    for ref in refs:
        ray.cancel(ref)
    calls = []
    for ref in refs:
        try:
            calls.append(int(ray.get(ref, timeout=STOP_WAIT_S)))
        except Exception:  # cancelled before it reported, or gone
            calls.append(0)
    return calls


def work(spec: dict) -> int:
    """A helper's whole life: the job's probe run against the store until every call it asks is in, or it is
    stopped; returns the calls it computed (all committed)."""
    from omegaconf import OmegaConf

    from fairaudit.job.client import open_client
    from fairaudit.job.config import Place, read_job
    from fairaudit.probes import AuditContext

    job = read_job(OmegaConf.create(spec["settings"]), place=Place(**spec["place"]), here=False)
    store, backend, client = open_client(job)
    try:
        job.probe.run(AuditContext(client, backend.tokenizer, job.spec, job.dataset, job.arm))
    except KeyboardInterrupt:
        pass
    finally:
        store.close()
        backend.close()
    return client.model_calls


def main() -> None:
    """`python -m fairaudit.job.workers`: one local helper, its spec on standard input; its computed calls as the
    last line of its standard output. SIGTERM (the job has every call) stops it where it is."""
    interrupt.arm()
    spec = json.loads(sys.stdin.read())
    calls = 0
    try:
        calls = work(spec)
    except KeyboardInterrupt:
        pass
    except AuditError as error:
        print(f"error: {error}", file=sys.stderr)
    print(json.dumps({"model_calls": calls, "pid": os.getpid(), "time": time.time()}), flush=True)


if __name__ == "__main__":
    main()
