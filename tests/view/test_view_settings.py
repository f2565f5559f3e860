"""The thread view's settings: retention and the tokens file."""

from __future__ import annotations

from pathlib import Path

import pytest

from processors.config import ConfigError, Settings


def test_defaults_keep_threads_30_days_and_disable_the_api() -> None:
    settings = Settings.from_env({})
    assert settings.view_retention_seconds == 30 * 86_400.0
    assert settings.tokens_file is None


def test_the_settings_are_read(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("")
    settings = Settings.from_env({"AGUI_VIEW_RETENTION_SECONDS": "3600",
                                  "AGUI_TOKENS_FILE": str(tokens)})
    assert (settings.view_retention_seconds, settings.tokens_file) == (3600.0, str(tokens))


@pytest.mark.parametrize(("name", "value"), [
    ("AGUI_VIEW_RETENTION_SECONDS", "0"),
    ("AGUI_VIEW_RETENTION_SECONDS", "a week"),
    ("AGUI_TOKENS_FILE", "/nonexistent/tokens"),
])
def test_a_bad_value_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Settings.from_env({name: value})
