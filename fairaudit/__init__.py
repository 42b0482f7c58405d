"""fairaudit: audit reasoning language models for bias inside their thinking."""

import os
from pathlib import Path

__version__ = "0.1.0"

CONF_DIR = str(Path(__file__).parent / "conf")  # Hydra's configs, inside the package so a wheel carries them


def home() -> Path:
    """Where the result store and the tracking database live by default, one place per user, so a re-run from
    any folder reuses every result: $FAIRAUDIT_HOME, else the user cache (~/.cache/fairaudit)."""
    return Path(os.environ.get("FAIRAUDIT_HOME") or "~/.cache/fairaudit").expanduser().absolute()


def _absolute(path: str, base: str) -> str:
    """`path` with ~ expanded, relative to `base` (the folder a command started from) unless absolute."""
    return str((Path(base) / Path(path).expanduser()).absolute())


def _register_resolvers() -> None:
    """${fairaudit.home:} and ${fairaudit.path:PATH,BASE}, with which conf/ places the store and tracking database."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("fairaudit.home"):
        OmegaConf.register_new_resolver("fairaudit.home", lambda: str(home()))
        OmegaConf.register_new_resolver("fairaudit.path", _absolute)


_register_resolvers()
