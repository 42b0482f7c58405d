"""One validation step for the global config values a user can type, run before any MLflow run opens or model loads.

Each problem is a short phrase naming the key and what it accepts (the rules of `fairaudit.errors.rules`);
`validate` raises them together as one AuditError (one `error:` line). The global keys are the model's, the
arms', the data set's, the store's and tracking's, and every token budget (`*.max_new_tokens`, below
model.max_context). A probe validates its own `probe.*` keys in its constructor (an arm it asks under with
`arm_rules`) and a backend its `backend.*` keys in its `check`, both with `check_fields`; checks that need the
data files (n against the data set's size, the protected attribute's values) stay with the dataset's own
`check()`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from fairaudit.errors import AuditError
from fairaudit.errors.rules import (
    ABSENT,
    MAX_CONTEXT,
    Check,
    arm_rules,
    boolean,
    integer,
    number,
    one_of,
    optional,
    plain,
    port_problem,
    template_fields,
    text,
)
from fairaudit.errors.secrets import unencoded_problem
from fairaudit.prompts.yesno import ANSWER_SOURCES, P_YES_READINGS, THINKING_STYLES
from fairaudit.tracking.location import EXPERIMENT_NAME, sqlite_problem, tracking_problem

if TYPE_CHECKING:  # omegaconf is imported where a whole config is read: check_fields runs on plain values without it
    from omegaconf import DictConfig

DEFAULT_CHECKPOINT = "base"    # the label of a model's own weights (model.path / model.revision)
MAX_WORKERS = 1024             # processes one job may be split over


def value_rules(max_context: Any) -> dict[str, Check]:
    """Key -> check for every typed value; a key that the composed config lacks is skipped."""
    fits = isinstance(max_context, int) and not isinstance(max_context, bool)
    budget = integer(1, max_context - 1, " (below model.max_context)") if fits else integer(1)
    arm = arm_rules(budget)
    rules = {
        "model.name": text(), "model.source": text(), "model.path": text(null=True), "model.revision": text(null=True),
        "model.batch_size": integer(1), "model.max_context": integer(2, MAX_CONTEXT), "model.max_think_tokens": budget,
        "model.thinking.style": one_of(*THINKING_STYLES), "model.thinking.open": text(),
        "model.thinking.close": text(), "model.thinking.instruction": text(empty=True),
        "model.answer_prefix": text(empty=True), "model.answer_source": one_of(*ANSWER_SOURCES),
        "model.p_yes": one_of(*P_YES_READINGS), "model.weights_gb": optional(number(0)), "model.needs_gpu": boolean,
        "dataset.name": text(), "dataset.seed": integer(0, 2**32 - 1), "dataset.root": text(null=True),
        "dataset.attribute": text(), "dataset.alpha": text(), "dataset.alpha_prime": text(),
        "dataset.question": text(), "dataset.path": text(null=True),
        "dataset.user_template": template_fields({"description", "question"}, {"description"}),
        "store.url": text(), "tracking.uri": text(), "tracking.experiment": text(longest=EXPERIMENT_NAME),
        "data.root": text(null=True), "job.workers": integer(1, MAX_WORKERS), "job.workers_on": one_of("local", "ray"),
    }
    rules.update({f"arm.{key}": check for key, check in arm.items()})
    return rules


def budget_keys(container: DictConfig) -> list[str]:
    """Dotted keys of every token budget set in the config (`max_new_tokens` at any depth, not null)."""
    from omegaconf import DictConfig

    found = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, DictConfig):
            for key in node:
                path = f"{prefix}{key}"
                if key == "max_new_tokens" and node[key] is not None:
                    found.append(path)
                walk(node[key], f"{path}.")

    walk(container, "")
    return found


def _dataset_n(cfg: DictConfig) -> str | None:
    """n counts records: an integer, or null where the data set's class says null takes every item
    (`n_null_takes_all`). Its range depends on the data set's size, which the dataset's check() knows."""
    from omegaconf import OmegaConf

    from fairaudit.catalog.registry import resolve

    value = OmegaConf.select(cfg, "dataset.n", default=ABSENT)
    if value is ABSENT or (value is None and getattr(resolve(cfg.dataset._target_), "n_null_takes_all", False)):
        return None
    return None if integer()(value) is None else f"dataset.n={value!r} must be an integer"


def _checkpoint(cfg: DictConfig) -> str | None:
    from omegaconf import OmegaConf

    value = plain(OmegaConf.select(cfg, "model.checkpoint", default=ABSENT))
    if value is ABSENT or isinstance(value, str):
        return None
    if not isinstance(value, dict) or not {"label", "path", "revision"} <= set(value):
        return f"model.checkpoint={value!r} must be a label string or {{label, path, revision}}"
    if value["label"] != DEFAULT_CHECKPOINT and value["path"] is None and value["revision"] is None \
            and value.get("same_weights") is not True:
        return (f"model.checkpoint.label={value['label']!r} names no weights of its own, so it would reuse "
                "the model's: set model.checkpoint.path "
                "(e.g. 'model.checkpoint.path=/ckpts/run7/${model.checkpoint.label}') or model.checkpoint.revision, "
                "or label the same weights on purpose with +model.checkpoint.same_weights=true")
    return None


def value_problems(cfg: DictConfig) -> list[str]:
    """Type and range problems of every typed value (resolved)."""
    from omegaconf import DictConfig, OmegaConf

    container = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    max_context = OmegaConf.select(container, "model.max_context", default=None)
    problems = [p for p in (_dataset_n(container), _checkpoint(container)) if p]
    rules = value_rules(max_context)
    rules.update({key: rules["arm.max_new_tokens"] for key in budget_keys(container) if key not in rules})
    for key, check in rules.items():
        value = OmegaConf.select(container, key, default=ABSENT)
        if value is ABSENT or _interpolated(cfg, key):  # its source key is checked (and named) instead
            continue
        value = plain(value)
        problem = check(value)
        if problem:
            problems.append(f"{key}={value!r} {problem}")
    template_kwargs = OmegaConf.select(container, "model.template_kwargs", default=ABSENT)
    if template_kwargs is not ABSENT and not isinstance(template_kwargs, DictConfig):
        problems.append(f"model.template_kwargs={plain(template_kwargs)!r} must be a mapping")
    return problems


def _interpolated(cfg: DictConfig, key: str) -> bool:
    from omegaconf import DictConfig, OmegaConf

    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return isinstance(node, DictConfig) and OmegaConf.is_interpolation(node, name)


def store_problem(url: str) -> str | None:
    """store.url: a sqlite file (a path or sqlite:/// URL) we can write; a database server is checked when opened."""
    if url.startswith("sqlite:///"):
        url = url[len("sqlite:///"):]
    elif "://" in url:
        return port_problem("store.url", url) if url.split("://")[0].split("+")[0] == "postgresql" else \
            f"store.url={url!r}: only sqlite files and postgresql servers are supported"
    return sqlite_problem("store.url", Path(url).expanduser())


def validate(cfg: DictConfig) -> None:
    """Raise one AuditError listing every problem of the typed config, before anything is opened or loaded."""
    try:
        problems = value_problems(cfg)
    except Exception as error:  # an interpolation that does not resolve, a malformed node
        raise AuditError(f"config does not resolve: {' '.join(str(error).split())}") from None
    places = (("store.url", cfg.store.url, store_problem), ("tracking.uri", cfg.tracking.uri, tracking_problem))
    if not problems:  # a password cut short first: the reader's error would name a piece of it
        problems = [p for key, url, check in places for p in [unencoded_problem(key, url) or check(url)] if p]
    if problems:
        raise AuditError("; ".join(problems))
