"""deploy/compose.yaml: the service and the agent on one machine, the agent on the GPUs and
pointed at the service, both locked down, setting only variables the code reads."""

from __future__ import annotations

import ipaddress
import re

import pytest

from tests.deploy.manifests import (
    COMPOSE,
    FOREIGN_ENV,
    UID,
    agent_settings,
    dockerfile_stages,
    documents,
    service_settings,
)

TOKENS = "a-token"
WEBHOOK_SECRET = "whsec_c2VjcmV0"


def _compose() -> dict:  # type: ignore[type-arg]
    return documents(COMPOSE)[0]


def _environment(service: dict) -> dict[str, str]:  # type: ignore[type-arg]
    """The environment with ${VAR:?...} / ${VAR:-default} interpolated as `docker compose`
    would with VRAMBUDGET_AGENT_TOKENS and _WEBHOOK_SECRET exported and nothing else."""
    exported = {
        "VRAMBUDGET_AGENT_TOKENS": TOKENS,
        "VRAMBUDGET_AGENT_WEBHOOK_SECRET": WEBHOOK_SECRET,
    }

    def interpolate(value: str) -> str:
        def one(match: re.Match[str]) -> str:
            name, op, rest = match.group(1), match.group(2), match.group(3)
            if name in exported:
                return exported[name]
            if op == ":?":
                raise AssertionError(f"{name} is required: {rest}")
            return rest

        return re.sub(r"\$\{(\w+)(:\?|:-)([^}]*)\}", one, value)

    return {k: interpolate(str(v)) for k, v in service["environment"].items()}


def test_both_deployables_are_built_from_the_dockerfile_targets() -> None:
    stages = dockerfile_stages()
    services = _compose()["services"]
    assert set(services) == {"service", "agent"}
    for name, target in (("service", "service"), ("agent", "agent")):
        assert services[name]["build"] == {"context": "..", "target": target}
        assert target in stages
        assert services[name]["image"] == f"vrambudget-{target}:0.1.0"


def test_containers_run_locked_down() -> None:
    for name, service in _compose()["services"].items():
        assert service["user"] == f"{UID}:{UID}", name
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        assert service["security_opt"] == ["no-new-privileges:true"], name
        assert "/tmp" in service["tmpfs"], name
        assert "privileged" not in service
        for port in service["ports"]:
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_the_agent_reserves_the_gpus() -> None:
    """Compose's GPU reservation: deploy.resources.reservations.devices with the nvidia driver
    and the `gpu` capability (which Compose requires)."""
    agent = _compose()["services"]["agent"]
    (device,) = agent["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert "gpu" in device["capabilities"]
    assert device["count"] == "all"
    assert "deploy" not in _compose()["services"]["service"]  # the service needs no GPU


def test_the_agent_is_pointed_at_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent connects to private addresses only when its allow-list names the address: the
    service has a fixed one on the compose network, and the allow-list names it and its port."""
    compose = _compose()
    service, agent = compose["services"]["service"], compose["services"]["agent"]
    address = ipaddress.ip_address(service["networks"]["vrambudget"]["ipv4_address"])
    (subnet,) = compose["networks"]["vrambudget"]["ipam"]["config"]
    assert address in ipaddress.ip_network(subnet["subnet"])
    port = _environment(service)["VRAMBUDGET_PORT"]
    assert _environment(agent)["VRAMBUDGET_AGENT_SERVICE_ALLOW"] == f"http://{address}:{port}"
    assert "vrambudget" in agent["networks"]
    assert agent["depends_on"] == {"service": {"condition": "service_healthy"}}
    settings, _ = service_settings(_environment(service), monkeypatch)
    assert settings.host == "0.0.0.0" and str(settings.port) == port
    assert service["ports"] == [f"127.0.0.1:{port}:{port}"]


def test_service_settings_are_read_by_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    service = _compose()["services"]["service"]
    env = _environment(service)
    settings, read = service_settings(env, monkeypatch)
    assert set(env) - set(FOREIGN_ENV) <= read
    cache = settings.hub.cache_dir
    assert cache is not None and any(cache.startswith(t + "/") for t in service["tmpfs"])
    assert any(env["HF_HOME"].startswith(t + "/") for t in service["tmpfs"])


def test_agent_settings_are_read_by_the_code() -> None:
    agent = _compose()["services"]["agent"]
    env = _environment(agent)
    settings, read = agent_settings(env)
    assert set(env) - set(FOREIGN_ENV) <= read
    assert settings.tokens == (TOKENS.encode(),)
    assert settings.webhook_secret == WEBHOOK_SECRET.encode()
    mounts = {v.split(":")[1] for v in agent["volumes"]}
    assert str(settings.data_dir) in mounts and env["HOME"] in mounts
    assert set(_compose()["volumes"]) == {v.split(":")[0] for v in agent["volumes"]}


def test_the_agent_refuses_to_start_without_its_secrets() -> None:
    agent = _compose()["services"]["agent"]
    for name in ("VRAMBUDGET_AGENT_TOKENS", "VRAMBUDGET_AGENT_WEBHOOK_SECRET"):
        assert re.fullmatch(r"\$\{" + name + r":\?.+\}", agent["environment"][name])
