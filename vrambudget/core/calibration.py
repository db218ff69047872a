"""Calibration profiles: the overheads only real hardware tells, measured by probes.

A profile is keyed by the GPU (the name the CUDA runtime reports, and the catalog id it
matches) and the software (driver, CUDA, torch versions), and holds the CUDA context bytes,
the cuBLAS/cuBLASLt workspace bytes, the NCCL communicator bytes and the allocator's
fragmentation fractions, each the median over the probes it came from (their ids are kept).
Building a profile (:func:`build_profiles`) and choosing one for a request
(:meth:`ProfileSet.best`) are pure; reading and writing the files is the caller's.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from .errors import InvalidWorkload
from .overheads import Overheads
from .probe_report import ProbeResource, measured_torch
from .result import Budget
from .spec import Software

__all__ = [
    "PROFILES_ENV",
    "CalibrationProfile",
    "ProfileSet",
    "apply_profile",
    "build_profiles",
    "load_profiles",
    "measured_overheads",
    "profiles_from",
]

ProfileId = Annotated[str, Meta(min_length=1, max_length=96, pattern=r"^[A-Za-z0-9_.-]+$")]
# A hand-edited profile with a negative value would give negative budget lines (and a negative
# allocation in the trace tier's replay): refused when the directory is loaded.
_Bytes = Annotated[int, Meta(ge=0, le=1 << 62)]
_Fraction = Annotated[float, Meta(ge=0.0, le=100.0)]


class CalibrationProfile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What probes measured on one GPU model with one software stack."""

    schema: Literal[1] = 1
    id: ProfileId
    gpu_name: str
    """``torch.cuda.get_device_name()`` of the probes."""
    gpu_id: str | None
    """The catalog GPU that name matched (null: none; the profile then applies to custom devices
    of that name)."""
    torch_version: str | None
    cuda_version: str | None
    driver_version: str | None
    cuda_context_bytes: _Bytes | None = None
    workspace_bytes: _Bytes | None = None
    nccl_communicator_bytes: _Bytes | None = None
    """No single-process probe measures it yet; a profile may carry one measured elsewhere."""
    inference_fragmentation_fraction: _Fraction | None = None
    training_fragmentation_fraction: _Fraction | None = None
    probe_ids: tuple[str, ...]
    samples: dict[str, int] = {}
    """How many probes each value is the median of."""
    created_at: str = ""


# ------------------------------------------------------------------------------ matching --


def _minor(v: str | None) -> str | None:
    if not v:
        return None
    return ".".join(v.split("+")[0].split(".")[:2])


def _major(v: str | None) -> str | None:
    return v.split(".")[0] if v else None


def _agree(profile: str | None, wanted: str | None) -> bool | None:
    """True: same; False: both known and different; None: one side unknown."""
    if profile is None or wanted is None:
        return None
    return profile == wanted


class ProfileSet:
    """Loaded profiles, and the choice of one for a device and software."""

    def __init__(self, profiles: Iterable[CalibrationProfile] = ()) -> None:
        self.profiles = tuple(sorted(profiles, key=lambda p: p.id))
        ids = [p.id for p in self.profiles]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate calibration profile ids: {sorted(ids)}")

    def __bool__(self) -> bool:
        return bool(self.profiles)

    def best(
        self, gpu_id: str | None, gpu_name: str, software: Software | None
    ) -> tuple[CalibrationProfile | None, tuple[str, ...]]:
        """The profile of this GPU whose versions agree with the request's the most; a
        version both sides name and that differs rules the profile out (torch and CUDA on
        major.minor, the driver on its major). Ties: the newest, then the id."""
        sw = software or Software()
        best: tuple[int, str, str] | None = None
        chosen: tuple[CalibrationProfile | None, tuple[str, ...]] = (None, ())
        for p in self.profiles:
            if not (
                (gpu_id is not None and p.gpu_id == gpu_id)
                or (p.gpu_id is None and p.gpu_name == gpu_name)
            ):
                continue
            checks = {
                "torch": _agree(_minor(p.torch_version), _minor(sw.torch_version)),
                "cuda": _agree(_minor(p.cuda_version), _minor(sw.cuda_version)),
                "driver": _agree(_major(p.driver_version), _major(sw.driver_version)),
            }
            if False in checks.values():
                continue
            matched = ("gpu", *(k for k, ok in checks.items() if ok))
            key = (len(matched), p.created_at, p.id)
            if best is None or key > best:
                best, chosen = key, (p, matched)
        return chosen


