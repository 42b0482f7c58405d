"""The one registry: what ships is what `conf/` holds.

A backend, probe, data set, model, arm or study exists when its `conf/<group>/<name>.yaml` does; a
backend's or probe's class is the `_target_` that file names, and a probe's part of `fairaudit report`
is its `report:` node: `sections`, the functions that build its sections, and `settings`, which the
report's command line overrides as `probes.<name>.<key>=...`. Nothing else lists them: shared code
and the tests ask this module, so a new probe or backend is new files only.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

from fairaudit import CONF_DIR
from fairaudit.errors import AuditError

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
def report_defaults() -> dict[str, Any]:
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


def report_node(probe: str) -> dict[str, Any]:
    """A probe's `report:` node ({} when it has none); an AuditError when it is not {sections, settings}."""
    node = settings("probe", probe).get("report") or {}
    if not isinstance(node, dict) or not set(node) <= {"sections", "settings"}:
        raise AuditError(f"conf/probe/{probe}.yaml: report must be a mapping of `sections` (the dotted names of "
                         f"its report's section builders) and `settings` (their settings), not {node!r}")
    return node


def report_sections(probe: str) -> list[str]:
    """Dotted names of the section builders a probe lists under `report.sections`."""
    return list(report_node(probe).get("sections") or [])


def report_settings() -> dict[str, dict[str, Any]]:
    """Every probe's `report.settings` by probe name (empty for a probe that declares none)."""
    return {probe: dict(report_node(probe).get("settings") or {}) for probe in names("probe")}


def report_builders(probes: Iterable[str]) -> dict[Callable, list[str]]:
    """The section builders the given probes list, each once, in probe name order, each with every shipped
    probe that lists it (whose runs and settings it is handed)."""
    from hydra.utils import get_method

    listed = {probe: report_sections(probe) for probe in names("probe")}
    wanted = dict.fromkeys(dotted for probe in sorted(set(probes) & set(listed)) for dotted in listed[probe])
    return {get_method(dotted): [probe for probe in listed if dotted in listed[probe]] for dotted in wanted}


REPORT_SETTINGS = "probe_reports"  # the config conf/report.yaml's defaults list names for `probes:`


def store_report_settings() -> None:
    """Make `probes.<name>.<key>` part of the report's config: Hydra's ConfigStore holds every probe's report
    settings as the config REPORT_SETTINGS, so the command line overrides them like any other key (and a
    misspelt one is refused with the nearest names). Run before the report's config is composed."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=REPORT_SETTINGS, node={"probes": report_settings()})
