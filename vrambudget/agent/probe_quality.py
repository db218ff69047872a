"""The output-quality check of a probe, run in its child after a succeeded measurement
(:func:`vrambudget.workloads.quality.evaluate`): the measured program is out of scope by then
(its memory freed, CUDA's cache emptied), so the check cannot disturb the measured peaks.

A candidate missing a threshold is a result (the report's ``passed`` and ``reasons``), not a
probe failure. An evaluation that cannot run (a format the model's layers cannot take, an
unreadable evaluation file, out of memory) ends the probe ``failed`` with the measurement kept
in the result and the reason in its ``message``: a caller that asked for the check and gates on
``succeeded`` must not read a missing report as a pass."""

from __future__ import annotations

from pathlib import Path

import msgspec

from vrambudget.core.spec import InferenceWorkload

from .child import ChildSettings
from .quality import eval_file
from .spec import ProbeRequest, ProbeResult

__all__ = ["with_quality"]


def with_quality(
    req: ProbeRequest, child: ChildSettings, result: ProbeResult
) -> tuple[str, ProbeResult, str | None]:
    """(status, result, error) of a succeeded measurement once its quality check ran."""
    check = req.quality
    assert check is not None
    try:
        from vrambudget.trace.models import resolve_models
        from vrambudget.workloads.quality import evaluate

        (w,) = resolve_models((req.workload,))
        if not isinstance(w, InferenceWorkload):  # the request's rules allow no other
            raise TypeError("the quality check needs an inference workload")
        weights = result.weights
        checkpoint = weights.path if weights is not None and weights.kind == "checkpoint" else None
        path: Path | None = eval_file(child.eval_dir, check.eval_set)
        report = evaluate(w, check, eval_path=path, checkpoint=checkpoint)
    except Exception as exc:  # noqa: BLE001 -- the measurement stands; the check's failure is told
        message = f"quality check: {type(exc).__name__}: {exc}"[:2000]
        return "failed", msgspec.structs.replace(result, message=message), message
    return "succeeded", msgspec.structs.replace(result, quality=report), None
