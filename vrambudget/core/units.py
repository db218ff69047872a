"""Byte units and integer helpers. Quantities are integer bytes everywhere; these names exist so
that a constant reads as what it is (``20 * MiB``) and so that GiB (2**30) and GB (10**9) are never
confused. Conversion to floats happens only at the edge (CLI tables, charts)."""

from __future__ import annotations

__all__ = ["GB", "MB", "GiB", "KiB", "MiB", "TiB", "ceil_div", "format_bytes", "round_up"]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
MB = 10**6
GB = 10**9


def ceil_div(numerator: int, denominator: int) -> int:
    """Integer ceiling division for non-negative numerators (no float round-off)."""
    return -(-numerator // denominator)


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``value``."""
    return ceil_div(value, multiple) * multiple


def format_bytes(num_bytes: int) -> str:
    """Human form for terminals only: binary units (GiB = 2**30 bytes)."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024.0 or unit == "PiB":
            return f"{value:,.0f} B" if unit == "B" else f"{value:,.2f} {unit}"
        value /= 1024.0
    raise AssertionError("unreachable")
