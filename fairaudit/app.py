"""The job: validate the config, build dataset, backend and probe from it, run, log to MLflow."""

from __future__ import annotations


from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from fairaudit import __version__
from fairaudit.console import console, summary_table
from fairaudit.errors import AuditError
from fairaudit.models import resolve_model_dir
from fairaudit.probes import AuditContext, ModelSpec, ProbeResult
from fairaudit.prompts.yesno import Arm, Thinking
from fairaudit.store import CachedBackend, Store
from fairaudit.tracking import Tracker, flatten, parent_run_id

ANSWER_SOURCES = ("parsed", "forced")


def model_spec(model: DictConfig) -> ModelSpec:
    """How the configured model thinks and answers."""
    if model.answer_source not in ANSWER_SOURCES:
        raise AuditError(f"model.answer_source {model.answer_source!r} is not one of {list(ANSWER_SOURCES)}")
    thinking = Thinking(**OmegaConf.to_container(model.thinking, resolve=True))
    if thinking.style not in ("native", "prompted", "none"):
        raise AuditError(f"model.thinking.style {thinking.style!r} is not one of ['native', 'prompted', 'none']")
    return ModelSpec(name=model.name, thinking=thinking, template_kwargs=dict(model.template_kwargs),
                     answer_prefix=model.answer_prefix, answer_source=model.answer_source)


def check_fit(arms: list[Arm], dataset, family: str, spec: ModelSpec, probe_name: str) -> None:
    """The data set and every arm fit the probe, and the model can run each arm."""
    if dataset.family != family:
        raise AuditError(f"probe {probe_name!r} takes {family} datasets; dataset {dataset.name!r} is a {dataset.family} dataset")
    for arm in arms:
        if arm.family != family:
            raise AuditError(f"probe {probe_name!r} takes {family} arms; arm {arm.name!r} is a {arm.family} arm")
        if arm.think and spec.thinking.style == "none":
            raise AuditError(f"arm {arm.name!r} needs a model that thinks; model {spec.name!r} has thinking.style=none")


def check_backend(cfg: DictConfig) -> None:
    """The backend's own settings, for backends that check them (a `check` classmethod), before any model loads."""
    backend_class = get_class(cfg.backend._target_)
    if hasattr(backend_class, "check"):
        backend_class.check(cfg.backend, cfg.model)


def checkpoint_spec(model: DictConfig) -> dict:
    """model.checkpoint as {label, path, revision}; a plain string names a hub revision and labels it."""
    checkpoint = model.checkpoint
    if isinstance(checkpoint, str):
        return {"label": checkpoint, "path": None, "revision": checkpoint}
    return {"label": checkpoint.label, "path": checkpoint.path, "revision": checkpoint.revision}


def job_tags(cfg: DictConfig, choices: dict) -> dict[str, str]:
    """Tags that let runs be filtered and compared across the grid, seeds and checkpoints."""
    return {
        "model": cfg.model.name,
        "dataset": cfg.dataset.name,
        "probe": choices.get("probe", "?"),
        "arm": cfg.arm.name,
        "seed": str(cfg.dataset.seed),
        "checkpoint": str(checkpoint_spec(cfg.model)["label"]),
        "fairaudit.kind": "job",
        "fairaudit.version": __version__,
    }


def run(cfg: DictConfig) -> ProbeResult:
    """Validate everything cheap first, then load the model, run the probe and log the run."""
    hydra_cfg = HydraConfig.get()
    choices = dict(hydra_cfg.runtime.choices)
    spec = model_spec(cfg.model)
    arm = Arm(**OmegaConf.to_container(cfg.arm, resolve=True))
    probe = instantiate(cfg.probe, _convert_="all")
    dataset = instantiate(cfg.dataset)
    check_fit(probe.arms(arm), dataset, probe.family, spec, choices.get("probe", "?"))
    dataset.check()
    check_backend(cfg)
    checkpoint = checkpoint_spec(cfg.model)
    model_dir = resolve_model_dir(cfg.model.source, checkpoint["path"] or cfg.model.path,
                                  checkpoint["revision"] or cfg.model.revision)
    inner = instantiate(cfg.backend, model_dir=str(model_dir), dtype=cfg.model.dtype, batch_size=cfg.model.batch_size)
    backend = CachedBackend(inner, Store(cfg.store.path), chunk_size=getattr(inner, "chunk_size", cfg.model.batch_size))

    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment)
    parent = parent_run_id(hydra_cfg.sweep.dir) if hydra_cfg.mode == RunMode.MULTIRUN else None
    tags = job_tags(cfg, choices)
    run_name = f"{tags['probe']} {tags['model']} {tags['dataset']} {tags['arm']}"
    run_id = tracker.start(run_name, tags, flatten(OmegaConf.to_container(cfg, resolve=True)), parent)
    try:
        result = probe.run(AuditContext(backend=backend, model=spec, dataset=dataset, arm=arm))
        result.metrics["model_calls"] = backend.model_calls
        result.metrics.update(inner.run_metrics() if hasattr(inner, "run_metrics") else {})
        tracker.log_config(cfg, list(hydra_cfg.overrides.task))
        tracker.log_result(result.metrics, result.tables, result.figures, result.records)
    except BaseException:
        tracker.end(failed=True)
        raise
    tracker.end()
    print_summary(run_name, result, run_id, cfg.tracking.uri)
    return result


def print_summary(title: str, result: ProbeResult, run_id: str, uri: str) -> None:
    """Headline metrics, the run id and how to open it in the MLflow UI."""
    console.print(summary_table(title, result.metrics, result.headline + ["model_calls"]))
    console.print(f"MLflow run [bold]{run_id}[/bold]")
    console.print(f"see it with: mlflow ui --backend-store-uri {uri}")
