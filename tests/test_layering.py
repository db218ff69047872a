"""Imports point down only: the analytic core needs the standard library and msgspec alone, and
torch appears nowhere in the service's analytic path."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names)


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_budget_core_imports_stdlib_and_msgspec_only():
    for path in (ROOT / "service" / "budget").rglob("*.py"):
        extra = imported(path) - STDLIB - {"msgspec"}
        assert not extra, f"{path.relative_to(ROOT)} imports {sorted(extra)}"


def test_api_does_not_import_torch_or_below():
    for path in list((ROOT / "service" / "api").rglob("*.py")) + [ROOT / "service" / "cli.py"]:
        assert "torch" not in imported(path), path


def test_service_starts_without_torch():
    code = ("import sys; import vrambudget.service.app as a; a.create_app(); "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_every_component_is_documented():
    from vrambudget.core.components import Component

    for member in Component:
        assert member.__doc__ and member.__doc__ != Component.__doc__, member


def test_agent_process_never_imports_torch():
    """The agent creates no CUDA context: torch lives only in the spawned probe children."""
    code = ("import sys; from vrambudget.agent.api import create_agent_app; "
            "from vrambudget.agent.settings import AgentSettings; create_agent_app(AgentSettings()); "
            "assert 'torch' not in sys.modules, 'agent imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_torch_only_below_workloads_trace_and_probe():
    allowed = {ROOT / "agent" / "probe.py"}
    for path in (ROOT / "agent").rglob("*.py"):
        if path not in allowed:
            assert "torch" not in imported(path), path
