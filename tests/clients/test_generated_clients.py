"""Clients generated from the published OpenAPI documents build, with every schema in them.

- Python: openapi-python-client (pinned in the ``dev`` extra) with ``--fail-on-warning``: a
  schema it cannot read (and silently drops without that flag) fails here. Every module of the
  generated package imports, and every component schema is a model class (or, for a tuple, the
  inline type that stands for it).
- TypeScript: openapi-typescript and tsc (exact versions in ``tests/clients/package-lock.json``,
  installed by ``scripts/_node.sh``). ``tsc --noEmit --strict`` compiles the types together with
  a file that names every component schema and assigns each OpenAPI request example to its
  schema's type, so a missing schema or an example the types reject is a compile error.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = Path(__file__).resolve().parent
DOCUMENTS = ("service", "agent")
BIN = Path(sys.executable).parent


def _document(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((ROOT / "openapi" / f"{name}.json").read_text())
    return loaded


def _flat(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.parametrize("name", DOCUMENTS)
def test_python_client_builds_with_every_schema(name: str, tmp_path: Path) -> None:
    generator = BIN / "openapi-python-client"
    assert generator.exists(), "openapi-python-client is in the dev extra: pip install -e .[dev]"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"project_name_override": f"vb_{name}", "post_hooks": []}))
    out = tmp_path / f"vb_{name}"
    r = _run(
        [
            str(generator),
            "generate",
            "--path",
            str(ROOT / "openapi" / f"{name}.json"),
            "--output-path",
            str(out),
            "--meta",
            "none",
            "--config",
            str(config),
            "--fail-on-warning",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    # every generated module imports (a syntax or name error in any model fails here)
    code = (
        "import importlib, pkgutil, sys\n"
        f"import vb_{name} as p\n"
        "names = [m.name for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.')]\n"
        "[importlib.import_module(n) for n in names]\n"
        "print(len(names))\n"
    )
    imported = _run([sys.executable, "-c", code], tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert int(imported.stdout) > 100
    init = (out / "models" / "__init__.py").read_text()
    classes = {_flat(c) for c in re.findall(r"^from \.\w+ import (\w+)$", init, re.M)}
    source = _flat(" ".join(p.read_text() for p in (out / "models").glob("*.py")))
    schemas = _document(name)["components"]["schemas"]
    missing = [
        s
        for s, schema in schemas.items()
        if _flat(s) not in classes
        and not (schema.get("type") == "array" and "componentsschemas" + _flat(s) in source)
    ]
    assert not missing, f"schemas without a model in the Python client: {missing}"


def _node_tools() -> Path:
    bin_dir = TOOLS / "node_modules" / ".bin"
    if not (bin_dir / "tsc").exists() or not (bin_dir / "openapi-typescript").exists():
        message = "tests/clients/node_modules missing: run `source scripts/_node.sh` (npm ci)"
        if shutil.which("npm") is None:
            pytest.skip("node/npm not installed: " + message)
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return bin_dir


def _examples(document: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(schema name, example name, value) of every request-body example."""
    found = []
    for item in document["paths"].values():
        for operation in item.values():
            if not isinstance(operation, dict):
                continue
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if body is None:
                continue
            schema = body["schema"]["$ref"].rsplit("/", 1)[-1]
            for name, example in body.get("examples", {}).items():
                found.append((schema, name, example["value"]))
    return found


def test_typescript_client_compiles_with_every_schema_and_example(tmp_path: Path) -> None:
    bin_dir = _node_tools()
    checks = []
    for name in DOCUMENTS:
        r = _run(
            [
                str(bin_dir / "openapi-typescript"),
                str(ROOT / "openapi" / f"{name}.json"),
                # a property with a default may be left out of a request: optional, as the
                # schema says (the tool's default makes it required, as in an answer)
                "--default-non-nullable=false",
                "-o",
                str(tmp_path / f"{name}.ts"),
            ],
            tmp_path,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        document = _document(name)
        lines = [
            f'import type {{ components }} from "./{name}";',
            "type S = components['schemas'];",
        ]
        for i, schema in enumerate(document["components"]["schemas"]):
            lines.append(f"export type T{i} = S[{json.dumps(schema)}];")
        examples = _examples(document)
        assert examples, f"{name}: no request examples"
        for i, (schema, _, value) in enumerate(examples):
            lines.append(f"export const e{i}: S[{json.dumps(schema)}] = {json.dumps(value)};")
        check = tmp_path / f"{name}_check.ts"
        check.write_text("\n".join(lines) + "\n")
        checks.append(check)
    r = _run(
        [
            str(bin_dir / "tsc"),
            "--noEmit",
            "--strict",
            "--target",
            "es2022",
            "--module",
            "esnext",
            "--moduleResolution",
            "bundler",
            *(str(c) for c in checks),
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_a_missing_schema_fails_the_typescript_check(tmp_path: Path) -> None:
    """The compile step can fail: a name no schema has is a type error."""
    bin_dir = _node_tools()
    r = _run(
        [
            str(bin_dir / "openapi-typescript"),
            str(ROOT / "openapi" / "agent.json"),
            "-o",
            str(tmp_path / "agent.ts"),
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    (tmp_path / "check.ts").write_text(
        'import type { components } from "./agent";\n'
        'export type X = components["schemas"]["NoSuchSchema"];\n'
    )
    r = _run(
        [
            str(bin_dir / "tsc"),
            "--noEmit",
            "--strict",
            "--module",
            "esnext",
            "--moduleResolution",
            "bundler",
            str(tmp_path / "check.ts"),
        ],
        tmp_path,
    )
    assert r.returncode != 0 and "NoSuchSchema" in r.stdout
