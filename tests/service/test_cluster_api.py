"""``POST /v1/cluster-requests`` through the app: JSON and YAML answers, the YAML validated
against the Kubernetes 1.34 schemas (kubernetes-validate, offline), and 4xx problems naming the
field."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml
from litestar.testing import TestClient

from vrambudget.service.app import Settings, create_app

H100 = {"source": "catalog", "id": "h100-sxm5-80gb"}
K8S = "1.34.0"


def serving(model: str, **fields: Any) -> dict[str, Any]:
    return {"kind": "llm_serving", "model": {"source": "preset", "id": model}, **fields}


BUDGET = {
    "source": {
        "from": "budget",
        "request": {
            "workloads": [serving("llama-3.1-8b", parallelism={"tensor": 2})],
            "device": H100,
        },
    }
}


@pytest.fixture(scope="module")
def client() -> Any:
    with TestClient(create_app(Settings())) as c:
        yield c


def test_json_answer_carries_every_object(client: Any) -> None:
    r = client.post("/v1/cluster-requests", json=BUDGET)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    a = r.json()
    assert a["resource_name"] == "nvidia.com/gpu" and a["devices_per_pod"] == 2
    limits = a["pod"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"memory": "17729Mi", "nvidia.com/gpu": "2"}  # tests/core/test_cluster.py
    for key in ("pod", "resource_claim", "resource_claim_template", "dra_pod"):
        kubernetes_validate.validate(a[key], K8S, strict=True)


@pytest.mark.parametrize(
    ("query", "headers", "kinds"),
    [
        ("?format=yaml", {}, ["Pod"]),
        ("", {"accept": "application/yaml"}, ["Pod"]),
        ("?format=yaml&manifests=dra", {}, ["ResourceClaimTemplate", "Pod"]),
    ],
)
def test_yaml_is_a_kubectl_stream_that_validates(
    client: Any, query: str, headers: dict[str, str], kinds: list[str]
) -> None:
    r = client.post(f"/v1/cluster-requests{query}", json=BUDGET, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/yaml")
    text = r.text
    assert text.startswith("# vrambudget cluster requests: 1 pod(s) of 2 x nvidia.com/gpu")
    assert "# memory: 17729Mi = host RAM 14294967296 B" in text
    docs = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in docs] == kinds
    for d in docs:
        kubernetes_validate.validate(d, K8S, strict=True)


def test_json_wins_without_yaml_accept(client: Any) -> None:
    r = client.post("/v1/cluster-requests", json=BUDGET, headers={"accept": "application/json"})
    assert r.headers["content-type"].startswith("application/json")


def fit_body(gpu_id: str, device_count: int) -> dict[str, Any]:
    return {
        "source": {
            "from": "fit",
            "request": {
                "workloads": [serving("llama-3.1-70b")],
                "devices": [H100],
                "device_counts": [1, 4],
            },
            "gpu_id": gpu_id,
            "device_count": device_count,
        }
    }


@pytest.mark.parametrize(
    ("body", "query", "status", "field"),
    [
        (fit_body("h100-sxm5-80gb", 1), "", 422, "$.source.device_count"),
        (fit_body("h100-sxm5-80gb", 2), "", 422, "$.source.device_count"),
        (fit_body("b200-180gb", 4), "", 422, "$.source.gpu_id"),
        ({**BUDGET, "mig_profile": "1g.10gb"}, "", 422, "$.mig_profile"),
        ({**BUDGET, "mig_profile": "tiny"}, "", 422, "$.mig_profile"),
        ({**BUDGET, "name": "Not_A_DNS_Label"}, "", 422, "$.name"),
        ({**BUDGET, "source": {"from": "nowhere"}}, "", 422, "$.source"),
        ({"source": {"from": "fit", "request": {"workloads": []}}}, "", 422, "$.source"),
        (
            {
                "source": {
                    "from": "budget",
                    "request": {
                        "workloads": [serving("llama-3.1-8b")],
                        "device": {"source": "catalog", "id": "mi300x-192gb"},
                    },
                }
            },
            "?format=yaml&manifests=dra",
            422,
            "$.manifests",
        ),
    ],
)
def test_problems_name_the_field(
    client: Any, body: dict[str, Any], query: str, status: int, field: str
) -> None:
    r = client.post(f"/v1/cluster-requests{query}", json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    fields = [e["field"] for e in problem.get("errors", ())]
    assert any(f.startswith(field) for f in fields) or field in problem["detail"], problem
