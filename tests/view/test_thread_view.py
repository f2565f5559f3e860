"""The thread view on plain dicts, no broker: order, replacement in place, runs,
replays, write-behind, retention, reloading, and poison input."""

from __future__ import annotations

from typing import Any

import orjson
from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.view.thread_view import (
    NOTHING_READ,
    Missing,
    RunStatus,
    ThreadView,
    header_key,
    history_partition,
    message_index_key,
    message_key,
    read_offset_key,
    run_key,
    thread_key,
)
from tests.memory_helpers import bytes_left_allocated
from tests.view_helpers import (
    HISTORY,
    RETENTION,
    T0,
    History,
    Store,
    as_input,
    assistant,
    closing_value,
    continued,
    feed,
    removed,
    user,
)
from topics.records import HistoryErasure, HistoryMessage, HistoryRun
from topics.tenant_topics import Template

DAY = 86_400.0


def ids(view: ThreadView, thread: str = "t1", tenant: str = "acme",
        after: str | None = None) -> list[str]:
    messages = view.messages(tenant, thread, after)
    assert not isinstance(messages, Missing), messages
    return [message["id"] for message in messages]


# --- the view ------------------------------------------------------------------------


def test_a_stored_message_keeps_no_more_memory_than_its_size() -> None:
    """The view kept each message, run summary and header as `orjson.dumps` returned
    them, each with the 4 KB buffer it was written in (allocations counted by
    tracemalloc, for 500 short messages and their runs)."""
    history, view = History(), Store().view()

    def apply_runs() -> ThreadView:
        for number in range(500):
            feed(view, history.run(f"t{number}", f"r{number}", [user(f"u{number}")]))
        return view

    assert bytes_left_allocated(apply_runs) / 500 < 4_000


def test_messages_of_successive_runs_follow_each_other() -> None:
    history, view = History(), Store().view()
    feed(view, history.run("t1", "r1", [user("m1"), assistant("m2")]))
    feed(view, history.run("t1", "r2", [user("m3"), assistant("m4")], at=T0 + 1000))
    assert ids(view) == ["m1", "m2", "m3", "m4"]
    assert view.runs("acme", "t1") == [
        {"runId": "r1", "outcome": "success", "messageCount": 2,
         "firstTime": T0, "lastTime": T0 + 5},
        {"runId": "r2", "outcome": "success", "messageCount": 2,
         "firstTime": T0 + 1000, "lastTime": T0 + 1005},
    ]
    assert view.counts.applied == 6


def test_a_message_seen_again_replaces_its_earlier_version_in_place() -> None:
    store, history = Store(), History()
    view = store.view()
    feed(view, history.run("t1", "r1", [user("m1"), assistant("m2", "draft")]))
    store.commit(view)
    feed(view, history.run("t1", "r2", [assistant("m2", "final"), user("m3")]))
    messages = view.messages("acme", "t1")
    assert isinstance(messages, list)
    assert [(m["id"], m["content"]) for m in messages] == [
        ("m1", "hi"), ("m2", "final"), ("m3", "hi")]
    # The replacement rewrote the one message entry, not the thread.
    thread = thread_key("acme", "t1")
    written = {change.key for change in store.commit(view)}
    assert message_key(thread, 1) in written
    assert message_key(thread, 0) not in written


def test_runs_that_ended_in_error_contribute_their_message_records() -> None:
    history, view = History(), Store().view()
    feed(view, history.run("t1", "r1", [user("m1")], outcome="error"))
    assert ids(view) == ["m1"]
    runs = view.runs("acme", "t1")
    assert isinstance(runs, list) and runs[0]["outcome"] == "error"


def test_a_run_published_twice_keeps_one_summary_and_one_copy_of_each_message() -> None:
    history, view = History(), Store().view()
    run = [user("m1"), assistant("m2")]
    feed(view, history.run("t1", "r1", run))
    feed(view, history.run("t1", "r1", run, at=T0 + 50))  # at-least-once duplicate
    assert ids(view) == ["m1", "m2"]
    runs = view.runs("acme", "t1")
    assert isinstance(runs, list) and [r["lastTime"] for r in runs] == [T0 + 55]


