"""The example answers in the docs are what the service answers now.

``scripts/docs_examples.py`` writes them (requests read from the docs, answers from an in-process
app); this test runs its check and fails naming every example that drifted. Regenerate with
``python scripts/docs_examples.py`` and review the diff: a changed number is a changed answer.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    path = ROOT / "scripts" / "docs_examples.py"
    spec = importlib.util.spec_from_file_location("docs_examples", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("docs_examples", module)
    spec.loader.exec_module(module)
    return module


def test_docs_examples_match_the_service() -> None:
    drifts = _script().check(ROOT)
    assert not drifts, (
        "docs examples drifted (run python scripts/docs_examples.py and review "
        "the diff):\n" + "\n".join(str(d) for d in drifts)
    )


def test_a_drift_is_reported_by_name(tmp_path: Path) -> None:
    script = _script()
    doc = tmp_path / "docs" / "API.md"
    doc.parent.mkdir()
    doc.write_text(
        "<!-- example-request: probe path=/readyz method=GET -->\n"
        '<!-- example-answer: probe keep=num_gpus -->\n```json\n{"num_gpus": 1}\n```\n'
        "<!-- /example-answer -->\n"
        "<!-- value: probe num_models -->0<!-- /value -->\n",
        encoding="utf-8",
    )
    drifts = script.check(tmp_path)
    assert sorted((d.kind, d.name) for d in drifts) == [
        ("answer", "probe"),
        ("value", "probe num_models"),
    ]
    assert "docs/API.md" in str(drifts[0]) and "probe" in str(drifts[0])
    script.generate(tmp_path, write=True)
    assert script.check(tmp_path) == []


def test_an_agent_request_is_sent_to_the_agent_with_its_headers(tmp_path: Path) -> None:
    """``app=agent``: the curl's path and ``-H`` headers go to an in-process agent whose token
    is ``dev-token``; with another token the agent answers 401, a drift from status=200."""
    script = _script()
    doc = tmp_path / "docs" / "FIRST_HOUR.md"
    doc.parent.mkdir()

    def page(token: str) -> str:
        return (
            "<!-- example-request: probes app=agent -->\n```bash\n"
            f"curl -s 'http://127.0.0.1:8100/v1/probes?limit=1' -H 'authorization: Bearer {token}'"
            "\n```\n\n<!-- example-answer: probes -->\n<!-- /example-answer -->\n"
        )

    doc.write_text(page("dev-token"), encoding="utf-8")
    script.generate(tmp_path, write=True)
    assert '{"items": [], "next": null}' in doc.read_text(encoding="utf-8")
    assert script.check(tmp_path) == []
    doc.write_text(page("wrong"), encoding="utf-8")
    drifts = script.check(tmp_path)
    assert [d.name for d in drifts] == ["probes"]
    assert "status 401, the doc expects 200" in drifts[0].notes
