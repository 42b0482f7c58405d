"""fairaudit: audit reasoning language models for bias inside their thinking."""

from pathlib import Path

from fairaudit.places import CONF, home, search_path

__version__ = "0.2.0"

CONF_DIR = str(CONF)  # Hydra's config folder


def _absolute(path: str, base: str) -> str:
    """`path` with ~ expanded, relative to `base` (the folder a command started from) unless absolute."""
    return str((Path(base) / Path(path).expanduser()).absolute())


def _register_resolvers() -> None:
    """${fairaudit.home:} and ${fairaudit.path:PATH,BASE}, with which conf/ places the store and tracking database,
    and ${fairaudit.searchpath:}, the config folders outside fairaudit (Hydra's search path)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("fairaudit.home"):
        OmegaConf.register_new_resolver("fairaudit.home", lambda: str(home()))
        OmegaConf.register_new_resolver("fairaudit.path", _absolute)
        OmegaConf.register_new_resolver("fairaudit.searchpath", search_path)


_register_resolvers()