def test_encrypted_values_come_back_byte_for_byte() -> None:
    secret = "gAAAA\u00e9\U0001f600==\\\"\u2028"
    message = {"id": "m1", "role": "reasoning", "content": "thinking",
               "encryptedValue": secret}
    store, history = Store(), History()
    view = store.view()
    feed(view, history.run("t1", "r1", [message]))
    store.commit(view)
    reloaded = store.view()
    assert reloaded.messages("acme", "t1") == [message]


def test_after_returns_the_messages_that_follow_and_unknown_ids_say_so() -> None:
    history, view = History(), Store().view()
    feed(view, history.run("t1", "r1", [user("m1"), assistant("m2"), user("m3")]))
    assert ids(view, after="m1") == ["m2", "m3"]
    assert ids(view, after="m3") == []
    assert view.messages("acme", "t1", after="nope") is Missing.AFTER
    assert view.messages("acme", "t1", after="\ud800") is Missing.AFTER


def test_threads_are_per_tenant() -> None:
    history, view = History(), Store().view()
    feed(view, history.run("t1", "r1", [user("m1")], tenant="acme"))
    assert view.messages("other", "t1") is Missing.THREAD
    assert view.runs("other", "t1") is Missing.THREAD
    assert view.messages("acme", "t2") is Missing.THREAD
    # A tenant containing the separator cannot reach another tenant's thread.
    feed(view, history.run("x", "r2", [user("m9")], tenant="acme/t1"))
    assert ids(view) == ["m1"]


def test_records_without_a_thread_are_ignored_and_unusable_ones_counted() -> None:
    history, view = History(), Store().view()
    threadless = HistoryRun(tenant="acme", outcome="error", messageCount=0).to_bytes()
    not_a_message = HistoryMessage.encode("acme", "t1", "r1", 0, {"id": "m1", "role": "?"})
    wrong_key = HistoryMessage.encode("acme", "t1", "r1", 0, user("m1"))
    feed(view, [history.record(b"acme/", threadless),
                history.record(b"acme/t1", b"not json"),
                history.record(b"acme/t2", wrong_key)])
    assert (view.counts.threadless, view.counts.unusable, view.counts.applied) == (1, 2, 0)
    assert view.messages("acme", "t1") is Missing.THREAD
    # A record of the thread whose message the ag-ui-protocol models do not parse: the
    # thread's messages are unchanged, its run counts it as taken in.
    feed(view, [history.record(b"acme/t1", not_a_message)])
    assert (view.counts.ignored, view.counts.applied) == (1, 0)
    assert view.messages("acme", "t1") == []
    assert view.read_offset((HISTORY, 0)) == 3  # read past them all the same


def test_a_record_without_timestamp_is_dated_by_the_clock() -> None:
    history = History()
    view = Store().view(clock=12.5)
    feed(view, [history.record(b"acme/t1",
                               HistoryMessage.encode("acme", "t1", "r1", 0, user("m1")),
                               timestamp=None)])
    feed(view, history.run("t1", "r1", [])[-1:])
    runs = view.runs("acme", "t1")
    assert isinstance(runs, list) and runs[0]["firstTime"] == 12_500


def summaries(view: ThreadView, thread: str = "t1") -> list[dict[str, Any]]:
    """The thread's run summaries without their times."""
    runs = view.runs("acme", thread)
    assert isinstance(runs, list), runs
    return [{k: v for k, v in run.items() if k not in ("firstTime", "lastTime")}
            for run in runs]


def held(view: ThreadView, thread: str = "t1") -> list[dict[str, Any]]:
    messages = view.messages("acme", thread)
    assert isinstance(messages, list), messages
    return messages


# --- v2: inputs, continuations, removals, closing records -----------------------------

CALL = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{\"q\""}}


