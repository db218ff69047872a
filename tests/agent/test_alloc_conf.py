"""The allocator setting a probe runs under (vrambudget/agent/alloc_conf.py): what the request
sets in the child's environment, what the result reports, and what the comparison estimates."""

from __future__ import annotations

import msgspec
import pytest

from tests.support.reports import cuda_report
from vrambudget.agent.alloc_conf import ENV_KEYS, apply, expandable_from
from vrambudget.core.probe_report import ProbeRequest
from vrambudget.core.stack import resolve_stack
from vrambudget.service.compute_worker import software_of


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, False),
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, True),
        ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}, True),
        ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, False),
        ({"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"}, False),
        # torch 2.9's name is read first where it is set
        (
            {
                "PYTORCH_ALLOC_CONF": "expandable_segments:False",
                "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            },
            False,
        ),
        ({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, True),
    ],
)
def test_the_setting_is_read_as_torch_reads_it(env: dict[str, str], want: bool) -> None:
    assert expandable_from(env) is want


def test_the_request_sets_both_variables_or_leaves_them() -> None:
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}
    apply(None, env)
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}
    apply(True, env)
    assert {k: env[k] for k in ENV_KEYS} == dict.fromkeys(ENV_KEYS, "expandable_segments:True")
    assert expandable_from(env)
    apply(False, env)
    assert not expandable_from(env)


def test_a_probe_request_names_it_and_the_comparison_estimates_what_ran() -> None:
    body = {"workload": {"kind": "custom", "entry_point": "x"}, "expandable_segments": True}
    assert msgspec.convert(body, ProbeRequest).expandable_segments is True
    report = cuda_report()
    assert report.result is not None
    assert software_of(report) is not None
    assert not resolve_stack(software_of(report)).expandable_segments
    ran = msgspec.structs.replace(
        report, result=msgspec.structs.replace(report.result, expandable_segments=True)
    )
    assert resolve_stack(software_of(ran)).expandable_segments


def test_the_child_sets_it_before_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    """``measure`` (the child's body) sets the variables the request names before torch's first
    allocation; a CPU run reports no allocator setting."""
    import os

    from tests.support.workloads import TINY
    from vrambudget.agent.child import ChildSettings
    from vrambudget.agent.probe import measure

    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    spec = {
        "kind": "inference",
        "model": TINY,
        "batch_size": 1,
        "prompt_tokens": 8,
        "generated_tokens": 1,
        "precision": {"weights": "fp32", "compute": "fp32"},
    }
    req = msgspec.convert(
        {"workload": spec, "iterations": 1, "expandable_segments": True}, ProbeRequest
    )
    out = measure(req, ChildSettings())
    assert out.result is not None and out.result.device == "cpu"
    assert all(os.environ[k] == "expandable_segments:True" for k in ENV_KEYS)
    assert out.result.expandable_segments is None


def test_an_engine_probe_refuses_it_naming_the_field() -> None:
    body = {
        "workload": {"kind": "llm_serving", "model": {"source": "preset", "id": "qwen2.5-7b"}},
        "engine": {"concurrency": 4},
        "expandable_segments": True,
    }
    with pytest.raises(msgspec.ValidationError, match="expandable_segments"):
        msgspec.convert(body, ProbeRequest)
    assert msgspec.convert({**body, "expandable_segments": None}, ProbeRequest).engine is not None


def test_the_comparison_keeps_a_report_without_torch_unnamed_and_drops_a_driver_that_is_none() -> (
    None
):
    """An engine probe reports no torch: the comparison's estimate leaves it unnamed (the
    engine release's pin applies), not ``""``; a report's driver string outside
    `software.driver_version`'s pattern is dropped, not read as an old driver."""
    report = cuda_report()
    assert report.result is not None

    def with_result(**changes: object) -> object:
        return msgspec.structs.replace(
            report, result=msgspec.structs.replace(report.result, **changes)
        )

    sw = software_of(with_result(torch_version=None, driver_version="535.247.01"))
    assert sw is not None
    assert (sw.torch_version, sw.driver_version) == (None, "535.247.01")
    odd = software_of(with_result(driver_version="12.4"))
    assert odd is not None and odd.driver_version is None


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("535.247.01", "535.247.01"),
        ("560.94", "560.94"),
        ("580", "580"),
        ("12.4", None),  # nvidia-smi's "CUDA Version", not a driver
        ("R535", None),
        ("0.0", None),
        ("535." + "1" * 40, None),  # longer than the field allows: not cut to a valid prefix
        (None, None),
        ("", None),
    ],
)
def test_a_reported_driver_is_kept_only_as_the_field_takes_it(
    text: str | None, want: str | None
) -> None:
    """The agent's NVML driver and a probe report's driver pass through one check (the
    ``software.driver_version`` pattern and length): what the service would refuse is dropped."""
    from types import SimpleNamespace

    from vrambudget.agent.roundtrip import nvml_driver
    from vrambudget.core.spec import Software, driver_version

    assert driver_version(text) == want
    assert nvml_driver(SimpleNamespace(driver_version=text)) == want
    if want is not None:
        assert msgspec.convert({"driver_version": want}, Software).driver_version == want
