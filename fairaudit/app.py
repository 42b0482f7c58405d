"""The job: check the config, build dataset, backend and probe from it, run, log to MLflow."""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from fairaudit import __version__, dry_run, interrupt, sweeps
from fairaudit.backends import WHAT, Backend, Capabilities, backends_with, require_implemented
from fairaudit.client import CachingClient
from fairaudit.console import console, print_error, print_result, print_verdict, summary_table
from fairaudit.disk import artifacts_full
from fairaudit.errors import AuditError, audit_cause, failure_line, input_error_line
from fairaudit.interrupt import Interrupted
from fairaudit.mlflow_ui import where_lines
from fairaudit.model_files import ModelMissing, checkpoint_spec
from fairaudit.models import model_dir_for, model_problem
from fairaudit.probes import AuditContext, ModelSpec, Probe, ProbeResult
from fairaudit.prompts.yesno import Arm, Thinking
from fairaudit.redact import scrub_hydra_files
from fairaudit.registry import probe_classes
from fairaudit.store import Store
from fairaudit.sweeps import AXIS_TAGS as AXES  # the grid's axes: tags, and short params
from fairaudit.sweeps import HEADLINE_TAG, swept_in
from fairaudit.tracking import KEY_TAG, MAX_TAG, NOTE_TAG, Tracker, config_key, flatten, parent_run_id, tracking_failure
from fairaudit.tracking_db import database_full
from fairaudit.validate import validate

# grid axis -> override keys that set it
AXIS_KEYS = {"model": ("model",), "dataset": ("dataset",), "probe": ("probe",), "arm": ("arm",),
             "seed": ("dataset.seed",), "checkpoint": ("model.checkpoint", "model.checkpoint.label"),
             "engine": ("backend", "model.dtype", "experiment/engines/engine")}
ENGINE_TAG = "engine"  # the backend and its numerics (engine_label), set once the backend is built
PROBE_META = ("report",)  # keys of conf/probe/*.yaml that `fairaudit report` reads, not the probe's constructor


def build(node, **kwargs):
    """hydra's instantiate, with an AuditError raised inside a constructor, or by the target's module as it
    is imported (a probe class that lacks `needs`), surfacing as itself (one line)."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as error:
        cause = audit_cause(error)
        if cause is not None:
            raise cause from None
        raise


def model_spec(model: DictConfig) -> ModelSpec:
    """How the configured model thinks and answers (its values checked by `validate`)."""
    thinking = Thinking(**OmegaConf.to_container(model.thinking, resolve=True))
    return ModelSpec(name=model.name, thinking=thinking, template_kwargs=dict(model.template_kwargs),
                     answer_prefix=model.answer_prefix, answer_source=model.answer_source, p_yes=model.p_yes)


def build_probe(node: DictConfig) -> Probe:
    """The probe from its config, without the keys fairaudit reads itself (`report:`); it checks its own settings."""
    settings = OmegaConf.to_container(node, resolve=True)
    return build({k: v for k, v in settings.items() if k not in PROBE_META}, _convert_="all")


def job_settings(cfg: DictConfig) -> dict:
    """The resolved config of a job, without the probe's `report:` node: what the job ran (its params, its key)."""
    settings = OmegaConf.to_container(cfg, resolve=True)
    settings["probe"] = {k: v for k, v in settings["probe"].items() if k not in PROBE_META}
    return settings


def check_fit(probe: Probe, probe_name: str, arms: list[Arm], dataset, spec: ModelSpec) -> None:
    """The data set and every arm are of the probe's family, and the model can run each arm."""
    family = probe.needs.family
    if dataset.family != family:
        raise AuditError(f"probe {probe_name!r} takes {family} datasets; "
                         f"dataset {dataset.name!r} is a {dataset.family} dataset")
    for arm in arms:
        if arm.family != family:
            raise AuditError(f"probe {probe_name!r} takes {family} arms; arm {arm.name!r} is a {arm.family} arm")
        if arm.think and spec.thinking.style == "none":
            raise AuditError(f"arm {arm.name!r} needs a model that thinks; model {spec.name!r} has thinking.style=none")