def test_a_continuation_adds_what_a_later_run_added_to_a_held_message() -> None:
    store, history = Store(), History()
    view = store.view()
    feed(view, history.run("t1", "r1", [
        user("u1"),
        {"id": "a1", "role": "assistant", "content": "Hel", "toolCalls": [CALL],
         "encryptedValue": "old", "encryptedValueType": "kms/1", "metadata": {"a": 1, "b": 2}},
        user("u2")]))
    store.commit(view)
    feed(view, history.run("t1", "r2", [continued({
        "id": "a1", "role": "assistant", "content": "lo",
        "toolCalls": [{"id": "c1", "function": {"arguments": ": 1}"}, "encryptedValue": "cv",
                       "encryptedValueType": "kms/2"},
                      {"id": "c2", "type": "function",
                       "function": {"name": "fetch", "arguments": "{}"}}],
        "encryptedValue": "new", "metadata": {"b": 3, "c": 4}})]))
    assert held(view)[1] == {
        "id": "a1", "role": "assistant", "content": "Hello",
        "toolCalls": [{**CALL, "function": {"name": "search", "arguments": "{\"q\": 1}"},
                       "encryptedValue": "cv", "encryptedValueType": "kms/2"},
                      {"id": "c2", "type": "function",
                       "function": {"name": "fetch", "arguments": "{}"}}],
        # the value without a type: the held type is removed with the old value
        "encryptedValue": "new", "metadata": {"a": 1, "b": 3, "c": 4}}
    assert [m["id"] for m in held(view)] == ["u1", "a1", "u2"]
    # It rewrote the one message entry; the others and the index stay.
    thread = thread_key("acme", "t1")
    written = {change.key for change in store.commit(view)}
    assert message_key(thread, 1) in written
    assert not written & {message_key(thread, 0), message_key(thread, 2),
                          message_index_key(thread, "a1")}


def test_a_continuation_of_a_message_not_held_is_appended_as_it_is() -> None:
    history, view = History(), Store().view()
    reasoning = {"id": "x1", "role": "reasoning", "content": "more",
                 "encryptedValue": "e", "encryptedValueType": "t"}
    feed(view, history.run("t1", "r1", [user("u1"), continued(reasoning)]))
    assert held(view) == [user("u1"), reasoning]


def test_a_continuation_that_cannot_apply_is_ignored_and_still_completes_its_run() -> None:
    history, view = History(), Store().view()
    activity = {"id": "act", "role": "activity", "activityType": "plan", "content": {"s": 1}}
    feed(view, history.run("t1", "r1", [activity]))
    feed(view, history.run("t1", "r2", [
        continued({"id": "act", "role": "activity", "content": "text"}),  # to an object
        continued({"id": "u9", "role": "user", "encryptedValue": "e"})]))  # no content
    assert held(view) == [activity]
    assert view.counts.ignored == 2
    status = view.run_status("acme", "t1", "r2")
    assert status is not None and status.complete


def test_an_input_is_added_when_absent_and_never_replaces() -> None:
    history, view = History(), Store().view()
    feed(view, history.run("t1", "r1", [as_input(user("u1", "first")), assistant("a1")]))
    feed(view, history.run("t1", "r2", [as_input(user("u1", "restated")),
                                       as_input(user("u2")), assistant("a2")]))
    assert [(m["id"], m["content"]) for m in held(view)] == [
        ("u1", "first"), ("a1", "hello"), ("u2", "hi"), ("a2", "hello")]


def test_a_removal_removes_a_message_an_earlier_run_delivered() -> None:
    store, history = Store(), History()
    view = store.view()
    feed(view, history.run("t1", "r1", [user("u1"), assistant("a1"), user("u2")]))
    store.commit(view)
    feed(view, history.run("t1", "r2", [removed("a1"), removed("never-held"), assistant("a2")]))
    assert ids(view) == ["u1", "u2", "a2"]
    assert ids(view, after="u1") == ["u2", "a2"]
    assert view.messages("acme", "t1", after="a1") is Missing.AFTER
    thread = thread_key("acme", "t1")
    written = {change.key: change.value for change in store.commit(view)}
    assert written[message_key(thread, 1)] is None
    assert written[message_index_key(thread, "a1")] is None
    # The id sent again later is a new message, at the end.
    feed(view, history.run("t1", "r3", [assistant("a1", "back")]))
    assert ids(view) == ["u1", "u2", "a2", "a1"]
    store.commit(view)
    assert ids(store.view()) == ["u1", "u2", "a2", "a1"]
    # Retention removes a thread with holes entirely.
    view.expire(0, T0 / 1000 + RETENTION + 1)
    store.commit(view)
    assert not [key for key in store.data if thread in key]


