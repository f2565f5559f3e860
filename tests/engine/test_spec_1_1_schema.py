"""The AG-UI 1.1 schema (issue 26, design section A).

* Closed string sets are stripped, never fatal: a string outside the set is an
  unknown member removed by the position rule; a non-string is malformed.
* `encryptedValueType` beside every `encryptedValue` (not on activity messages).
* The interrupt outcome carries at least one interrupt.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.engine.test_properties import JSON, SETTINGS
from tests.engine_helpers import (
    MESSAGE,
    Replay,
    enc,
    play,
    play_run,
    r_content,
    r_end,
    r_start,
    run_finished,
    run_started,
    snapshot,
    sub_finished,
    sub_started,
    t_chunk,
    t_content,
    t_end,
    t_start,
    tc_end,
    tc_result,
    tc_start,
)
from topics.events import (
    CLEAN_CHECKS,
    EVENT_MODELS,
    REMOVE,
    TEXT_MESSAGE_ROLES,
    Findings,
    check_model,
    json_type_name,
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
    assert replay.concluded and replay.concluded[-1].outcome.value == "finished"
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
