"""A cluster answer (:class:`vrambudget.core.cluster.ClusterAnswer`) as YAML for
``kubectl apply -f -``: the chosen manifests as a multi-document stream, preceded by comments
that say where each quantity comes from."""

from __future__ import annotations

from typing import Any, Literal

import yaml

__all__ = ["Manifests", "manifests_yaml"]

Manifests = Literal["device-plugin", "dra"]


def _comment(text: str) -> str:
    return "\n".join(f"# {line}" if line else "#" for line in text.splitlines())


def manifests_yaml(answer: dict[str, Any], which: Manifests = "device-plugin") -> str:
    """``which``: ``device-plugin`` (the Pod requesting ``nvidia.com/gpu`` / ``amd.com/gpu``
    / a MIG resource) or ``dra`` (the ResourceClaimTemplate and the Pod that uses it)."""
    if which == "dra":
        if answer.get("resource_claim_template") is None:
            docs: list[Any] = []
        else:
            docs = [answer["resource_claim_template"], answer["dra_pod"]]
    else:
        docs = [answer["pod"]]
    head = [
        f"vrambudget cluster requests: {answer['pods']} pod(s) of {answer['devices_per_pod']} x "
        f"{answer['resource_name']} ({answer['gpu']}), one per node"
    ]
    for line in answer["lines"]:
        head.append(f"{line['resource']}: {line['quantity']} = {line['formula']}")
        head.append(f"  source: {line['source']}")
    head.extend(f"warning: {w}" for w in answer.get("warnings", ()))
    if which == "dra" and not docs:
        head.append("no DRA objects for this device (see the warnings)")
    body = yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, width=100)
    return _comment("\n".join(head)) + "\n" + body