def test_run_summaries_carry_the_closing_records_fields() -> None:
    history, view = History(), Store().view()
    feed(view, history.run("t1", "r1", [user("u1")], outcome="interrupt",
                           interrupts=[{"id": "i1", "reason": "approval"}], inputEchoed=True,
                           usage=[{"inputTokens": 3}]))
    feed(view, history.run("t1", "r2", [assistant("a1")], pendingToolCallIds=["c9"],
                           inputEchoed=False))
    feed(view, history.run("t1", "r3", [], outcome="failed",
                           failure={"code": "orphan_event"}, inputEchoed=True))
    feed(view, history.run("t1", "r4", [], outcome="abandoned",
                           failure={"code": "run_abandoned"}))
    assert summaries(view) == [
        {"runId": "r1", "outcome": "interrupt", "messageCount": 1,
         "interrupts": [{"id": "i1", "reason": "approval"}], "usage": [{"inputTokens": 3}],
         "inputEchoed": True},
        {"runId": "r2", "outcome": "success", "messageCount": 1, "pendingToolCallIds": ["c9"],
         "inputEchoed": False},
        {"runId": "r3", "outcome": "failed", "messageCount": 0,
         "failure": {"code": "orphan_event"}, "inputEchoed": True},
        {"runId": "r4", "outcome": "abandoned", "messageCount": 0,
         "failure": {"code": "run_abandoned"}},
    ]
    assert view.unechoed_runs("acme", "t1") == 1
    assert view.unechoed_runs("acme", "t9") == 0


def test_a_late_error_turns_the_run_into_an_error_and_keeps_its_messages() -> None:
    store, history = Store(), History()
    view = store.view()
    feed(view, history.run("t1", "r1", [user("u1"), assistant("a1")],
                           pendingToolCallIds=["c1"], inputEchoed=False))
    store.commit(view)
    feed(view, [history.late_error("t1", "r1", at=T0 + 900)])
    assert ids(view) == ["u1", "a1"]
    runs = view.runs("acme", "t1")
    assert runs == [{"runId": "r1", "outcome": "error", "late": True,
                     "error": {"message": "failed after all"}, "messageCount": 2,
                     "inputEchoed": False, "firstTime": T0, "lastTime": T0 + 900}]
    assert view.unechoed_runs("acme", "t1") == 1  # the same run, counted once
    store.commit(view)
    assert store.view().run_status("acme", "t1", "r1") == RunStatus(runs[0], True)


def test_a_replaced_summary_recounts_the_runs_without_their_input() -> None:
    history, view = History(), Store().view()
    feed(view, history.run("t1", "r1", [], inputEchoed=False))
    feed(view, history.run("t1", "r1", [], inputEchoed=True))
    assert view.unechoed_runs("acme", "t1") == 0


def test_v1_records_still_apply() -> None:
    """A worker upgraded while v1 records are still in the topic reads them too."""
    history, view = History(), Store().view()
    feed(view, history.v1_run("t1", "r1", [user("u1"), assistant("a1", "draft")]))
    feed(view, history.run("t1", "r2", [assistant("a1", "final"), user("u2")]))
    feed(view, history.v1_run("t1", "r3", [user("u3")], outcome="error"))
    assert [(m["id"], m["content"]) for m in held(view)] == [
        ("u1", "hi"), ("a1", "final"), ("u2", "hi"), ("u3", "hi")]
    assert summaries(view) == [
        {"runId": "r1", "outcome": "success", "messageCount": 2},
        {"runId": "r2", "outcome": "success", "messageCount": 2},
        {"runId": "r3", "outcome": "error", "messageCount": 1}]


