"""The tensor-parallel calibrate launches (research/data/vllm_tp_logs.json) against the fitted
constants: how far each re-created launch lands, and that the NVLink-class transfer constants
err on the side of fewer KV tokens."""

from __future__ import annotations

import json

from research.vllm_tp_logs import LEFT_OUT, LOGS, REQUESTS, implied

ROWS = implied()


def test_every_logged_launch_is_recreated_or_says_why_not():
    ids = {e["id"] for e in json.loads(LOGS.read_text())["logs"]}
    assert ids == set(REQUESTS) | set(LEFT_OUT)
    assert not set(REQUESTS) & set(LEFT_OUT)


def test_calibrate_launches_land_within_ten_percent_and_never_far_above():
    for r in ROWS:
        err = (r.predicted_kv_tokens - r.measured_kv_tokens) / r.measured_kv_tokens
        assert -0.10 <= err <= 0.01, (r.log, err)


def test_fabric_classes_of_the_launches():
    by = {r.log: r.fabric for r in ROWS}
    assert {by[k] for k in by if "3090" in k or "t4" in k} == {"pcie"}
    assert {by[k] for k in by if "h100" in k or "a100" in k} == {"nvlink"}


def test_nvlink_launches_of_other_releases_never_get_more_kv_than_printed():
    # the transfer constants take the largest implied value: the prediction is at or below
    for r in ROWS:
        if r.fabric == "nvlink":
            assert r.implied_non_torch_bytes <= r.modelled_non_torch_bytes, r
