"""A sweep checked whole before its parent run opens, with the checks a run makes before its own run opens: its
tracking location; every job's values, settings and fit (`read_job`), and no job twice; then what this host holds
and reaches, each asked once for the grid: the data (files, size, protected values), each backend's server, each
model's files (a metadata query: nothing downloaded). Each distinct problem is one `error:` line, exit code 2."""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from fairaudit.errors import AuditError, input_error_line
from fairaudit.job.checks import value_problems
from fairaudit.job.config import ModelSource, Place, backend_of, read_job
from fairaudit.job.grid import job_label, sweep_jobs
from fairaudit.job.ray_tasks import address_of, cluster_problem, launcher_is_ray
from fairaudit.terminal.output import print_error, print_failure
from fairaudit.tracking.location import validate_tracking


@dataclass(frozen=True)
class GridJob:
    """One job of a sweep, composed as Hydra's sweeper will launch it."""

    num: int
    overrides: list[str]
    label: str            # what sets it apart, e.g. "dataset=compas"
    config: DictConfig    # its own keys (the `hydra` node left out)
    choices: dict         # config group -> option (probe, backend, ...)


def grid_jobs(config: DictConfig) -> list[GridJob]:
    """Every job of the sweep, composed once (its `hydra` node holds values known only once it is launched)."""
    from hydra.core.global_hydra import GlobalHydra

    loader, jobs = GlobalHydra.instance().config_loader(), []
    for num, overrides in enumerate(sweep_jobs(config.hydra)):
        job = loader.load_sweep_config(config, list(overrides))
        own = OmegaConf.masked_copy(job, [key for key in job if key != "hydra"])
        label = job_label(config.hydra, overrides) or " ".join(overrides) or f"job {num}"
        jobs.append(GridJob(num, list(overrides), label, own, dict(job.hydra.runtime.choices)))
    return jobs


def on_a_cluster(config: DictConfig) -> bool:
    """A SLURM sweep, or a sweep on a Ray cluster: its jobs run on nodes that may mount data, models and caches
    where this host does not and reach servers this host cannot (each job still checks them before its run opens)."""
    launcher = config.hydra.launcher
    return "submitit" in str(launcher.get("_target_", "")) or (launcher_is_ray(launcher) and bool(address_of(
        launcher.get("ray", {}).get("init"))))


def launcher_problem(config: DictConfig) -> str | None:
    """Why the sweep's launcher cannot start its jobs, found before any starts (a Ray cluster that does not answer)."""
    if not launcher_is_ray(config.hydra.launcher):
        return None
    return cluster_problem(OmegaConf.to_container(config.hydra.launcher.get("ray", {}).get("init") or {}))


def each_job(jobs: list[GridJob], problem: Callable[[GridJob], str | None],
             key: Callable[[GridJob], str] | None = None) -> list[str]:
    """One line per distinct problem: `problem(job)` asked once per distinct `key(job)` (default: every job); a line
    every job meets reads as a run's own, one that only some meet leads with the first of them, by number and what
    it varies."""
    groups: dict[str, list[GridJob]] = {}
    for job in jobs:
        groups.setdefault(key(job) if key else str(job.num), []).append(job)
    hits: dict[str, list[GridJob]] = {}
    for group in groups.values():
        line = problem(group[0])
        if line:
            hits.setdefault(line, []).extend(group)
    return [line if len(found) == len(jobs) else f"job {found[0].num} ({found[0].label}): {line}"
            for line, found in hits.items()]


def one_line(check: Callable[[GridJob], None]) -> Callable[[GridJob], str | None]:
    """`check(job)` as a problem: its bad-input error as one line, None when it passes (a bug still raises)."""
    def problem(job: GridJob) -> str | None:
        try:
            check(job)
        except Exception as error:
            line = input_error_line(error)
            if line is None:
                raise
            return line
        return None
    return problem


def resolved_part(job: GridJob, *keys: str) -> str:
    """The resolved config under `keys` as one string: jobs that share it share its checks. Each key resolves in the
    whole config (`backend.n_ctx: ${model.max_context}` reads the job's model)."""
    parts = {key: OmegaConf.select(job.config, key) for key in keys}
    return json.dumps({key: OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
                       for key, value in parts.items()}, sort_keys=True, default=str)


