"""The architecture as a test (docs/ARCHITECTURE.md draws it): every import in the package,
module-level or inside a function, points down the layers, and no group of modules imports
itself in a circle. Third-party imports are checked per layer too (the core is stdlib +
msgspec; torch only below ``workloads``, ``trace`` and the agent's probe child)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vrambudget"
STDLIB = set(sys.stdlib_module_names)

# Layer ranks, lowest first. A module may import its own layer and the layers below it; two
# layers of one rank (the two apps) may not import each other.
LAYERS: dict[str, int] = {
    "core": 0,
    "workloads": 1,
    "hub": 1,
    "trace": 2,
    "http": 3,
    "service": 4,
    "agent": 4,
    "cli": 5,
}
# Third-party packages each layer may import (the layers below it add theirs).
THIRD_PARTY: dict[str, set[str]] = {
    "core": {"msgspec"},
    "workloads": {"torch", "transformers", "peft", "diffusers", "safetensors"},
    "hub": {"huggingface_hub"},
    "trace": {"torch"},
    "http": {"litestar", "brotli"},
    "service": {"litestar", "uvicorn", "pebble", "prometheus_client", "yaml"},
    "agent": {
        "litestar",
        "uvicorn",
        "httpx",
        "pynvml",
        "torch",
        "publicsuffixlist",
        "prometheus_client",
    },
    "cli": {"uvicorn", "gguf"},
}
# torch may appear in these agent modules only: they run in the spawned probe children.
AGENT_TORCH = {"probe.py", "probe_cpu.py", "probe_cuda.py"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported name, line) of every import statement in the file, relative ones resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                yield (full if full in MODULES else target), node.lineno


def _graph() -> dict[str, dict[str, int]]:
    """module -> {internal module it imports: line}. Importing ``a.b.c`` runs ``a`` and ``a.b``
    too, so those packages count as imported (except the importer's own parents)."""
    edges: dict[str, dict[str, int]] = {m: {} for m in MODULES}
    for module, path in MODULES.items():
        parents = {module.rsplit(".", i)[0] for i in range(module.count(".") + 1)}
        for name, line in _imports(module, path):
            if not name.startswith("vrambudget"):
                continue
            parts = name.split(".")
            for i in range(2, len(parts) + 1):
                target = ".".join(parts[:i])
                if target in MODULES and target not in parents:
                    edges[module].setdefault(target, line)
    return edges


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def test_every_subpackage_has_a_layer() -> None:
    for module in MODULES:
        layer = _layer(module)
        assert layer is None or layer in LAYERS or layer == "__main__", (
            f"{module}: a new sub-package needs a place in LAYERS and docs/ARCHITECTURE.md"
        )


def test_imports_point_down() -> None:
    wrong = []
    for module, targets in _graph().items():
        src = _layer(module)
        for target, line in targets.items():
            dst = _layer(target)
            if src is None or dst is None or src not in LAYERS or dst not in LAYERS:
                continue
            if src != dst and LAYERS[dst] >= LAYERS[src]:
                wrong.append(f"{_where(module, line)} ({src}) imports {target} ({dst})")
    assert not wrong, "upward or sideways imports:\n" + "\n".join(wrong)


def _cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    edges = _graph()
    found = []
    for comp in _cycles(edges):
        members = set(comp)
        arrows = [
            f"  {_where(a, line)} imports {b}"
            for a in comp
            for b, line in edges[a].items()
            if b in members
        ]
        found.append(" <-> ".join(comp) + "\n" + "\n".join(arrows))
    assert not found, "import cycles:\n" + "\n".join(found)


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [
        ["a", "b", "c"]
    ]
    assert _cycles({"a": {"b": 1}, "b": {}}) == []


def test_third_party_imports_per_layer() -> None:
    allowed: dict[str, set[str]] = {}
    for layer, rank in LAYERS.items():
        allowed[layer] = set().union(
            *(THIRD_PARTY[other] for other, r in LAYERS.items() if r < rank or other == layer)
        )
    # Not the apps' frameworks; the torch layers use the ML frameworks they model.
    frameworks = THIRD_PARTY["workloads"] | {"msgspec"}
    allowed["workloads"] = frameworks
    allowed["hub"] = {"msgspec", "huggingface_hub"}
    allowed["trace"] = frameworks
    wrong = []
    for module, path in MODULES.items():
        layer = _layer(module)
        if layer not in LAYERS:
            continue
        for name, line in _imports(module, path):
            top = name.split(".")[0]
            if top in STDLIB or top == "vrambudget" or top == "__future__":
                continue
            ok = top in allowed[layer]
            if top == "torch" and layer == "agent":
                ok = path.name in AGENT_TORCH
            if top in THIRD_PARTY["workloads"] and layer in ("service", "http", "cli"):
                ok = False
            if not ok:
                wrong.append(f"{_where(module, line)} ({layer}) imports {top}")
    assert not wrong, "\n".join(wrong)


def test_service_starts_without_torch() -> None:
    code = (
        "import sys; import vrambudget.service.app as a; a.create_app(); "
        "bad = [m for m in ('torch', 'transformers', 'peft', 'diffusers') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_every_component_is_documented() -> None:
    from vrambudget.core.components import Component

    for member in Component:
        assert member.__doc__ and member.__doc__ != Component.__doc__, member


def test_agent_process_never_imports_torch() -> None:
    """The agent creates no CUDA context: torch lives only in the spawned probe children."""
    code = (
        "import sys; from vrambudget.agent.api import create_agent_app; "
        "from vrambudget.agent.settings import AgentSettings; "
        "create_agent_app(AgentSettings()); "
        "assert 'torch' not in sys.modules, 'agent imported torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
