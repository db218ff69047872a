"""A family's config values, read with its ``transformers`` defaults filled in."""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from ..errors import InvalidWorkload


class _Cfg:
    """Config values with the family's transformers defaults filled in."""

    def __init__(self, config: Any, defaults: dict[str, Any]) -> None:
        self._config = config
        self._defaults = defaults

    def get(self, key: str, fallback: Any = None) -> Any:
        value = getattr(self._config, key, UNSET)
        if value is UNSET:
            value = self._defaults.get(key)
        return fallback if value is None else value

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise InvalidWorkload(f"config.{key}", "is required for this model_type")
        return value
