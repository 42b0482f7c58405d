"""Where fairaudit's files live and what moves them: the result store and tracking database ($FAIRAUDIT_HOME), the
user cache of built files ($FAIRAUDIT_CACHE), the configs (fairaudit's `conf/`, then the folders outside it that
$FAIRAUDIT_PATH and installed packages name). The lowest layer: it imports nothing of fairaudit but `errors`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from functools import lru_cache
from pathlib import Path

from fairaudit.errors import AuditError

CONF = Path(__file__).parent / "conf"  # Hydra's configs, inside the package so a wheel carries them
PATH_VARIABLE = "FAIRAUDIT_PATH"       # folders of configs (and the Python modules they name) outside fairaudit
ENTRY_POINTS = "fairaudit"             # installed packages' config folders, by entry point


def home() -> Path:
    """Where the result store and the tracking database live by default, one place per user, so a re-run from
    any folder reuses every result: $FAIRAUDIT_HOME, else the user cache (~/.cache/fairaudit)."""
    return Path(os.environ.get("FAIRAUDIT_HOME") or "~/.cache/fairaudit").expanduser().absolute()


def cache_root() -> Path:
    """The user cache for converted models and other files built once: $FAIRAUDIT_CACHE, else ~/.cache/fairaudit."""
    return Path(os.environ.get("FAIRAUDIT_CACHE", Path.home() / ".cache" / "fairaudit")).expanduser()


def extension_roots() -> list[Path]:
    """The config roots outside fairaudit: each folder $FAIRAUDIT_PATH names (os.pathsep-separated; the folder is
    also put on `sys.path`, so the Python modules beside its configs import), then the folder of the package each
    installed distribution names under the entry point group `fairaudit` (e.g. `[project.entry-points.fairaudit]
    conf = "my_audits.conf"`). Each holds config groups: `probe/`, `backend/`, `dataset/`, `model/`, ..."""
    return _extension_roots(os.environ.get(PATH_VARIABLE, ""))


@lru_cache(maxsize=None)
def _extension_roots(path_variable: str) -> list[Path]:
    folders = [Path(part).expanduser().absolute() for part in path_variable.split(os.pathsep) if part]
    for folder in folders:
        if not folder.is_dir():
            raise AuditError(f"{PATH_VARIABLE}: {folder} is not a folder (it lists folders of configs, "
                             f"separated by {os.pathsep!r}); create it, or leave it out of {PATH_VARIABLE}")
        if str(folder) not in sys.path:
            sys.path.append(str(folder))  # the modules its configs' _target_ names
    return folders + [root for root in map(_package_root, _entry_points()) if root is not None]


def _entry_points() -> list[tuple[str, str]]:
    from importlib.metadata import entry_points

    return sorted((point.name, point.value) for point in entry_points(group=ENTRY_POINTS))


def _package_root(point: tuple[str, str]) -> Path | None:
    """The folder of the package an entry point names (found without importing it)."""
    name, value = point
    spec = importlib.util.find_spec(value.split(":")[0])
    if spec is None or not spec.submodule_search_locations:
        raise AuditError(f"entry point {name} = {value!r} (group {ENTRY_POINTS!r}) names no installed package folder")
    return Path(list(spec.submodule_search_locations)[0])


def config_roots() -> list[Path]:
    """Every config root, fairaudit's own `conf/` first."""
    return [CONF, *extension_roots()]


def search_path() -> list[str]:
    """The config roots outside fairaudit as Hydra search path entries (file://...)."""
    return [f"file://{root}" for root in extension_roots()]
