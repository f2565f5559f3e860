"""Settings that would make the workers read their own output are refused at start;
so are the tap's bad settings, by name (exit 2)."""

from __future__ import annotations

import os
import subprocess

import pytest

from processors.config import ConfigError, Settings, TapSettings
from processors.tap.runs import EchoMode
from tests.service_harness import AGUI_STREAM


@pytest.mark.parametrize("env", [
    {"AGUI_INPUT_PATTERN": r"agui\..*"},  # also matches agui.history and agui.deadletter
    {"AGUI_INPUT_TOPICS": "agui.events,agui.history"},
    {"AGUI_INPUT_TOPICS": "runs", "AGUI_DEADLETTER_TOPIC": "runs"},
])
def test_an_output_topic_that_is_also_an_input_is_refused(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="is also an input topic"):
        Settings.from_env(env)


def test_a_pattern_that_leaves_the_outputs_out_is_accepted() -> None:
    settings = Settings.from_env({"AGUI_INPUT_PATTERN": r"agui\.events\..*"})
    assert settings.input_pattern == r"agui\.events\..*"


@pytest.mark.parametrize(("env", "named"), [
    ({}, "AGUI_TAP_UPSTREAM_URL"),
    ({"AGUI_TAP_UPSTREAM_URL": "ftp://agent"}, "AGUI_TAP_UPSTREAM_URL"),
    ({"AGUI_TAP_TENANT_SOURCE": "token"}, "AGUI_TOKENS_FILE"),
    ({"AGUI_TAP_ECHO": "everything"}, "AGUI_TAP_ECHO"),
    ({"AGUI_TAP_BUFFER_BYTES": "10"}, "AGUI_TAP_BUFFER_BYTES"),
    ({"AGUI_TAP_TENANT_REQUEST_HEADER": "X Tenant"}, "AGUI_TAP_TENANT_REQUEST_HEADER"),
])
def test_a_bad_tap_setting_is_refused_by_name(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        TapSettings.from_env({"AGUI_TAP_UPSTREAM_URL": "http://agent:8000/", **env}
                             if env else env)


def test_the_tap_command_exits_2_on_a_bad_setting() -> None:
    result = subprocess.run([AGUI_STREAM, "tap"], env={**os.environ, "AGUI_TAP_UPSTREAM_URL": ""},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "AGUI_TAP_UPSTREAM_URL" in result.stderr


def test_tap_settings_take_the_shared_ones() -> None:
    settings = TapSettings.from_env({"AGUI_TAP_UPSTREAM_URL": "https://agent/ag-ui/",
                                     "AGUI_TENANT_HEADER": "org"})
    assert settings.upstream_url == "https://agent/ag-ui"
    assert settings.base.tenant_header == "org" and settings.echo is EchoMode.MESSAGES
