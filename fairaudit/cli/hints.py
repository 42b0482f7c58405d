"""The fixes the override checks name beyond the nearest name: a misspelt subcommand, a key that lives one level
down (`seed` for `dataset.seed`), a hub id where a model config goes, a range written `0:3`, a setting a probe or
backend does not take and the sweep form under `make run`."""

from __future__ import annotations

import difflib
import inspect
import os
import re

from fairaudit.catalog import registry

SPAN = re.compile(r"^(\d+):(\d+)$")  # 0:3, a range as Python slices write it
TARGETS = ("probe", "backend", "dataset", "arm")  # groups whose settings are a class's keyword arguments


def command_typo(arg: str, commands: list[str]) -> str | None:
    """`lst` for `list`: a word that is no override, no config name and near a subcommand."""
    if "=" in arg or arg.startswith("-") or arg in registry.groups():
        return None
    if any(arg in registry.names(group) for group in registry.groups()):
        return None
    close = difflib.get_close_matches(arg, commands, n=1, cutoff=0.7)
    return f"{arg}: fairaudit has no command {arg!r}; did you mean fairaudit {close[0]}?" if close else None


def keys_named(last: str, node, prefix: str = "", depth: int = 2) -> list[str]:
    """The dotted keys under `node` (to `depth` levels down) whose last part is `last`: where `seed` lives."""
    from omegaconf import DictConfig

    found = []
    for name in node.keys() if isinstance(node, DictConfig) else ():
        path = f"{prefix}{name}"
        if name == last and prefix:
            found.append(path)
        if depth > 0:
            found += keys_named(last, node._get_node(name), f"{path}.", depth - 1)
    return found


def hub_model_hint(group: str, value: str) -> str:
    """A hub id (`Qwen/Qwen3-8B`) typed as a model config's name: how to audit a hub model."""
    if group != "model" or "/" not in value:
        return ""
    return (f"; a hub model is audited through a shipped config of its family: model=qwen3 model.source={value} "
            "(model.path=FOLDER for weights on disk)")


def range_problem(override) -> str | None:
    """`dataset.seed=0:3`: Hydra sweeps a range written range(0,3)."""
    if override.key_or_group.startswith("hydra") or override.is_sweep_override():
        return None
    match = SPAN.match(str(override.value()))
    if not match:
        return None
    key, (low, high) = override.key_or_group, match.groups()
    return (f"{override.input_line}: a range is written range({low},{high}) (the values {low} to {int(high) - 1}): "
            f"{sweep_form(f'{key}=range({low},{high})')}")


def sweep_form(line: str) -> str:
    """The command that sweeps `line`: `make run ARGS="-m ..."` under `make run` (FAIRAUDIT_MAKE_RUN), else
    `fairaudit -m ...`."""
    return f'make run ARGS="-m {line}"' if os.environ.get("FAIRAUDIT_MAKE_RUN") else f"fairaudit -m {line}"


def added_setting_problem(overrides, composed) -> str | None:
    """`+probe.x=1`: a setting the probe's (backend's, ...) class does not take, named with the ones it does,
    instead of the TypeError its constructor would raise."""
    for override in overrides:
        group, _, setting = override.key_or_group.partition(".")
        if not (override.is_add() or override.is_force_add()) or group not in TARGETS or not setting:
            continue
        target = composed.get(group, {}).get("_target_")
        takes = inspect.signature(registry.resolve(target).__init__).parameters if target else {}
        name = setting.split(".")[0]
        if takes and name not in takes and not any(p.kind is p.VAR_KEYWORD for p in takes.values()):
            known = ", ".join(p for p in takes if p != "self")
            return (f"{override.input_line}: the {group} {target.rsplit('.', 1)[-1]} has no setting {name!r}; its "
                    f"settings: {known} (each is set without the +)")
    return None

