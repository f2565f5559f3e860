"""The reference fold of a thread's history records (topics/history_fold.py): each
rule of docs/topics.md, *Folding the history topic*, and that no record makes it
raise."""

from __future__ import annotations

import copy
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.view_helpers import assistant, user
from topics.history_fold import FoldedThread, fold_history

ENVELOPE = {"schema": "agui.history.v2", "tenant": "acme", "threadId": "t1"}


def content(run_id: str, seq: int, kind: str, message: dict[str, Any]) -> dict[str, Any]:
    return {**ENVELOPE, "runId": run_id, "kind": kind, "seq": seq, "message": message}


def removal(run_id: str, seq: int, message_id: str) -> dict[str, Any]:
    return {**ENVELOPE, "runId": run_id, "kind": "removal", "seq": seq,
            "messageId": message_id}


def closing(run_id: str, **fields: Any) -> dict[str, Any]:
    return {**ENVELOPE, "runId": run_id, "kind": "run", "outcome": "success", **fields}


def messages(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return fold_history(records).messages


def test_a_message_replaces_the_held_one_in_place_or_is_appended() -> None:
    assert messages([content("r1", 0, "message", user("u1")),
                     content("r1", 1, "message", assistant("a1", "draft")),
                     content("r1", 2, "message", user("u2")),
                     content("r2", 0, "message", assistant("a1", "final"))]) == [
        user("u1"), assistant("a1", "final"), user("u2")]


def test_an_input_is_appended_only_when_its_id_is_not_held() -> None:
    assert messages([content("r1", 0, "input", user("u1", "first")),
                     content("r2", 0, "input", user("u1", "again")),
                     content("r2", 1, "input", user("u2"))]) == [
        user("u1", "first"), user("u2")]


def test_a_continuation_appends_content_and_arguments_and_merges_the_rest() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\""},
            "encryptedValue": "old", "encryptedValueType": "k1"}
    held = {"id": "a1", "role": "assistant", "content": "Hel", "toolCalls": [call],
            "encryptedValue": "v1", "encryptedValueType": "k1", "metadata": {"x": 1, "y": 2},
            "name": "bot"}
    addition = {"id": "a1", "role": "assistant", "name": "other", "content": "lo",
                "toolCalls": [{"id": "c1", "function": {"arguments": ": 1}"},
                               "encryptedValue": "new"},
                              {"id": "c2", "type": "function",
                               "function": {"name": "g", "arguments": "{}"}}],
                "encryptedValue": "v2", "encryptedValueType": "k2", "metadata": {"y": 3}}
    records = [content("r1", 0, "message", held), content("r2", 0, "continuation", addition)]
    before = copy.deepcopy(records)
    assert messages(records) == [{
        "id": "a1", "role": "assistant", "name": "bot", "content": "Hello",
        "toolCalls": [{"id": "c1", "type": "function",
                       "function": {"name": "f", "arguments": "{\"a\": 1}"},
                       "encryptedValue": "new"},  # a value without a type: the type goes
                      {"id": "c2", "type": "function",
                       "function": {"name": "g", "arguments": "{}"}}],
        "encryptedValue": "v2", "encryptedValueType": "k2", "metadata": {"x": 1, "y": 3}}]
    assert records == before  # nothing given to the fold is changed


def test_a_continuation_sets_a_type_only_with_a_value() -> None:
    held = {"id": "r", "role": "reasoning", "content": "a", "encryptedValue": "v",
            "encryptedValueType": "k"}
    only_type = {"id": "r", "role": "reasoning", "encryptedValueType": "k2"}
    assert messages([content("r1", 0, "message", held),
                     content("r2", 0, "continuation", only_type)]) == [held]


def test_a_continuation_of_a_message_not_held_is_appended_as_it_is() -> None:
    addition = {"id": "a1", "role": "assistant", "content": "more"}
    assert messages([content("r1", 0, "message", user("u1")),
                     content("r2", 0, "continuation", addition)]) == [user("u1"), addition]