def check_capabilities(probe: Probe, probe_name: str, backend: str, capabilities: Capabilities) -> None:
    """The backend's capabilities (under its settings) cover the probe's needs: else one line naming what
    lacks, why, the backends that have it, and the probes this backend can run."""
    lacking = [c for c in probe.needs.capabilities if not capabilities.has(c)]
    if not lacking:
        return
    able = [b for b in backends_with(lacking[0]) if b != backend and all(b in backends_with(c) for c in lacking[1:])]
    runnable = [name for name, cls in probe_classes().items()
                if all(capabilities.has(c) for c in cls.needs.capabilities)]
    raise AuditError(f"probe {probe_name!r} needs a backend that can {' and '.join(WHAT[c] for c in lacking)}; "
                     f"backend={backend} cannot{f' ({capabilities.limits})' if capabilities.limits else ''}. "
                     f"Backends that can: {', '.join(f'backend={b}' for b in able) or 'none shipped'}; "
                     f"probes backend={backend} runs: {', '.join(runnable) or 'none'}")


@dataclass
class Job:
    """A job's parts, built and checked before any model loads or run opens."""

    spec: ModelSpec
    arm: Arm
    arms: list[Arm]
    probe: Probe
    dataset: object


def check_settings(cfg: DictConfig) -> tuple[type[Backend], Probe]:
    """Every setting's own check, no data file read and no model loaded: the global config values, the
    backend's settings (its `check`) and engine (not for a dry run, which needs none), the probe's (its
    constructor). Returns the backend class and the probe."""
    validate(cfg)
    backend_class = get_class(cfg.backend._target_)
    require_implemented(backend_class)
    backend_class.check(cfg.backend, cfg.model)
    if not cfg.dry_run:
        backend_class.require_engine()
    return backend_class, build_probe(cfg.probe)


def prepare(cfg: DictConfig) -> Job:
    """Every cheap check, in the order a user fixes them: the settings, the data set's and arms' fit to the
    probe, the backend's capabilities against the probe's needs, the data files, the model's files (here, or on
    the hub by a metadata query: nothing downloaded)."""
    backend_class, probe = check_settings(cfg)
    choices = HydraConfig.get().runtime.choices
    spec = model_spec(cfg.model)
    arm = Arm(**OmegaConf.to_container(cfg.arm, resolve=True))
    dataset = build(cfg.dataset)
    arms = probe.arms(arm)
    check_fit(probe, choices.get("probe", "?"), arms, dataset, spec)
    check_capabilities(probe, choices.get("probe", "?"), choices.get("backend", backend_class.name),
                       backend_class.capabilities_for(cfg.backend))
    dataset.check()
    problem = None if cfg.dry_run else model_problem(cfg)  # a dry run says so itself, after the pairs
    if problem:
        raise AuditError(problem)
    return Job(spec, arm, arms, probe, dataset)


def engine_label(backend: Backend) -> str:
    """The `engine` tag, the axis of +experiment=engines: the backend and how it computes (`hf float32`)."""
    return f"{backend.name} {backend.numerics}".strip()


def slurm_job_id() -> str:
    """This SLURM job's id as `squeue` and submitit write it: <array job>_<task> for an array task."""
    if "SLURM_ARRAY_JOB_ID" in os.environ:
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ["SLURM_JOB_ID"]


def job_tags(cfg: DictConfig, choices: dict) -> dict[str, str]:
    """Tags that let runs be filtered and compared across the grid, seeds and checkpoints
    (and, for a job run by SLURM, its job id, which names its log folder)."""
    slurm = {"slurm_job_id": slurm_job_id()} if "SLURM_JOB_ID" in os.environ else {}
    return {
        "model": cfg.model.name,
        "dataset": cfg.dataset.name,
        "probe": choices.get("probe", "?"),
        "arm": cfg.arm.name,
        "seed": str(cfg.dataset.seed),
        "checkpoint": str(checkpoint_spec(cfg.model)["label"]),
        "backend": str(choices.get("backend", cfg.backend.get("_target_", "?"))),
        "fairaudit.kind": "job",
        "fairaudit.version": __version__,
        **slurm,
    }


def job_run_name(tags: dict[str, str], varied: list[str]) -> str:
    """The axes set by the keys in `varied` first (what differs across the sweep), then the other axes.

    e.g. `-m dataset=adult,compas` names its jobs "adult | counterfactual smollm2 think".
    """
    lead = [axis for axis in (*AXES, ENGINE_TAG) if set(AXIS_KEYS[axis]) & set(varied) and axis in tags]
    shown = [f"seed {tags[a]}" if a == "seed" else tags[a] for a in lead]
    rest = [tags[a] for a in AXES[:4] if a not in lead]
    return " ".join(shown) + (" | " if shown else "") + " ".join(rest)


def varied_keys(hydra_cfg) -> list[str]:
    """Keys that differ between this job and its siblings (a sweep's swept keys), else the keys overridden."""
    if hydra_cfg.mode == RunMode.MULTIRUN:
        return list(swept_in(hydra_cfg.sweep.dir))
    return [o.lstrip("+~").split("=", 1)[0] for o in hydra_cfg.overrides.task]