def test_entries_the_release_before_stored_are_read() -> None:
    """A header whose open run is a bare time, a summary saying `finished`: what the
    release that read only v1 stored."""
    store, history = Store(), History()
    thread = thread_key("acme", "t1")
    store.data[header_key(thread)] = orjson.dumps({
        "tenant": "acme", "threadId": "t1", "partition": 0, "messages": 1, "runs": 1,
        "firstTime": T0, "lastTime": T0, "openRuns": {"r2": T0 + 10}})
    store.data[message_key(thread, 0)] = orjson.dumps(user("u1"))
    store.data[message_index_key(thread, "u1")] = b"\0\0\0\0"
    store.data[run_key(thread, 0)] = orjson.dumps({
        "runId": "r1", "outcome": "finished", "messageCount": 1, "firstTime": T0,
        "lastTime": T0})
    store.data[b"J" + thread + b"r1"] = b"\0\0\0\0"
    view = store.view()
    # r2's message came before the upgrade; its closing record after.
    feed(view, history.run("t1", "r2", [])[-1:])
    assert summaries(view) == [
        {"runId": "r1", "outcome": "success", "messageCount": 1},
        {"runId": "r2", "outcome": "success", "messageCount": 0}]
    status = view.run_status("acme", "t1", "r2")
    assert status is not None and status.complete and status.summary["firstTime"] == T0 + 10


# --- run completion ---------------------------------------------------------------------


def complete(view: ThreadView, run_id: str) -> bool | None:
    status = view.run_status("acme", "t1", run_id)
    return None if status is None else status.complete


def test_a_run_is_complete_once_its_closing_record_and_its_content_records_are_in() -> None:
    history, view = History(), Store().view()
    records = history.run("t1", "r1", [removed("x"), as_input(user("u1")), assistant("a1")])
    for record in records[:-1]:
        feed(view, [record])
        assert complete(view, "r1") is None
    feed(view, records[-1:])
    assert complete(view, "r1") is True


def test_a_closing_record_counting_records_not_in_yet_leaves_the_run_incomplete() -> None:
    history, view = History(), Store().view()
    key = b"acme/t1"
    first = HistoryMessage.encode("acme", "t1", "r1", 0, user("u1"))
    closing = HistoryRun(tenant="acme", threadId="t1", runId="r1", outcome="success",
                         messageCount=2).to_bytes()
    last = HistoryMessage.encode("acme", "t1", "r1", 1, assistant("a1"))
    feed(view, [history.record(key, first), history.record(key, closing)])
    assert complete(view, "r1") is False
    feed(view, [history.record(key, first)])  # a duplicate counts once
    assert complete(view, "r1") is False
    feed(view, [history.record(key, last)])
    assert complete(view, "r1") is True


def test_a_failed_run_is_complete_at_its_closing_record() -> None:
    history, view = History(), Store().view()
    feed(view, history.run("t1", "r1", [], outcome="failed", failure={"code": "x"}))
    assert complete(view, "r1") is True


def test_a_complete_run_published_again_stays_complete() -> None:
    history, view = History(), Store().view()
    run = [user("u1"), continued(assistant("a1", "x")), removed("u0")]
    feed(view, history.run("t1", "r1", run))
    again = history.run("t1", "r1", run, at=T0 + 50)
    for record in again:
        feed(view, [record])
        assert complete(view, "r1") is True
    # Its content records changed nothing the second time: the continuation did not
    # append twice.
    assert held(view) == [user("u1"), assistant("a1", "x")]
    assert view.counts.duplicates == 3
    status = view.run_status("acme", "t1", "r1")
    assert status is not None and status.summary["firstTime"] == T0


# --- replays and write-behind ------------------------------------------------------------


def test_records_at_or_below_the_read_offset_are_skipped() -> None:
    store, history = Store(), History()
    view = store.view()
    first = history.run("t1", "r1", [user("m1")])
    feed(view, first)
    store.commit(view)
    second = history.run("t1", "r2", [user("m2")])
    feed(view, second)  # applied, never committed: the worker crashes here
    restarted = store.view()
    assert restarted.read_offset((HISTORY, 0)) == first[-1].offset
    feed(restarted, first + second)  # delivered again from the committed offset
    assert restarted.counts.replayed == len(first)
    assert ids(restarted) == ["m1", "m2"]
    assert restarted.read_offset((HISTORY, 0)) == second[-1].offset
    feed(restarted, second)  # and again, before any commit
    assert restarted.counts.replayed == len(first) + len(second)


