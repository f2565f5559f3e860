"""Secrets are never printed: settings reprs, exception logs (no broker)."""

from __future__ import annotations

import logging

import pytest

from processors.config import Settings
from processors.runtime.kafka_client import faust_credentials
from processors.safe_logging import log_exception_kind

PASSWORD = "pa55-W0RD-never-printed"
CONTENT = "reasoning text that must not be logged"


def test_settings_and_credentials_reprs_hide_the_sasl_password() -> None:
    settings = Settings.from_env({
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KAFKA_SASL_USERNAME": "agui", "KAFKA_SASL_PASSWORD": PASSWORD})
    assert settings.sasl_password == PASSWORD  # still there for the client
    for text in (repr(settings), str(settings), repr(faust_credentials(settings))):
        assert PASSWORD not in text
        assert "agui" in text or "SASL" in text  # the rest is still printed


def test_an_exception_is_logged_by_kind_and_frames_never_its_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def decode(value: str) -> None:
        raise ValueError(f"cannot parse {value!r}")

    try:
        decode(CONTENT)  # (the frames show this line: no literal in it)
    except ValueError as error:
        with caplog.at_level(logging.DEBUG):
            log_exception_kind(logging.getLogger("agui_stream"), logging.ERROR,
                               "could not decode", error, " at t[0]@5")
    assert "could not decode (ValueError at t[0]@5)" in caplog.text
    assert "in decode" in caplog.text  # where it was raised
    assert CONTENT not in caplog.text