def test_text_continues_content_parts_as_one_more_part() -> None:
    held = {"id": "u1", "role": "user", "content": [{"type": "text", "text": "a"}]}
    assert messages([content("r1", 0, "message", held),
                     content("r2", 0, "continuation", {"id": "u1", "role": "user",
                                                       "content": "b"})]) == [
        {"id": "u1", "role": "user", "content": [{"type": "text", "text": "a"},
                                                 {"type": "text", "text": "b"}]}]


def test_a_continuation_that_cannot_apply_is_ignored() -> None:
    activity = {"id": "act", "role": "activity", "activityType": "p", "content": {"s": 1}}
    odd_call = {"id": "a1", "role": "assistant",
                "toolCalls": [{"id": "c1", "function": {"name": "f"}}]}
    assert messages([
        content("r1", 0, "message", activity), content("r1", 1, "message", odd_call),
        content("r2", 0, "continuation", {"id": "act", "role": "activity", "content": "x"}),
        content("r2", 1, "continuation", {"id": "a1", "role": "assistant", "toolCalls": [
            {"id": "c1", "function": {"arguments": "x"}}]}),
        content("r2", 2, "continuation", {"id": "a1", "role": "assistant", "content": 7}),
    ]) == [activity, odd_call]


def test_a_removal_removes_and_the_id_sent_again_is_appended() -> None:
    assert messages([content("r1", 0, "message", user("u1")),
                     content("r1", 1, "message", assistant("a1")),
                     content("r1", 2, "message", user("u2")),
                     removal("r2", 0, "a1"), removal("r2", 1, "nothing"),
                     content("r3", 0, "message", assistant("a1", "back"))]) == [
        user("u1"), user("u2"), assistant("a1", "back")]


def test_a_content_record_seen_before_changes_nothing() -> None:
    run = [content("r1", 0, "message", user("u1")),
           content("r1", 1, "continuation", {"id": "u1", "role": "user", "content": "!"}),
           removal("r1", 2, "u0")]
    later = content("r2", 0, "message", user("u0"))
    assert messages([*run, later, *run]) == [user("u1", "hi!"), user("u0")]


def test_the_last_closing_record_is_the_runs_fate_and_a_late_error_is_final() -> None:
    folded = fold_history([
        closing("r1", messageCount=2, pendingToolCallIds=["c1"], inputEchoed=False),
        closing("r2", outcome="failed", messageCount=0, failure={"code": "orphan_event"}),
        closing("r1", outcome="error", late=True, error={"message": "boom"}),
        closing("r1", messageCount=2, pendingToolCallIds=["c1"]),  # a duplicate, after
        closing("r2", outcome="failed", messageCount=0, failure={"code": "orphan_event"},
                inputEchoed=True),
    ])
    assert folded.runs == {
        "r1": {"outcome": "error", "late": True, "error": {"message": "boom"},
               "messageCount": 2, "inputEchoed": False},
        "r2": {"outcome": "failed", "messageCount": 0, "failure": {"code": "orphan_event"},
               "inputEchoed": True},
    }
    assert list(folded.runs) == ["r1", "r2"]


def test_v1_records_fold_as_their_v2_equivalent() -> None:
    v1 = {"schema": "agui.history.v1", "tenant": "acme", "threadId": "t1", "runId": "r1"}
    folded = fold_history([
        {**v1, "kind": "message", "seq": 0, "message": user("u1")},
        {**v1, "kind": "run", "outcome": "finished", "messageCount": 1,
         "usage": [{"t": 1}]},
        {**v1, "runId": "r2", "kind": "message", "seq": 0, "message": user("u1", "v2")},
        {**v1, "runId": "r2", "kind": "run", "outcome": "error", "messageCount": 1,
         "error": {"message": "x"}},
        {**v1, "kind": "input", "seq": 1, "message": user("u9")},  # no such v1 kind
        {**v1, "runId": "r3", "kind": "run", "outcome": "success", "messageCount": 0},
    ])
    assert folded == FoldedThread([user("u1", "v2")], {
        "r1": {"outcome": "success", "messageCount": 1, "usage": [{"t": 1}]},
        "r2": {"outcome": "error", "messageCount": 1, "error": {"message": "x"}}})


