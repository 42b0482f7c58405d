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
from fairaudit.catalog import registry
from fairaudit.errors import AuditError, audit_cause
from fairaudit.errors.contracts import require_complete
from fairaudit.job.checks import validate
from fairaudit.job.grid import swept_in, task_overrides
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
        overrides = task_overrides(hydra)
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
    arguments of its constructor; source: where its backend finds the model's files; the rest is read from
    `settings`.
    """

    settings: dict
    place: Place
    backend_class: type[Backend]
    backend_settings: dict
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
    source: "ModelSource" = field(init=False)

    def __post_init__(self):
        self.probe_name = self.place.choices.get("probe", "?")
        self.backend_name = self.place.choices.get("backend", self.backend_class.name)
        self.model, self.dry_run = self.settings["model"], bool(self.settings.get("dry_run"))
        self.store_url = self.settings["store"]["url"]
        self.batch_keyed = bool(self.settings["store"].get("batch_keyed", False))
        self.tracking = (self.settings["tracking"]["uri"], self.settings["tracking"]["experiment"])
        self.source = ModelSource(self.backend_class, self.backend_settings, self.model)


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
    """The data set is of the probe's family, every arm of a family it takes, and the model can run each arm."""
    needs = probe.needs
    if dataset.family != needs.family:
        raise AuditError(f"probe {probe_name!r} takes {needs.family} datasets; "
                         f"dataset {dataset.name!r} is a {dataset.family} dataset")
    if needs.data is not None and not isinstance(dataset, needs.data):
        readable = " or ".join(f"dataset={name}" for name in registry.datasets_reading(needs.data))
        raise AuditError(f"probe {probe_name!r} reads {readable} (its items have what it measures); "
                         f"dataset {dataset.name!r} is another {dataset.family} dataset")
    for arm in arms:
        if not needs.takes_arm(arm.family):
            taken = " or ".join(needs.arm_families or (needs.family,))
            raise AuditError(f"probe {probe_name!r} takes {taken} arms; arm {arm.name!r} is a {arm.family} arm")
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
    job = Job(settings, place, checked.backend_class, checked.backend_settings, spec, arm, probe.arms(arm), probe,
              dataset)
    check_fit(probe, job.probe_name, job.arms, dataset, spec)
    check_capabilities(probe, job.probe_name, job.backend_name,
                       job.backend_class.capabilities_for(job.backend_settings))
    if not here:
        return job
    dataset.check()
    if not job.dry_run:  # a dry run talks to no server, and says itself what its model lacks, after the pairs
        job.backend_class.reach(job.backend_settings)
        problem = job.source.problem(weights=True) or workers_problem(settings.get("job", {}))
        if problem:
            raise AuditError(problem)
    return job


@dataclass(frozen=True)
class ModelSource:
    """A model's files as one backend finds them: the one way to the model's folder (`folder`) and to the line
    saying why its files cannot be had (`problem`), for a job, a resolved config or a composed one."""

    backend_class: type[Backend]
    backend_settings: Mapping
    model: Mapping  # the `model` config: its files, and its name and size in a missing file's line

    @classmethod
    def of(cls, settings: Mapping) -> "ModelSource":
        """The source of a resolved config's model under its backend (`settings` needs only those two)."""
        backend_class, backend_settings = backend_of(settings)
        return cls(backend_class, backend_settings, settings["model"])

    @classmethod
    def composed(cls, cfg: DictConfig) -> "ModelSource":
        """The source of a composed config outside a run (a script, a notebook, a benchmark): its `backend` and
        `model` resolved on their own, so keys only a Hydra run resolves (the store's folder) are not needed."""
        return cls.of({key: OmegaConf.to_container(cfg[key], resolve=True) for key in ("backend", "model")})

    def folder(self, weights: bool = True, fetch: bool = True) -> Path | None:
        """The local folder of the model at its checkpoint, as its backend finds it (`Backend.resolve_model`), its
        files checked; weights=False: one that renders the prompts, no weights fetched (a dry run); fetch=False:
        the check alone (nothing downloaded, None returned)."""
        folder = self.backend_class.resolve_model(ModelFiles.of(self.model), self.backend_settings, weights=weights,
                                                  fetch=fetch)
        if folder is not None:  # its files checked before a backend reads them
            check_model_folder(folder, weights=weights and self.backend_class.capabilities.loads_weights)
        return folder

    def problem(self, weights: bool = True) -> str | None:
        """The one line saying why the model's files cannot be had and how to get them, found without downloading
        anything (None: they are here or the hub holds them)."""
        try:
            self.folder(weights, fetch=False)
        except ModelMissing as missing:
            return missing.line(self.model)
        except AuditError as error:  # e.g. a model.path that holds no model, an embedded model's package absent
            return str(error)
        return None

    def backend(self, model_dir: Path | None = None) -> Backend:
        """The backend outside a run, on `model_dir` (default: the model's folder), built as a run builds it."""
        return self.backend_class(model_dir=str(model_dir or self.folder()), dtype=self.model["dtype"],
                                  batch_size=self.model["batch_size"], **self.backend_settings)
