"""What names a job's run: its tags (the grid's axes, its key, its place in a sweep), its run name, its params and
its parent run (`run_identity`)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Mapping

from fairaudit import __version__
from fairaudit.backends import Backend
from fairaudit.models.files import checkpoint_spec
from fairaudit.tracking import tags as t
from fairaudit.tracking.runs import config_key

if TYPE_CHECKING:
    from fairaudit.job.config import Job

# grid axis -> override keys that set it
AXIS_KEYS = {"model": ("model",), "dataset": ("dataset",), "probe": ("probe",), "arm": ("arm",),
             "seed": ("dataset.seed",), "checkpoint": ("model.checkpoint", "model.checkpoint.label"),
             "engine": ("backend", "model.dtype", "backend.numerics", "model.batch_size", "backend.batch_invariant",
                        "experiment/engines/engine")}


def engine_label(backend: Backend, batch_size: int) -> str:
    """The `engine` tag, the axis of +experiment=engines: the backend, how it computes, and its batch size where its
    results depend on their batch (`hf float32 batch 8`, `llamacpp Q4_1`)."""
    batch = "" if backend.batch_invariant else f" batch {batch_size}"
    return f"{backend.name} {backend.numerics}".strip() + batch


def engine_params(backend: Backend, batch_size: int) -> dict[str, str]:
    """What the engine computed with, as the run's `engine.*` params (the report's within-engine axes)."""
    return {"engine.backend": backend.name, "engine.numerics": backend.numerics, "engine.batch_size": str(batch_size),
            "engine.batch_invariant": str(backend.batch_invariant).lower()}


def slurm_job_id() -> str:
    """This SLURM job's id as `squeue` and submitit write it: <array job>_<task> for an array task."""
    if "SLURM_ARRAY_JOB_ID" in os.environ:
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ["SLURM_JOB_ID"]


def job_tags(settings: Mapping, place) -> dict[str, str]:
    """Tags that let runs be filtered and compared across the grid, seeds and checkpoints, and name the job: its
    key (resolved config and overrides), in a sweep its number and overrides, for a job SLURM runs its job id
    (which names its log folder). settings: the job's resolved config; place: a `config.Place`."""
    slurm = {t.SLURM_JOB_TAG: slurm_job_id()} if "SLURM_JOB_ID" in os.environ else {}
    backend = settings["backend"].get("_target_", "?")
    tags = {
        "model": settings["model"]["name"],
        "dataset": settings["dataset"]["name"],
        "probe": place.choices.get("probe", "?"),
        "arm": settings["arm"]["name"],
        "seed": str(settings["dataset"]["seed"]),
        "checkpoint": str(checkpoint_spec(settings["model"])["label"]),
        t.BACKEND_TAG: str(place.choices.get("backend", backend)),
        t.KIND_TAG: "job",
        t.VERSION_TAG: __version__,
        t.KEY_TAG: config_key("job", settings, place.overrides),
        **slurm,
    }
    if place.sweep_dir is not None:
        tags.update({t.JOB_NUM_TAG: str(place.num), t.JOB_OVERRIDES_TAG: " ".join(place.overrides)[:6000]})
    return tags


def job_run_name(tags: dict[str, str], varied: list[str]) -> str:
    """The axes set by the keys in `varied` first (what differs across the sweep), then the other axes.

    e.g. `-m dataset=adult,compas` names its jobs "adult | counterfactual smollm2 think".
    """
    lead = [axis for axis in (*t.AXIS_TAGS, t.ENGINE_TAG) if set(AXIS_KEYS[axis]) & set(varied) and axis in tags]
    shown = [f"seed {tags[a]}" if a == "seed" else tags[a] for a in lead]
    rest = [tags[a] for a in t.AXIS_TAGS[:4] if a not in lead]
    return " ".join(shown) + (" | " if shown else "") + " ".join(rest)


def run_identity(job: "Job", backend: Backend) -> tuple[str, dict[str, str], dict[str, str]]:
    """What the job's run is opened with: its name, its tags and its params (the grid's axes as short params, so
    Compare can plot against them; the engine's)."""
    batch_size = job.model["batch_size"]
    tags = {**job_tags(job.settings, job.place), t.ENGINE_TAG: engine_label(backend, batch_size)}
    axes = {axis: tags[axis] for axis in t.AXIS_TAGS}
    params = {**axes, **engine_params(backend, batch_size)}
    return job_run_name(tags, job.place.varied), tags, params