def test_records_of_no_thread_or_run_and_malformed_ones_are_ignored() -> None:
    good = content("r1", 0, "message", user("u1"))
    folded = fold_history([
        {**good, "threadId": None}, {k: v for k, v in good.items() if k != "runId"},
        {**good, "seq": True}, {**good, "seq": -1}, {**good, "schema": "agui.history.v3"},
        {**good, "message": {"role": "user"}}, {**good, "kind": ["message"]},
        {**closing("r1"), "outcome": "finished"}, {**closing("r1"), "outcome": []},
        {**closing("r1"), "messageCount": "2"}, {**closing("r1"), "late": 1},
        {**closing("r1"), "failure": {}}, "not a record", None,
    ])
    assert folded == FoldedThread()


def test_the_fold_accepts_only_what_accept_does() -> None:
    records = [content("r1", 0, "message", user("u1")),
               content("r1", 1, "message", {"id": "x", "role": "?"}),
               content("r2", 0, "continuation", {"id": "u1", "role": "user", "content": "!"})]
    assert fold_history(records, lambda m: m["role"] == "user"
                        and m["content"] == "hi").messages == [user("u1")]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(["id", "role", "content", "toolCalls", "function",
                                       "arguments", "encryptedValue", "encryptedValueType",
                                       "metadata"]) | st.text(max_size=3),
                      children, max_size=4),
    max_leaves=10,
)
BASES = [content("r1", 0, kind, user("u1")) for kind in ("message", "input", "continuation")]
BASES += [removal("r1", 0, "u1"), closing("r1", messageCount=1)]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(
    JSON,
    st.builds(lambda base, fields: {**base, **fields}, st.sampled_from(BASES),
              st.dictionaries(st.sampled_from(["schema", "kind", "seq", "message", "messageId",
                                               "runId", "threadId", "outcome", "late",
                                               "messageCount", "inputEchoed"]),
                              JSON, max_size=3))), max_size=10))
def test_no_record_makes_the_fold_raise(records: list[Any]) -> None:
    prefix = [content("r0", 0, "message", {
        "id": "u1", "role": "user", "content": "x", "toolCalls": [
            {"id": "c", "function": {"arguments": "1"}}], "metadata": {"a": 1}})]
    before = orjson.dumps(records)
    folded = fold_history(prefix + records)
    assert isinstance(folded.messages, list) and isinstance(folded.runs, dict)
    assert orjson.dumps(records) == before


def erasure(**fields: Any) -> dict[str, Any]:
    return {**ENVELOPE, "kind": "erasure", "erasedAt": 1, **fields}


def test_an_erasure_drops_everything_before_it_and_later_records_start_afresh() -> None:
    first = [content("r1", 0, "message", user("u1")), closing("r1", messageCount=1)]
    folded = fold_history([*first, erasure(), content("r2", 0, "message", user("u2")),
                           closing("r2", messageCount=1), *first])
    assert folded.messages == [user("u2"), user("u1")]  # r1 again: new after the erasure
    assert list(folded.runs) == ["r2", "r1"]
    assert fold_history([*first, erasure()]) == FoldedThread()


def test_an_erasure_that_names_no_thread_or_time_or_is_v1_is_ignored() -> None:
    first = [content("r1", 0, "message", user("u1"))]
    for bad in (erasure(threadId=None), erasure(erasedAt="now"),
                erasure(schema="agui.history.v1")):
        assert messages([*first, bad]) == [user("u1")]
