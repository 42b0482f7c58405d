"""fairaudit: audit reasoning language models for bias inside their thinking."""

__version__ = "0.1.0"
