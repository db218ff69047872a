"""``vrambudget cluster``: the same answer as the core's, as JSON or a kubectl YAML stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from vrambudget.cli.main import main

REQUEST = {
    "source": {
        "from": "budget",
        "request": {
            "workloads": [
                {
                    "kind": "llm_serving",
                    "model": {"source": "preset", "id": "llama-3.1-8b"},
                    "parallelism": {"tensor": 2},
                }
            ],
            "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
        },
    },
    "name": "llama-8b",
}


def run(tmp_path: Path, capsys: Any, body: dict[str, Any], *flags: str) -> tuple[int, str, str]:
    f = tmp_path / "req.json"
    f.write_text(json.dumps(body))
    rc = main(["cluster", str(f), *flags])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json(tmp_path: Path, capsys: Any) -> None:
    rc, out, _ = run(tmp_path, capsys, REQUEST)
    assert rc == 0
    a = json.loads(out)
    assert a["pod"]["spec"]["containers"][0]["resources"]["limits"] == {
        "memory": "17729Mi",  # tests/core/test_cluster.py, by hand
        "nvidia.com/gpu": "2",
    }


@pytest.mark.parametrize(
    ("flags", "kinds"), [((), ["Pod"]), (("--dra",), ["ResourceClaimTemplate", "Pod"])]
)
def test_yaml_validates(
    tmp_path: Path, capsys: Any, flags: tuple[str, ...], kinds: list[str]
) -> None:
    rc, out, _ = run(tmp_path, capsys, REQUEST, "--yaml", *flags)
    assert rc == 0
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == kinds
    for d in docs:
        kubernetes_validate.validate(d, "1.34.0", strict=True)


def test_refusal_exits_2_naming_the_field(tmp_path: Path, capsys: Any) -> None:
    body = {**REQUEST, "mig_profile": "2g.10gb"}  # the H100 80GB's profiles have no 2g.10gb
    rc, out, err = run(tmp_path, capsys, body)
    assert rc == 2 and out == ""
    assert err.startswith("error: mig_profile: 2g.10gb is not a MIG profile of NVIDIA H100")
    assert "allowed: 1g.10gb" in err