def test_each_tenant_topic_has_its_own_read_offsets() -> None:
    """Per-tenant topics: two tenants' topics share partition numbers, each with its own
    offsets; a thread is found in its tenant's topic, and a restart reads each on."""
    template = Template("agui.history.{tenant}")
    store = Store()

    def view() -> ThreadView:
        return ThreadView(store.data, partitions=1, retention_seconds=RETENTION,
                          tenant_topic=template.topic)

    acme, globex = History(), History()  # partition 0 of each topic, offsets from 0
    first = view()
    feed(first, [record._replace(topic="agui.history.acme")
                 for record in acme.run("t1", "r1", [user("m1")])])
    feed(first, [record._replace(topic="agui.history.globex")
                 for record in globex.run("t1", "r1", [user("g1")], tenant="globex")])
    assert first.counts.replayed == 0  # the same offsets, in another topic
    assert first.partition_for("acme", "t1")[0] == "agui.history.acme"
    store.commit(first)
    restarted = view()
    for tenant in ("acme", "globex"):
        assert restarted.read_offset(restarted.partition_for(tenant, "t1")) == 1
    assert restarted.read_offset(("agui.history", 0)) == NOTHING_READ
    assert ids(restarted, tenant="globex") == ["g1"]
    assert restarted.partition_for("x" * 300, "t1")[0] == ""  # no topic can be its


def test_each_changed_entry_is_handed_out_once_per_commit() -> None:
    store, history = Store(), History()
    view = store.view()
    feed(view, history.run("t1", "r1", [user(f"m{n}") for n in range(10)]))
    changes = view.changes(0)
    keys = [change.key for change in changes]
    assert len(keys) == len(set(keys))
    # 10 messages, 10 index entries, 1 run, 1 run index, the header, the offset
    assert len(keys) == 24
    assert view.changes(0) == []
    assert view.dirty_partitions() == []


def test_reads_see_changes_until_the_store_has_them() -> None:
    store, history = Store(), History()
    view = store.view()
    feed(view, history.run("t1", "r1", [assistant("m1", "one")]))
    assert ids(view) == ["m1"]  # nothing committed yet
    in_flight = view.changes(0)
    feed(view, history.run("t1", "r2", [assistant("m1", "two")]))  # while the commit is sent
    store.apply(view, in_flight)
    messages = view.messages("acme", "t1")
    assert isinstance(messages, list) and messages[0]["content"] == "two"
    store.commit(view)
    assert store.view().messages("acme", "t1") == messages


def test_once_applied_the_store_is_read_again() -> None:
    store, history = Store(), History()
    view = store.view()
    feed(view, history.run("t1", "r1", [assistant("m1", "one")]))
    store.commit(view)
    key = message_key(thread_key("acme", "t1"), 0)
    store.data[key] = orjson.dumps(assistant("m1", "restored"))  # e.g. by recovery
    messages = view.messages("acme", "t1")
    assert isinstance(messages, list) and messages[0]["content"] == "restored"


def test_forget_reloads_everything_from_the_stored_table() -> None:
    store, history = Store(), History()
    view = store.view()
    feed(view, history.run("t1", "r1", [user("m1"), assistant("m2")]))
    store.commit(view)
    feed(view, history.run("t1", "r2", [user("m3")]))  # not committed
    view.forget()
    assert ids(view) == ["m1", "m2"]
    runs = view.runs("acme", "t1")
    assert isinstance(runs, list) and len(runs) == 1
    assert view.read_offset((HISTORY, 0)) == 2
    assert view.read_offset((HISTORY, 1)) == NOTHING_READ


# --- retention --------------------------------------------------------------------------