def job_identity(cfg: DictConfig) -> dict[str, str]:
    """Tags naming the job: its key (resolved config and overrides) and, in a sweep, its number and overrides."""
    hydra_cfg = HydraConfig.get()
    overrides = list(hydra_cfg.overrides.task)
    key = {KEY_TAG: config_key("job", job_settings(cfg), overrides)}
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return key
    return {**key, "fairaudit.job_num": str(hydra_cfg.job.num), "fairaudit.job_overrides": " ".join(overrides)[:6000]}


def run(cfg: DictConfig) -> ProbeResult | None:
    """Check everything cheap first, then load the model, run the probe and log the run."""
    job = prepare(cfg)
    if cfg.dry_run:
        return preview(cfg, job)
    hydra_cfg = HydraConfig.get()
    model_dir = model_dir_for(cfg)  # its files checked
    store = Store(cfg.store.url)  # a database server that refuses: one line before the backend reads the model
    backend = build(cfg.backend, model_dir=str(model_dir), dtype=cfg.model.dtype, batch_size=cfg.model.batch_size)
    client = CachingClient(backend, store, chunk_size=cfg.model.batch_size)

    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment)
    parent = parent_run_id(hydra_cfg.sweep.dir) if hydra_cfg.mode == RunMode.MULTIRUN else None
    tags = {**job_tags(cfg, dict(hydra_cfg.runtime.choices)), **job_identity(cfg), ENGINE_TAG: engine_label(backend)}
    run_name = job_run_name(tags, varied_keys(hydra_cfg))
    axes = {axis: tags[axis] for axis in AXES}  # short params, so Compare can plot against the grid's axes
    run_id = tracker.start(run_name, tags, {**axes, **flatten(job_settings(cfg))}, parent)
    try:
        result = job.probe.run(AuditContext(client, backend.tokenizer, job.spec, job.dataset, job.arm))
        result.metrics.update(client.metrics())
        verdict = job.probe.verdict(result)
        log_run(tracker, cfg, job, result, verdict, run_name)
    except KeyboardInterrupt:
        tracker.end(killed=True,
                    error=f"interrupted (Ctrl-C) after {client.model_calls} new results, all kept in the store")
        raise Interrupted(client.model_calls) from None
    except BaseException as error:
        failure = (tracking_failure(error, cfg.tracking.uri) or database_full(error, cfg.tracking.uri)
                   or artifacts_full(error, tracker.run.info.artifact_uri, tracker.writing))
        tracker.end(failed=True, error=failure_line(failure or error))
        raise failure or error
    tracker.end()
    print_summary(run_name, result, verdict, run_id, tracker.experiment_id, cfg.tracking.uri)
    return result


def log_run(tracker: Tracker, cfg: DictConfig, job: Job, result: ProbeResult, verdict: list[str],
            run_name: str) -> None:
    """Everything a finished probe logs: config, data set input, metrics, tables, figures, records, the
    per-sample views, and the verdict (as verdict.txt and the run's description)."""
    title_figures(result.figures, f"{job.spec.name}, {job.dataset.name}: {' vs '.join(a.name for a in job.arms)}")
    tracker.log_config(cfg, list(HydraConfig.get().overrides.task))
    view = job.probe.samples
    tracker.log_dataset(result.records[view.frame], job.dataset.name, data_source(job.dataset))
    tracker.log_result(result.metrics, result.tables, result.figures, result.records)
    tracker.log_samples(result.records[view.frame], view.layout, run_name)
    tracker.log_texts({"verdict.txt": "\n".join(verdict) + "\n"})
    tracker.set_tags({HEADLINE_TAG: json.dumps(result.headline), NOTE_TAG: "\n\n".join(verdict)[:MAX_TAG]})


def data_source(dataset) -> str:
    """Where a data set was read from: its file (MCQ sets), else its data root (tabular sets)."""
    return str(getattr(dataset, "path", None) or getattr(dataset, "root", None) or dataset.name)


def title_figures(figures: dict, title: str) -> None:
    """Every figure of a run names its model, dataset and arms above its panels (wrapped, so never clipped)."""
    for figure in figures.values():
        figure.suptitle(title, fontsize="medium", wrap=True)


