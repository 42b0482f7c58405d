"""A sweep checked whole before its parent run opens: its tracking location, every job's values, the grid's data
files and models (a metadata query: nothing downloaded). Each distinct problem is one `error:` line, exit code 2."""

from __future__ import annotations

import sys

from omegaconf import DictConfig, OmegaConf

from fairaudit.errors import AuditError, input_error_line
from fairaudit.job.checks import validate_tracking, value_problems
from fairaudit.job.config import files_problem
from fairaudit.job.grid import job_label, sweep_jobs, swept_of
from fairaudit.terminal.output import print_error

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
    def problem(job) -> str | None:
        parts = {key: OmegaConf.to_container(job[key], resolve=True) for key in ("backend", "model")}
        return files_problem(parts, weights=not job.get("dry_run"))

    return grid_problems(config, MODEL_KEYS, problem, named=False)


def sweep_value_problems(config: DictConfig) -> list[str]:
    """One line per sweep job whose typed values `validate` would refuse (a typo in a list's third item), found
    before the sweep's parent run opens: each job's config composed as Hydra's sweeper will launch it."""
    from hydra.core.global_hydra import GlobalHydra

    loader, varied, problems = GlobalHydra.instance().config_loader(), set(swept_of(config.hydra)), []
    for num, overrides in enumerate(sweep_jobs(config.hydra)):
        job = loader.load_sweep_config(config, list(overrides))
        try:  # the job's own keys: its hydra node holds values known only once it is launched (hydra.job.num)
            found = value_problems(OmegaConf.masked_copy(job, [key for key in job if key != "hydra"]))
        except Exception as error:  # an interpolation that does not resolve
            found = [f"config does not resolve: {' '.join(str(error).split())}"]
        own = " ".join(o for o in overrides if o.lstrip("+~").split("=", 1)[0] in varied)
        problems += [f"job {num} ({own}): {'; '.join(found)}"] if found else []
    return problems


def sweep_problems(config: DictConfig) -> list[str]:
    """Every problem found before a sweep's parent opens: its tracking location, then a bad value in any job,
    then the grid's data and models."""
    try:
        validate_tracking(config.tracking.uri, config.tracking.experiment)
    except AuditError as error:
        return [str(error)]
    return sweep_value_problems(config) or grid_data_problems(config) or grid_model_problems(config)


def exit_on(problems: list[str]) -> None:
    """Each problem as its `error:` line, then exit code 2; nothing when there is none."""
    for line in problems:
        print_error(line)
    if problems:
        sys.exit(2)