def test_threads_idle_longer_than_the_retention_are_removed_entirely() -> None:
    store, history = Store(), History()
    view = store.view()
    feed(view, history.run("old", "r1", [user("m1")], at=T0))
    feed(view, history.run("new", "r2", [user("m2")], at=T0 + int(10 * DAY * 1000)))
    store.commit(view)
    view.expire(0, T0 / 1000 + RETENTION + 1)
    store.commit(view)
    assert view.messages("acme", "old") is Missing.THREAD
    assert ids(view, "new") == ["m2"]
    assert view.counts.expired_threads == 1
    old = thread_key("acme", "old")
    assert not [key for key in store.data if old in key]
    assert store.view().messages("acme", "old") is Missing.THREAD


def test_a_thread_written_again_is_kept() -> None:
    store, history = Store(), History()
    view = store.view()
    feed(view, history.run("t1", "r1", [user("m1")], at=T0))
    feed(view, history.run("t1", "r2", [user("m2")], at=T0 + int(RETENTION * 1000)))
    view.expire(0, T0 / 1000 + RETENTION + 1)
    assert ids(view) == ["m1", "m2"]


def test_an_expired_thread_started_again_starts_empty() -> None:
    store, history = Store(), History()
    view = store.view()
    feed(view, history.run("t1", "r1", [user("m1"), user("m2")], at=T0))
    view.expire(0, T0 / 1000 + RETENTION + 1)
    feed(view, history.run("t1", "r2", [user("m3")], at=T0 + int(RETENTION * 1000) + 2000))
    store.commit(view)
    assert ids(store.view()) == ["m3"]


def test_expiry_after_forget_reads_the_stored_threads_once_and_by_partition() -> None:
    store = Store()
    view = store.view()
    feed(view, History(0).run("t0", "r1", [user("m1")]))
    feed(view, History(1).run("t1", "r2", [user("m2")]))
    store.commit(view)
    view.forget()
    late = T0 / 1000 + RETENTION + 1
    view.expire(0, late)
    view.expire(0, late)
    assert store.scans == 1
    assert view.messages("acme", "t0") is Missing.THREAD
    assert ids(view, "t1") == ["m2"]  # partition 1 was not expired
    view.expire(1, late)
    assert view.messages("acme", "t1") is Missing.THREAD
    assert store.scans == 1


def test_expiry_leaves_a_header_it_cannot_read() -> None:
    store = Store()
    store.data[header_key(thread_key("acme", "t1"))] = b"\xff"
    view = store.view()
    view.expire(0, T0 / 1000 + RETENTION + 1)
    assert header_key(thread_key("acme", "t1")) in store.data


def test_history_partition_is_the_producers_default_partitioner() -> None:
    for thread in ("t1", "t2", "thread-\u00e9", ""):
        key = f"acme/{thread}".encode()
        assert history_partition("acme", thread, 8) == DefaultPartitioner()(
            key, list(range(8)), list(range(8)))


# --- poison input -------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(["schema", "tenant", "threadId", "runId", "kind", "seq",
                                       "message", "id", "role", "content", "outcome",
                                       "messageCount", "toolCalls", "function",
                                       "arguments", "encryptedValue", "metadata",
                                       "messageId"]) | st.text(max_size=4),
                      children, max_size=6),
    max_leaves=12,
)


_FIELDS = ["schema", "threadId", "runId", "kind", "seq", "message", "messageId", "outcome",
           "messageCount", "tenant", "late", "inputEchoed", "pendingToolCallIds",
           "interrupts", "failure", "error", "usage"]


def _plausible(base: dict[str, Any], fields: dict[str, Any]) -> bytes:
    return orjson.dumps({**base, **fields})


_BASES: list[dict[str, Any]] = [
    {"schema": schema, "tenant": "acme", "threadId": "t1", "runId": "r1", **rest}
    for schema in ("agui.history.v1", "agui.history.v2")
    for rest in ({"kind": "message", "seq": 0, "message": user("m1")},
                 {"kind": "continuation", "seq": 0, "message": {
                     "id": "m1", "role": "user", "content": "x",
                     "toolCalls": [{"id": "c", "function": {"arguments": "1"}}]}},
                 {"kind": "input", "seq": 0, "message": user("m1")},
                 {"kind": "removal", "seq": 0, "messageId": "m1"},
                 {"kind": "run", "outcome": "success", "messageCount": 1})]


