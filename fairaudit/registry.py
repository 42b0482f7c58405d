"""The one registry: what ships is what `conf/` holds.

A backend, probe, data set, model, arm or study exists when its `conf/<group>/<name>.yaml` does; a
backend's or probe's class is the `_target_` that file names, and a probe's sections of
`fairaudit report` are the functions it lists under `report:`. Nothing else lists them: shared code
and the tests ask this module, so a new probe or backend is new files only.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

from fairaudit import CONF_DIR

CONF = Path(CONF_DIR)


def names(group: str) -> list[str]:
    """The selectable names of a config group (`backend`, `probe`, `dataset`, ...), sorted."""
    return sorted(path.stem for path in (CONF / group).glob("*.yaml"))


@lru_cache(maxsize=None)
def settings(group: str, name: str) -> dict[str, Any]:
    """`conf/<group>/<name>.yaml` as written (defaults lists and interpolations not resolved)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(CONF / group / f"{name}.yaml"))


@lru_cache(maxsize=None)
def report_settings() -> dict[str, Any]:
    """`conf/report.yaml` as written: the report's defaults (e.g. the `family` a sweep's parent counts)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(CONF / "report.yaml"))


def target(group: str, name: str) -> type:
    """The class `conf/<group>/<name>.yaml` names by `_target_` (imported; optional engines stay lazy)."""
    from hydra.utils import get_class

    return get_class(settings(group, name)["_target_"])


def backend_classes() -> dict[str, type]:
    """Every shipped backend class by its `backend=` name."""
    return {name: target("backend", name) for name in names("backend")}


def probe_classes() -> dict[str, type]:
    """Every shipped probe class by its `probe=` name."""
    return {name: target("probe", name) for name in names("probe")}


def report_builders(probes: Iterable[str]) -> list[Callable]:
    """The section builders the given probes list under `report:`, each once, in probe name order."""
    from hydra.utils import get_method

    builders: dict[str, Callable] = {}
    for probe in sorted(set(probes) & set(names("probe"))):
        for dotted in settings("probe", probe).get("report", []):
            builders.setdefault(dotted, get_method(dotted))
    return list(builders.values())
