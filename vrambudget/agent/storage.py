"""Can the agent record what it accepts? The data directory must be writable and have free
space, or ``/readyz`` says why and ``POST /v1/probes`` answers 503 instead of accepting a
probe whose outcome it could not store."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["storage_checker"]


def storage_checker(data_dir: Path, min_free_bytes: int) -> Callable[[], str | None]:
    """A check of ``data_dir``: None when writes can be expected to succeed, else why not."""

    def check() -> str | None:
        try:
            st = os.statvfs(data_dir)
        except OSError as exc:
            return f"the data directory cannot be examined: {exc.strerror or exc}"
        if st.f_flag & os.ST_RDONLY or not os.access(data_dir, os.W_OK):
            return "the data directory is read-only"
        free = st.f_bavail * st.f_frsize
        if free < min_free_bytes:
            return f"the data directory has {free} bytes free (below {min_free_bytes})"
        return None

    return check
