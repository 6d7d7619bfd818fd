"""The package's version, in one place: pyproject.toml reads it at build time."""

__version__ = "0.1.0"
