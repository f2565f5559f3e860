"""Settings that would make the workers read their own output are refused at start."""

from __future__ import annotations

import pytest

from processors.config import ConfigError, Settings


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
