"""Which answers are pure functions of the request, for their ``Cache-Control``
(:mod:`vrambudget.http.representation`, docs/HTTP.md).

Every POST answer of the service is computed from the request alone -- the catalogs, the
calibration profiles and the code are fixed for a deployment -- except where a workload names a
Hugging Face Hub repository at a branch or a tag (``revision`` null: ``main``): the answer then
follows what the branch points at, which can move at any time. Such an answer is marked
``Cache-Control: no-cache`` (keep it, but revalidate with its ``ETag`` before reuse). A
repository at a full commit sha is immutable, so its answer is pure too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from vrambudget.core.spec import HubModel

__all__ = ["answer_headers", "reads_moving_source"]

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
"""A git commit sha (the Hub's revisions are git revisions): immutable, unlike a branch or tag."""


def reads_moving_source(workloads: Iterable[Any]) -> bool:
    """Whether a workload's model is a Hub repository at a branch or tag."""
    for w in workloads:
        model = getattr(w, "model", None)
        if isinstance(model, HubModel) and not _COMMIT.match(model.revision or ""):
            return True
    return False


def answer_headers(workloads: Iterable[Any]) -> dict[str, str]:
    """The headers an answer computed from ``workloads`` adds to its route's defaults."""
    return {"Cache-Control": "no-cache"} if reads_moving_source(workloads) else {}