def value_line(job: GridJob) -> str | None:
    """A typed value `validate` would refuse (a typo in a list's third item)."""
    try:
        found = value_problems(job.config)
    except Exception as error:  # an interpolation that does not resolve
        found = [f"config does not resolve: {' '.join(str(error).split())}"]
    return "; ".join(found) or None


def repeats(jobs: list[GridJob]) -> list[str]:
    """Jobs whose configs are the same job again (`-m dataset=adult,adult`): a sweep that would run one job twice."""
    first: dict[str, GridJob] = {}
    for job in jobs:
        same = first.setdefault(json.dumps(OmegaConf.to_container(job.config, resolve=True), sort_keys=True,
                                           default=str), job)
        if same is not job:
            return [f"job {job.num} ({job.label}) is job {same.num} ({same.label}) again: the sweep lists one value "
                    "twice (or a study's own sweep repeats it); drop the repeat"]
    return []


def setting_line(job: GridJob) -> str | None:
    """What `read_job` refuses before it reads data or reaches anything: settings, the probe's arms, fit, needs."""
    place = Place(job.choices, job.overrides, [], None, job.num)
    return one_line(lambda j: read_job(j.config, place, here=False))(job)


def data_line(job: GridJob) -> str | None:
    """The data set's own check: its files, `n` against its size, its protected attribute and values."""
    from hydra.utils import instantiate

    return one_line(lambda j: instantiate(j.config.dataset).check())(job)


def dataset_key(job: GridJob) -> str:
    """The data set's config but its seed, which changes which records are drawn, not whether they can be."""
    return json.dumps({k: v for k, v in OmegaConf.to_container(job.config.dataset, resolve=True).items()
                       if k != "seed"}, sort_keys=True, default=str)


def reach_line(job: GridJob) -> str | None:
    """The backend's server answers (Backend.reach); a dry run reaches nothing."""
    if job.config.get("dry_run"):
        return None

    def reach(j: GridJob) -> None:
        backend_class, settings = backend_of({"backend": OmegaConf.to_container(j.config.backend, resolve=True)})
        backend_class.reach(settings)
    return one_line(reach)(job)


def model_line(job: GridJob) -> str | None:
    """The model's files: here or on the hub (a metadata query), with how to get them; a dry run needs only the
    files that render prompts."""
    return ModelSource.composed(job.config).problem(weights=not job.config.get("dry_run"))


def sweep_problems(config: DictConfig) -> list[str]:
    """Every problem found before a sweep's parent opens: its tracking location, then a bad value in any job, a job
    twice, a setting or pairing any job refuses, then (not for a SLURM sweep) the grid's data, servers and models."""
    try:
        validate_tracking(config.tracking.uri, config.tracking.experiment)
    except AuditError as error:
        return [str(error)]
    launcher = launcher_problem(config)
    if launcher:
        return [launcher]
    jobs = grid_jobs(config)
    found = each_job(jobs, value_line) or repeats(jobs) or each_job(jobs, setting_line)
    if found or on_a_cluster(config):
        return found
    return (each_job(jobs, data_line, dataset_key)
            or each_job(jobs, reach_line, lambda job: resolved_part(job, "backend", "dry_run"))
            or each_job(jobs, model_line, lambda job: resolved_part(job, "backend", "model", "dry_run")))


def exit_on(problems: list[str]) -> None:
    """Each problem as its `error:` line, then exit code 2; nothing when there is none."""
    for line in problems:
        print_error(line)
    if problems:
        sys.exit(2)


def ends_the_command(hook: Callable[..., Any]) -> Callable[..., Any]:
    """A Hydra callback hook whose error ends the command. Hydra turns an exception raised in a callback into a
    warning and goes on (a sweep would run without its checks or its parent run); here bad input is its `error:`
    line and exit code 2, anything else its traceback and line, exit code 1."""
    @functools.wraps(hook)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return hook(*args, **kwargs)
        except Exception as error:
            sys.exit(print_failure(error))
    return guarded
