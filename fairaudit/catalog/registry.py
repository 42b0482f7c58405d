"""The one registry: what can be chosen is what the config roots hold.

A backend, probe, data set, model, arm or study exists when a config root holds `<group>/<name>.yaml`; a
backend's or probe's class is the `_target_` that file names (`resolve`, the one place a class is looked up from
config), and a probe's part of `fairaudit report` is its `report:` node: `sections`, the functions that build its
sections, and `settings`, which the report's command line overrides as `probes.<name>.<key>=...`. Nothing else
lists them: the command line, `fairaudit list`, validation and the tests ask this module, so a new probe or
backend is new files only.

The config roots are fairaudit's own `conf/` and the folders outside it (`fairaudit.places.config_roots`:
$FAIRAUDIT_PATH's folders, installed packages' by entry point). The first root that holds a name wins; Hydra
searches the same roots (conf/config.yaml's `hydra.searchpath`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

from fairaudit.errors import AuditError
from fairaudit.places import CONF, config_roots

GROUPS = {"model": "models", "dataset": "datasets", "probe": "probes", "arm": "arms", "backend": "backends",
          "experiment": "studies"}  # the selectable config groups and what `fairaudit list` calls them
META = {"probe": ("report", "smallest_run"), "backend": ("conformance",)}  # keys fairaudit reads, not constructors


def config_file(group: str, name: str) -> Path:
    """`<group>/<name>.yaml` of the first root that holds it."""
    for root in config_roots():
        path = root / group / f"{name}.yaml"
        if path.is_file():
            return path
    raise AuditError(f"there is no {group} named {name!r} (`fairaudit list` shows them all)")


def names(group: str) -> list[str]:
    """The selectable names of a config group (`backend`, `probe`, `dataset`, ...) in every root, sorted."""
    return sorted({path.stem for root in config_roots() for path in (root / group).glob("*.yaml")})


def groups() -> list[str]:
    """Every config group some root holds (fairaudit's and an extension's own), sorted."""
    return sorted({path.name for root in config_roots() for path in root.iterdir() if path.is_dir()})


@lru_cache(maxsize=None)
def _load(path: Path) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(path))


def settings(group: str, name: str) -> dict[str, Any]:
    """`<group>/<name>.yaml` as written (defaults lists and interpolations not resolved)."""
    return _load(config_file(group, name))


def describe(group: str, name: str) -> str:
    """A config file's description: its leading comment up to the first line ending a sentence (or a colon)."""
    words: list[str] = []
    for line in config_file(group, name).read_text().splitlines():
        text = line.strip()
        if not text.startswith("#"):
            break
        if not text.startswith("# @package"):
            words.append(text.lstrip("#").strip())
            if words[-1].endswith((".", ":")):
                break
    return " ".join(words).rstrip(":")


def report_defaults() -> dict[str, Any]:
    """`conf/report.yaml` as written: the report's defaults (e.g. the `family` a sweep's parent counts)."""
    return _load(CONF / "report.yaml")


def report_family(probes: Iterable[str]) -> dict[str, Any]:
    """`conf/report.yaml`'s `family`, its `metrics` (null there: each probe's own) the tests the given probes declare
    (`report.family`)."""
    family = dict(report_defaults()["family"])
    if family.get("metrics") is None:
        family["metrics"] = declared(probes, "family")
    return family


def resolve(dotted: str) -> type:
    """The class a `_target_` names, imported (optional engines stay lazy); one line when it cannot be imported
    (Hydra's own "Error locating target" hides the ImportError behind it)."""
    from hydra.utils import get_class

    try:
        return get_class(dotted)
    except ImportError as error:
        cause = error.__cause__ or error
        raise AuditError(f"cannot import {dotted!r}: {type(cause).__name__}: {cause}") from None


def target(group: str, name: str) -> type:
    """The class `<group>/<name>.yaml` names by `_target_`."""
    return resolve(settings(group, name)["_target_"])


def meta(group: str, name: str, key: str) -> Any:
    """A node of `<group>/<name>.yaml` that fairaudit reads itself (META; None when absent)."""
    assert key in META[group], f"{key!r} is not a meta key of {group} configs: {META[group]}"
    return settings(group, name).get(key)


def datasets_reading(data: type) -> list[str]:
    """The data sets (conf/dataset/) whose items are `data`'s: that class or a subclass of it."""
    return [name for name in names("dataset") if issubclass(target("dataset", name), data)]


def backend_classes() -> dict[str, type]:
    """Every backend class by its `backend=` name."""
    return {name: target("backend", name) for name in names("backend")}


def probe_classes() -> dict[str, type]:
    """Every probe class by its `probe=` name."""
    return {name: target("probe", name) for name in names("probe")}


def backends_with(capability: str) -> list[str]:
    """Names of the model backends whose declared capabilities include `capability` (a rehearsal backend such as
    backend=mock is never offered in place of a model)."""
    return [name for name, cls in backend_classes().items() if cls.capabilities.has(capability) and not cls.rehearsal]


REPORT_KEYS = {  # what a probe's `report:` node may declare
    "sections": "the dotted names of its report's section builders",
    "settings": "their settings",
    "main": "the names of its headline sections, printed in the terminal",
    "summaries": "the metrics summarised across seeds",
    "curves": "the metrics drawn against checkpoint order",
    "family": "its log10 p metrics, corrected together for multiple comparisons",
    "sign_test": "{greater, than, alternative}: the metric predicted larger in each cell than another or a number",
}


def report_node(probe: str) -> dict[str, Any]:
    """A probe's `report:` node ({} when it has none); an AuditError when it holds a key not in REPORT_KEYS."""
    node = meta("probe", probe, "report") or {}
    if not isinstance(node, dict) or not set(node) <= set(REPORT_KEYS):
        keys = "; ".join(f"`{key}` ({what})" for key, what in REPORT_KEYS.items())
        raise AuditError(f"{config_file('probe', probe)}: report must be a mapping of {keys}, not {node!r}")
    return node


def declared(probes: Iterable[str], key: str) -> list[str]:
    """What the given probes list under `report.<key>` (main, summaries, curves, family), each once, in probe name
    order."""
    chosen = sorted(set(probes) & set(names("probe")))
    return list(dict.fromkeys(item for probe in chosen for item in report_node(probe).get(key) or []))


def declared_sign_test(probes: Iterable[str]) -> dict[str, Any]:
    """The sign test the first of the given probes (in name order) that declares one declares ({}: none)."""
    chosen = sorted(set(probes) & set(names("probe")))
    return next((dict(report_node(p)["sign_test"]) for p in chosen if report_node(p).get("sign_test")), {})


def report_sections(probe: str) -> list[str]:
    """Dotted names of the section builders a probe lists under `report.sections`."""
    return list(report_node(probe).get("sections") or [])


def report_settings() -> dict[str, dict[str, Any]]:
    """Every probe's `report.settings` by probe name (empty for a probe that declares none)."""
    return {probe: dict(report_node(probe).get("settings") or {}) for probe in names("probe")}


def report_builders(probes: Iterable[str]) -> dict[Callable, list[str]]:
    """The section builders the given probes list, each once, in probe name order, each with every probe that
    lists it (whose runs and settings it is handed)."""
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