def apply_profile(
    ov: Overheads, profile: CalibrationProfile | None, matched: tuple[str, ...] = ()
) -> Overheads:
    """``ov`` with the values ``profile`` measured; the rest stay built-in."""
    if profile is None:
        return ov

    def source(key: str) -> str:  # no str.format: a name may hold braces
        n = profile.samples.get(key, len(profile.probe_ids))
        return (
            f"calibration profile {profile.id} ({profile.gpu_name}; median of {n} "
            f"probe(s): {', '.join(profile.probe_ids[:8])})"
        )

    changes: dict[str, object] = {"profile": profile.id, "profile_match": matched}
    if profile.cuda_context_bytes is not None:
        changes.update(
            cuda_context_bytes=profile.cuda_context_bytes,
            cuda_context_source=source("cuda_context_bytes"),
        )
    if profile.workspace_bytes is not None:
        changes.update(
            workspace_bytes=profile.workspace_bytes, workspace_source=source("workspace_bytes")
        )
    if profile.nccl_communicator_bytes is not None:
        changes.update(
            nccl_communicator_bytes=profile.nccl_communicator_bytes,
            communication_source=source("nccl_communicator_bytes"),
        )
    frac_src = []
    if profile.inference_fragmentation_fraction is not None:
        changes["inference_fragmentation_ppm"] = round(
            profile.inference_fragmentation_fraction * 1_000_000
        )
        frac_src.append(f"inference {source('inference_fragmentation_fraction')}")
    if profile.training_fragmentation_fraction is not None:
        changes["training_fragmentation_ppm"] = round(
            profile.training_fragmentation_fraction * 1_000_000
        )
        frac_src.append(f"training {source('training_fragmentation_fraction')}")
    if frac_src:
        untouched = [
            k
            for k, v in (
                ("inference", profile.inference_fragmentation_fraction),
                ("training", profile.training_fragmentation_fraction),
            )
            if v is None
        ]
        tail = (
            f"; {', '.join(untouched)}: built-in ({ov.fragmentation_source})" if (untouched) else ""
        )
        changes["fragmentation_source"] = "; ".join(frac_src) + tail
    return dataclasses.replace(ov, **changes)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ building --


def measured_overheads(report: ProbeResource, estimate: Budget | None) -> dict[str, float]:
    """The overheads one CUDA report measures: ``cuda_context_bytes`` (NVML delta at context
    creation), ``workspace_bytes`` (a first GEMM's allocation), and the fragmentation fraction
    of its kind, (reserved peak - allocated peak) / the estimate's largest transient bytes (the
    quantity the service's fraction multiplies)."""
    res = report.result
    if res is None or report.status not in ("succeeded",):
        raise InvalidWorkload(
            "status",
            f"probe {report.id}: status {report.status!r}; only "
            "succeeded probes calibrate (unreliable ones saw other processes "
            "change device memory)",
        )
    if res.device != "cuda":
        raise InvalidWorkload(
            "result.device",
            f"probe {report.id} ran on the CPU: it measures "
            "no CUDA context, workspace or allocator overhead",
        )
    out: dict[str, float] = {}
    if res.nvml is not None and res.nvml.cuda_context_bytes > 0:
        out["cuda_context_bytes"] = res.nvml.cuda_context_bytes
    t = measured_torch(res)
    if t.workspace_bytes is not None:
        out["workspace_bytes"] = t.workspace_bytes
    if estimate is not None and t.reserved_peak_bytes is not None:
        dev = estimate.devices[estimate.most_loaded]
        transient = dev.inputs.get("largest_transient_bytes")
        if isinstance(transient, int) and transient > 0:
            kind = report.request.workload.__struct_config__.tag
            frac = (t.reserved_peak_bytes - t.allocated_peak_bytes) / transient
            out[f"{kind}_fragmentation_fraction"] = round(max(0.0, frac), 4)
    return out


