"""fairaudit: audit reasoning language models for bias inside their thinking."""

from pathlib import Path

__version__ = "0.1.0"

CONF_DIR = str(Path(__file__).parent / "conf")  # Hydra's configs, inside the package so a wheel carries them
