"""The AG-UI 1.1 schema and its compatibility boundary (issue 26, design section A).

* Closed string sets are stripped, never fatal: a string outside the set is an
  unknown member removed by the position rule; a non-string is malformed.
* `encryptedValueType` beside every `encryptedValue` (not on activity messages).
* The interrupt outcome carries at least one interrupt.
* A whole `null` is malformed where the schema says "any JSON but null", except
  where the deprecation registry keeps it as a retired shape: there it is
  removed with a `retired_shape` warning, as is a `binary` content part
  translated into a media part.
* `SUPPORTED_PROTOCOL` is 1.1.
* The compiled clean checks agree with the full walk on all of these fields.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from processors.engine.content import InMemoryContentStore
from processors.engine.engine import KeyEngine
from processors.engine.state import KeyState
from tests.engine.test_decorated_events import _walk_leaves_untouched
from tests.engine.test_properties import JSON, SETTINGS
from tests.engine_helpers import (
    MESSAGE,
    Replay,
    act_delta,
    act_snap,
    custom,
    enc,
    finished_clean,
    play,
    play_run,
    r_content,
    r_end,
    r_start,
    raw_event,
    run_finished,
    run_started,
    snapshot,
    sub_finished,
    sub_started,
    t_chunk,
    t_content,
    t_end,
    t_start,
    tc_chunk,
    tc_end,
    tc_result,
    tc_start,
)
from topics.events import (
    CLEAN_CHECKS,
    EVENT_MODELS,
    REMOVE,
    SUPPORTED_PROTOCOL,
    TEXT_MESSAGE_ROLES,
    Findings,
    check_model,
    json_type_name,
    protocol_version_is_foreign,
)

NOT_A_STRING = JSON.filter(lambda value: type(value) is not str)


def walk(event: dict[str, Any]) -> tuple[Any, Findings]:
    """The full schema walk of an event (a copy): what it returns, and its findings."""
    findings = Findings()
    event = copy.deepcopy(event)
    return check_model(EVENT_MODELS[event["type"]], event, "", findings), findings


def assert_malformed_at(replay: Replay, line: int) -> None:
    assert replay.failures == [(line, "malformed_event")], replay.entries()


def assert_finished(replay: Replay) -> None:
    assert replay.failures == [], replay.entries()
    assert replay.concluded and replay.concluded[-1].outcome.value == "success"
    for message in replay.messages:
        MESSAGE.validate_python(message)


def run_input(**fields: Any) -> dict[str, Any]:
    return {"threadId": "t1", "runId": "r1", "messages": [], **fields}


FUNCTION = {"name": "f", "arguments": "{}"}


# =====================================================================================
# 1. Closed string sets: stripped, never fatal
# =====================================================================================


class ClosedSet:
    """One closed string set: the events that carry `value` in it, and what survives."""

    def __init__(self, members: frozenset[str], line: int, event_type: str, pointer: str,
                 events: Callable[[Any], list[dict[str, Any]]],
                 survivors: list[dict[str, Any]], dropped: bool = False) -> None:
        self.members = members
        self.line = line  # the line of the event carrying the value
        self.event_type = event_type
        self.pointer = pointer
        self.events = events  # the whole key, RUN_STARTED to RUN_FINISHED
        self.survivors = survivors  # the run's messages once the value is stripped
        self.dropped = dropped  # the event itself goes (a required position at its top)


def _in_run(*events: dict[str, Any]) -> list[dict[str, Any]]:
    return [run_started(), *events, run_finished()]


def _calls(first_type: Any) -> list[dict[str, Any]]:
    return [{"id": "c1", "type": first_type, "function": dict(FUNCTION)},
            {"id": "c2", "type": "function", "function": dict(FUNCTION)}]


def _resume(status: Any) -> dict[str, Any]:
    return run_started(input=run_input(resume=[{"interruptId": "i1", "status": status},
                                               {"interruptId": "i2", "status": "resolved"}]))


CLOSED_SETS = {
    "TEXT_MESSAGE_START.role": ClosedSet(
        TEXT_MESSAGE_ROLES, 2, "TEXT_MESSAGE_START", "/role",
        lambda role: _in_run(t_start("m", role=role), t_content("m", "hi"), t_end("m")),
        # an optional role removed: the message is the assistant's
        [{"id": "m", "role": "assistant", "content": "hi"}]),
    "TEXT_MESSAGE_CHUNK.role": ClosedSet(
        TEXT_MESSAGE_ROLES, 2, "TEXT_MESSAGE_CHUNK", "/role",
        lambda role: _in_run(t_chunk(messageId="m", role=role, delta="hi")),
        [{"id": "m", "role": "assistant", "content": "hi"}]),
    "TOOL_CALL_RESULT.role": ClosedSet(
        frozenset({"tool"}), 4, "TOOL_CALL_RESULT", "/role",
        lambda role: _in_run(tc_start("c"), tc_end("c"), tc_result("r", "c", role=role)),
        [{"id": "r", "role": "tool", "content": "ok", "toolCallId": "c"}]),
    "REASONING_MESSAGE_START.role": ClosedSet(
        frozenset({"reasoning"}), 2, "REASONING_MESSAGE_START", "/role",
        lambda role: _in_run(r_start("m", role=role)),
        [], dropped=True),
    "ToolCall.type": ClosedSet(
        frozenset({"function"}), 2, "MESSAGES_SNAPSHOT", "/messages/0/toolCalls/0/type",
        lambda type_: _in_run(snapshot({"id": "a", "role": "assistant",
                                        "toolCalls": _calls(type_)})),
        [{"id": "a", "role": "assistant", "toolCalls": _calls("function")[1:]}]),
    "ResumeEntry.status": ClosedSet(
        frozenset({"resolved", "cancelled"}), 1, "RUN_STARTED", "/input/resume/0/status",
        lambda status: [_resume(status), run_finished()],
        []),
}


@pytest.mark.parametrize("name", CLOSED_SETS)
@SETTINGS
@given(data=st.data())
def test_string_outside_a_closed_set_is_stripped_and_the_run_survives(
        name: str, data: st.DataObject) -> None:
    case = CLOSED_SETS[name]
    value = data.draw(st.text(max_size=12).filter(lambda v: v not in case.members))
    replay = play(*case.events(value))
    assert replay.warnings == [(case.line, "unknown_member")], replay.entries()
    removed = "was removed with the event" if case.dropped else "was removed"
    # The reason names the pointer, never the value.
    assert replay.reasons == [f"{case.event_type}: unknown union member at {case.pointer}"
                              f" {removed}"]
    assert_finished(replay)
    messages = replay.messages
    if name == "TOOL_CALL_RESULT.role":
        messages = messages[-1:]  # the result, after its host
    assert messages == case.survivors


@pytest.mark.parametrize("name", CLOSED_SETS)
@SETTINGS
@given(data=st.data())
def test_non_string_in_a_closed_set_is_malformed(name: str, data: st.DataObject) -> None:
    case = CLOSED_SETS[name]
    value = data.draw(NOT_A_STRING)
    replay = play(*case.events(value))
    assert_malformed_at(replay, case.line)
    problem = ("is null; omit it instead" if value is None
               else f"must be a string (got {json_type_name(value)})")
    assert replay.reasons == [f"{case.event_type}: {case.pointer} {problem}"]


@pytest.mark.parametrize("name", CLOSED_SETS)
def test_every_member_of_a_closed_set_is_accepted(name: str) -> None:
    case = CLOSED_SETS[name]
    for member in sorted(case.members):
        replay = play(*case.events(member))
        assert replay.warnings == [], (member, replay.entries())
        # A REASONING_MESSAGE_START that applies leaves its message open at the finish.
        opened = ["open_at_finish"] if case.dropped else []
        assert replay.failure_codes == opened, (member, replay.entries())


def test_closed_set_removal_follows_the_position_rule() -> None:
    """Optional: the key goes; required: the containing value; in a list: the element."""
    event, findings = walk(t_start("m", role="critic"))
    assert event == t_start("m") and findings.unknown_members == ["/role"]
    event, findings = walk(tc_result("r", "c", role="assistant"))
    assert event == tc_result("r", "c") and findings.unknown_members == ["/role"]
    event, findings = walk(r_start("m", role="thinking"))
    assert event is REMOVE and findings.unknown_members == ["/role"]
    event, findings = walk(snapshot({"id": "a", "role": "assistant", "toolCalls": _calls("mcp")}))
    assert event["messages"][0]["toolCalls"] == _calls("function")[1:]
    assert findings.unknown_members == ["/messages/0/toolCalls/0/type"]
    event, findings = walk(_resume("paused"))
    assert event["input"]["resume"] == [{"interruptId": "i2", "status": "resolved"}]
    assert findings.unknown_members == ["/input/resume/0/status"]


def test_removed_reasoning_start_leaves_its_message_unopened() -> None:
    replay = play_run(r_start("m", role="thinking"), r_content("m", "x"), r_end("m"))
    assert replay.warnings == [(2, "unknown_member")]
    assert replay.failures == [(3, "message_not_open")]


@pytest.mark.parametrize("event", [
    {"type": "REASONING_MESSAGE_START", "role": "thinking", "messageId": 5},
    {"type": "REASONING_MESSAGE_START", "messageId": 5, "role": "thinking"},
    {"type": "REASONING_MESSAGE_START", "role": "thinking"},
    {"type": "REASONING_MESSAGE_START", "role": "thinking", "messageId": "m", "metadata": None},
    snapshot({"id": "u", "role": "user", "content": [
        {"type": "image", "source": {"type": "s3", "value": "k"}, "id": 5}]}),
    snapshot({"id": "u", "role": "user", "content": [
        {"id": 5, "type": "image", "source": {"type": "s3", "value": "k"}}]}),
], ids=["unknown first", "unknown last", "required missing", "null", "part: unknown first",
        "part: unknown last"])
def test_unknown_member_in_a_required_position_does_not_excuse_a_malformed_value(
        event: dict[str, Any]) -> None:
    """The rest of the value is judged before it is removed, whatever the key order."""
    replay = play_run(event)
    assert_malformed_at(replay, 2)
    assert replay.warnings == []


# =====================================================================================
# 2. encryptedValueType
# =====================================================================================

ENCRYPTED_MESSAGES = {
    "developer": {"id": "d", "role": "developer", "content": "x"},
    "system": {"id": "s", "role": "system", "content": "x"},
    "assistant": {"id": "a", "role": "assistant", "content": "x"},
    "user": {"id": "u", "role": "user", "content": "x"},
    "tool": {"id": "t", "role": "tool", "content": "x", "toolCallId": "c"},
    "reasoning": {"id": "r", "role": "reasoning", "content": "x"},
}


def _typed(message: dict[str, Any], value_type: Any) -> dict[str, Any]:
    return {**message, "encryptedValue": "v", "encryptedValueType": value_type}


def test_encrypted_value_type_on_the_encrypted_value_event() -> None:
    event = enc("m", "v", encryptedValueType="anthropic.redacted_thinking")
    replay = play_run(r_start("m"), r_content("m", "x"), r_end("m"), event)
    assert replay.warnings == [] and replay.failures == []
    checked, findings = walk(event)
    assert checked == event and not findings.unknown_fields
    assert CLEAN_CHECKS["REASONING_ENCRYPTED_VALUE"](event)


@pytest.mark.parametrize("role", ENCRYPTED_MESSAGES)
def test_encrypted_value_type_on_messages(role: str) -> None:
    message = _typed(ENCRYPTED_MESSAGES[role], "openai.encrypted_content")
    for event in (snapshot(message), run_started(input=run_input(messages=[message]))):
        checked, findings = walk(event)
        assert not findings.unknown_fields, event
        assert checked == event
    replay = play_run(snapshot(message))
    assert replay.warnings == [] and replay.failures == []


def test_encrypted_value_type_on_a_tool_call() -> None:
    call = {"id": "c", "type": "function", "function": dict(FUNCTION), "encryptedValue": "v",
            "encryptedValueType": "x.signature"}
    event = snapshot({"id": "a", "role": "assistant", "toolCalls": [call]})
    checked, findings = walk(event)
    assert checked == event and not findings.unknown_fields
    replay = play_run(event)
    assert replay.warnings == [] and replay.failures == []


def test_encrypted_value_type_is_not_on_activity_messages() -> None:
    activity = {"id": "act", "role": "activity", "activityType": "plan", "content": {},
                "encryptedValueType": "x"}
    replay = play_run(snapshot(activity))
    assert replay.warnings == [(2, "unknown_field")]
    assert replay.reasons == ["MESSAGES_SNAPSHOT: unknown property"
                              " /messages/0/encryptedValueType was stripped"]


@pytest.mark.parametrize("value_type", [5, None, True, {"kind": "x"}, ["x"]])
def test_encrypted_value_type_not_a_string_is_malformed(value_type: Any) -> None:
    call = {"id": "c", "type": "function", "function": dict(FUNCTION), "encryptedValue": "v",
            "encryptedValueType": value_type}
    for event in (enc("m", "v", encryptedValueType=value_type),
                  snapshot(_typed(ENCRYPTED_MESSAGES["reasoning"], value_type)),
                  snapshot({"id": "a", "role": "assistant", "toolCalls": [call]})):
        assert_malformed_at(play_run(r_start("m"), r_content("m", "x"), r_end("m"), event), 5)


# =====================================================================================
# 3. The interrupt outcome carries at least one interrupt
# =====================================================================================


def test_interrupt_outcome_with_no_interrupts_is_malformed() -> None:
    replay = play(run_started(), run_finished(outcome={"type": "interrupt", "interrupts": []}))
    assert_malformed_at(replay, 2)
    assert replay.reasons == ["RUN_FINISHED: /outcome/interrupts must have at least 1"
                              " element(s)"]


def test_interrupt_outcome_with_an_interrupt_is_valid() -> None:
    outcome = {"type": "interrupt", "interrupts": [{"id": "i", "reason": "approval"}]}
    replay = play(run_started(), run_finished(outcome=outcome))
    assert replay.failures == [] and replay.warnings == []


def test_suspended_subagent_may_carry_no_interrupt_ids() -> None:
    replay = play_run(sub_started("s"),
                      sub_finished("s", outcome={"type": "suspended", "interruptIds": []}))
    assert replay.failures == [] and replay.warnings == []


# =====================================================================================
# 4. Whole nulls: malformed, except where null is a value
# =====================================================================================

TEXT_PART_NULL_METADATA = [{"type": "text", "text": "a", "metadata": None}]


@pytest.mark.parametrize("event", [
    snapshot({"id": "u", "role": "user", "content": TEXT_PART_NULL_METADATA}),
    tc_result("r", "c", content=TEXT_PART_NULL_METADATA),
    run_started(input=run_input(messages=[{"id": "u", "role": "user",
                                           "content": TEXT_PART_NULL_METADATA}])),
], ids=["snapshot", "tool result", "run input"])
def test_null_text_part_metadata_is_malformed(event: dict[str, Any]) -> None:
    if event["type"] == "RUN_STARTED":
        replay = play(event)
        assert_malformed_at(replay, 1)
    else:
        replay = play_run(event)
        assert_malformed_at(replay, 2)
    assert replay.warnings == []
    assert replay.reasons[0].endswith("/content/0/metadata is null; omit it instead")


@pytest.mark.parametrize("event", [
    raw_event(event=None),
    custom(value=None),
    {"type": "STATE_SNAPSHOT", "snapshot": None},
    {"type": "STATE_DELTA", "delta": [{"op": "add", "path": "/a", "value": None}]},
], ids=["RAW.event", "CUSTOM.value", "STATE_SNAPSHOT.snapshot", "patch value"])
def test_null_stays_a_value_where_the_schema_allows_it(event: dict[str, Any]) -> None:
    finished_clean(play_run(event))


@pytest.mark.parametrize("value", [False, 0, "", [], {}, [None], {"k": None}])
def test_any_value_but_a_whole_null_is_accepted(value: Any) -> None:
    part = {"type": "text", "text": "a", "metadata": value}
    image = {"type": "image", "source": {"type": "url", "value": "u"}, "metadata": value}
    finished_clean(play(
        run_started(rawEvent=value, input=run_input(
            state=value, forwardedProps=value,
            tools=[{"name": "f", "description": "d", "parameters": value}],
            resume=[{"interruptId": "i", "status": "resolved", "payload": value}])),
        snapshot({"id": "u", "role": "user", "content": [part, image]}),
        sub_started("s"), sub_finished("s", result=value),
        run_finished(result=value),
    ))


# =====================================================================================
# 5. Retired shapes, translated at the compatibility boundary
# =====================================================================================


def _media(kind: str) -> dict[str, Any]:
    return {"type": kind, "source": {"type": "url", "value": "u"}, "metadata": None}


# name -> (the key, the line of the retired shape, its event type, its pointer)
RETIRED_NULLS: dict[str, tuple[list[dict[str, Any]], int, str, str]] = {
    "rawEvent": (_in_run(custom(rawEvent=None)), 2, "CUSTOM", "/rawEvent"),
    "rawEvent on RUN_STARTED": ([run_started(rawEvent=None), run_finished()], 1, "RUN_STARTED",
                                "/rawEvent"),
    "TOOL_CALL_START.parentMessageId": (
        _in_run(tc_start("c", parentMessageId=None), tc_end("c")), 2, "TOOL_CALL_START",
        "/parentMessageId"),
    "TOOL_CALL_CHUNK.parentMessageId": (
        _in_run(tc_chunk(toolCallId="c", toolCallName="f", parentMessageId=None, delta="{}")),
        2, "TOOL_CALL_CHUNK", "/parentMessageId"),
    "RUN_FINISHED.outcome": ([run_started(), run_finished(outcome=None)], 2, "RUN_FINISHED",
                             "/outcome"),
    "RUN_FINISHED.result": ([run_started(), run_finished(result=None)], 2, "RUN_FINISHED",
                            "/result"),
    "SUBAGENT_FINISHED.result": (_in_run(sub_started("s"), sub_finished("s", result=None)), 3,
                                 "SUBAGENT_FINISHED", "/result"),
    "ResumeEntry.payload": (
        [run_started(input=run_input(resume=[{"interruptId": "i", "status": "resolved",
                                              "payload": None}])), run_finished()],
        1, "RUN_STARTED", "/input/resume/0/payload"),
    **{f"{kind} part metadata": (
        _in_run(snapshot({"id": "u", "role": "user", "content": [_media(kind)]})), 2,
        "MESSAGES_SNAPSHOT", "/messages/0/content/0/metadata")
       for kind in ("image", "audio", "video", "document")},
    "media part metadata in a tool result": (
        _in_run(tc_start("c"), tc_end("c"), tc_result("r", "c", content=[_media("image")])),
        4, "TOOL_CALL_RESULT", "/content/0/metadata"),
    "Tool.parameters": (
        [run_started(input=run_input(tools=[{"name": "f", "description": "d",
                                             "parameters": None}])), run_finished()],
        1, "RUN_STARTED", "/input/tools/0/parameters"),
    "RunAgentInput.forwardedProps": (
        [run_started(input=run_input(forwardedProps=None)), run_finished()], 1, "RUN_STARTED",
        "/input/forwardedProps"),
    "RunAgentInput.state": ([run_started(input=run_input(state=None)), run_finished()], 1,
                            "RUN_STARTED", "/input/state"),
}


def _retired_reason(event_type: str, pointer: str) -> str:
    return (f"{event_type}: retired shape at {pointer} was translated to its AG-UI 1.1"
            " replacement")


def _without(value: Any, pointer: str) -> Any:
    """`value` (a copy) with the key at `pointer` removed."""
    value = copy.deepcopy(value)
    *path, last = pointer.split("/")[1:]
    target = value
    for token in path:
        target = target[int(token) if type(target) is list else token]
    del target[last]
    return value


@pytest.mark.parametrize("name", RETIRED_NULLS)
def test_retired_null_is_removed_with_a_warning(name: str) -> None:
    events, line, event_type, pointer = RETIRED_NULLS[name]
    replay = play(*events)
    assert replay.warnings == [(line, "retired_shape")], replay.entries()
    assert replay.reasons == [_retired_reason(event_type, pointer)]
    assert_finished(replay)
    event = events[line - 1]
    checked, findings = walk(event)
    assert checked == _without(event, pointer)  # the field is absent
    assert findings.retired_shapes == [pointer]
    assert not findings.unknown_fields and not findings.unknown_members


def test_retired_null_parent_means_no_parent() -> None:
    replay = play_run(t_start("m"), t_end("m"), tc_start("c", parentMessageId=None), tc_end("c"))
    assert [m["id"] for m in replay.messages] == ["m", "c"]  # a host of its own


def test_retired_null_outcome_means_success() -> None:
    replay = play(run_started(), run_finished(outcome=None))
    assert replay.concluded[0].outcome.value == "success"


def test_retired_shapes_are_warned_once_per_run_type_and_pointer() -> None:
    replay = play(
        run_started(rawEvent=None),  # 1: warns (checked before the run starts)
        custom(rawEvent=None),  # 2: warns
        custom(rawEvent=None),  # 3: same type + pointer: silent
        custom(extra=1),  # 4: an unknown field at another key: its own warning
        custom(extra=1, rawEvent=None),  # 5: both already warned: silent
        t_start("m", rawEvent=None),  # 6: another event type: warns
        t_end("m"),
        run_finished(),
        run_started("r2"),
        custom(rawEvent=None),  # 10: a new run warns again
        run_finished("r2"),
    )
    assert replay.warnings == [(1, "retired_shape"), (2, "retired_shape"), (4, "unknown_field"),
                               (6, "retired_shape"), (10, "retired_shape")]
    assert replay.failures == []


def test_retired_and_unknown_field_warnings_share_no_key() -> None:
    """A run that warned an unknown property at a pointer (as a restored state may
    say) still warns a retired shape at the same event type and pointer, and back."""
    state = orjson.loads(play(run_started(), custom(extra=1)).engine.state.to_json())
    assert state["run"]["warned"] == ["CUSTOM /extra"]
    state["run"]["warned"] = ["CUSTOM /rawEvent", "retired CUSTOM /extra"]
    engine = KeyEngine(KeyState.from_json(orjson.dumps(state)))
    replay = play(custom(rawEvent=None), custom(extra=1), custom(rawEvent=None, extra=1),
                  engine=engine)
    assert replay.warnings == [(1, "retired_shape"), (2, "unknown_field")]


def test_retired_shape_dedup_survives_a_state_round_trip() -> None:
    content = InMemoryContentStore()
    first = play(run_started(), custom(rawEvent=None), engine=KeyEngine(content=content))
    restored = KeyEngine(KeyState.from_json(first.engine.state.to_json()), content)
    second = play(custom(rawEvent=None), run_finished(), engine=restored)
    assert first.warnings == [(2, "retired_shape")]
    assert second.warnings == []


def test_a_retired_shape_in_a_malformed_event_only_fails() -> None:
    replay = play_run(custom(rawEvent=None, timestamp=1.5))
    assert_malformed_at(replay, 2)
    assert replay.warnings == []


# --- binary content parts -------------------------------------------------------------

# (binary part, the media part it becomes)
BINARY_PARTS = {
    "image data": ({"type": "binary", "mimeType": "image/png", "data": "AAA"},
                   {"type": "image",
                    "source": {"type": "data", "value": "AAA", "mimeType": "image/png"}}),
    "audio url": ({"type": "binary", "mimeType": "audio/wav", "url": "https://a/x.wav"},
                  {"type": "audio",
                   "source": {"type": "url", "value": "https://a/x.wav", "mimeType": "audio/wav"}}),
    "video: data wins, id and filename kept": (
        {"type": "binary", "mimeType": "video/mp4", "data": "BBB", "url": "https://v",
         "filename": "clip.mp4", "id": "f1"},
        {"type": "video", "id": "f1",
         "source": {"type": "data", "value": "BBB", "mimeType": "video/mp4"},
         "metadata": {"filename": "clip.mp4"}}),
    "pdf is a document": ({"type": "binary", "mimeType": "application/pdf", "url": "u"},
                          {"type": "document",
                           "source": {"type": "url", "value": "u",
                                      "mimeType": "application/pdf"}}),
    "text/plain is a document": ({"type": "binary", "mimeType": "text/plain", "data": "aGk="},
                                 {"type": "document",
                                  "source": {"type": "data", "value": "aGk=",
                                             "mimeType": "text/plain"}}),
    "MIME type case-insensitive": ({"type": "binary", "mimeType": "Image/PNG", "data": "C"},
                                   {"type": "image",
                                    "source": {"type": "data", "value": "C",
                                               "mimeType": "Image/PNG"}}),
    "no subtype": ({"type": "binary", "mimeType": "image", "data": "C"},
                   {"type": "document",
                    "source": {"type": "data", "value": "C", "mimeType": "image"}}),
    "empty data: the url": ({"type": "binary", "mimeType": "image/gif", "data": "", "url": "u",
                             "filename": ""},
                            {"type": "image",
                             "source": {"type": "url", "value": "u", "mimeType": "image/gif"}}),
}


@pytest.mark.parametrize("name", BINARY_PARTS)
def test_binary_part_becomes_a_media_part(name: str) -> None:
    binary, media = BINARY_PARTS[name]
    text = {"type": "text", "text": "look"}
    replay = play_run(snapshot({"id": "u", "role": "user", "content": [text, binary]}))
    assert replay.warnings == [(2, "retired_shape")]
    assert replay.reasons == [_retired_reason("MESSAGES_SNAPSHOT", "/messages/0/content/1")]
    assert_finished(replay)
    assert replay.messages == [{"id": "u", "role": "user", "content": [text, media]}]


@pytest.mark.parametrize("where", ["tool result", "tool message", "run input"])
def test_binary_part_translated_wherever_parts_are(where: str) -> None:
    binary, media = BINARY_PARTS["audio url"]
    if where == "tool result":
        event, pointer = tc_result("r", "c", content=[binary]), "/content/0"
    elif where == "tool message":
        event = snapshot({"id": "t", "role": "tool", "toolCallId": "c", "content": [binary]})
        pointer = "/messages/0/content/0"
    else:
        event = run_started(input=run_input(messages=[{"id": "u", "role": "user",
                                                       "content": [binary]}]))
        pointer = "/input/messages/0/content/0"
    checked, findings = walk(event)
    assert findings.retired_shapes == [pointer]
    assert not findings.unknown_members and not findings.unknown_fields
    parent, _, index = pointer.rpartition("/")
    translated = checked
    for token in parent.split("/")[1:]:
        translated = translated[int(token) if type(translated) is list else token]
    assert translated[int(index)] == media


@pytest.mark.parametrize("binary", [
    {"type": "binary", "mimeType": "image/png", "id": "file-1"},
    {"type": "binary", "mimeType": "image/png"},
    {"type": "binary", "mimeType": "image/png", "data": "", "url": ""},
], ids=["id only", "bare", "empty"])
def test_binary_part_with_neither_data_nor_url_is_an_unknown_member(
        binary: dict[str, Any]) -> None:
    text = {"type": "text", "text": "look"}
    replay = play_run(snapshot({"id": "u", "role": "user", "content": [text, binary]}))
    assert replay.warnings == [(2, "unknown_member")]
    assert replay.reasons == ["MESSAGES_SNAPSHOT: unknown union member at"
                              " /messages/0/content/1/type was removed"]
    assert replay.messages == [{"id": "u", "role": "user", "content": [text]}]


@pytest.mark.parametrize("binary", [
    {"type": "binary", "data": "AAA"},
    {"type": "binary", "mimeType": 5, "data": "AAA"},
    {"type": "binary", "mimeType": "image/png", "data": 5},
    {"type": "binary", "mimeType": "image/png", "url": ["u"]},
    {"type": "binary", "mimeType": "image/png", "data": "A", "filename": None},
    {"type": "binary", "mimeType": "image/png", "data": "A", "id": 1},
], ids=["no mimeType", "mimeType not a string", "data not a string", "url not a string",
        "null filename", "id not a string"])
def test_malformed_binary_part_is_malformed(binary: dict[str, Any]) -> None:
    replay = play_run(snapshot({"id": "u", "role": "user", "content": [binary]}))
    assert_malformed_at(replay, 2)
    assert replay.warnings == []


def test_binary_part_unknown_property_is_stripped_then_translated() -> None:
    binary = {"type": "binary", "mimeType": "image/png", "data": "A", "detail": "high"}
    replay = play_run(snapshot({"id": "u", "role": "user", "content": [binary]}))
    assert sorted(replay.warnings) == [(2, "retired_shape"), (2, "unknown_field")]
    assert replay.messages[0]["content"] == [
        {"type": "image", "source": {"type": "data", "value": "A", "mimeType": "image/png"}}]


def test_binary_part_warned_once_per_run_and_pointer() -> None:
    message = {"id": "u", "role": "user",
               "content": [{"type": "binary", "mimeType": "image/png", "data": "A"}]}
    replay = play_run(snapshot(message), snapshot(message))
    assert replay.warnings == [(2, "retired_shape")]


# =====================================================================================
# 6. The supported protocol
# =====================================================================================


def test_supported_protocol_is_1_1() -> None:
    assert SUPPORTED_PROTOCOL == (1, 1)
    assert not protocol_version_is_foreign("1.1")
    assert not protocol_version_is_foreign("1.0")
    assert protocol_version_is_foreign("1.2")
    assert protocol_version_is_foreign("2.0")


def test_protocol_1_1_is_silent_and_1_2_warns() -> None:
    finished_clean(play(run_started(protocolVersion="1.1"), run_finished()))
    replay = play(run_started(protocolVersion="1.2"), run_finished())
    assert replay.warnings == [(1, "protocol_version")]


# =====================================================================================
# The clean checks agree with the walk on these fields
# =====================================================================================

OPAQUE = [{}, 0, "x", [None], {"k": None}, False, None]
# Per event type: its required fields (valid), and the pool each field of interest
# draws from (absent too).
AGREEMENT: dict[str, tuple[dict[str, Any], dict[str, list[Any]]]] = {
    "TEXT_MESSAGE_START": ({"messageId": "m"}, {
        "role": [*sorted(TEXT_MESSAGE_ROLES), "critic", "", "tool", 3, None]}),
    "TEXT_MESSAGE_CHUNK": ({}, {
        "role": [*sorted(TEXT_MESSAGE_ROLES), "critic", 3, None], "delta": ["d"]}),
    "TOOL_CALL_RESULT": ({"messageId": "r", "toolCallId": "c", "content": "ok"}, {
        "role": ["tool", "assistant", 3, None]}),
    "REASONING_MESSAGE_START": ({"messageId": "m"}, {
        "role": ["reasoning", "thinking", 3, None]}),
    "REASONING_ENCRYPTED_VALUE": ({"subtype": "message", "entityId": "m",
                                   "encryptedValue": "v"}, {
        "encryptedValueType": ["x.y", "", 3, None]}),
    "TOOL_CALL_START": ({"toolCallId": "c", "toolCallName": "f"}, {
        "parentMessageId": ["p", "", 3, None]}),
    "TOOL_CALL_CHUNK": ({"toolCallId": "c"}, {"parentMessageId": ["p", 3, None]}),
    "RUN_FINISHED": ({"threadId": "t", "runId": "r"}, {
        "result": OPAQUE, "outcome": [None]}),
    "SUBAGENT_FINISHED": ({"subagentRunId": "s"}, {"result": OPAQUE}),
    "CUSTOM": ({"name": "n", "value": None}, {}),
    "RAW": ({"event": None}, {}),
}
ABSENT = object()


@st.composite
def decorated_events(draw: Any) -> dict[str, Any]:
    event_type = draw(st.sampled_from(sorted(AGREEMENT)))
    required, pools = AGREEMENT[event_type]
    event: dict[str, Any] = {"type": event_type, **required}
    for name, pool in {**pools, "rawEvent": OPAQUE, "timestamp": [1_700_000_000_000]}.items():
        value = draw(st.sampled_from([ABSENT, *pool]))
        if value is not ABSENT:
            event[name] = value
    return dict(draw(st.permutations(list(event.items()))))


@SETTINGS
@given(decorated_events())
def test_clean_check_and_walk_agree(event: dict[str, Any]) -> None:
    """Clean exactly when the walk returns the event untouched with no finding: an
    out-of-set string, a retired null, a whole null take the walk; in-set values,
    encryptedValueType and any non-null rawEvent or result stay on the hot path."""
    clean = CLEAN_CHECKS[event["type"]](event)
    assert clean == _walk_leaves_untouched(copy.deepcopy(event)), event


@pytest.mark.parametrize("event", [
    t_start("m", role="user", timestamp=1, rawEvent={"id": "chunk"}),
    t_chunk(messageId="m", role="developer", delta="x", timestamp=1),
    tc_result("r", "c", role="tool", timestamp=1),
    r_start("m", timestamp=1, rawEvent=[]),
    enc("m", "v", encryptedValueType="anthropic.redacted_thinking", timestamp=1),
    tc_start("c", parentMessageId="m", timestamp=1),
    run_finished(result={"ok": True}, timestamp=1),
    custom(value=None, rawEvent=0),
], ids=lambda event: event["type"])
def test_flat_events_stay_on_the_hot_path(event: dict[str, Any]) -> None:
    assert CLEAN_CHECKS[event["type"]](event)


def test_patch_value_may_still_be_null_inside_an_activity_delta() -> None:
    replay = play_run(act_snap("a", {"n": 1}),
                      act_delta("a", [{"op": "replace", "path": "/n", "value": None}]))
    finished_clean(replay)
    assert replay.messages[0]["content"] == {"n": None}
