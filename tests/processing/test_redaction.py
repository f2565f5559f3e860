"""Dead-letter event copies are redacted by construction (topics/redaction.py).

Explicit cases for the shapes that leaked before, and a hypothesis test that
plants distinct secrets anywhere in arbitrary events, valid or malformed, runs
them through the real dead-letter path (RecordProcessor -> OutputBuilder) and
finds none of them in any dead-letter record (key, value, headers), in the log
or on the metrics page.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from processors.metrics import Metrics
from processors.processing.outputs import Outgoing
from tests.processing.test_record_processor import DEADLETTER, Committed, Feeder
from topics.events import EVENT_MODELS
from topics.redaction import TRAVELS, redact_event

SECRET = "SECRET-7f3a9c"


def marker(kind: str, size: int) -> dict[str, Any]:
    return {"redacted": True, "type": kind, "bytes": size}


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ({"type": "REASONING_ENCRYPTED_VALUE", "subtype": "message", "entityId": "rm",
          "encryptedValue": [SECRET], "timestamp": 1700000000000},
         {"type": "REASONING_ENCRYPTED_VALUE", "subtype": "message", "entityId": "rm",
          "encryptedValue": marker("array", 17), "timestamp": 1700000000000}),
        ({"type": "REASONING_MESSAGE_CONTENT", "messageId": "rm", "delta": {"t": SECRET}},
         {"type": "REASONING_MESSAGE_CONTENT", "messageId": "rm",
          "delta": marker("object", 21)}),
        ({"type": "RUN_STARTED", "threadId": "t", "runId": "r",
          "rawEvent": {"choices": [{"delta": {"reasoning": SECRET}}]}},
         {"type": "RUN_STARTED", "threadId": "t", "runId": "r"}),
        ({"type": "REASONING_MESSAGE_START", "messageId": "rm", "role": "reasoning",
          "notes": SECRET},
         {"type": "REASONING_MESSAGE_START", "messageId": "rm", "role": "reasoning",
          "notes": marker("string", 13)}),
        # text content, run error messages, custom values: not identifying, not copied
        ({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": SECRET},
         {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": marker("string", 13)}),
        ({"type": "RUN_ERROR", "message": SECRET, "code": "E42"},
         {"type": "RUN_ERROR", "message": marker("string", 13), "code": "E42"}),
        # an identifying field of the wrong type is not copied either
        ({"type": "REASONING_MESSAGE_START", "messageId": [SECRET], "role": {"r": SECRET},
          "timestamp": "1700000000000"},
         {"type": "REASONING_MESSAGE_START", "messageId": marker("array", 17),
          "role": marker("object", 21), "timestamp": marker("string", 13)}),
        # a type that is not a string, or not AG-UI's: markers only, even for the type
        ({"type": ["CUSTOM"], "name": "x", "value": 1},
         {"type": marker("array", 10), "name": marker("string", 1),
          "value": marker("number", 1)}),
        ({"type": SECRET, "messageId": "m"},
         {"type": marker("string", 13), "messageId": marker("string", 1)}),
        # not an object at all
        ([1, 2, 3], marker("array", 7)),
        (SECRET, marker("string", 13)),
        (None, marker("null", 4)),
    ],
    ids=["encrypted-list", "reasoning-delta-object", "raw-event", "unknown-field",
         "text-delta", "run-error-message", "identifying-wrong-types", "type-list",
         "type-unknown", "array", "string", "null"],
)
def test_redaction_copies_only_identifying_fields(event: Any, expected: Any) -> None:
    assert redact_event(event) == expected


def test_redaction_is_total_for_values_json_cannot_encode() -> None:
    deep: Any = SECRET
    for _ in range(1_000):
        deep = [deep]
    assert redact_event({"type": "CUSTOM", "name": "n", "value": deep}) == {
        "type": "CUSTOM", "name": "n", "value": {"redacted": True, "type": "array"}}
    assert redact_event({"type": "RUN_STARTED", "timestamp": 2**70}) == {
        "type": "RUN_STARTED", "timestamp": {"redacted": True, "type": "number"}}
    assert redact_event({"type": "CUSTOM", "value": {1, 2}})["value"] == {
        "redacted": True, "type": "set"}


def test_every_allow_listed_field_is_identifying() -> None:
    # A reviewer's list: a field added here must be an id, a name, a role, a code,
    # a type or a timestamp, never content.
    allowed = {name for fields in TRAVELS.values() for name in fields}
    assert allowed == {
        "type", "messageId", "toolCallId", "parentMessageId", "threadId", "runId",
        "parentRunId", "entityId", "subagentRunId", "parentSubagentRunId",
        "parentToolCallId", "activityType", "stepName", "toolCallName", "name", "role",
        "subtype", "code", "protocolVersion", "timestamp"}


# --- secrets planted anywhere, through the real dead-letter path ----------------------

SECRETS = st.integers(0, 10**6).map(lambda n: f"S3CR3T{n:07d}X")


STRING_SHAPES = ["plain", "digits", "long", "unicode"]
CONTAINER_SHAPES = ["list", "object", "deep"]


@st.composite
def secret_value(draw: st.DrawFn, secrets: list[str], shapes: list[str]) -> Any:
    """A JSON value of one of `shapes` with a fresh secret somewhere in it."""
    secret = draw(SECRETS)
    secrets.append(secret)
    shape = draw(st.sampled_from(shapes))
    if shape == "plain":
        return secret
    if shape == "list":
        return [1, secret, None]
    if shape == "object":
        return {"k": secret, "n": 2}
    if shape == "digits":  # a number as a string
        digits = "".join(str(ord(c) % 10) for c in secret) + "90210471123"
        secrets[-1] = digits
        return digits
    if shape == "long":
        return "x" * 20_000 + secret + "y" * 20_000
    if shape == "deep":
        return {"a": [{"b": [secret]}]}
    return "é✓\u2028" + secret + "\U0001f600"


IDENTIFYING_VALUES = {"timestamp": 1_700_000_000_000}


@st.composite
def events_with_secrets(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[str]]:
    secrets: list[str] = []
    events: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 4))):
        choice = draw(st.sampled_from([*sorted(EVENT_MODELS), "UNKNOWN_EVENT", "list-type"]))
        event: dict[str, Any] = {"type": [choice] if choice == "list-type" else choice}
        model = EVENT_MODELS.get(choice)
        travels = TRAVELS.get(choice, {})
        for name in ([] if model is None else list(model.fields)) + ["extra", "rawEvent"]:
            if name == "type" or not draw(st.booleans()):
                continue
            if name in travels:
                # An identifying field of its own type travels as it is: an id, never a
                # secret. Of another type (a secret inside a list, say) it must not.
                event[name] = (draw(secret_value(secrets, CONTAINER_SHAPES))
                               if draw(st.booleans())
                               else IDENTIFYING_VALUES.get(name, f"id-{name}"))
            else:
                event[name] = draw(secret_value(secrets, STRING_SHAPES + CONTAINER_SHAPES))
        events.append(event)
    # At least one dead letter in every example: reasoning text for a message not open.
    events.append({"type": "REASONING_MESSAGE_CONTENT", "messageId": "not-open",
                   "delta": draw(secret_value(secrets, STRING_SHAPES))})
    return events, secrets


def _dead_letter_bytes(outgoing: list[Outgoing]) -> bytes:
    return b"".join(o.key + o.value + b"".join(n.encode() + v for n, v in o.headers)
                    for o in outgoing if o.topic == DEADLETTER)


def _forms(secret: str) -> list[bytes]:
    """The secret as it could appear in bytes: raw, JSON-escaped, ASCII-escaped."""
    return [secret.encode(), orjson.dumps(secret)[1:-1],
            json.dumps(secret)[1:-1].encode()]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(planted=events_with_secrets(), in_run=st.booleans())
def test_no_planted_secret_reaches_a_dead_letter_the_log_or_the_metrics(
    planted: tuple[list[dict[str, Any]], list[str]], in_run: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    events, secrets = planted
    metrics = Metrics()
    processor = Committed().processor(metrics)
    feeder = Feeder()
    run = ([{"type": "RUN_STARTED", "threadId": "t", "runId": "r"}] if in_run else [])
    records = [feeder.record(e) for e in [*run, *events]]
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        outgoing = [out for record in records for out in processor.process(record, 0.0)]
    assert any(o.topic == DEADLETTER for o in outgoing)
    exposed = [_dead_letter_bytes(outgoing), caplog.text.encode(),
               generate_latest(metrics.registry)]
    for secret in secrets:
        for form in _forms(secret):
            for where, data in zip(("dead letters", "log", "metrics"), exposed, strict=True):
                assert form not in data, f"{secret!r} in the {where}"
