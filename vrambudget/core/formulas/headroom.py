"""Headroom: the safety margin the caller asked to keep free.

Shown in answers::

    max(ceil(fraction x device subtotal), min_bytes)
"""

from __future__ import annotations

from ..spec import Headroom

__all__ = ["FORMULA", "SOURCE", "headroom", "headroom_bytes"]

FORMULA = "max(ceil(fraction x device subtotal), min_bytes)"
SOURCE = "requested by the caller"


def headroom(subtotal: int, fraction_ppm: int, min_bytes: int) -> int:
    """``max(ceil(subtotal x fraction), min_bytes)`` with the fraction in millionths (exact).

    Worked number: a 20,000,000,000 B subtotal with fraction 0.05 and min_bytes 1 GiB:
    max(1,000,000,000, 1,073,741,824) = 1,073,741,824 B."""
    room = -(-subtotal * fraction_ppm // 1_000_000)
    return room if room > min_bytes else min_bytes


def headroom_bytes(subtotal: int, h: Headroom) -> int:
    return headroom(subtotal, round(h.fraction * 1_000_000), h.min_bytes)