def _values() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=64),
        JSON.map(orjson.dumps),
        st.builds(_plausible, st.sampled_from(_BASES),
                  st.dictionaries(st.sampled_from(_FIELDS), JSON, max_size=3)),
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([b"acme/t1", b"acme/", b"", b"\xff/t1"]),
                          _values(), st.none() | st.integers(0, 2**40)), max_size=12))
def test_any_record_is_applied_or_counted_never_raised(
        records: list[tuple[bytes, bytes, int | None]]) -> None:
    store, history = Store(), History()
    view = store.view()
    for key, value, timestamp in records:
        view.apply(history.record(key, value, timestamp))
    counts = view.counts
    assert (counts.applied + counts.threadless + counts.unusable + counts.ignored
            + counts.duplicates == len(records))
    store.commit(view)
    view.expire(0, 2.0**41)
    view.forget()
    messages = view.messages("acme", "t1")
    assert isinstance(messages, list) or messages is Missing.THREAD



def test_apply_names_the_thread_each_record_concerned() -> None:
    """What wakes the API's waiters: the thread's key, for a record of it (a duplicate
    or an ignored one too), nothing for a replay or a record of no thread."""
    history = History()
    view = ThreadView({}, partitions=1, retention_seconds=RETENTION)
    records = history.run("t1", "r1", [user("m1")])
    assert [view.apply(record) for record in records] == [thread_key("acme", "t1")] * 2
    assert view.apply(records[0]) is None  # a replay: offset already read
    assert view.apply(history.record(b"acme/", closing_value("acme", None, None))) is None
    assert view.apply(history.record(b"acme/t1", b"not json")) is None


def test_an_erasure_deletes_every_entry_of_its_thread_and_only_those() -> None:
    store, history = Store(), History()
    view = store.view()
    feed(view, history.run("t1", "r1", [user("m1"), assistant("m2")]))
    feed(view, history.run("t2", "r2", [user("m3")]))
    store.commit(view)
    kept = {key: value for key, value in store.data.items()
            if thread_key("acme", "t1") not in key}
    feed(view, [history.record(b"acme/t1", HistoryErasure(
        tenant="acme", threadId="t1", erasedAt=T0).to_bytes())])
    store.commit(view)
    offset = history.offset - 1
    assert store.data == {**kept, read_offset_key(0): offset.to_bytes(8, "big")}
    assert view.messages("acme", "t1") is Missing.THREAD
    assert view.messages("acme", "t2") == [user("m3")]
    assert view.counts.erased_threads == 1
    feed(view, history.run("t1", "r3", [user("m4")]))  # later records start it afresh
    assert view.messages("acme", "t1") == [user("m4")]


def test_what_was_read_mid_recovery_is_read_again_once_the_table_has_recovered() -> None:
    """A partition's offset and the expiry index read while the table was still being
    restored (the lag timer, a request) are stale; the worker calls `forget()` again
    when the table's recovery ends (view_service, `on_recover`), and both are exact."""
    written, history = Store(), History()
    view = written.view()
    feed(view, history.run("early", "r1", [user("m1")], at=T0))
    feed(view, history.run("late", "r2", [user("m2")], at=T0))
    written.commit(view)
    # The new owner's table, half restored: only the first thread's entries so far.
    restoring = Store()
    restoring.data = {key: value for key, value in written.data.items()
                      if thread_key("acme", "late") not in key and key[:1] != b"P"}
    recovering = restoring.view()
    recovering.forget()  # the partitions moved
    assert recovering.read_offset((HISTORY, 0)) == NOTHING_READ  # stale, cached
    assert recovering.threads_held([0]) == 1  # the expiry index, built once, stale
    restoring.data = dict(written.data)  # recovery ends
    recovering.forget()  # the table's recovery callback
    assert recovering.read_offset((HISTORY, 0)) == view.read_offset((HISTORY, 0))
    assert recovering.threads_held([0]) == 2
    recovering.expire(0, T0 / 1000 + RETENTION + 1)
    assert recovering.counts.expired_threads == 2  # the late-restored thread expires too
