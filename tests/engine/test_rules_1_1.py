"""The engine's AG-UI 1.1 rules (docs/rules.md), one focused test per rule: run
outcomes and late errors, messages accumulating across the runs of one key,
steps per owner, chunk conflicts, ownership of activity and snapshot messages,
activity warnings, tool results that name a message, reused subagents, the
input echo, encryptedValueType and the retired THINKING_* events."""

from __future__ import annotations

from typing import Any

import pytest

from processors.engine.decisions import Concluded
from processors.engine.engine import KeyEngine
from processors.engine.state import KeyState
from tests.engine_helpers import (
    MESSAGE,
    Replay,
    act_delta,
    act_snap,
    custom,
    enc,
    in_run,
    play,
    play_run,
    r_chunk,
    r_content,
    r_end,
    r_start,
    reasoning,
    run_error,
    run_finished,
    run_started,
    snapshot,
    span_end,
    span_start,
    step_finished,
    step_started,
    sub_finished,
    sub_started,
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


def entries(concluded: Concluded) -> list[tuple[str, dict[str, Any]]]:
    return [(entry.kind, entry.message) for entry in concluded.entries]


# --- outcomes and late errors (events/lifecycle, patterns/interrupt-resume) ------------


@pytest.mark.parametrize(("outcome", "ending", "detail"), [
    (None, "success", None),
    ({"type": "success"}, "success", None),
    ({"type": "success", "pendingToolCallIds": ["c1"]}, "success",
     {"pendingToolCallIds": ["c1"]}),
    ({"type": "interrupt", "interrupts": [{"id": "i1", "reason": "approval"}]}, "interrupt",
     {"interrupts": [{"id": "i1", "reason": "approval"}]}),
    ({"type": "cancelled"}, "cancelled", None),
])
def test_run_finished_keeps_its_outcome(outcome: dict[str, Any] | None, ending: str,
                                        detail: dict[str, Any] | None) -> None:
    fields = {} if outcome is None else {"outcome": outcome}
    replay = play(run_started(), *text("m", "x"), run_finished(**fields))
    concluded = replay.concluded[0]
    assert (concluded.outcome.value, concluded.detail) == (ending, detail)
    assert concluded.messages == [{"id": "m", "role": "assistant", "content": "x"}]


def test_an_unknown_outcome_is_stripped_and_reads_as_success() -> None:
    replay = play(run_started(), run_finished(outcome={"type": "postponed"}))
    assert replay.warning_codes == ["unknown_member"]
    assert replay.concluded[0].outcome.value == "success"


@pytest.mark.parametrize("outcome", [None, {"type": "cancelled"},
                                     {"type": "interrupt", "interrupts": [{"id": "i",
                                                                           "reason": "r"}]}])
def test_a_late_run_error_turns_the_closed_run_into_an_error(
        outcome: dict[str, Any] | None) -> None:
    fields = {} if outcome is None else {"outcome": outcome}
    replay = play(run_started(), *text("m", "x"), run_finished(**fields),
                  run_error("flush failed", code="IO"))
    first, late = replay.concluded
    assert not first.late and first.messages  # delivered, and stays delivered
    assert late.late and late.outcome.value == "error" and late.entries == []
    assert late.run == first.run and late.error == {"message": "flush failed", "code": "IO"}
    assert replay.warnings == [(6, "late_run_error")]
    assert replay.failures == []


def test_after_a_late_run_error_only_run_started() -> None:
    replay = play(run_started(), run_finished(), run_error("late"), run_error("later"))
    assert replay.failures == [(4, "run_already_ended")]
    replay = play(run_started(), run_finished(), run_error("late"), run_started("r2"),
                  run_finished("r2"))
    assert [c.outcome.value for c in replay.concluded] == ["success", "error", "success"]


def test_a_failed_run_keeps_its_identity_for_its_closing_record() -> None:
    replay = play(run_started(), r_content("m", "orphan"))
    failed = replay.steps[1].decisions[-1]
    assert failed.run is not None and failed.run.run_id == "r1"  # type: ignore[union-attr]


# --- messages accumulate across the runs of a key (events/lifecycle) -----------------


def two_runs(first: list[Any], second: list[Any]) -> Replay:
    return play(*in_run(*first), *in_run(*second, run="r2"))


def test_an_encrypted_value_for_an_earlier_runs_message_continues_it() -> None:
    replay = two_runs([*reasoning("m", "one")],
                      [enc("m", "v2", encryptedValueType="anthropic.redacted_thinking")])
    assert replay.warnings == [] and replay.losses == []
    assert entries(replay.concluded[1]) == [("continuation", {
        "id": "m", "role": "reasoning", "encryptedValue": "v2",
        "encryptedValueType": "anthropic.redacted_thinking"})]


def test_an_encrypted_value_for_an_earlier_runs_tool_call_continues_its_host() -> None:
    replay = two_runs([*text("a", "x"), tc_start("c", parentMessageId="a"), tc_end("c")],
                      [enc("c", "v", subtype="tool-call")])
    assert entries(replay.concluded[1]) == [("continuation", {
        "id": "a", "role": "assistant", "toolCalls": [{"id": "c", "encryptedValue": "v"}]})]


def test_re_streaming_an_earlier_message_appends_to_it() -> None:
    replay = two_runs([*text("m", "Hello")],
                      [t_start("m", role="user"), t_content("m", " again"), t_end("m")])
    assert entries(replay.concluded[1]) == [("continuation", {
        "id": "m", "role": "assistant", "content": " again"})]  # established role stands


def test_reopening_an_earlier_tool_call_appends_its_arguments() -> None:
    replay = two_runs([tc_start("c"), tc_args("c", '{"a":'), tc_end("c")],
                      [tc_start("c"), tc_args("c", "1}"), tc_end("c")])
    assert entries(replay.concluded[1]) == [("continuation", {
        "id": "c", "role": "assistant",
        "toolCalls": [{"id": "c", "function": {"arguments": "1}"}}]})]


def test_a_call_whose_parent_an_earlier_run_delivered_joins_it() -> None:
    replay = two_runs([*text("a", "x")], [tc_start("c2", parentMessageId="a"), tc_end("c2")])
    assert entries(replay.concluded[1]) == [("continuation", {
        "id": "a", "role": "assistant",
        "toolCalls": [{"id": "c2", "type": "function",
                       "function": {"name": "lookup", "arguments": ""}}]})]


def test_a_later_snapshot_restates_and_removes_earlier_messages() -> None:
    user = {"id": "u", "role": "user", "content": "q"}
    replay = two_runs([*text("a", "x"), *text("b", "y"), *reasoning("r", "z")],
                      [snapshot(user, {"id": "b", "role": "assistant", "content": "Y"})])
    assert entries(replay.concluded[1]) == [
        ("removal", {"id": "a"}),  # not listed: dropped
        ("message", user),
        ("message", {"id": "b", "role": "assistant", "content": "Y"}),  # restated in place
    ]  # reasoning "r" survives: the snapshot carries no reasoning message


def test_a_snapshot_that_carries_reasoning_removes_earlier_reasoning() -> None:
    replay = two_runs([*reasoning("r", "z")],
                      [snapshot({"id": "r2", "role": "reasoning", "content": "w"})])
    assert entries(replay.concluded[1])[0] == ("removal", {"id": "r"})


def test_a_failed_run_delivers_nothing_to_later_runs() -> None:
    replay = play(*in_run(*text("m", "x"), r_content("nope", "?")), *in_run(
        enc("m", "v"), run="r2"))
    assert replay.warning_codes == ["encrypted_value_unknown_entity"]


def test_the_key_index_survives_a_restore() -> None:
    engine = KeyEngine()
    play(*in_run(*text("m", "x")), engine=engine)
    restored = KeyEngine(KeyState.from_json(engine.state.to_json()))
    replay = play(*in_run(enc("m", "v"), run="r2"), engine=restored)
    assert entries(replay.concluded[0]) == [("continuation", {
        "id": "m", "role": "assistant", "encryptedValue": "v"})]


# --- steps per owner (events/subagents) ----------------------------------------------


def test_a_parent_and_a_subagent_may_each_have_a_step_of_one_name() -> None:
    replay = play_run(step_started("plan"), step_started("plan", subagentRunId="A"),
                      step_finished("plan", subagentRunId="A"), step_finished("plan"))
    assert replay.failures == [] and replay.concluded[0].outcome.value == "success"


def test_a_step_finished_closes_only_its_own_owners_step() -> None:
    replay = play_run(step_started("plan", subagentRunId="A"), step_finished("plan"))
    assert replay.failure_codes == ["owner_mismatch"]
    replay = play_run(step_started("plan"), step_finished("plan", subagentRunId="A"))
    assert replay.failure_codes == ["owner_mismatch"]
    replay = play_run(step_finished("plan", subagentRunId="A"))
    assert replay.failure_codes == ["step_not_open"]


def test_an_open_step_is_named_with_its_owner_at_finish() -> None:
    replay = play_run(step_started("plan", subagentRunId="A"))
    assert replay.failure_codes == ["open_at_finish"]
    assert "step 'plan' of subagent run 'A'" in replay.reasons[-1]


# --- chunk conflicts (patterns/streaming) ---------------------------------------------


@pytest.mark.parametrize(("opener", "continuation", "fails"), [
    ({"parentMessageId": "a"}, {"parentMessageId": "a"}, False),
    ({"parentMessageId": "a"}, {}, False),
    ({"parentMessageId": "a"}, {"parentMessageId": "b"}, True),
    ({}, {"parentMessageId": "a"}, True),  # the opener established "none"
    ({}, {"parentMessageId": ""}, False),  # "" names no message
])
def test_a_tool_chunk_continuation_may_repeat_only_its_openers_parent(
        opener: dict[str, Any], continuation: dict[str, Any], fails: bool) -> None:
    replay = play_run(*text("a", "x"),
                      tc_chunk(toolCallId="c", toolCallName="f", delta="{", **opener),
                      tc_chunk(toolCallId="c", delta="}", **continuation))
    assert replay.failure_codes == (["chunk_conflict"] if fails else [])


# --- ownership (events/subagents, events/activity, events/state) ----------------------


def test_an_activity_delta_under_another_owner_fails() -> None:
    patch = [{"op": "add", "path": "/x", "value": 1}]
    replay = play_run(act_snap("a", {}, subagentRunId="A"), act_delta("a", patch,
                                                                      subagentRunId="B"))
    assert replay.failure_codes == ["owner_mismatch"]
    replay = play_run(act_snap("a", {}, subagentRunId="A"), act_delta("a", patch))
    assert replay.failures == []  # an absent tag never disagrees
    replay = play_run(act_snap("a", {}, subagentRunId="A"), act_snap("a", {}),  # re-minted
                      act_delta("a", patch, subagentRunId="A"))
    assert replay.failure_codes == ["owner_mismatch"]


def test_a_snapshot_establishes_the_owner_of_its_messages() -> None:
    restated = {"id": "m", "role": "assistant", "content": "x", "subagentRunId": "A"}
    replay = play_run(snapshot(restated), t_start("m", subagentRunId="B"))
    assert replay.failure_codes == ["owner_mismatch"]
    replay = play_run(snapshot(restated), t_start("m", subagentRunId="A"), t_content("m", "y"),
                      t_end("m"))
    assert replay.failures == [] and replay.messages[0]["content"] == "xy"


# --- activity (events/activity, patterns/snapshots) ------------------------------------


def test_activity_warns_for_patches_that_do_not_apply_and_unknown_targets() -> None:
    replay = play_run(act_snap("a", {"n": 1}),
                      act_delta("a", [{"op": "test", "path": "/n", "value": 2}]),
                      act_delta("a", [{"op": "remove", "path": "/missing"}]),
                      act_delta("nope", [{"op": "add", "path": "/x", "value": 1}]),
                      act_delta("a", [{"op": "replace", "path": "", "value": [1]}]))
    assert replay.warnings == [(3, "activity_patch_failed"), (4, "activity_patch_failed"),
                               (5, "activity_unknown_message"), (6, "activity_patch_failed")]
    assert replay.messages[0]["content"] == {"n": 1}


def test_a_delta_retypes_the_activity_and_metadata_survives_a_replacing_snapshot() -> None:
    replay = play_run(act_snap("a", {"n": 1}, metadata={"k": 1}),
                      act_delta("a", [{"op": "replace", "path": "/n", "value": 2}],
                                activityType="progress", metadata={"j": 2}),
                      act_snap("a", {"n": 3}, metadata={"k": 9}),
                      act_snap("a", {"ignored": True}, replace=False, metadata={"z": 0}))
    assert replay.messages == [{"id": "a", "role": "activity", "activityType": "plan",
                                "content": {"n": 3}, "metadata": {"k": 9, "j": 2, "z": 0}}]


# --- tool results naming a message (events/tool-calls) --------------------------------


def test_a_result_named_after_its_parentless_call_takes_that_id() -> None:
    replay = play_run(tc_start("call_1", "search"), tc_args("call_1", "{}"), tc_end("call_1"),
                      tc_result("call_1", "call_1"))  # the AG-UI .NET SDK's shape
    assert replay.warnings == []
    assert replay.messages == [
        {"id": "call_1/assistant", "role": "assistant",
         "toolCalls": [{"id": "call_1", "type": "function",
                        "function": {"name": "search", "arguments": "{}"}}]},
        {"id": "call_1", "role": "tool", "toolCallId": "call_1", "content": "ok"},
    ]
    for message in replay.messages:
        MESSAGE.validate_python(message)


def test_a_result_naming_a_producers_message_is_dropped_with_a_warning() -> None:
    replay = play_run(*text("a", "x"), tc_start("c", parentMessageId="a"), tc_end("c"),
                      tc_result("a", "c"))
    assert replay.warning_codes == ["message_id_conflict"]
    assert replay.messages[0]["content"] == "x" and "toolCalls" in replay.messages[0]
    assert len(replay.messages) == 1


def test_a_restated_result_replaces_the_earlier_one_in_place() -> None:
    replay = play_run(tc_start("c"), tc_end("c"), tc_result("res", "c", "first"),
                      tc_result("res", "c", "second"))
    assert [m.get("content") for m in replay.messages] == [None, "second"]


def test_an_empty_parent_message_id_names_no_message() -> None:
    replay = play_run(tc_start("c", parentMessageId=""), tc_end("c"))
    assert [m["id"] for m in replay.messages] == ["c"]


# --- subagents -----------------------------------------------------------------------


def test_a_reused_subagent_id_warns_and_starts_a_new_invocation() -> None:
    replay = play_run(sub_started("A"), sub_finished("A"), sub_started("A"),
                      custom(subagentRunId="A"), sub_finished("A"))
    assert replay.warnings == [(4, "subagent_reused")]
    assert replay.failures == []


# --- the input echo (events/lifecycle, basic/run-input) -------------------------------


INPUT = [
    {"id": "sys", "role": "system", "content": "be brief"},
    {"id": "u1", "role": "user", "content": "first question"},
    {"id": "a1", "role": "assistant", "content": "answer",
     "toolCalls": [{"id": "c1", "type": "function",
                    "function": {"name": "f", "arguments": "{}"}}]},
    {"id": "t1", "role": "tool", "toolCallId": "c1", "content": "42"},
    {"id": "u2", "role": "user", "content": "and now?"},
]


def echo(messages: list[dict[str, Any]], run: str = "r1") -> dict[str, Any]:
    return run_started(run, input={"threadId": "t1", "runId": run, "messages": messages})


def test_the_input_messages_new_to_the_thread_come_first() -> None:
    replay = play(echo(INPUT), *text("a2", "reply"), run_finished())
    concluded = replay.concluded[0]
    assert entries(concluded) == [("input", INPUT[3]), ("input", INPUT[4]),
                                  ("message", {"id": "a2", "role": "assistant",
                                               "content": "reply"})]
    assert concluded.input_echoed is True


def test_every_input_message_is_an_entity_of_the_run() -> None:
    replay = play(echo(INPUT), enc("a1", "v"), enc("c1", "w", subtype="tool-call"),
                  enc("u2", "x"), run_finished())
    assert replay.warnings == []
    kinds = [(kind, message["id"]) for kind, message in entries(replay.concluded[0])]
    assert kinds == [("input", "t1"), ("message", "u2"), ("continuation", "a1")]


def test_a_first_turn_echo_is_all_new_and_a_key_never_republishes_what_it_holds() -> None:
    first = INPUT[:2]
    replay = play(echo(first), *text("a1", "answer"), run_finished(),
                  echo([*first, {"id": "a1", "role": "assistant", "content": "answer"},
                        {"id": "u2", "role": "user", "content": "more"}], "r2"),
                  run_finished("r2"))
    assert [kind for kind, _ in entries(replay.concluded[0])] == ["input", "input", "message"]
    assert entries(replay.concluded[1]) == [("input", {"id": "u2", "role": "user",
                                                       "content": "more"})]


def test_a_run_without_input_says_so() -> None:
    assert play(run_started(), run_finished()).concluded[0].input_echoed is False


# --- encryptedValueType (events/reasoning) --------------------------------------------


def test_the_value_type_rides_with_its_value_and_is_replaced_with_it() -> None:
    replay = play_run(*reasoning("m", "x"),
                      enc("m", "sig", encryptedValueType="anthropic.signature"),
                      enc("m", "new"))  # a new value without a type removes the type
    assert replay.messages[0]["encryptedValue"] == "new"
    assert "encryptedValueType" not in replay.messages[0]
    replay = play_run(*reasoning("m", "x"), enc("m", "v", encryptedValueType="t"))
    assert replay.messages[0]["encryptedValueType"] == "t"


def test_a_snapshot_carries_the_value_type_of_messages_and_tool_calls() -> None:
    message = {"id": "a", "role": "assistant", "encryptedValue": "v",
               "encryptedValueType": "t1",
               "toolCalls": [{"id": "c", "type": "function",
                              "function": {"name": "f", "arguments": "{}"},
                              "encryptedValue": "w", "encryptedValueType": "t2"}]}
    replay = play_run(snapshot(message))
    assert replay.warnings == [] and replay.messages == [message]


# --- retired THINKING_* events (basic/versioning, DEPRECATIONS.md) ---------------------


def test_thinking_events_are_translated_to_reasoning_with_minted_ids() -> None:
    replay = play_run({"type": "THINKING_START", "title": "plan"},
                      {"type": "THINKING_TEXT_MESSAGE_START"},
                      {"type": "THINKING_TEXT_MESSAGE_CONTENT", "delta": "hmm"},
                      {"type": "THINKING_TEXT_MESSAGE_CONTENT", "delta": " ok"},
                      {"type": "THINKING_TEXT_MESSAGE_END"},
                      {"type": "THINKING_END"})
    assert replay.failures == []
    assert replay.warning_codes == ["retired_shape"] * 5  # once per run per retired type
    assert replay.messages == [{"id": "r1/thinking-message-1", "role": "reasoning",
                                "content": "hmm ok"}]


def test_a_thinking_content_with_no_current_message_is_an_orphan() -> None:
    replay = play_run({"type": "THINKING_TEXT_MESSAGE_CONTENT", "delta": "x"})
    assert replay.failure_codes == ["message_not_open"]


def test_thinking_ids_are_the_same_on_a_replay() -> None:
    events = [span_start("s"), {"type": "THINKING_TEXT_MESSAGE_START"},
              {"type": "THINKING_TEXT_MESSAGE_CONTENT", "delta": "x"},
              {"type": "THINKING_TEXT_MESSAGE_END"}, span_end("s")]
    assert play_run(*events).messages == play_run(*events).messages


# --- chunks and reasoning stay as they were ----------------------------------------------


def test_a_reasoning_chunk_opens_a_message_continued_across_runs() -> None:
    replay = two_runs([r_chunk(messageId="m", delta="a")], [r_chunk(messageId="m", delta="b")])
    assert entries(replay.concluded[1]) == [("continuation", {
        "id": "m", "role": "reasoning", "content": "b"})]


def test_an_open_message_at_run_error_discards_only_what_the_run_added() -> None:
    replay = play(*in_run(*text("m", "kept")), run_started("r2"), t_start("m"),
                  t_content("m", " lost"), run_error())
    assert replay.warnings == [(9, "incomplete_at_error")]
    assert replay.concluded[1].entries == []


def test_r_start_on_an_earlier_text_message_continues_it_with_its_role() -> None:
    replay = two_runs([*text("m", "a")], [r_start("m"), r_content("m", "b"), r_end("m")])
    assert entries(replay.concluded[1]) == [("continuation", {
        "id": "m", "role": "assistant", "content": "b"})]


def test_a_run_id_mismatch_names_its_known_cause() -> None:
    replay = play(run_started(), run_finished(run="r-other"))
    assert replay.failure_codes == ["run_id_mismatch"]
    assert "LangGraph's AG-UI adapter before 0.0.38" in replay.reasons[-1]


def test_chunks_continuing_an_earlier_runs_message_may_repeat_what_it_established() -> None:
    replay = two_runs([t_start("m", name="bot"), t_content("m", "a"), t_end("m")],
                      [{"type": "TEXT_MESSAGE_CHUNK", "messageId": "m", "delta": "b"},
                       {"type": "TEXT_MESSAGE_CHUNK", "name": "bot", "delta": "c"}])
    assert replay.failures == []
    assert entries(replay.concluded[1]) == [("continuation", {
        "id": "m", "role": "assistant", "content": "bc"})]


def test_a_replace_false_snapshot_leaves_an_earlier_runs_activity_as_it_stands() -> None:
    replay = two_runs([act_snap("a", {"n": 1})], [act_snap("a", {"n": 2}, replace=False)])
    assert replay.concluded[1].entries == []


def test_an_unknown_event_type_is_named_when_it_looks_like_a_type() -> None:
    replay = play_run({"type": "FUTURE_EVENT"}, {"type": "a secret sentence, not a type"})
    assert "'FUTURE_EVENT'" in replay.reasons[0]
    assert "secret" not in replay.reasons[1] and "(not shown)" in replay.reasons[1]


def test_a_delivered_message_dropped_then_restated_in_one_run_goes_last() -> None:
    replay = two_runs([*reasoning("m1", "a")],
                      [snapshot({"id": "m2", "role": "reasoning", "content": "b"}),
                       snapshot({"id": "m1", "role": "reasoning", "content": "c"},
                                {"id": "m2", "role": "reasoning", "content": "b"})])
    assert [(kind, message["id"]) for kind, message in entries(replay.concluded[1])] == [
        ("removal", "m1"), ("message", "m2"), ("message", "m1")]


def test_a_restated_delivered_message_a_later_snapshot_drops_is_removed() -> None:
    replay = two_runs([*reasoning("m1", "a")],
                      [snapshot({"id": "m1", "role": "reasoning", "content": ""}),
                       snapshot({"id": "m2", "role": "reasoning", "content": "b"})])
    assert [(kind, message["id"]) for kind, message in entries(replay.concluded[1])] == [
        ("removal", "m1"), ("message", "m2")]
