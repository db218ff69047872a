"""The data files the core reads (catalogs, fitted calibrations), packaged with the wheel
(``[tool.setuptools.package-data]`` in pyproject.toml lists each)."""

from __future__ import annotations

from importlib import resources

__all__ = ["data_file"]


def data_file(name: str) -> bytes:
    """The bytes of the packaged data file ``name`` (``gpus.json``, ``error_bands.json``...)."""
    return resources.files(__name__).joinpath(name).read_bytes()
