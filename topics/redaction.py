"""The copy of an offending event that travels in its dead letter, redacted by construction.

Nothing is copied unless it is on an allow-list: per event type, the fields
that identify and classify (ids, type, role, names, codes, timestamps), each
only with the JSON type it must have. Every other field, whatever its type
and however deep its content, becomes a marker that says only its JSON type
and size. `rawEvent` (where agent servers put the provider's raw chunk,
reasoning included) never travels. An event whose type is not a string, or
not an AG-UI type, travels as markers only: its keys and their sizes.

`redact_event` is total: any value in, a JSON value out, never an exception.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from topics.events import EVENT_MODELS, json_type_name

# Fields that travel as they are when they are strings (where the event type has them).
_IDENTIFYING_STRINGS: Final = frozenset({
    "type", "messageId", "toolCallId", "parentMessageId", "threadId", "runId",
    "parentRunId", "entityId", "subagentRunId", "parentSubagentRunId", "parentToolCallId",
    "activityType", "stepName", "toolCallName", "name", "role", "subtype", "code",
    "protocolVersion",
})
_IDENTIFYING_INTEGERS: Final = frozenset({"timestamp"})
NEVER_TRAVELS: Final = frozenset({"rawEvent"})
_MAX_SAFE_INTEGER: Final = 2**53 - 1

# Per event type: field -> the Python type its value must have to travel.
TRAVELS: Final[dict[str, dict[str, type]]] = {
    event_type: {
        **{name: str for name in model.fields if name in _IDENTIFYING_STRINGS},
        **{name: int for name in model.fields if name in _IDENTIFYING_INTEGERS},
    }
    for event_type, model in EVENT_MODELS.items()
}


def redaction_marker(value: Any) -> dict[str, Any]:
    """What travels in place of `value`: its JSON type and its size in bytes."""
    marker: dict[str, Any] = {"redacted": True, "type": json_type_name(value)}
    size = _encoded_size(value)
    if size is not None:
        marker["bytes"] = size
    return marker


def redact_event(event: Any) -> Any:
    """The dead-letter copy of a decoded event (see the module docstring)."""
    try:
        if type(event) is not dict:
            return redaction_marker(event)
        event_type = event.get("type")
        travels = TRAVELS.get(event_type) if type(event_type) is str else None
        copy: dict[str, Any] = {}
        for key, value in event.items():
            if key in NEVER_TRAVELS:
                continue
            kind = None if travels is None else travels.get(key)
            copy[key] = (value if kind is not None and _has_type(value, kind)
                         else redaction_marker(value))
        return copy
    except Exception:  # a mapping that misbehaves: nothing of it travels
        return {"redacted": True, "type": "unreadable"}


def _has_type(value: Any, kind: type) -> bool:
    if kind is not int:
        return type(value) is kind
    # A timestamp: an integral JSON number within +-(2^53 - 1); booleans are not numbers.
    if type(value) is int:
        return abs(value) <= _MAX_SAFE_INTEGER
    return type(value) is float and value.is_integer() and abs(value) <= _MAX_SAFE_INTEGER


def _encoded_size(value: Any) -> int | None:
    if type(value) is str:
        return len(value.encode("utf-8", "surrogatepass"))
    try:
        return len(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError):  # not JSON, or nested too deep to encode
        return None