def preview(cfg: DictConfig, job: Job) -> None:
    """dry_run=true: print the prompts the probe would send, rendered by the backend's tokenizer on the folder
    it finds without weights; no model loads, nothing is logged. Without a tokenizer (offline, not cached), the
    data's messages unrendered, then one error line saying why and how to get it."""
    backend_class = get_class(cfg.backend._target_)
    try:
        tokenizer = backend_class.load_tokenizer(model_dir_for(cfg, weights=False), cfg.backend)
    except (AuditError, OSError, ValueError) as error:  # transformers' OSError: a folder without a tokenizer
        shown = dry_run.show_messages(job.dataset.messages())
        why = error.line(cfg.model) if isinstance(error, ModelMissing) else " ".join(str(error).split())
        raise AuditError(f"dry run: the {shown} messages above are the data it would send, but it cannot render "
                         f"them into prompts: {why}") from None
    count = dry_run.show(job.probe.prompts(AuditContext(None, tokenizer, job.spec, job.dataset, job.arm)))
    console.print(f"dry run: {count} prompts, no model loaded, nothing logged")


def run_sweep_job(cfg: DictConfig) -> None:
    """One job of a multirun. A failing job never stops the sweep: it is one error line here, naming the job by
    what it varies (a traceback too when it is not bad input), and a FAILED child run carrying that line. A dry
    run's failing job ends the dry run (exit code 2): a dry run records nothing."""
    try:
        scrub_hydra_files(cfg)
        run(cfg)
    except KeyboardInterrupt as stop:
        stop_sweep(cfg, getattr(stop, "kept", 0))
    except Exception as error:
        line = input_error_line(error)
        if line is None:
            traceback.print_exc()
        line = line or failure_line(error)
        hydra_cfg = HydraConfig.get()
        print_error(f"{job_label(hydra_cfg.sweep.dir, list(hydra_cfg.overrides.task)) or 'job'}: {line}")
        if cfg.dry_run:
            sys.exit(2)
        record_failed_job(cfg, line)


def job_label(sweep_dir: str, overrides: list[str]) -> str:
    """A sweep job named by the overrides that set it apart from its siblings (e.g. "dataset=compas")."""
    path = Path(sweep_dir) / "multirun.yaml"
    return sweeps.job_label(OmegaConf.load(path).hydra, overrides) if path.exists() else ""


def stop_sweep(cfg: DictConfig, kept: int) -> None:
    """Ctrl-C in a sweep job: its run has closed KILLED; the parent ends KILLED too, one line says what is kept."""
    hydra_cfg = HydraConfig.get()
    parent = parent_run_id(hydra_cfg.sweep.dir)
    if parent:
        tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment)
        tracker.client.set_tag(parent, NOTE_TAG, f"interrupted (Ctrl-C) in job {hydra_cfg.job.num}")
        tracker.client.set_terminated(parent, status="KILLED")
    console.print(interrupt.message(kept, hydra_cfg.job.num), highlight=False, soft_wrap=True)
    sys.exit(interrupt.EXIT_CODE)


def record_failed_job(cfg: DictConfig, line: str) -> None:
    """A FAILED child run for a job that failed before its run opened (one that opened has closed itself)."""
    hydra_cfg = HydraConfig.get()
    parent = parent_run_id(hydra_cfg.sweep.dir)
    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment)
    opened = tracker.client.search_runs([tracker.experiment_id], f"tags.mlflow.parentRunId = '{parent}' AND "
                                        f"tags.`fairaudit.job_num` = '{hydra_cfg.job.num}'")
    if opened:
        return
    overrides = list(hydra_cfg.overrides.task)
    label = job_label(hydra_cfg.sweep.dir, overrides)  # e.g. "dataset.n=999999": what sets it apart
    try:
        tags = {**job_tags(cfg, dict(hydra_cfg.runtime.choices)), **job_identity(cfg)}
        name = job_run_name(tags, varied_keys(hydra_cfg))
        name = f"{label} | {name}" if label and " | " not in name else name  # a sweep over keys that are no axis
    except Exception:  # a config that does not even resolve: the failure is still recorded
        tags = {"fairaudit.kind": "job", "fairaudit.job_num": str(hydra_cfg.job.num),
                "fairaudit.job_overrides": " ".join(overrides)}
        name = label or " ".join(overrides) or f"job {hydra_cfg.job.num}"
    tracker.start(name[:250], tags, {}, parent)
    tracker.end(failed=True, error=line)


def print_summary(title: str, result: ProbeResult, verdict: list[str], run_id: str, experiment_id: str,
                  uri: str) -> None:
    """The verdict and the headline metrics on stdout; the run id and where to see it on stderr."""
    print_verdict(verdict)
    print_result(summary_table(title, result.metrics, result.headline + ["model_calls"]))
    console.print(f"MLflow run [bold]{run_id}[/bold]")
    for line in where_lines(uri, experiment_id, run_id):
        console.print(line, highlight=False, soft_wrap=True)
