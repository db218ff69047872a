"""The opaque keyset cursor of :meth:`Store.list_probes`: a probe's ``(created_at, id)``."""

from __future__ import annotations

import base64
import binascii
import json

from .rows import ProbeRow


def _encode_cursor(row: ProbeRow) -> str:
    raw = json.dumps([row.created_at, row.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, probe_id = json.loads(raw)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise ValueError(f"invalid page cursor {cursor!r}") from exc
    ok = isinstance(created_at, int | float) and not isinstance(created_at, bool)
    if not (ok and isinstance(probe_id, str)):
        raise ValueError(f"invalid page cursor {cursor!r}")
    return float(created_at), probe_id
