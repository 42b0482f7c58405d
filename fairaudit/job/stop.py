"""A sweep whose jobs run in processes of their own (`hydra/launcher=joblib`, `submitit_local`, `slurm`, `ray`) stopped
whole: the signal that stops its parent (Ctrl-C, SIGTERM, SIGHUP) is passed on to each running job (a SLURM array is
cancelled with scancel: SIGTERM; a Ray sweep's tasks end as its parent leaves the cluster), which closes its run
KILLED as a lone run does; the parent waits for them
(at most GRACE_S), kills what is left, closes KILLED any run a killed job left RUNNING and its own run, and exits
with 128 + the signal's number. A job starting once its sweep is stopping stops at once."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, read_write

from fairaudit.errors import interrupt
from fairaudit.job.ray_tasks import connect, launcher_is_ray
from fairaudit.processes import descendants
from fairaudit.tracking.sweeps import close_stopped

GRACE_S = 30.0  # how long a stopped sweep's jobs have to close their runs before they are killed
EXIT_S = 5.0  # how long the parent then waits for the jobs' processes to end before it kills them
JOBS = ".fairaudit-jobs"  # in the sweep folder: a file per running job, named by its process's pid
STOP = "stop"  # in JOBS once the sweep is stopping: the number of the signal that stopped it
BASIC = "BasicLauncher"  # Hydra's launcher that runs a sweep's jobs in its own process, one by one


@dataclass(frozen=True)
class ParallelSweep:
    """The sweep this process launched, when its jobs run in processes of their own."""

    folder: Path  # Hydra's sweep folder
    uri: str  # tracking.uri
    slurm_jobs: str | None  # the launcher's submitit folder, with %j for the job id: a SLURM array's jobs
    ray: bool = False  # its jobs are Ray tasks (hydra/launcher=ray): this process's Ray job owns them


_launched: list[ParallelSweep] = []  # the sweep this process launched last, when it runs its jobs elsewhere


def watch(config: DictConfig) -> None:
    """Arm the sweep's parent (once its sweep opens) to stop every job on a signal, when its launcher runs them in
    processes of their own; the basic launcher's jobs run here and stop as this process does."""
    launcher = config.hydra.launcher
    if str(launcher._target_).endswith(BASIC):
        return
    folder = Path(config.hydra.sweep.dir).absolute()
    jobs = folder / JOBS
    (jobs / STOP).unlink(missing_ok=True)  # left by an earlier, stopped sweep in the same folder
    jobs.mkdir(parents=True, exist_ok=True)
    slurm = "slurm" in str(launcher._target_).lower()
    if launcher_is_ray(launcher):  # joined here, so that the launcher finds it joined and a stop stays ours
        connect({"log_to_driver": True, **OmegaConf.to_container(launcher.ray.init, resolve=True)})  # jobs' lines
        with read_write(config.hydra):  # a task's worker starts elsewhere: the sweep folder as this one sees it, in
            config.hydra.sweep.dir = str(folder)  # the overrides every job's config is composed again from
            config.hydra.overrides.hydra.append(f"hydra.sweep.dir='{folder}'")
    if not _launched:
        interrupt.on_stop(stop_jobs, kill_jobs, finish)
    _launched[:] = [ParallelSweep(folder, str(config.tracking.uri), str(launcher.submitit_folder) if slurm else None,
                                  launcher_is_ray(launcher))]


def stop_jobs(signum: int) -> None:
    """The first signal: each job told to stop (a job yet to start finds the sweep stopping), then waited for."""
    if not _launched:
        return
    (sweep,) = _launched
    (sweep.folder / JOBS / STOP).write_text(str(signum))
    if sweep.slurm_jobs:
        cancel(sweep.slurm_jobs)
    for pid in running_jobs(sweep.folder):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    wait_until(lambda: not busy(sweep), GRACE_S)


def kill_jobs() -> None:
    """A second signal: every job killed at once."""
    if not _launched:
        return
    (sweep,) = _launched
    if sweep.slurm_jobs:
        cancel(sweep.slurm_jobs, "--signal=KILL")
    kill(job_processes())


