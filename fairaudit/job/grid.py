"""What a sweep varies, read from Hydra's overrides: its swept keys, each job's overrides and label, its name."""

from __future__ import annotations

import subprocess
from datetime import datetime
from pathlib import Path

from omegaconf import OmegaConf


def git_commit(cwd: str | Path = ".") -> str:
    """The commit checked out where the sweep was started ("unknown" outside a git checkout)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def task_overrides(hydra) -> list[str]:
    """The command line's overrides as typed (`hydra.overrides.task`), never resolved: an override that reads a
    credential from the environment (`store.url=${oc.env:FAIRAUDIT_STORE_URL}`) stays the name of its variable."""
    return OmegaConf.to_container(hydra.overrides.task, resolve=False)


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
    return swept(task_overrides(hydra), OmegaConf.to_container(params) if params else None)


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
    lines = [f"{key}={value}" for key, value in params.items()] + task_overrides(hydra)
    parsed = OverridesParser.create().parse_overrides(lines)
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


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


def override_params(overrides: list[str], swept_values: dict[str, str] | None = None) -> dict[str, str]:
    """The sweep's params, `sweep.<key>` -> value(s): its command-line overrides, and every key it sweeps (`swept`:
    a study's hydra.sweeper.params too, e.g. `sweep.dataset.seed` = "range(5)")."""
    pairs = [o.lstrip("+~").split("=", 1) for o in overrides if "=" in o]
    pairs += [(key.lstrip("+~"), value) for key, value in (swept_values or {}).items()]
    return {f"sweep.{key}": value[:6000] for key, value in pairs}