def _group_key(report: ProbeResource) -> tuple[str, str | None, str | None, str | None]:
    res = report.result
    assert res is not None
    return (
        res.device_name,
        _minor(res.torch_version),
        _minor(res.cuda_version),
        _major(res.driver_version),
    )


def _slug(text: str) -> str:
    # ASCII only: the id must match ProfileId's pattern (str.isalnum accepts any letter).
    keep = "".join(ch.lower() if ch.isascii() and ch.isalnum() else "-" for ch in text)
    return "-".join(part for part in keep.split("-") if part)[:80] or "gpu"


def build_profiles(
    reports: Iterable[tuple[ProbeResource, Budget | None, str | None]], created_at: str
) -> tuple[CalibrationProfile, ...]:
    """One profile per (GPU name, torch, CUDA, driver) group of reports; each value the median
    over the reports that measured it (bytes: the lower median, an integer). Each report comes
    with its analytic estimate (for the fragmentation fraction) and its catalog GPU id."""
    groups: dict[
        tuple[str, str | None, str | None, str | None],
        list[tuple[ProbeResource, dict[str, float], str | None]],
    ] = {}
    for report, estimate, gpu_id in reports:
        values = measured_overheads(report, estimate)
        groups.setdefault(_group_key(report), []).append((report, values, gpu_id))
    profiles = []
    for (name, torch_v, cuda_v, driver_v), members in sorted(
        groups.items(), key=lambda kv: str(kv[0])
    ):
        first = members[0][0].result
        assert first is not None
        collected: dict[str, list[float]] = {}
        for _, values, _ in members:
            for k, v in values.items():
                collected.setdefault(k, []).append(v)
        medians: dict[str, object] = {}
        for k, vs in collected.items():
            medians[k] = (
                int(statistics.median_low(vs))
                if k.endswith("_bytes")
                else round(statistics.median(vs), 4)
            )
        ids = tuple(sorted(r.id for r, _, _ in members))
        gpu_ids = {g for _, _, g in members}
        slug = _slug(f"{name}-torch{torch_v}-cuda{cuda_v}-driver{driver_v}")
        profiles.append(
            CalibrationProfile(
                id=slug,
                gpu_name=name,
                gpu_id=next(iter(gpu_ids)) if len(gpu_ids) == 1 else None,
                torch_version=first.torch_version,
                cuda_version=first.cuda_version,
                driver_version=first.driver_version,
                probe_ids=ids,
                samples={k: len(v) for k, v in sorted(collected.items())},
                created_at=created_at,
                **medians,  # type: ignore[arg-type]
            )
        )
    return tuple(profiles)


# ------------------------------------------------------------------------------ files -----

PROFILES_ENV = "VRAMBUDGET_PROFILES_DIR"
_PROFILE_DECODER = msgspec.json.Decoder(CalibrationProfile)


def load_profiles(directory: str | Path) -> ProfileSet:
    """Every ``*.json`` profile in ``directory`` (sorted); a file that is not a valid profile
    raises ValueError naming it, so a service never starts with a profile it cannot use."""
    path = Path(directory)
    if not path.is_dir():
        raise ValueError(f"calibration profiles directory {str(path)!r} does not exist")
    profiles = []
    for f in sorted(path.glob("*.json")):
        try:
            profiles.append(_PROFILE_DECODER.decode(f.read_bytes()))
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise ValueError(f"calibration profile {f}: {exc}") from None
    return ProfileSet(profiles)


@functools.cache
def profiles_from(directory: str | None) -> ProfileSet:
    """:func:`load_profiles`, once per directory (None: no profiles)."""
    return ProfileSet() if not directory else load_profiles(directory)
