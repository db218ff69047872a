"""The data files the core reads (catalogs, fitted calibrations), packaged with the wheel
(``[tool.setuptools.package-data]`` in pyproject.toml lists each)."""

from __future__ import annotations

from importlib import resources
from typing import TypeVar

import msgspec

__all__ = ["data_file"]

T = TypeVar("T")


def data_file(name: str, type: type[T]) -> T:
    """The packaged JSON data file ``name`` (``gpus.json``, ``error_bands.json``...), decoded
    and validated as ``type``."""
    return msgspec.json.decode(resources.files(__name__).joinpath(name).read_bytes(), type=type)
