"""Every config under conf/ composes, and every `_target_` resolves and accepts its arguments (no GPU, no model)."""

from __future__ import annotations

import inspect

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from fairaudit.catalog import registry

CONF = registry.CONF
RUNTIME_KWARGS = {"backend": {"model_dir", "dtype", "batch_size"}}
READ_BY_FAIRAUDIT = {group: set(keys) for group, keys in registry.META.items()}  # stripped before it is built
GROUPS = registry.groups()
APPENDED = {"experiment", "plan"}  # groups a command appends (+group=option): studies, `fairaudit plan`'s settings
options = registry.names


def composed(*overrides: str) -> DictConfig:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def targets(node, path=""):
    """(path, config node) of every node holding a _target_."""
    if isinstance(node, DictConfig):
        if "_target_" in node:
            yield path, node
        for key in node:
            if key != "hydra":
                yield from targets(node[key], f"{path}.{key}" if path else key)


def check_binds(path: str, node: DictConfig) -> None:
    target = get_object(node._target_)
    kwargs = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items()
              if not k.startswith("_") and k not in READ_BY_FAIRAUDIT.get(path, set())}
    signature = inspect.signature(target)
    signature.bind_partial(**kwargs)
    required = {n for n, p in signature.parameters.items()
                if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    missing = required - set(kwargs) - RUNTIME_KWARGS.get(path, set())
    assert not missing, f"{path}: {node._target_} needs {sorted(missing)}"


@pytest.mark.parametrize("group, option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes_and_binds(group, option):
    cfg = composed(f"{'+' if group in APPENDED else ''}{group}={option}")
    for path, node in targets(cfg):
        check_binds(path, node)


@pytest.mark.slow
def test_model_configs_declare_how_they_think():
    for option in options("model"):
        model = composed(f"model={option}").model
        assert model.thinking.style in {"native", "prompted", "none"}, option
        assert model.answer_source in {"parsed", "forced"}, option
        assert {"label", "path", "revision"} <= set(model.checkpoint), option


def test_default_config_is_the_embedded_counterfactual_audit():
    cfg = composed()
    assert (cfg.model.source, cfg.probe._target_.rsplit(".", 1)[1], cfg.arm.name) == (
        "embedded:smollm2", "CounterfactualProbe", "think")
    assert cfg.probe.baseline_arm.name == "nothink"
    assert cfg.tracking.uri.startswith("sqlite:////")  # absolute path
