"""deploy/kubernetes: valid against the Kubernetes schemas (as written and as kustomize renders
it), locked down, probing routes that answer, setting only variables the code reads."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
from litestar.testing import TestClient

from tests.deploy.manifests import (
    FOREIGN_ENV,
    KUBERNETES,
    KUSTOMIZATIONS,
    ROOT,
    SECRET_EXAMPLE,
    UID,
    agent_settings,
    containers,
    documents,
    env_values,
    kustomization_files,
    one,
    rendered,
    service_settings,
    source_documents,
)
from vrambudget.agent.api import create_agent_app
from vrambudget.agent.settings import AgentSettings
from vrambudget.agent.webhooks.signing import decode_secret
from vrambudget.service.app import create_app

# The oldest Kubernetes the manifests are written for (matchLabelKeys in topology spread
# constraints is on by default from 1.27; autoscaling/v2 and policy/v1 are GA before) and the
# newest schema kubernetes-validate ships.
VERSIONS = ("1.30.0", "1.37.0")

DEPLOY_MD = ROOT / "docs" / "DEPLOY.md"


def _validate(doc: dict[str, object], version: str) -> None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        meta = doc.get("metadata", {})
        name = meta.get("name") if isinstance(meta, dict) else None
        pytest.fail(f"{doc.get('kind')} {name} is not valid for Kubernetes {version}: {exc}")


@pytest.mark.parametrize("version", VERSIONS)
def test_every_document_as_written_is_valid(version: str) -> None:
    docs = [*source_documents(), *documents(SECRET_EXAMPLE)]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            "Namespace",
            "Deployment",
            "Service",
            "HorizontalPodAutoscaler",
            "PodDisruptionBudget",
            "Namespace",
            "DaemonSet",
            "Service",
            "Secret",
        ]
    )
    for doc in docs:
        _validate(doc, version)


def test_every_manifest_file_is_in_a_kustomization() -> None:
    """A file left out of kustomization.yaml would be neither applied nor checked."""
    listed = {p.resolve() for p in kustomization_files(KUBERNETES)}
    on_disk = {
        p.resolve()
        for p in KUBERNETES.rglob("*.yaml")
        if p.name != "kustomization.yaml" and p != SECRET_EXAMPLE
    }
    assert on_disk == listed


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_kustomize_renders_valid_documents(directory: Path) -> None:
    docs = rendered(directory)  # skips where kubectl is not installed
    assert docs
    for doc in docs:
        for version in VERSIONS:
            _validate(doc, version)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] in ("vrambudget", "vrambudget-agent")
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "vrambudget"
        if doc["kind"] in ("Deployment", "DaemonSet"):
            images = {c["image"] for c in containers(doc["spec"]["template"]["spec"])}
            assert images <= {"vrambudget-service:0.1.0", "vrambudget-agent:0.1.0"}


def test_the_whole_tree_renders_both_deployables() -> None:
    docs = rendered(KUBERNETES)
    assert one(docs, "Deployment")["metadata"]["namespace"] == "vrambudget"
    assert one(docs, "DaemonSet")["metadata"]["namespace"] == "vrambudget-agent"
    assert len(docs) == len(source_documents())


def _workloads() -> list[dict[str, object]]:
    docs = source_documents()
    return [one(docs, "Deployment"), one(docs, "DaemonSet")]


@pytest.mark.parametrize("workload", _workloads(), ids=lambda d: d["kind"])  # type: ignore[index]
def test_containers_run_locked_down(workload: dict) -> None:  # type: ignore[type-arg]
    pod = workload["spec"]["template"]["spec"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    for c in containers(pod):
        effective = {**pod["securityContext"], **c.get("securityContext", {})}
        assert effective["allowPrivilegeEscalation"] is False
        assert effective["readOnlyRootFilesystem"] is True
        assert effective["capabilities"]["drop"] == ["ALL"]
        assert "privileged" not in effective
        if c["name"] == "data-dir-owner":
            # The one exception: the agent's init container chowns the host directory.
            assert effective["runAsUser"] == 0
            assert sorted(effective["capabilities"]["add"]) == ["CHOWN", "FOWNER"]
            assert "chown 10001:10001 /var/lib/vrambudget-agent" in " ".join(c["command"])
        else:
            assert effective["runAsNonRoot"] is True
            assert effective["runAsUser"] == UID
            assert effective["runAsGroup"] == UID
            assert "add" not in effective["capabilities"]


@pytest.mark.parametrize("workload", _workloads(), ids=lambda d: d["kind"])  # type: ignore[index]
def test_what_a_container_writes_is_on_a_volume(workload: dict) -> None:  # type: ignore[type-arg]
    """The root filesystem is read-only: /tmp (torch's temporary directory), and every path a
    setting points at, must be a mounted volume."""
    pod = workload["spec"]["template"]["spec"]
    volumes = {v["name"] for v in pod["volumes"]}
    for c in pod["containers"]:
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert set(mounts.values()) <= volumes
        assert "/tmp" in mounts
        env = env_values(c)
        for name in (
            "VRAMBUDGET_HUB_CACHE_DIR",
            "HF_HOME",
            "VRAMBUDGET_AGENT_DATA_DIR",
            "HOME",
        ):
            if name in env:
                assert any(
                    env[name] == path or env[name].startswith(path + "/") for path in mounts
                ), f"{name}={env[name]} is on the read-only root filesystem"


def test_probes_answer_on_the_service() -> None:
    deployment = one(source_documents(), "Deployment")
    c = deployment["spec"]["template"]["spec"]["containers"][0]
    port = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert int(env_values(c)["VRAMBUDGET_PORT"]) == port["http"]
    paths = {c["readinessProbe"]["httpGet"]["path"], c["livenessProbe"]["httpGet"]["path"]}
    assert paths == {"/readyz", "/healthz"}
    with TestClient(create_app()) as client:
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["port"] == "http"
            assert client.get(c[probe]["httpGet"]["path"]).status_code == 200


def test_probes_answer_on_the_agent_without_a_token(tmp_path: Path) -> None:
    daemonset = one(source_documents(), "DaemonSet")
    c = daemonset["spec"]["template"]["spec"]["containers"][0]
    port = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert int(env_values(c)["VRAMBUDGET_AGENT_PORT"]) == port["http"]
    settings = AgentSettings(data_dir=tmp_path, tokens=(b"a-token",))
    with TestClient(create_agent_app(settings)) as client:
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
            assert c[probe]["httpGet"] == {"path": path, "port": "http"}
            assert client.get(path).status_code == 200  # no Authorization header
        assert client.get("/v1/probes").status_code == 401  # the rest does need one


def test_services_select_the_pods_and_name_their_port() -> None:
    docs = source_documents()
    for workload, name in (
        (one(docs, "Deployment"), "vrambudget"),
        (one(docs, "DaemonSet"), "vrambudget-agent"),
    ):
        service = one(docs, "Service", name)
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ports = {p["name"] for p in workload["spec"]["template"]["spec"]["containers"][0]["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    assert one(docs, "Service", "vrambudget-agent")["spec"]["clusterIP"] == "None"


def test_hpa_pdb_and_spread_cover_the_deployment() -> None:
    docs = source_documents()
    deployment = one(docs, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert hpa["spec"]["minReplicas"] >= 2  # the PDB then always leaves one replica up
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"
    assert "replicas" not in deployment["spec"]  # the HPA owns the count
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1
    keys = {
        t["topologyKey"]
        for t in deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    }
    assert keys == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}


def test_service_settings_are_read_by_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """No drift: every variable the Deployment sets is one the service reads, with a value it
    accepts; the worker counts fit the CPU limit (one core per process that can be busy)."""
    c = one(source_documents(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = env_values(c)
    plain = {k: v for k, v in env.items() if not v.startswith("secret:")}
    settings, read = service_settings({**plain, "VRAMBUDGET_HUB_TOKEN": "hf_x"}, monkeypatch)
    assert set(env) - set(FOREIGN_ENV) <= read
    assert (
        "VRAMBUDGET_HUB_TOKEN" in read
        and env["VRAMBUDGET_HUB_TOKEN"] == "secret:vrambudget-hub/token"
    )
    assert settings.host == "0.0.0.0"
    assert settings.hub.cache_dir == env["VRAMBUDGET_HUB_CACHE_DIR"]
    busy = settings.compute_workers + settings.trace_workers + 1  # + the event loop
    assert _cores(c["resources"]["limits"]["cpu"]) == busy


def test_agent_settings_are_read_by_the_code() -> None:
    c = one(source_documents(), "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    env = env_values(c)
    secret = documents(SECRET_EXAMPLE)[0]
    filled = {
        k: (secret["stringData"][v.split("/")[1]] if v.startswith("secret:") else v)
        for k, v in env.items()
    }
    settings, read = agent_settings(filled)
    assert set(env) - set(FOREIGN_ENV) <= read
    assert str(settings.data_dir) == "/var/lib/vrambudget-agent"
    assert settings.tokens == (b"CHANGEME",)
    assert decode_secret(settings.webhook_secret)  # the example's format is one the agent takes


def test_agent_secret_keys_match_everywhere() -> None:
    """The Secret the DaemonSet reads, the example manifest, and the commands that create it
    (kustomization.yaml's comment, docs/DEPLOY.md) name the same Secret and keys."""
    c = one(source_documents(), "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    refs = {v.removeprefix("secret:") for v in env_values(c).values() if v.startswith("secret:")}
    assert refs == {"vrambudget-agent/tokens", "vrambudget-agent/webhook-secret"}
    secret = documents(SECRET_EXAMPLE)[0]
    assert {f"{secret['metadata']['name']}/{k}" for k in secret["stringData"]} == refs
    for text in ((KUBERNETES / "agent" / "kustomization.yaml").read_text(), DEPLOY_MD.read_text()):
        commands = re.findall(
            r"create secret generic (vrambudget-agent)\b(.*?)(?:```|\n\w|$)", text, re.S
        )
        assert commands, "no `kubectl create secret generic vrambudget-agent` command"
        for name, rest in commands:
            keys = re.findall(r"--from-literal=([\w-]+)=", rest)
            assert {f"{name}/{k}" for k in keys} == refs


def test_agent_runs_on_gpu_nodes_with_its_gpu() -> None:
    pod = one(source_documents(), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    agent = pod["containers"][0]
    assert agent["resources"]["limits"]["nvidia.com/gpu"] >= 1
    data = next(v for v in pod["volumes"] if v["name"] == "data")
    assert data["hostPath"] == {"path": "/var/lib/vrambudget-agent", "type": "DirectoryOrCreate"}


# A resource.Quantity as the API server parses it (the schemas type it as int-or-string only):
# k8s.io/apimachinery/pkg/api/resource/quantity.go, "<quantity> ::= <signedNumber><suffix>".
_QUANTITY = re.compile(
    r"^[+-]?(\d+|\d+\.\d*|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?\d+)?$"
)


@pytest.mark.parametrize("workload", _workloads(), ids=lambda d: d["kind"])  # type: ignore[index]
def test_quantities_parse(workload: dict) -> None:  # type: ignore[type-arg]
    pod = workload["spec"]["template"]["spec"]
    quantities = [
        q
        for c in containers(pod)
        for part in ("requests", "limits")
        for q in c.get("resources", {}).get(part, {}).values()
    ] + [v["emptyDir"]["sizeLimit"] for v in pod["volumes"] if "sizeLimit" in v.get("emptyDir", {})]
    assert quantities
    for q in quantities:
        assert _QUANTITY.match(str(q)), f"{q!r} is not a Kubernetes quantity"


def test_deploy_doc_states_the_manifests_numbers() -> None:
    """docs/DEPLOY.md quotes the requests, limits and HPA target the manifests set."""
    docs = source_documents()
    c = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    hpa = one(docs, "HorizontalPodAutoscaler")
    text = DEPLOY_MD.read_text()
    for value in (
        c["resources"]["requests"]["cpu"],
        c["resources"]["requests"]["memory"],
        c["resources"]["limits"]["cpu"],
        f"{hpa['spec']['metrics'][0]['resource']['target']['averageUtilization']}%",
        f"minReplicas: {hpa['spec']['minReplicas']}",
        f"maxReplicas: {hpa['spec']['maxReplicas']}",
    ):
        assert f"`{value}`" in text, f"docs/DEPLOY.md does not quote `{value}`"


def _cores(quantity: str | int) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)
