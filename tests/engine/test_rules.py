"""One focused test per rule of the rule book, docs/rules.md.

Each test fails when its rule is broken; the conformance corpus covers some of
the same ground, these tests concentrate on what it leaves out.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from processors.engine.content import InMemoryContentStore
from processors.engine.decisions import Concluded, Discarded, EncryptedLost, Failed, Warned
from processors.engine.engine import KeyEngine
from processors.engine.state import KeyState
from tests.engine_helpers import (
    MESSAGE,
    act_delta,
    act_snap,
    custom,
    enc,
    finished_clean,
    in_run,
    play,
    play_run,
    r_chunk,
    r_content,
    r_end,
    r_start,
    raw_event,
    reasoning,
    run_error,
    run_finished,
    run_started,
    snapshot,
    span_end,
    span_start,
    step_finished,
    step_started,
    sub_error,
    sub_finished,
    sub_started,
    t_chunk,
    t_content,
    t_end,
    t_start,
    tc_args,
    tc_chunk,
    tc_end,
    tc_result,
    tc_start,
    text,
)


def fails_at(replay: Any, line: int, code: str) -> None:
    assert replay.failures == [(line, code)], replay.entries()


# =====================================================================================
# 1. Wire shape
# =====================================================================================

# (event with a null optional field) - every kind of optional field
NULL_OPTIONAL = {
    "base timestamp": custom(timestamp=None),
    "base metadata": custom(metadata=None),
    "subagentRunId": custom(subagentRunId=None),
    "optional string (name)": t_start("m", name=None),
    "optional closed set (role)": t_start("m", role=None),
    "chunk messageId": r_chunk(messageId=None, delta="x"),
    "chunk delta": r_chunk(messageId="m", delta=None),
    "tool chunk toolCallName": tc_chunk(toolCallId="c", toolCallName=None),
    "optional boolean (replace)": act_snap("a", {}, replace=None),
    "optional list (usage)": run_finished(usage=None),
    "optional count in usage": run_finished(usage=[{"inputTokens": None}]),
    "RUN_ERROR code": run_error(code=None),
    "subagent description": sub_started("s", description=None),
    "tool result role": tc_result("tm", "c", role=None),
    "snapshot encryptedValue": snapshot({"id": "u", "role": "user", "content": "x",
                                         "encryptedValue": None}),
    "snapshot message name": snapshot({"id": "u", "role": "user", "content": "x",
                                       "name": None}),
    "snapshot assistant content": snapshot({"id": "a", "role": "assistant", "content": None}),
    "snapshot tool call encryptedValue": snapshot(
        {"id": "a", "role": "assistant", "toolCalls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"},
             "encryptedValue": None}]}),
    "snapshot tool error": snapshot({"id": "x", "role": "tool", "content": "r",
                                     "toolCallId": "c", "error": None}),
}


@pytest.mark.parametrize("event", NULL_OPTIONAL.values(), ids=NULL_OPTIONAL.keys())
def test_null_on_optional_field_is_malformed(event: dict[str, Any]) -> None:
    replay = play_run(event)
    fails_at(replay, 2, "malformed_event")
    assert replay.concluded == []


@pytest.mark.parametrize(
    "event",
    [
        run_started(protocolVersion=None),
        run_started(parentRunId=None),
        run_started(input=None),
    ],
    ids=["protocolVersion", "parentRunId", "input"],
)
def test_null_on_optional_field_of_run_started_is_malformed(event: dict[str, Any]) -> None:
    replay = play(event)
    fails_at(replay, 1, "malformed_event")


NULL_OPAQUE = {
    "metadata value": custom(metadata={"k": None}),
    "custom value": custom(value=None),
    "raw event": raw_event(event=None),
    "state snapshot": {"type": "STATE_SNAPSHOT", "snapshot": None},
    "patch value": {"type": "STATE_DELTA", "delta": [{"op": "add", "path": "/a", "value": None}]},
}


@pytest.mark.parametrize("event", NULL_OPAQUE.values(), ids=NULL_OPAQUE.keys())
def test_null_in_opaque_position_is_a_value(event: dict[str, Any]) -> None:
    finished_clean(play_run(event))


def test_null_result_and_input_state_are_retired_shapes() -> None:
    replay = play(run_started(input={"threadId": "t1", "runId": "r1", "messages": [],
                                     "state": None, "forwardedProps": None}),
                  run_finished(result=None))
    assert replay.failures == []
    assert replay.warnings == [(1, "retired_shape"), (1, "retired_shape"), (2, "retired_shape")]


@pytest.mark.parametrize("timestamp", [1.5, "1700", True, False, 2**53, -(2**53), 1e20, [1], {}])
def test_bad_timestamp_is_malformed(timestamp: Any) -> None:
    fails_at(play_run(custom(timestamp=timestamp)), 2, "malformed_event")


@pytest.mark.parametrize("timestamp", [1700000000000, 1700000000000.0, 0, -5, 2**53 - 1,
                                       -(2**53 - 1)])
def test_integer_timestamp_accepted(timestamp: Any) -> None:
    finished_clean(play_run(custom(timestamp=timestamp)))


def test_integer_valued_float_timestamp_on_the_wire_accepted() -> None:
    raw = b'{"type":"CUSTOM","name":"c","value":1,"timestamp":1700000000000.0}'
    finished_clean(play_run(raw))


MISSING_OR_WRONG = {
    "content without delta": {"type": "REASONING_MESSAGE_CONTENT", "messageId": "m"},
    "content without messageId": {"type": "REASONING_MESSAGE_CONTENT", "delta": "x"},
    "tool start without name": {"type": "TOOL_CALL_START", "toolCallId": "c"},
    "encrypted without value": {"type": "REASONING_ENCRYPTED_VALUE", "subtype": "message",
                                "entityId": "m"},
    "encrypted without entityId": {"type": "REASONING_ENCRYPTED_VALUE", "subtype": "message",
                                   "encryptedValue": "v"},
    "encrypted without subtype": {"type": "REASONING_ENCRYPTED_VALUE", "entityId": "m",
                                  "encryptedValue": "v"},
    "encrypted numeric value": enc("m", 5),  # type: ignore[arg-type]
    "subagent without subagentRunId": {"type": "SUBAGENT_STARTED", "name": "n"},
    "subagent finished without id": {"type": "SUBAGENT_FINISHED"},
    "delta not a string": t_content("m", 5),  # type: ignore[arg-type]
    "metadata not an object": custom(metadata=[1]),
    "metadata a string": custom(metadata="x"),
    "subagentRunId not a string": custom(subagentRunId=3),
    "run error without message": {"type": "RUN_ERROR"},
    "usage count fractional": run_finished(usage=[{"inputTokens": 1.5}]),
    "usage count negative": run_finished(usage=[{"inputTokens": -1}]),
    "replace not boolean": act_snap("a", {}, replace="yes"),
    "activity content not object": act_snap("a", []),  # type: ignore[arg-type]
    "patch not a list": act_delta("a", {"op": "add"}),  # type: ignore[arg-type]
    "snapshot messages not list": {"type": "MESSAGES_SNAPSHOT", "messages": {}},
    "snapshot message without id": snapshot({"role": "user", "content": "x"}),
    "snapshot role not a string": snapshot({"id": "x", "role": 3, "content": "x"}),
}


@pytest.mark.parametrize("event", MISSING_OR_WRONG.values(), ids=MISSING_OR_WRONG.keys())
def test_missing_required_or_wrong_type_is_malformed(event: dict[str, Any]) -> None:
    fails_at(play_run(*reasoning("m", "x"), event), 5, "malformed_event")


def test_run_finished_missing_run_id_is_malformed() -> None:
    fails_at(play(run_started(), {"type": "RUN_FINISHED", "threadId": "t1"}), 2,
             "malformed_event")


def test_empty_delta_is_allowed() -> None:
    messages = finished_clean(play_run(*reasoning("m", "", "a", ""), *text("t", "")))
    assert messages == [{"id": "m", "role": "reasoning", "content": "a"},
                        {"id": "t", "role": "assistant", "content": ""}]


UNDECODABLE = {
    "not json": b"not json",
    "truncated": b'{"type":"CUSTOM"',
    "empty": b"",
    "bad utf-8": b'{"type":"CUSTOM\xff"}',
    "array": b"[]",
    "array of events": b'[{"type":"RUN_FINISHED","threadId":"t1","runId":"r1"}]',
    "string": b'"RUN_STARTED"',
    "number": b"42",
    "null": b"null",
    "object without type": b'{"threadId":"t1"}',
    "numeric type": b'{"type":5}',
    "null type": b'{"type":null}',
    "object type": b'{"type":{"name":"CUSTOM"}}',
}


@pytest.mark.parametrize("raw", UNDECODABLE.values(), ids=UNDECODABLE.keys())
def test_undecodable_record_fails_active_run(raw: bytes) -> None:
    replay = play(run_started(), *reasoning("m", "x"), enc("m", "v"), raw)
    fails_at(replay, 6, "undecodable_record")
    assert replay.steps[5].event_type == "undecodable"
    assert replay.losses == [(6, "run_failed")]
    failed = replay.steps[5].decisions[-1]
    assert isinstance(failed, Failed) and failed.run is not None
    assert failed.run.run_id == "r1"


@pytest.mark.parametrize("raw", [b"[]", b'{"x":1}', b"nope"])
def test_undecodable_with_no_run_fails_on_its_own(raw: bytes) -> None:
    replay = play(raw)
    fails_at(replay, 1, "undecodable_record")
    failed = replay.steps[0].decisions[-1]
    assert isinstance(failed, Failed) and failed.run is None
    # ... and after a finished run, too; the finished run keeps its history.
    replay = play(*in_run(*text("m", "hi")), raw)
    assert replay.failures == [(6, "undecodable_record")]
    assert replay.concluded[0].messages[0]["content"] == "hi"


def test_run_level_events_reject_subagent_tag_as_unknown_field() -> None:
    # subagentRunId is a base field of attributable events only (section 1).
    replay = play(run_started(subagentRunId="s"), run_finished())
    assert replay.warning_codes == ["unknown_field"]
    assert replay.concluded[0].outcome.value == "success"


# =====================================================================================
# 2. Unknown material
# =====================================================================================


def test_unknown_event_type_dropped_with_warning() -> None:
    replay = play_run(*text("m", "a"), {"type": "FUTURE_THING", "messageId": "m", "delta": "b"})
    assert replay.warnings == [(5, "unknown_event_type")]
    assert replay.failures == []
    assert replay.messages == [{"id": "m", "role": "assistant", "content": "a"}]
    assert replay.steps[4].event_type == "unknown"


@pytest.mark.parametrize("event_type", ["THINKING_STARTED", "thinking_start", "run_started"])
def test_misspelled_types_are_unknown(event_type: str) -> None:
    replay = play_run({"type": event_type, "delta": "x"})
    assert replay.warnings == [(2, "unknown_event_type")]
    assert replay.messages == []


def test_unknown_event_type_outside_a_run_only_warns() -> None:
    replay = play({"type": "FUTURE_THING"}, run_started(), run_finished())
    assert replay.warnings == [(1, "unknown_event_type")]
    assert replay.failures == []


def test_unknown_field_stripped_event_still_applies() -> None:
    replay = play_run(t_start("m", future=1), t_content("m", "hi", extra={"a": 1}), t_end("m"))
    assert replay.warnings == [(2, "unknown_field"), (3, "unknown_field")]
    assert replay.messages == [{"id": "m", "role": "assistant", "content": "hi"}]


def test_unknown_field_deduplicated_per_run_type_and_pointer() -> None:
    replay = play(
        run_started(),
        t_start("m"),
        t_content("m", "a", future=1),  # 3: warns
        t_content("m", "b", future=2),  # 4: same type + pointer: silent
        t_content("m", "c", other=1),  # 5: another pointer: warns
        t_end("m", future=1),  # 6: another event type: warns
        t_chunk(messageId="n", delta="x", future=1),  # 7: type as received: warns
        t_chunk(delta="y", future=1),  # 8: silent
        run_finished(),
        run_started("r2"),
        custom(),
        t_start("m2"),
        t_content("m2", "a", future=1),  # 13: a new run warns again
        t_end("m2"),
        run_finished("r2"),
    )
    assert replay.warnings == [(3, "unknown_field"), (5, "unknown_field"),
                               (6, "unknown_field"), (7, "unknown_field"),
                               (13, "unknown_field")]
    assert replay.concluded[0].messages[0]["content"] == "abc"
    assert replay.concluded[0].messages[1]["content"] == "xy"


def test_unknown_field_pointer_includes_array_index() -> None:
    user = {"id": "u", "role": "user", "content": "q", "extra": 1}
    user2 = {"id": "u2", "role": "user", "content": "q", "extra": 1}
    replay = play_run(
        snapshot(user, user2),  # /messages/0/extra and /messages/1/extra
        snapshot(user, user2),  # both already warned in this run
        snapshot(user2),  # /messages/0/extra: already warned
        snapshot({"id": "a", "role": "assistant", "toolCalls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "", "x": 1}},
        ]}),
    )
    assert replay.warnings == [(2, "unknown_field"), (2, "unknown_field"),
                               (5, "unknown_field")]
    assert any("/messages/0/toolCalls/0/function/x" in r for r in replay.reasons)
    assert "/messages/1/extra" in " ".join(replay.reasons)
    assert all("extra" not in m for m in replay.messages)


def test_opaque_positions_are_never_inspected() -> None:
    anything = {"deep": {"unknown": [1, {"x": None}]}, "type": "not-a-union"}
    finished_clean(play(
        run_started(input={"threadId": "t1", "runId": "r1", "messages": [],
                           "state": anything, "forwardedProps": anything,
                           "tools": [{"name": "f", "description": "d", "parameters": anything}]},
                    rawEvent=anything, metadata=anything),
        custom(value=anything, rawEvent=anything, metadata=anything),
        raw_event(event=anything),
        {"type": "STATE_SNAPSHOT", "snapshot": anything},
        tc_start("c"), tc_args("c", '{"not": "inspected", "type": 5}'), tc_end("c"),
        tc_result("tm", "c", content="{}"),
        act_snap("act", anything),
        run_finished(result=anything),
    ))


def test_unknown_member_in_list_is_dropped() -> None:
    replay = play_run(snapshot(
        {"id": "x1", "role": "critic", "content": "?"},
        {"id": "u", "role": "user", "content": "hi"},
        {"id": "x2", "role": "judge", "content": "?"},
    ))
    assert replay.warnings == [(2, "unknown_member"), (2, "unknown_member")]
    assert replay.messages == [{"id": "u", "role": "user", "content": "hi"}]


def test_unknown_content_part_dropped_from_list() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "hologram", "data": "?"},
             {"type": "text", "text": "b"}]
    replay = play_run(snapshot({"id": "u", "role": "user", "content": parts}))
    assert replay.warning_codes == ["unknown_member"]
    assert replay.messages[0]["content"] == [{"type": "text", "text": "a"},
                                             {"type": "text", "text": "b"}]
    MESSAGE.validate_python(replay.messages[0])


def test_unknown_member_in_optional_position_removes_key() -> None:
    replay = play(run_started(), run_finished(outcome={"type": "partial", "why": "x"}))
    assert replay.warnings == [(2, "unknown_member")]
    assert replay.failures == []
    assert replay.concluded[0].outcome.value == "success"


def test_unknown_member_in_required_position_removes_containing_value() -> None:
    # ImagePart.source is required: an unknown source type removes the part.
    parts = [{"type": "text", "text": "a"},
             {"type": "image", "source": {"type": "s3", "value": "bucket/key"}}]
    replay = play_run(snapshot({"id": "u", "role": "user", "content": parts}))
    assert replay.warning_codes == ["unknown_member"]
    assert replay.messages[0]["content"] == [{"type": "text", "text": "a"}]


def test_unknown_patch_operation_is_dropped() -> None:
    replay = play_run(act_snap("a", {"n": 1}),
                      act_delta("a", [{"op": "frobnicate", "path": "/n"},
                                      {"op": "replace", "path": "/n", "value": 2}]))
    assert replay.warning_codes == ["unknown_member"]
    assert replay.messages[0]["content"] == {"n": 2}


def test_unknown_member_warns_every_occurrence() -> None:
    critic = {"id": "x", "role": "critic", "content": "?"}
    replay = play_run(snapshot(critic), snapshot(critic))
    assert replay.warnings == [(2, "unknown_member"), (3, "unknown_member")]


@pytest.mark.parametrize("subtype", [5, True, ["message"], {"x": 1}, None])
def test_non_string_subtype_is_malformed(subtype: Any) -> None:
    replay = play_run(*reasoning("m", "x"), enc("m", "v", subtype=subtype))
    fails_at(replay, 5, "malformed_event")


@pytest.mark.parametrize("subtype", ["reasoning", "Message", "TOOL-CALL", "tool_call", ""])
def test_unknown_string_subtype_strips_event_and_loses_value(subtype: str) -> None:
    replay = play_run(*reasoning("m", "x"), enc("m", "first"), enc("m", "second", subtype=subtype),
                      enc("nobody", "third", subtype=subtype))
    assert replay.warnings == [(6, "unknown_subtype"), (7, "unknown_subtype")]
    assert replay.losses == [(6, "unknown_subtype"), (7, "unknown_subtype")]
    assert replay.failures == []
    assert replay.messages[0]["encryptedValue"] == "first"


@pytest.mark.parametrize("version", ["1.0", "0.9", "0.0", "1.1"])
def test_protocol_version_not_newer_is_silent(version: str) -> None:
    finished_clean(play(run_started(protocolVersion=version), run_finished()))


@pytest.mark.parametrize("version", ["1.2", "2.0", "1", "v1.0", "1.0.0", "", "10.0", " 1.0",
                                     "1.0-beta", "one"])
def test_protocol_version_newer_or_foreign_warns_and_proceeds(version: str) -> None:
    replay = play(run_started(protocolVersion=version), *text("m", "x"), run_finished())
    assert replay.warnings == [(1, "protocol_version")]
    assert replay.concluded[0].outcome.value == "success"
    warned = replay.steps[0].decisions[0]
    assert isinstance(warned, Warned) and warned.run is not None  # attributed to the run


# =====================================================================================
# 3. Run lifecycle
# =====================================================================================


@pytest.mark.parametrize("event", [custom(), r_start("m"), run_finished(), span_start("s"),
                                   enc("m", "v")],
                         ids=lambda e: e["type"])
def test_first_event_must_be_run_started(event: dict[str, Any]) -> None:
    replay = play(event, run_started(), run_finished())
    fails_at(replay, 1, "run_not_started")
    failed = replay.steps[0].decisions[-1]
    assert isinstance(failed, Failed) and failed.run is None
    assert replay.concluded[0].outcome.value == "success"  # RUN_STARTED starts fresh


def test_run_error_as_first_event_is_a_run_of_its_own() -> None:
    replay = play(run_error("could not start", code="BOOT"), run_started(), run_finished())
    first, second = replay.concluded
    assert first.outcome.value == "error" and first.run is None and first.messages == []
    assert first.error == {"message": "could not start", "code": "BOOT"}
    assert second.outcome.value == "success"


def test_run_started_while_active_fails_and_starts_nothing() -> None:
    replay = play(run_started(), *reasoning("m", "x"), enc("m", "v"), run_started("r2"),
                  custom(), run_finished("r2"))
    fails_at(replay, 6, "run_already_active")
    assert replay.losses == [(6, "run_failed")]
    assert replay.discarded == 2  # r2 never started: its events are discarded
    assert replay.concluded == []


def test_events_after_failure_are_discarded_until_run_started() -> None:
    replay = play(run_started(), r_end("nope"), custom(), run_error(), run_finished(),
                  b"garbage", {"type": "FUTURE"}, run_started("r2"), *text("m", "x"),
                  run_finished("r2"))
    fails_at(replay, 2, "message_not_open")
    for step in replay.steps[2:7]:
        assert [type(d) for d in step.decisions] == [Discarded]
    assert replay.concluded[0].run is not None and replay.concluded[0].run.run_id == "r2"
    assert replay.messages == [{"id": "m", "role": "assistant", "content": "x"}]


def test_after_run_finished_only_run_started_or_late_run_error() -> None:
    replay = play(*in_run(*text("m", "x")), custom())
    fails_at(replay, 6, "run_already_ended")
    failed = replay.steps[5].decisions[-1]
    assert isinstance(failed, Failed) and failed.run is None
    assert replay.concluded[0].messages == [{"id": "m", "role": "assistant", "content": "x"}]
    fails_at(play(*in_run(), run_finished()), 3, "run_already_ended")


def test_late_run_error_after_finished_turns_the_run_into_an_error() -> None:
    replay = play(*in_run(*text("m", "x")), run_error("late"))
    assert replay.warnings == [(6, "late_run_error")]
    assert [(c.outcome.value, c.late) for c in replay.concluded] == [("success", False),
                                                                     ("error", True)]
    # ... but only one: after a RUN_ERROR only RUN_STARTED may follow.
    replay = play(*in_run(), run_error("late"), run_error("later"))
    fails_at(replay, 4, "run_already_ended")


@pytest.mark.parametrize("event", [run_error("again"), custom(), run_finished(), t_start("m")],
                         ids=lambda e: e["type"])
def test_after_run_error_only_run_started(event: dict[str, Any]) -> None:
    replay = play(run_started(), run_error(), event, run_started("r2"), run_finished("r2"))
    fails_at(replay, 3, "run_already_ended")
    assert [c.outcome.value for c in replay.concluded] == ["error", "success"]


@pytest.mark.parametrize("finish", [run_finished(run="other"), run_finished(thread="t2")])
def test_run_finished_ids_must_match(finish: dict[str, Any]) -> None:
    fails_at(play(run_started(), finish), 2, "run_id_mismatch")


@pytest.mark.parametrize(
    ("events", "kind"),
    [
        ([span_start("s1")], "reasoning span 's1'"),
        ([r_start("m1")], "reasoning message 'm1'"),
        ([t_start("m1")], "text message 'm1'"),
        ([tc_start("c1")], "tool call 'c1'"),
        ([step_started("plan")], "step 'plan'"),
        ([sub_started("s1")], "subagent 's1'"),
    ],
)
def test_open_at_finish_names_kind_and_id(events: list[dict[str, Any]], kind: str) -> None:
    replay = play_run(*events)
    fails_at(replay, 2 + len(events), "open_at_finish")
    assert kind in replay.reasons[-1]


def test_open_at_finish_lists_every_open_item() -> None:
    replay = play_run(span_start("s"), r_start("rm"), t_start("tm"), tc_start("tc"),
                      step_started("st"), sub_started("sa"))
    fails_at(replay, 8, "open_at_finish")
    reason = replay.reasons[-1]
    for item in ("reasoning span 's'", "reasoning message 'rm'", "text message 'tm'",
                 "tool call 'tc'", "step 'st'", "subagent 'sa'"):
        assert item in reason


def test_chunk_items_are_not_open_at_finish() -> None:
    messages = finished_clean(play_run(r_chunk(messageId="c", delta="x"),
                                       t_chunk(messageId="t", delta="y", subagentRunId="s"),
                                       tc_chunk(toolCallId="k", toolCallName="f", delta="{}")))
    assert [m["id"] for m in messages] == ["c", "t", "k"]


def test_run_error_keeps_completed_discards_open() -> None:
    replay = play(run_started(), *reasoning("done", "d"), enc("done", "kept"),
                  r_start("open-r"), r_content("open-r", "partial"), enc("open-r", "lost-r"),
                  t_start("open-t"), enc("open-t", "lost-t"),
                  r_chunk(messageId="chunked", delta="c"),
                  run_error("crash", code="E1"))
    line = 12
    assert replay.failures == []
    assert sorted(replay.warnings) == [(line, "incomplete_at_error")] * 2
    assert replay.losses == [(line, "incomplete_at_error")] * 2
    concluded = replay.concluded[0]
    assert concluded.outcome.value == "error"
    assert concluded.error == {"message": "crash", "code": "E1"}
    assert concluded.messages == [
        {"id": "done", "role": "reasoning", "content": "d", "encryptedValue": "kept"},
        {"id": "chunked", "role": "reasoning", "content": "c"},  # chunk lanes close first
    ]


def test_run_error_with_open_tool_call() -> None:
    replay = play(
        run_started(),
        *text("a1", "let me look"),
        tc_start("kept", parentMessageId="a1"), tc_end("kept"),
        tc_start("open1", parentMessageId="a1"), enc("open1", "v1", subtype="tool-call"),
        tc_start("open2"), tc_args("open2", "{"),  # host message 'open2' holds only this call
        enc("open2", "v2", subtype="tool-call"), enc("open2", "v3"),  # value on the host too
        run_error(),
    )
    line = 13
    assert replay.warnings == [(line, "incomplete_at_error")] * 2
    assert replay.losses == [(line, "incomplete_at_error")] * 3
    assert replay.messages == [
        {"id": "a1", "role": "assistant", "content": "let me look",
         "toolCalls": [{"id": "kept", "type": "function",
                        "function": {"name": "lookup", "arguments": ""}}]},
    ]


def test_abandon_fails_run_and_loses_held_values() -> None:
    engine = KeyEngine()
    play(run_started(), *reasoning("m", "x"), enc("m", "v"), tc_start("c"),
         enc("c", "w", subtype="tool-call"), engine=engine)
    step = engine.abandon()
    kinds = [type(d) for d in step.decisions]
    assert kinds == [EncryptedLost, EncryptedLost, Failed]
    assert all(d.reason.value == "run_abandoned" for d in step.decisions[:2])  # type: ignore[union-attr]
    failed = step.decisions[-1]
    assert isinstance(failed, Failed) and failed.code.value == "run_abandoned"
    assert failed.run is not None and failed.run.run_id == "r1"
    assert engine.state.run is None  # state freed
    assert not engine.abandon().decisions
    replay = play(custom(), run_started("r2"), run_finished("r2"), engine=engine)
    assert replay.discarded == 1 and replay.concluded[0].outcome.value == "success"


def test_delta_after_abandon_is_discarded() -> None:
    # The engine keeps where a key's bare deltas stream to; abandoning drops it.
    engine = KeyEngine()
    play(run_started(), r_start("m"), r_content("m", "a"), r_content("m", "b"), engine=engine)
    engine.abandon()
    replay = play(r_content("m", "c"), run_started("r2"), *reasoning("m", "d"),
                  run_finished("r2"), engine=engine)
    assert replay.discarded == 1
    assert replay.messages == [{"id": "m", "role": "reasoning", "content": "d"}]


def test_abandon_without_run_decides_nothing() -> None:
    engine = KeyEngine()
    assert not engine.abandon().decisions
    play(*in_run(), engine=engine)
    assert not engine.abandon().decisions


def test_several_runs_messages_accumulate_across_runs() -> None:
    replay = play(*in_run(span_start("s"), *reasoning("m", "one"), span_end("s")),
                  *in_run(span_start("s"), span_end("s"), enc("m", "v"), run="r2"))
    assert replay.warnings == []
    assert [c.outcome.value for c in replay.concluded] == ["success", "success"]
    assert replay.concluded[0].messages == [{"id": "m", "role": "reasoning", "content": "one"}]
    assert replay.concluded[1].messages == []  # no whole message: a continuation of "m"
    assert [(e.kind, e.message) for e in replay.concluded[1].entries] == [
        ("continuation", {"id": "m", "role": "reasoning", "encryptedValue": "v"})]


# =====================================================================================
# 4. Spans, reasoning messages, chunks, text, tool calls, owners
# =====================================================================================


def test_span_open_close_and_codes() -> None:
    finished_clean(play_run(span_start("s"), span_end("s"), span_start("s"), span_end("s")))
    fails_at(play_run(span_start("s"), span_start("s")), 3, "span_already_open")
    fails_at(play_run(span_end("s")), 2, "span_not_open")
    fails_at(play_run(span_start("s"), span_end("s"), span_end("s")), 4, "span_not_open")


def test_span_holds_several_messages_nesting_not_enforced() -> None:
    messages = finished_clean(play_run(
        r_start("early"), span_start("s"), r_content("early", "a"),
        *reasoning("m1", "b"), *reasoning("m2", "c"), span_end("s"), r_end("early")))
    assert [m["id"] for m in messages] == ["early", "m1", "m2"]


def test_span_ids_namespace_nothing() -> None:
    fails_at(play_run(span_start("x"), r_content("x", "orphan")), 3, "message_not_open")
    fails_at(play_run(span_start("x"), r_end("x")), 3, "message_not_open")
    fails_at(play_run(r_start("x"), r_end("x"), span_end("x")), 4, "span_not_open")
    messages = finished_clean(play_run(span_start("x"), *reasoning("x", "ok"), span_end("x"),
                                       enc("x", "v")))
    assert messages == [{"id": "x", "role": "reasoning", "content": "ok", "encryptedValue": "v"}]


@pytest.mark.parametrize("role", [1, True, ["reasoning"]])
def test_reasoning_start_role_fixed(role: Any) -> None:
    fails_at(play_run(r_start("m", role=role)), 2, "malformed_event")


def test_reasoning_start_role_required() -> None:
    event = r_start("m")
    del event["role"]
    fails_at(play_run(event), 2, "malformed_event")


def test_reasoning_message_codes() -> None:
    fails_at(play_run(r_start("m"), r_start("m")), 3, "message_already_open")
    fails_at(play_run(r_content("m", "x")), 2, "message_not_open")
    fails_at(play_run(r_end("m")), 2, "message_not_open")
    fails_at(play_run(*reasoning("m", "x"), r_content("m", "y")), 5, "message_not_open")


def test_interleaved_and_reopened_reasoning_messages() -> None:
    messages = finished_clean(play_run(
        r_start("a"), r_start("b"), r_content("a", "1"), r_content("b", "x"),
        r_content("a", "2"), r_end("a"), r_end("b"),
        r_start("a"), r_content("a", "3"), r_end("a")))
    assert messages == [{"id": "a", "role": "reasoning", "content": "123"},
                        {"id": "b", "role": "reasoning", "content": "x"}]


# --- chunks -------------------------------------------------------------------------


def test_chunk_expands_start_content_and_continues() -> None:
    messages = finished_clean(play_run(
        r_chunk(messageId="c", delta="a"), r_chunk(delta="b"), r_chunk(messageId="c", delta="c"),
        r_chunk(messageId="c"), r_chunk(delta="d")))
    assert messages == [{"id": "c", "role": "reasoning", "content": "abcd"}]


def test_chunk_without_delta_opens_empty_message() -> None:
    messages = finished_clean(play_run(r_chunk(messageId="c")))
    assert messages == [{"id": "c", "role": "reasoning", "content": ""}]


def test_first_chunk_needs_id() -> None:
    fails_at(play_run(r_chunk(delta="x")), 2, "chunk_without_id")
    fails_at(play_run(t_chunk(delta="x")), 2, "chunk_without_id")
    fails_at(play_run(tc_chunk(delta="x", toolCallName="f")), 2, "chunk_without_id")
    fails_at(play_run(r_chunk(delta="x", subagentRunId="s")), 2, "chunk_without_id")


def test_tool_chunk_without_name_is_chunk_without_id() -> None:
    fails_at(play_run(tc_chunk(toolCallId="c", delta="{}")), 2, "chunk_without_id")


def test_chunk_different_id_closes_previous() -> None:
    messages = finished_clean(play_run(
        r_chunk(messageId="a", delta="1"), r_chunk(messageId="b", delta="2"),
        r_start("a"), r_content("a", "3"), r_end("a")))  # 'a' was closed: re-open continues
    assert messages == [{"id": "a", "role": "reasoning", "content": "13"},
                        {"id": "b", "role": "reasoning", "content": "2"}]


@pytest.mark.parametrize(
    "between",
    [
        r_chunk(messageId="c", delta=""),
        r_chunk(delta=""),
        enc("c", "v"),
        raw_event(),
        act_snap("act", {"a": 1}),
        act_delta("act", [{"op": "add", "path": "/b", "value": 2}]),
        sub_started("other"),
        {"type": "FUTURE_EVENT"},  # dropped before expansion: closes nothing
    ],
    ids=["empty-delta-same-id", "empty-delta", "encrypted", "raw", "activity-snapshot",
         "activity-delta", "subagent-started", "unknown-type"],
)
def test_events_that_do_not_close_a_chunk(between: dict[str, Any]) -> None:
    tail = [sub_finished("other")] if between["type"] == "SUBAGENT_STARTED" else []
    replay = play_run(act_snap("act", {}), r_chunk(messageId="c", delta="a"), between,
                      r_chunk(delta="b"), *tail)
    assert replay.failures == []
    assert replay.by_id()["c"]["content"] == "ab"


@pytest.mark.parametrize(
    "between",
    [custom(), r_start("x"), span_start("s"), t_start("t"), tc_start("k"), step_started("p"),
     {"type": "STATE_SNAPSHOT", "snapshot": {}}, t_chunk(messageId="t"),
     tc_chunk(toolCallId="k", toolCallName="f"), r_chunk(messageId="other")],
    ids=lambda e: e["type"] + ("-" + e.get("messageId", e.get("toolCallId", ""))),
)
def test_other_events_in_the_lane_close_the_chunk(between: dict[str, Any]) -> None:
    replay = play_run(r_chunk(messageId="c", delta="a"), between, r_chunk(delta="b"))
    if between["type"] == "REASONING_MESSAGE_CHUNK":
        assert replay.failures == []  # id-less chunk continues the new item
        assert replay.by_id()["other"]["content"] == "b"
        return
    fails_at(replay, 4, "chunk_without_id")


def test_closing_event_gets_synthesized_end_before_it() -> None:
    # REASONING_MESSAGE_END for the chunk item itself: the synthesized END came
    # first, so this END names a message that is no longer open.
    fails_at(play_run(r_chunk(messageId="c", delta="a"), r_end("c")), 3, "message_not_open")
    # ... and a CONTENT for it too.
    fails_at(play_run(r_chunk(messageId="c", delta="a"), r_content("c", "b")), 3,
             "message_not_open")


def test_event_in_another_lane_does_not_close() -> None:
    replay = play_run(r_chunk(messageId="c", delta="a"), custom(subagentRunId="s"),
                      r_chunk(delta="b"))
    assert replay.failures == []
    assert replay.by_id()["c"]["content"] == "ab"


@pytest.mark.parametrize("closer", [snapshot(), run_error()], ids=["snapshot", "run-error"])
def test_snapshot_and_run_events_close_all_lanes(closer: dict[str, Any]) -> None:
    replay = play(run_started(), r_chunk(messageId="p", delta="a"),
                  r_chunk(messageId="s", delta="b", subagentRunId="sub"), closer,
                  r_chunk(delta="c", subagentRunId="sub"))
    if closer["type"] == "RUN_ERROR":
        assert replay.concluded[0].messages == [
            {"id": "p", "role": "reasoning", "content": "a"},
            {"id": "s", "role": "reasoning", "content": "b", "subagentRunId": "sub"}]
        fails_at(replay, 5, "run_already_ended")
    else:
        fails_at(replay, 5, "chunk_without_id")


def test_chunk_lanes_parent_first_then_only_lane_then_ambiguous() -> None:
    # parent pending: an untagged id-less chunk goes to the parent even with other lanes
    replay = play_run(r_chunk(messageId="s1", delta="x", subagentRunId="A"),
                      r_chunk(messageId="p", delta="1"), r_chunk(delta="2"))
    assert replay.by_id()["p"]["content"] == "12"
    # only one lane pending: the continuation goes there
    replay = play_run(r_chunk(messageId="s1", delta="x", subagentRunId="A"), r_chunk(delta="y"))
    assert replay.by_id()["s1"] == {"id": "s1", "role": "reasoning", "content": "xy",
                                    "subagentRunId": "A"}
    # several lanes, none the parent: ambiguous
    fails_at(play_run(r_chunk(messageId="a", delta="x", subagentRunId="A"),
                      r_chunk(messageId="b", delta="y", subagentRunId="B"),
                      r_chunk(delta="z")), 4, "chunk_ambiguous")
    # lanes pending only of another kind: no candidate
    fails_at(play_run(t_chunk(messageId="t", delta="x", subagentRunId="A"), r_chunk(delta="z")),
             3, "chunk_without_id")


def test_tagged_chunk_continues_its_own_lane() -> None:
    messages = finished_clean(play_run(
        r_chunk(messageId="a", delta="1", subagentRunId="A"),
        r_chunk(messageId="b", delta="x", subagentRunId="B"),
        r_chunk(delta="2", subagentRunId="A"), r_chunk(delta="y", subagentRunId="B")))
    assert [(m["id"], m["content"]) for m in messages] == [("a", "12"), ("b", "xy")]


# One item pending in each lane: x0 in the parent's, x1 in sub-1's, x2 in sub-2's.
_LANE_ITEMS = {"x0": None, "x1": "sub-1", "x2": "sub-2"}


def _chunk_of(kind: str, item_id: str | None, delta: str, tag: str | None,
              first: bool = False) -> dict[str, Any]:
    fields: dict[str, Any] = {"delta": delta}
    if item_id is not None:
        fields["toolCallId" if kind == "tool" else "messageId"] = item_id
    if first and kind == "tool":
        fields["toolCallName"] = "lookup"
    if tag is not None:
        fields["subagentRunId"] = tag
    return {"reasoning": r_chunk, "text": t_chunk, "tool": tc_chunk}[kind](**fields)


def _item_texts(kind: str, messages: list[dict[str, Any]]) -> dict[str, str]:
    if kind == "tool":
        return {call["id"]: call["function"]["arguments"]
                for m in messages for call in m.get("toolCalls", [])}
    return {m["id"]: m["content"] for m in messages}


@pytest.mark.parametrize("kind", ["reasoning", "text", "tool"])
@pytest.mark.parametrize(
    ("tag", "item_id", "expected"),
    [
        # the tag of the lane that has the item pending: continues it
        ("sub-1", "x1", {"x0": "x0|0", "x1": "x1+|1", "x2": "x2|2"}),
        (None, "x0", {"x0": "x0+|0", "x1": "x1|1", "x2": "x2|2"}),
        # absent tag, another lane's item: continues that item, closes nothing
        (None, "x1", {"x0": "x0|0", "x1": "x1+|1", "x2": "x2|2"}),
        # another tag than the item's owner: owner_mismatch, not a second open
        ("sub-2", "x1", "owner_mismatch"),
        ("sub-1", "x0", "owner_mismatch"),
        ("sub-1", "x2", "owner_mismatch"),
        # a new id: closes the chunk's own lane's item and opens the new one there
        ("sub-1", "new", {"x0": "x0|0", "x1": "x1", "new": "+|1", "x2": "x2|2"}),
        (None, "new", {"x0": "x0", "new": "+|0", "x1": "x1|1", "x2": "x2|2"}),
        ("sub-3", "new", {"x0": "x0|0", "x1": "x1|1", "x2": "x2|2", "new": "+"}),
    ],
    ids=lambda v: repr(v) if not isinstance(v, dict) else "",
)
def test_chunk_id_names_one_item_whatever_the_lane(
    kind: str, tag: str | None, item_id: str, expected: dict[str, str] | str
) -> None:
    opened = [_chunk_of(kind, item, item, lane, first=True) for item, lane in _LANE_ITEMS.items()]
    chunk = _chunk_of(kind, item_id, "+", tag, first=item_id == "new")
    # Id-less continuations: each lane's pending item gets "|" and its lane's digit.
    then = [_chunk_of(kind, None, "|1", "sub-1"), _chunk_of(kind, None, "|2", "sub-2"),
            _chunk_of(kind, None, "|0", None)]
    replay = play_run(*opened, chunk, *then)
    if isinstance(expected, str):
        fails_at(replay, 5, expected)
        return
    assert replay.failures == [], replay.entries()
    assert _item_texts(kind, replay.messages) == expected
    owners = {m.get("subagentRunId") for m in replay.messages if kind != "tool"}
    assert kind == "tool" or owners == {None, "sub-1", "sub-2", *([tag] if tag else [])}


def test_chunk_of_another_lane_item_closed_by_an_end_is_not_open() -> None:
    # The END closed x1 while it was sub-1's pending item; a chunk naming it
    # expands to a CONTENT of a message that is not open.
    fails_at(play_run(r_chunk(messageId="x1", delta="a", subagentRunId="sub-1"), r_end("x1"),
                      r_chunk(messageId="x1", delta="b")), 4, "message_not_open")
    fails_at(play_run(r_chunk(messageId="x1", delta="a", subagentRunId="sub-1"), r_end("x1"),
                      r_chunk(delta="b", subagentRunId="sub-1")), 4, "message_not_open")


def test_issue_example_untagged_chunk_continues_the_subagent_item() -> None:
    messages = finished_clean(play_run(
        r_chunk(messageId="rm1", delta="a ", subagentRunId="sub-1"),
        r_chunk(messageId="rm1", delta="b ")))
    assert messages == [{"id": "rm1", "role": "reasoning", "content": "a b ",
                         "subagentRunId": "sub-1"}]


def test_explicit_start_then_chunk_same_id_is_second_open() -> None:
    fails_at(play_run(r_start("m"), r_chunk(messageId="m", delta="x")), 3,
             "message_already_open")
    fails_at(play_run(t_start("m"), t_chunk(messageId="m", delta="x")), 3,
             "message_already_open")
    fails_at(play_run(tc_start("c"), tc_chunk(toolCallId="c", toolCallName="lookup")), 3,
             "tool_call_already_open")


def test_text_chunk_conflict_on_role_or_name() -> None:
    fails_at(play_run(t_chunk(messageId="m", role="user", delta="a"),
                      t_chunk(messageId="m", role="assistant")), 3, "chunk_conflict")
    fails_at(play_run(t_chunk(messageId="m", name="bob", delta="a"), t_chunk(name="alice")),
             3, "chunk_conflict")
    messages = finished_clean(play_run(t_chunk(messageId="m", role="user", name="bob", delta="a"),
                                       t_chunk(role="user", name="bob", delta="b")))
    assert messages == [{"id": "m", "role": "user", "name": "bob", "content": "ab"}]


def test_tool_chunk_conflict_on_name() -> None:
    fails_at(play_run(tc_chunk(toolCallId="c", toolCallName="f"),
                      tc_chunk(toolCallName="g", delta="x")), 3, "chunk_conflict")


def test_tool_chunk_expansion_and_args() -> None:
    messages = finished_clean(play_run(
        *text("a1", "hi"),
        tc_chunk(toolCallId="c1", toolCallName="search", parentMessageId="a1", delta='{"q":'),
        tc_chunk(delta='"x"'), tc_chunk(toolCallId="c1", delta="}"),
        tc_chunk(toolCallId="c2", toolCallName="calc"),  # closes c1; own assistant message
        tc_chunk(delta="{}"),
    ))
    assert messages == [
        {"id": "a1", "role": "assistant", "content": "hi", "toolCalls": [
            {"id": "c1", "type": "function",
             "function": {"name": "search", "arguments": '{"q":"x"}'}}]},
        {"id": "c2", "role": "assistant", "toolCalls": [
            {"id": "c2", "type": "function", "function": {"name": "calc", "arguments": "{}"}}]},
    ]


def test_text_chunk_creates_message_with_role_and_name() -> None:
    messages = finished_clean(play_run(t_chunk(messageId="m", role="user", name="n", delta="q")))
    assert messages == [{"id": "m", "role": "user", "name": "n", "content": "q"}]


# --- text messages and tool calls -------------------------------------------------------


def test_text_message_codes() -> None:
    fails_at(play_run(t_start("m"), t_start("m")), 3, "message_already_open")
    fails_at(play_run(t_content("m", "x")), 2, "message_not_open")
    fails_at(play_run(*text("m", "x"), t_end("m")), 5, "message_not_open")


def test_text_and_reasoning_are_separate_namespaces() -> None:
    fails_at(play_run(r_start("m"), t_content("m", "x")), 3, "message_not_open")


@pytest.mark.parametrize("role", [3, False, ["user"]])
def test_text_message_role_closed_set(role: Any) -> None:
    fails_at(play_run(t_start("m", role=role)), 2, "malformed_event")


def test_text_message_role_default_and_given() -> None:
    messages = finished_clean(play_run(*text("a", "x"), *text("u", "y", role="user"),
                                       *text("s", "z", role="system", name="sys"),
                                       *text("d", "w", role="developer")))
    assert [(m["id"], m["role"]) for m in messages] == [
        ("a", "assistant"), ("u", "user"), ("s", "system"), ("d", "developer")]
    assert messages[2]["name"] == "sys"


def test_tool_call_codes() -> None:
    fails_at(play_run(tc_start("c"), tc_start("c")), 3, "tool_call_already_open")
    fails_at(play_run(tc_args("c", "x")), 2, "tool_call_not_open")
    fails_at(play_run(tc_end("c")), 2, "tool_call_not_open")
    fails_at(play_run(tc_start("c"), tc_end("c"), tc_args("c", "x")), 4, "tool_call_not_open")


def test_tool_call_hosts() -> None:
    messages = finished_clean(play_run(
        *text("a1", "hi"),
        tc_start("c1", parentMessageId="a1"), tc_args("c1", '{"a":'), tc_args("c1", "1}"),
        tc_end("c1"),
        tc_start("c2"), tc_end("c2"),  # no parent: a new assistant message with the call's id
        tc_start("c3", parentMessageId="new-parent"), tc_end("c3"),
    ))
    assert messages == [
        {"id": "a1", "role": "assistant", "content": "hi", "toolCalls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup",
                                                          "arguments": '{"a":1}'}}]},
        {"id": "c2", "role": "assistant", "toolCalls": [
            {"id": "c2", "type": "function", "function": {"name": "lookup", "arguments": ""}}]},
        {"id": "new-parent", "role": "assistant", "toolCalls": [
            {"id": "c3", "type": "function", "function": {"name": "lookup", "arguments": ""}}]},
    ]


def test_tool_result_placed_after_host_and_earlier_results() -> None:
    messages = finished_clean(play_run(
        *text("a1", "calling"),
        tc_start("c1", parentMessageId="a1"), tc_end("c1"),
        tc_start("c2", parentMessageId="a1"), tc_end("c2"),
        *text("later", "after the calls"),
        tc_result("r1", "c1", "one"),
        tc_result("r2", "c2", "two", role="tool"),
        tc_result("r3", "unknown-call", "three"),
    ))
    assert [m["id"] for m in messages] == ["a1", "r1", "r2", "later", "r3"]
    assert messages[1] == {"id": "r1", "role": "tool", "content": "one", "toolCallId": "c1"}


def test_tool_result_role_closed_set() -> None:
    fails_at(play_run(tc_result("r", "c", role=5)), 2, "malformed_event")


# --- owners ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("opener", "continuation"),
    [
        (span_start("x", subagentRunId="A"), span_end("x", subagentRunId="B")),
        (r_start("x", subagentRunId="A"), r_content("x", "d", subagentRunId="B")),
        (r_start("x", subagentRunId="A"), r_end("x", subagentRunId="B")),
        (t_start("x", subagentRunId="A"), t_content("x", "d", subagentRunId="B")),
        (tc_start("x", subagentRunId="A"), tc_args("x", "d", subagentRunId="B")),
        (tc_start("x", subagentRunId="A"), tc_end("x", subagentRunId="B")),
        (r_start("x"), r_content("x", "d", subagentRunId="B")),  # parent-owned
    ],
    ids=["span", "reasoning-content", "reasoning-end", "text", "tool-args", "tool-end",
         "parent-owned"],
)
def test_owner_mismatch(opener: dict[str, Any], continuation: dict[str, Any]) -> None:
    fails_at(play_run(opener, continuation), 3, "owner_mismatch")


@pytest.mark.parametrize(
    ("opener", "closer", "reopener"),
    [
        (span_start("x", subagentRunId="A"), span_end("x"), span_start("x", subagentRunId="B")),
        (r_start("x", subagentRunId="A"), r_end("x"), r_start("x", subagentRunId="B")),
        (t_start("x", subagentRunId="A"), t_end("x"), t_start("x", subagentRunId="B")),
        (tc_start("x", subagentRunId="A"), tc_end("x"), tc_start("x", subagentRunId="B")),
    ],
    ids=["span", "reasoning", "text", "tool"],
)
def test_tagged_reopen_under_another_subagent(opener: dict[str, Any], closer: dict[str, Any],
                                              reopener: dict[str, Any]) -> None:
    fails_at(play_run(opener, closer, reopener), 4, "owner_mismatch")


def test_absent_tag_never_disagrees_and_opener_keeps_ownership() -> None:
    messages = finished_clean(play_run(
        r_start("m", subagentRunId="A"), r_content("m", "a"), r_end("m"),
        r_start("m"), r_content("m", "b", subagentRunId="A"), r_end("m", subagentRunId="A")))
    assert messages == [{"id": "m", "role": "reasoning", "content": "ab", "subagentRunId": "A"}]


def test_owners_are_per_namespace() -> None:
    finished_clean(play_run(
        span_start("x", subagentRunId="A"), r_start("x", subagentRunId="B"),
        t_start("x2", subagentRunId="C"), tc_start("x", subagentRunId="D"),
        tc_end("x"), t_end("x2"), r_end("x", subagentRunId="B"),
        span_end("x", subagentRunId="A")))


def test_encrypted_value_is_never_owner_checked() -> None:
    messages = finished_clean(play_run(
        *reasoning("m", "x", subagentRunId="A"), enc("m", "v", subagentRunId="B"),
        tc_start("c", subagentRunId="A"), enc("c", "w", subtype="tool-call", subagentRunId="B"),
        tc_end("c")))
    assert messages[0]["encryptedValue"] == "v"
    assert messages[1]["toolCalls"][0]["encryptedValue"] == "w"


# =====================================================================================
# 5/6. Encrypted values and losses
# =====================================================================================


def test_encrypted_value_on_every_role_but_activity() -> None:
    replay = play_run(
        *reasoning("r", "x"), *text("a", "y"), *text("u", "q", role="user"),
        *text("s", "z", role="system"), *text("d", "w", role="developer"),
        tc_start("c"), tc_end("c"), tc_result("tm", "c", "res"),
        act_snap("act", {"a": 1}),
        *(enc(mid, f"v-{mid}") for mid in ("r", "a", "u", "s", "d", "c", "tm")),
        enc("act", "v-act"),
    )
    assert replay.warning_codes == ["encrypted_value_unknown_entity"]
    assert replay.loss_reasons == ["unknown_entity"]
    for message in replay.messages:
        if message["role"] == "activity":
            assert "encryptedValue" not in message
        else:
            assert message["encryptedValue"] == f"v-{message['id']}"


def test_encrypted_value_subtypes_target_their_namespace() -> None:
    replay = play_run(*text("a", "x"), tc_start("c", parentMessageId="a"), tc_end("c"),
                      enc("c", "v1"),  # a message named c? none
                      enc("a", "v2", subtype="tool-call"),  # a tool call named a? none
                      enc("c", "v3", subtype="tool-call"))
    assert replay.warning_codes == ["encrypted_value_unknown_entity"] * 2
    assert replay.messages[0]["toolCalls"][0]["encryptedValue"] == "v3"
    assert "encryptedValue" not in replay.messages[0]


def test_encrypted_value_last_wins_and_opens_or_closes_nothing() -> None:
    messages = finished_clean(play_run(
        r_start("m"), enc("m", "during"), r_content("m", "a"), r_end("m"), enc("m", "after"),
        tc_start("c"), enc("c", "x", subtype="tool-call"), enc("c", "y", subtype="tool-call"),
        tc_end("c")))
    assert messages[0]["encryptedValue"] == "after"
    assert messages[1]["toolCalls"][0]["encryptedValue"] == "y"


@pytest.mark.parametrize(
    "events",
    [
        [],  # never seen
        [span_start("m"), span_end("m")],  # seen only as a span id
        [act_snap("m", {})],  # an activity message
        [*text("m", "x"), snapshot()],  # removed by a snapshot: never resurrected
    ],
    ids=["never-seen", "span-only", "activity", "snapshot-removed"],
)
def test_encrypted_value_unknown_entity_warns_and_loses(events: list[dict[str, Any]]) -> None:
    replay = play_run(*events, enc("m", "v"))
    line = 2 + len(events)
    assert replay.warnings == [(line, "encrypted_value_unknown_entity")]
    assert replay.losses == [(line, "unknown_entity")]
    assert replay.failures == []
    assert replay.concluded[0].outcome.value == "success"
    assert all("encryptedValue" not in m for m in replay.messages)


def test_encrypted_value_before_entity_not_applied_later() -> None:
    replay = play_run(enc("m", "early"), *reasoning("m", "x"))
    assert replay.loss_reasons == ["unknown_entity"]
    assert replay.messages == [{"id": "m", "role": "reasoning", "content": "x"}]


ODD_VALUES = {
    "empty": "",
    "spaces": "  padded \t\n ",
    "controls": "\u0000\u0001\u001f\u007f",
    "separators": "\u2028\u2029",
    "decomposed": "e\u0301 vs \u00e9",
    "bom": "\ufeffbom",
    "emoji zwj": "👩‍👩‍👧‍👦🏳️‍🌈",
    "rtl": "\u202eRTL\u202c",
    "astral": "\U0001d11e\U00010348",
    "backslashes": '\\u00e9 \\" \\\\',
    "json-looking": '{"type":"RUN_ERROR","message":"x"}',
    "base64": "gAAAAB+/==",
    "noncharacter": "\ufffe\uffff",
    "long": "x" * 1_000_000 + "é",
}


@pytest.mark.parametrize("value", ODD_VALUES.values(), ids=ODD_VALUES.keys())
def test_encrypted_value_byte_identical(value: str) -> None:
    messages = finished_clean(play_run(*reasoning("m", "x"), enc("m", value),
                                       tc_start("c"), tc_end("c"),
                                       enc("c", value, subtype="tool-call")))
    assert messages[0]["encryptedValue"] == value
    assert messages[1]["toolCalls"][0]["encryptedValue"] == value
    assert orjson.dumps(messages[0]["encryptedValue"]) == orjson.dumps(value)


def test_encrypted_value_escaped_on_the_wire_is_decoded_exactly() -> None:
    raw = (b'{"type":"REASONING_ENCRYPTED_VALUE","subtype":"message","entityId":"m",'
           b'"encryptedValue":"\\u00e9\\ud83d\\ude00e\\u0301\\/"}')
    messages = finished_clean(play_run(*reasoning("m", "x"), raw))
    assert messages[0]["encryptedValue"] == "\u00e9\U0001f600e\u0301/"


def test_run_failed_loses_each_held_value_once() -> None:
    replay = play_run(*reasoning("m", "x"), enc("m", "1"), enc("m", "2"),  # replaced: held once
                      tc_start("c"), enc("c", "3", subtype="tool-call"), tc_end("c"),
                      *text("t", "y"), span_end("nope"))
    line = 2 + 3 + 2 + 3 + 3
    assert replay.failures == [(line, "span_not_open")]
    assert replay.losses == [(line, "run_failed")] * 2
    decisions = replay.steps[line - 1].decisions
    assert isinstance(decisions[-1], Failed)  # the concluding decision comes last


def test_retracted_value_is_not_held() -> None:
    replay = play_run(*reasoning("m", "x"), enc("m", "v"),
                      snapshot({"id": "m", "role": "reasoning", "content": "x"}),
                      span_end("nope"))
    assert replay.failure_codes == ["span_not_open"]
    assert replay.losses == []


# =====================================================================================
# 5. MESSAGES_SNAPSHOT
# =====================================================================================


def test_snapshot_replaces_in_place_appends_new_drops_unlisted() -> None:
    messages = finished_clean(play_run(
        *text("u1", "q", role="user"), *text("a1", "old answer"), *text("a2", "dropped"),
        snapshot({"id": "a1", "role": "assistant", "content": "new answer"},
                 {"id": "u1", "role": "user", "content": "q (edited)"},
                 {"id": "s9", "role": "system", "content": "appended"}),
        t_start("a3"), t_content("a3", "after"), t_end("a3")))
    assert messages == [
        {"id": "u1", "role": "user", "content": "q (edited)"},
        {"id": "a1", "role": "assistant", "content": "new answer"},
        {"id": "s9", "role": "system", "content": "appended"},
        {"id": "a3", "role": "assistant", "content": "after"},
    ]


def test_snapshot_retracts_and_replaces_encrypted_value() -> None:
    messages = finished_clean(play_run(
        *reasoning("r", "x"), enc("r", "old"), *text("a", "y"), enc("a", "old-a"),
        snapshot({"id": "a", "role": "assistant", "content": "y"},  # retracts
                 {"id": "r", "role": "reasoning", "content": "x", "encryptedValue": "new"})))
    assert messages == [{"id": "r", "role": "reasoning", "content": "x", "encryptedValue": "new"},
                        {"id": "a", "role": "assistant", "content": "y"}]


def test_snapshot_reasoning_survives_unless_snapshot_carries_reasoning() -> None:
    survives = finished_clean(play_run(
        r_chunk(messageId="r", delta="streamed"), enc("r", "v"), *text("a", "x"),
        snapshot({"id": "u", "role": "user", "content": "q"})))
    assert survives == [
        {"id": "r", "role": "reasoning", "content": "streamed", "encryptedValue": "v"},
        {"id": "u", "role": "user", "content": "q"}]
    replaced = finished_clean(play_run(
        *reasoning("r", "streamed"), snapshot({"id": "r2", "role": "reasoning", "content": "o"})))
    assert replaced == [{"id": "r2", "role": "reasoning", "content": "o"}]


def test_snapshot_activity_survives_unless_snapshot_carries_activity() -> None:
    survives = finished_clean(play_run(act_snap("act", {"s": 1}), snapshot()))
    assert survives == [{"id": "act", "role": "activity", "activityType": "plan",
                         "content": {"s": 1}}]
    replaced = finished_clean(play_run(
        act_snap("act", {"s": 1}),
        snapshot({"id": "act2", "role": "activity", "activityType": "t", "content": {}})))
    assert [m["id"] for m in replaced] == ["act2"]


def test_snapshot_never_drops_open_message_or_tool_call() -> None:
    messages = finished_clean(play_run(
        t_start("open-t"), t_content("open-t", "a"),
        r_start("open-r"), r_content("open-r", "b"),
        *text("host", "h"), tc_start("c1", parentMessageId="host"), tc_args("c1", "{"),
        tc_start("c0", parentMessageId="host"), tc_end("c0"),
        snapshot({"id": "other", "role": "reasoning", "content": "carried"},
                 {"id": "host", "role": "assistant", "content": "restated"}),
        t_content("open-t", "b"), t_end("open-t"),
        r_content("open-r", "c"), r_end("open-r"),
        tc_args("c1", "}"), tc_end("c1"),
    ))
    by_id = {m["id"]: m for m in messages}
    assert by_id["open-t"]["content"] == "ab"
    assert by_id["open-r"]["content"] == "bc"
    # the restated host keeps the still-streaming call, not the completed unlisted one
    assert by_id["host"]["content"] == "restated"
    assert [c["id"] for c in by_id["host"]["toolCalls"]] == ["c1"]
    assert by_id["host"]["toolCalls"][0]["function"]["arguments"] == "{}"


def test_snapshot_messages_and_tool_calls_become_entities() -> None:
    messages = finished_clean(play_run(
        snapshot({"id": "sys", "role": "system", "content": "s"},
                 {"id": "a", "role": "assistant", "toolCalls": [
                     {"id": "c", "type": "function",
                      "function": {"name": "f", "arguments": "{}"}}]},
                 {"id": "tm", "role": "tool", "content": "r", "toolCallId": "c"}),
        enc("sys", "v1"), enc("c", "v2", subtype="tool-call"), enc("tm", "v3"),
        tc_result("tm2", "c", "second")))
    assert messages == [
        {"id": "sys", "role": "system", "content": "s", "encryptedValue": "v1"},
        {"id": "a", "role": "assistant", "toolCalls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"},
             "encryptedValue": "v2"}]},
        {"id": "tm", "role": "tool", "content": "r", "toolCallId": "c", "encryptedValue": "v3"},
        {"id": "tm2", "role": "tool", "content": "second", "toolCallId": "c"},
    ]


def test_snapshot_tool_call_type_closed_set() -> None:
    fails_at(play_run(snapshot({"id": "a", "role": "assistant", "toolCalls": [
        {"id": "c", "type": 5, "function": {"name": "f", "arguments": ""}}]})),
        2, "malformed_event")


# =====================================================================================
# Activity, RUN_STARTED.input, section 7 outputs, metadata (section 9)
# =====================================================================================


def test_activity_snapshot_and_delta_build_activity_message() -> None:
    replay = play_run(
        act_snap("act", {"steps": ["a"]}, subagentRunId="S"),
        act_delta("act", [{"op": "add", "path": "/steps/-", "value": "b"},
                          {"op": "add", "path": "/done", "value": False}]),
        act_delta("act", [{"op": "test", "path": "/done", "value": True},  # fails: whole patch
                          {"op": "replace", "path": "/done", "value": "x"}]),
        act_snap("act", {"ignored": True}, replace=False),
        act_delta("missing", [{"op": "add", "path": "/x", "value": 1}]),
    )
    assert replay.warnings == [(4, "activity_patch_failed"), (6, "activity_unknown_message")]
    messages = replay.messages
    assert messages == [{"id": "act", "role": "activity", "activityType": "plan",
                         "content": {"steps": ["a", "b"], "done": False},
                         "subagentRunId": "S"}]
    replaced = finished_clean(play_run(act_snap("act", {"a": 1}), act_snap("act", {"b": 2})))
    assert replaced[0]["content"] == {"b": 2}


def test_run_started_input_tail_is_history_and_every_input_message_an_entity() -> None:
    replay = play(
        run_started(input={"threadId": "t1", "runId": "r1", "messages": [
            {"id": "old-r", "role": "reasoning", "content": "earlier", "encryptedValue": "e"},
            {"id": "old-u", "role": "user", "content": "q"}]}),
        enc("old-r", "again"), *text("a", "x"), run_finished())
    assert replay.warnings == []
    assert [(e.kind, e.message) for e in replay.concluded[0].entries] == [
        ("input", {"id": "old-u", "role": "user", "content": "q"}),
        ("continuation", {"id": "old-r", "role": "reasoning", "encryptedValue": "again"}),
        ("message", {"id": "a", "role": "assistant", "content": "x"})]


def test_concluded_carries_usage_and_messages_parse() -> None:
    usage = [{"provider": "p", "model": "m", "inputTokens": 3, "reasoningTokens": 2}]
    replay = play(run_started(), *reasoning("r", "x"), run_finished(usage=usage))
    concluded = replay.concluded[0]
    assert concluded.usage == usage and concluded.error is None
    assert concluded.run is not None and (concluded.run.thread_id, concluded.run.run_id) == (
        "t1", "r1")
    for message in concluded.messages:
        MESSAGE.validate_python(message)
    replay = play(run_started(), run_error("x", usage=usage))
    assert replay.concluded[0].usage == usage


def test_metadata_merges_key_by_key_into_message() -> None:
    messages = finished_clean(play_run(
        t_start("m", metadata={"a": 1, "nested": {"x": 1}}),
        t_content("m", "h", metadata={"b": 2, "nested": {"y": 2}}),
        t_content("m", "i"),
        t_end("m", metadata={"a": 3}),
        r_chunk(messageId="r", delta="x", metadata={"k": 1}), r_chunk(delta="y",
                                                                      metadata={"k": 2}),
        tc_start("c", metadata={"t": 1}), tc_args("c", "{}", metadata={"u": 2}),
        tc_end("c", metadata={"t": 3}),
    ))
    assert messages[0] == {"id": "m", "role": "assistant", "content": "hi",
                           "metadata": {"a": 3, "nested": {"y": 2}, "b": 2}}
    assert messages[1]["metadata"] == {"k": 2}
    assert messages[2]["toolCalls"][0]["metadata"] == {"t": 3, "u": 2}


# --- steps and subagents (section 9) ----------------------------------------------------


def test_steps_discipline() -> None:
    finished_clean(play_run(step_started("a"), step_started("b"), step_finished("a"),
                            step_finished("b"), step_started("a"), step_finished("a")))
    fails_at(play_run(step_started("a"), step_started("a")), 3, "step_already_open")
    fails_at(play_run(step_finished("a")), 2, "step_not_open")


def test_subagents_discipline() -> None:
    finished_clean(play_run(sub_started("s1"), sub_started("s2"), sub_finished("s1"),
                            sub_error("s2")))
    fails_at(play_run(sub_started("s"), sub_started("s")), 3, "subagent_already_open")
    fails_at(play_run(sub_finished("s")), 2, "subagent_not_open")
    fails_at(play_run(sub_started("s"), sub_error("s"), sub_error("s")), 4, "subagent_not_open")


# =====================================================================================
# Confidentiality, state
# =====================================================================================

SECRET = "TOP-SECRET-Ωmega"


def test_reasons_never_contain_encrypted_values_or_deltas() -> None:
    secret_runs: list[list[Any]] = [
        [*reasoning("m", SECRET), enc("m", SECRET), enc("nobody", SECRET),
         enc("m", SECRET, subtype="weird"), r_content("m", SECRET)],
        [r_chunk(messageId="c", delta=SECRET), r_chunk(delta=SECRET),
         enc("c", SECRET), tc_chunk(toolCallId="k", delta=SECRET)],
        [t_chunk(messageId="c", delta=SECRET, name="x"), t_chunk(delta=SECRET, name="y")],
        [tc_chunk(toolCallId="k", toolCallName="f", delta=SECRET),
         tc_chunk(toolCallName="g", delta=SECRET)],
        [enc("m", SECRET, subtype=5)],
        [t_content("m", SECRET, timestamp=SECRET)],
        [custom(metadata=SECRET)],
        [r_start("m"), enc("m", SECRET), r_content("m", SECRET), run_error(SECRET)],
        [tc_start("c"), tc_args("c", SECRET), tc_args("c", 5)],
    ]
    for events in secret_runs:
        replay = play_run(*events)
        assert replay.reasons, events
        for reason in replay.reasons:
            assert SECRET not in reason, reason
    engine = KeyEngine()
    play(run_started(), *reasoning("m", SECRET), enc("m", SECRET), engine=engine)
    for decision in engine.abandon().decisions:
        assert SECRET not in repr(decision)


def test_state_round_trip_mid_run() -> None:
    events = [run_started(), span_start("s"), r_chunk(messageId="c", delta="a"),
              *reasoning("m", "x"), enc("m", "v"), tc_start("k", subagentRunId="A"),
              tc_args("k", "{"), t_start("t", metadata={"a": 1}), t_content("t", "1"),
              tc_args("k", "x", subagentRunId="A"),
              t_content("t", "2", future=1), tc_args("k", "}"), tc_end("k"), t_end("t"),
              t_content("x", "orphan")]
    whole = play(*events)
    for cut in range(1, len(events)):
        content = InMemoryContentStore()
        first = KeyEngine(content=content)
        head = play(*events[:cut], engine=first)
        restored = KeyEngine(KeyState.from_json(first.state.to_json()), content)
        tail = play(*events[cut:], engine=restored)
        assert head.steps + tail.steps == whole.steps, cut


# A run's state as the engine stored it before messages lost their id list and
# empty `fields` their dict: the same bytes must load, continue and store again.
_STORED_MID_RUN = (
    b'{"phase":"active","run":{"thread":"t1","run":"r1","open":{"span":[],"reasoning":[],'
    b'"text":[],"tool":[],"step":[],"subagent":[]},"owners":{"span":{},"reasoning":{"b":"S"},'
    b'"text":{"a":null},"tool":{"c":null}},"lanes":[],"order":["a","res","b"],"messages":'
    b'[["a","assistant",{},"",0,[["c","lookup","",1,null,null]],null,null],'
    b'["res","tool",{"toolCallId":"c"},"ok",null,null,null,null],'
    b'["b","reasoning",{"subagentRunId":"S"},"",2,null,null,null]],"tools":{"c":"a"},'
    b'"slot":3,"warned":[]}}'
)


def test_stored_state_of_the_previous_layout_loads() -> None:
    events = [run_started(), t_start("a"), t_content("a", "hi"),
              tc_start("c", parentMessageId="a"), tc_args("c", "{}"), tc_end("c"), t_end("a"),
              r_start("b", subagentRunId="S"), r_content("b", "x", subagentRunId="S"),
              r_end("b"), tc_result("res", "c")]
    tail = [tc_result("res2", "c"), run_finished()]
    content = InMemoryContentStore()
    for slot, fragment in enumerate(("hi", "{}", "x")):
        content.fragments(slot).append(fragment)
    restored = KeyEngine(KeyState.from_json(_STORED_MID_RUN), content)
    assert restored.state.to_json() == _STORED_MID_RUN
    assert play(*tail, engine=restored).steps == play(*events, *tail).steps[len(events):]


def test_concluded_messages_are_independent_copies() -> None:
    replay = play_run(*text("m", "x", metadata={"a": 1}))
    concluded = replay.concluded[0]
    assert isinstance(concluded, Concluded)
    snapshot_before = copy.deepcopy(concluded.messages)
    play_run(*text("m", "y", metadata={"a": 2}))
    assert concluded.messages == snapshot_before
