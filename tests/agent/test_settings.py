"""The agent's settings from the environment; a bad value names its variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from vrambudget.agent.settings import AgentSettings, AgentSettingsError


def test_settings_from_env(tmp_path: Path) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text("# comment\nfrom-file\n")
    s = AgentSettings.from_env(
        {
            "VRAMBUDGET_AGENT_TOKENS": "a, b",
            "VRAMBUDGET_AGENT_TOKEN_FILE": str(token_file),
            "VRAMBUDGET_AGENT_ENTRY_POINTS": "x=pkg.mod:fn",
            "VRAMBUDGET_AGENT_PORT": "9000",
            "VRAMBUDGET_AGENT_CALLBACK_ALLOW": "https://hooks.example.com",
        }
    )
    assert s.tokens == (b"a", b"b", b"from-file")
    assert s.entry_points == {"x": "pkg.mod:fn"}
    assert s.port == 9000 and s.callback_allow_list == ("https://hooks.example.com",)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"VRAMBUDGET_AGENT_PORT": "70000"}, "VRAMBUDGET_AGENT_PORT must be in 0 .. 65535"),
        ({"VRAMBUDGET_AGENT_PORT": "x"}, "VRAMBUDGET_AGENT_PORT must be a number"),
        ({"VRAMBUDGET_AGENT_ENTRY_POINTS": "os.system"}, "is not name=module:function"),
        ({"VRAMBUDGET_AGENT_MAX_QUEUE": "0"}, "VRAMBUDGET_AGENT_MAX_QUEUE must be in 1 .. 10000"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(AgentSettingsError, match=message):
        AgentSettings.from_env(env)