def finish() -> None:
    """Once the stop reached this process's top: what still runs killed, the runs it left RUNNING and the sweep's
    parent run closed KILLED. Best effort: a tracking server that is gone leaves them to the next run's clean-up."""
    if not _launched:
        return
    (sweep,) = _launched
    if sweep.slurm_jobs:
        cancel(sweep.slurm_jobs, "--signal=KILL")
    if sweep.ray:
        leave_ray()
    left = job_processes()
    wait_until(lambda: not any(alive(pid) for pid in left), EXIT_S)
    kill(left)
    with contextlib.suppress(Exception):
        close_stopped(sweep.uri, sweep.folder, f"interrupted ({interrupt.cause()}): its jobs were stopped")
    settled()


def leave_ray() -> None:
    """This process leaves its Ray cluster: Ray then ends every task this process's Ray job still runs (on any node
    of the cluster); the runs they leave RUNNING are closed KILLED here."""
    import ray

    if ray.is_initialized():
        with contextlib.suppress(Exception):
            ray.shutdown()


def settled() -> None:
    """The sweep's jobs all ended: their marks folder removed, and a signal from now on stops this process alone."""
    for sweep in _launched:
        for mark in (sweep.folder / JOBS).glob("*"):
            mark.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            (sweep.folder / JOBS).rmdir()
    _launched.clear()


def in_own_process() -> bool:
    """This sweep job runs in a process of its own, not in its sweep's parent (as the basic launcher's do)."""
    return not str(HydraConfig.get().launcher._target_).endswith(BASIC)


@contextlib.contextmanager
def job_process(sweep_dir: str):
    """A sweep job's stay in a process of its own: its signals armed (the first stops it; the parent handles any
    more), its pid marked in the sweep folder so a stopping parent signals it, and a sweep already stopping stops
    it before it starts."""
    if not in_own_process():
        yield
        return
    interrupt.arm(again_exits=False)
    jobs = Path(sweep_dir) / JOBS
    jobs.mkdir(parents=True, exist_ok=True)
    mark = jobs / str(os.getpid())
    mark.touch()
    try:
        if (jobs / STOP).exists():
            interrupt.stop_now(int((jobs / STOP).read_text() or signal.SIGTERM))
        yield
    finally:
        mark.unlink(missing_ok=True)


def running_jobs(folder: Path) -> list[int]:
    """The pids of the sweep's jobs running in this process's children (a pid a dead job left is never another's)."""
    ours = set(descendants(os.getpid()))
    return [int(mark.name) for mark in (folder / JOBS).glob("*") if mark.name.isdigit() and int(mark.name) in ours]


def job_processes() -> list[int]:
    """This process's descendants that run jobs: all but the resource trackers of multiprocessing and loky, which
    end when this process does."""
    return [pid for pid in descendants(os.getpid()) if "resource_tracker" not in command_of(pid)]


def busy(sweep: ParallelSweep) -> bool:
    """A job of the sweep still runs: a SLURM job still queued, or a job process still marked here."""
    if sweep.slurm_jobs and slurm_ids(sweep.slurm_jobs):
        listed = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(slurm_ids(sweep.slurm_jobs))],
                                capture_output=True, text=True)
        if listed.returncode == 0 and listed.stdout.strip():
            return True
    return bool(running_jobs(sweep.folder))


def slurm_ids(submitit_folder: str) -> list[str]:
    """The SLURM jobs (array ids) the launcher submitted: its folders `<job id>_<task>` under the submitit folder."""
    pattern = Path(submitit_folder.replace("%j", "*"))
    found = {m.group(1) for p in pattern.parent.glob(pattern.name) if (m := re.fullmatch(r"(\d+)(_\d+)?", p.name))}
    return sorted(found)


def cancel(submitit_folder: str, *options: str) -> None:
    """scancel the sweep's SLURM jobs (SIGTERM to their processes, then SLURM's SIGKILL; pending ones never start)."""
    ids = slurm_ids(submitit_folder)
    if ids:
        with contextlib.suppress(OSError):
            subprocess.run(["scancel", *options, *ids], capture_output=True, timeout=30)


def command_of(pid: int) -> str:
    """The process's command line, "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """The process still runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_until(done: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.1)
