"""A job's config, read once and in one place, turned into the objects every later stage is handed.

`read_job(cfg)` is the one reader of a job's composed config. It checks every setting in the order a user fixes
them (the global values, the backend's and the probe's own settings, the data set's and arms' fit to the probe, the
backend's capabilities against the probe's needs, the data files, the model's files) and returns a `Job`: plain
values and built objects. Nothing after it reads the config: the run, the dry run and tracking take the `Job`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fairaudit.backends import WHAT, Backend, Capabilities
from fairaudit.errors import AuditError, audit_cause
from fairaudit.errors.contracts import require_complete
from fairaudit.job import registry
from fairaudit.job.checks import validate
from fairaudit.job.grid import swept_in
from fairaudit.job.ray_tasks import workers_problem
from fairaudit.models.checks import check_model_folder
from fairaudit.models.files import ModelFiles, ModelMissing
from fairaudit.probes import ModelSpec, Probe
from fairaudit.prompts.yesno import Arm, Thinking


@dataclass(frozen=True)
class Place:
    """Where a job runs: alone, or as job `num` of the sweep whose Hydra folder is `sweep_dir`."""

    choices: dict[str, str]       # config group -> the option chosen (probe, backend, ...)
    overrides: list[str]          # the job's command-line overrides
    varied: list[str]             # keys that set it apart: its sweep's swept keys, else the keys overridden
    sweep_dir: str | None = None  # None: a single run
    num: int | None = None        # its number in the sweep

    @classmethod
    def of_hydra(cls) -> "Place":
        """This process's place, from Hydra's runtime config."""
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra = HydraConfig.get()
        overrides = list(hydra.overrides.task)
        if hydra.mode != RunMode.MULTIRUN:
            return cls(dict(hydra.runtime.choices), overrides, [o.lstrip("+~").split("=", 1)[0] for o in overrides])
        return cls(dict(hydra.runtime.choices), overrides, list(swept_in(hydra.sweep.dir)), str(hydra.sweep.dir),
                   int(hydra.job.num))


@dataclass
class Job:
    """A job's parts, built and checked from its config before any model loads or run opens: plain values and built
    objects, so nothing after `read_job` reads the config.

    settings: the resolved config, the keys fairaudit reads itself left out (what the job ran: its params and key);
    backend_class and backend_settings: the class `backend._target_` names, resolved once, and the keyword
    arguments of its constructor; files: the model's files at its checkpoint; the rest is read from `settings`.
    """

    settings: dict
    place: Place
    backend_class: type[Backend]
    backend_settings: dict
    files: ModelFiles
    spec: ModelSpec
    arm: Arm
    arms: list[Arm]
    probe: Probe
    dataset: Any
    probe_name: str = field(init=False)
    backend_name: str = field(init=False)
    model: dict = field(init=False)        # model.* (dtype, batch_size, ...)
    dry_run: bool = field(init=False)
    store_url: str = field(init=False)
    batch_keyed: bool = field(init=False)  # store.batch_keyed
    tracking: tuple[str, str] = field(init=False)  # (tracking.uri, tracking.experiment)

    def __post_init__(self):
        self.probe_name = self.place.choices.get("probe", "?")
        self.backend_name = self.place.choices.get("backend", self.backend_class.name)
        self.model, self.dry_run = self.settings["model"], bool(self.settings.get("dry_run"))
        self.store_url = self.settings["store"]["url"]
        self.batch_keyed = bool(self.settings["store"].get("batch_keyed", False))
        self.tracking = (self.settings["tracking"]["uri"], self.settings["tracking"]["experiment"])


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


def resolved(cfg: DictConfig) -> dict:
    """The job's config as plain values, the keys of its probe's and backend's configs that fairaudit reads itself
    (`registry.META`: the probe's `report:` node, ...) left out: what the job ran, its params and its key."""
    settings = OmegaConf.to_container(cfg, resolve=True)
    for group, keys in registry.META.items():
        settings[group] = {k: v for k, v in settings[group].items() if k not in keys}
    return settings


def model_spec(model: Mapping) -> ModelSpec:
    """How the configured model thinks and answers (its values checked by `validate`)."""
    if isinstance(model, DictConfig):
        model = OmegaConf.to_container(model, resolve=True)
    return ModelSpec(name=model["name"], thinking=Thinking(**model["thinking"]),
                     template_kwargs=dict(model["template_kwargs"]), answer_prefix=model["answer_prefix"],
                     answer_source=model["answer_source"], p_yes=model["p_yes"])


def backend_of(settings: Mapping) -> tuple[type[Backend], dict]:
    """The backend class `backend._target_` names (checked complete) and its constructor's other settings."""
    backend = {k: v for k, v in settings["backend"].items() if k not in registry.META["backend"]}
    backend_class = registry.resolve(backend.pop("_target_"))
    require_complete(backend_class)
    return backend_class, backend


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
    able = [b for b in registry.backends_with(lacking[0])
            if b != backend and all(b in registry.backends_with(c) for c in lacking[1:])]
    runnable = [name for name, cls in registry.probe_classes().items()
                if all(capabilities.has(c) for c in cls.needs.capabilities)]
    raise AuditError(f"probe {probe_name!r} needs a backend that can {' and '.join(WHAT[c] for c in lacking)}; "
                     f"backend={backend} cannot{f' ({capabilities.limits})' if capabilities.limits else ''}. "
                     f"Backends that can: {', '.join(f'backend={b}' for b in able) or 'none shipped'}; "
                     f"probes backend={backend} runs: {', '.join(runnable) or 'none'}")


def build_probe(node: Mapping) -> Probe:
    """The probe of a `probe` config node (the keys fairaudit reads itself left out); it checks its own settings."""
    settings = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    return build({k: v for k, v in settings.items() if k not in registry.META["probe"]}, _convert_="all")


@dataclass(frozen=True)
class Settings:
    """A job's settings, each checked on its own (no data file read, no model files looked for)."""

    values: dict                  # the resolved config (`resolved`)
    backend_class: type[Backend]
    backend_settings: dict
    probe: Probe


def check_settings(cfg: DictConfig) -> Settings:
    """Every setting's own check, in the order a user fixes them: the global values, the backend's settings (its
    `check`) and engine (not for a dry run, which needs none), the probe's (its constructor)."""
    validate(cfg)
    values = resolved(cfg)
    backend_class, backend_settings = backend_of(values)
    backend_class.check(backend_settings, values["model"])
    if not values["dry_run"]:
        backend_class.require_engine()
    return Settings(values, backend_class, backend_settings, build_probe(values["probe"]))


def read_job(cfg: DictConfig, place: Place | None = None, here: bool = True) -> Job:
    """The job `cfg` describes, every cheap check passed (nothing loaded, nothing downloaded): its settings
    (`check_settings`), the data set's and arms' fit to the probe, the backend's capabilities against the probe's
    needs, then what this host holds and reaches (`here`; a sweep's checks ask each once for the whole grid): the
    data (its files, `n` against its size, the protected values), the backend's server, the model's files."""
    checked, place = check_settings(cfg), place or Place.of_hydra()
    settings, probe = checked.values, checked.probe
    spec, arm = model_spec(settings["model"]), Arm(**settings["arm"])
    dataset = build(settings["dataset"])
    job = Job(settings, place, checked.backend_class, checked.backend_settings, ModelFiles.of(settings["model"]),
              spec, arm, probe.arms(arm), probe, dataset)
    check_fit(probe, job.probe_name, job.arms, dataset, spec)
    check_capabilities(probe, job.probe_name, job.backend_name,
                       job.backend_class.capabilities_for(job.backend_settings))
    if not here:
        return job
    dataset.check()
    if not job.dry_run:  # a dry run talks to no server, and says itself what its model lacks, after the pairs
        job.backend_class.reach(job.backend_settings)
        problem = model_problem(job) or workers_problem(settings.get("job", {}))
        if problem:
            raise AuditError(problem)
    return job


def model_folder(job: Job, weights: bool = True, fetch: bool = True) -> Path | None:
    """The local folder of the job's model at its checkpoint, as its backend finds it (`Backend.resolve_model`),
    its files checked; weights=False: one that renders the prompts, no weights fetched (a dry run);
    fetch=False: the check alone (nothing downloaded, None returned)."""
    return files_folder(job.backend_class, job.backend_settings, job.files, weights, fetch)


def files_folder(backend_class: type[Backend], backend_settings: Mapping, files: ModelFiles, weights: bool = True,
                 fetch: bool = True) -> Path | None:
    """`model_folder` of a model's files under a backend's settings."""
    folder = backend_class.resolve_model(files, backend_settings, weights=weights, fetch=fetch)
    if folder is not None:  # its files checked before a backend reads them
        check_model_folder(folder, weights=weights and backend_class.capabilities.loads_weights)
    return folder


def folder_of(settings: Mapping, weights: bool = True, fetch: bool = True) -> Path | None:
    """`model_folder` of the model and backend of a resolved config (`settings` needs only those two)."""
    backend_class, backend_settings = backend_of(settings)
    return files_folder(backend_class, backend_settings, ModelFiles.of(settings["model"]), weights, fetch)


def composed_parts(cfg: DictConfig) -> dict:
    """The `backend` and `model` of a composed config outside a run (a script, a notebook, a benchmark), resolved on
    their own, so keys only a Hydra run resolves (the store's folder) are not needed."""
    return {key: OmegaConf.to_container(cfg[key], resolve=True) for key in ("backend", "model")}


def composed_folder(cfg: DictConfig, weights: bool = True) -> Path | None:
    """`folder_of` a composed config outside a run (`composed_parts`)."""
    return folder_of(composed_parts(cfg), weights)


def composed_backend(cfg: DictConfig, model_dir: Path | None = None) -> Backend:
    """The backend of a composed config outside a run (`composed_parts`), on `model_dir` (default: its model's
    folder), built as a run builds it."""
    parts = composed_parts(cfg)
    backend_class, settings = backend_of(parts)
    folder = model_dir or folder_of(parts)
    return backend_class(model_dir=str(folder), dtype=parts["model"]["dtype"], batch_size=parts["model"]["batch_size"],
                         **settings)


def files_problem(settings: Mapping, weights: bool = True) -> str | None:
    """The one line saying why the model files of a resolved config (its `model` and `backend`) cannot be had and
    how to get them, found without downloading anything (None: they are here or the hub holds them)."""
    try:
        folder_of(settings, weights, fetch=False)
    except ModelMissing as missing:
        return missing.line(settings["model"])
    except AuditError as error:  # e.g. a model.path that holds no model, an embedded model's package absent
        return str(error)
    return None


def model_problem(job: Job) -> str | None:
    """`files_problem` of the job's model, with its weights unless it is a dry run."""
    return files_problem(job.settings, weights=not job.dry_run)


def build_backend(job: Job, model_dir: Path) -> Backend:
    """The job's backend on its model's folder (`model_folder`); the constructor reads only what names the model:
    weights load on the first model call. Under store.batch_keyed a backend that is not batch-invariant stores its
    results under its batch size too (`/batch<N>` after its fingerprint), so each batch size computes its own."""
    backend = job.backend_class(model_dir=str(model_dir), dtype=job.model["dtype"],
                                batch_size=job.model["batch_size"], **job.backend_settings)
    if job.batch_keyed and not backend.batch_invariant:
        backend.fingerprint = f"{backend.fingerprint}/batch{job.model['batch_size']}"
    return backend
