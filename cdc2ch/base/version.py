"""This release's version (also pyproject.toml's)."""

__version__ = "0.1.0"
