"""The thread view on plain dicts, no broker: order, replacement in place, runs,
replays, write-behind, retention, reloading, and poison input."""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, Mapping
from typing import Any

import orjson
from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.processing.record_processor import StateChange
from processors.view.thread_view import (
    NOTHING_READ,
    Missing,
    ThreadView,
    header_key,
    history_partition,
    message_key,
    thread_key,
)
from tests.memory_helpers import bytes_left_allocated
from tests.view_helpers import T0, History, assistant, feed, user
from topics.records import HistoryMessage, HistoryRun

DAY = 86_400.0
RETENTION = 30 * DAY


class Store:
    """The committed table as a dict; counts full scans (`items()`)."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.scans = 0

    def view(self, clock: float = T0 / 1000) -> ThreadView:
        return ThreadView(ScanCounting(self), partitions=4, retention_seconds=RETENTION,
                          clock=lambda: clock)

    def commit(self, view: ThreadView) -> list[StateChange]:
        changes = [change for partition in view.dirty_partitions()
                   for change in view.changes(partition)]
        self.apply(view, changes)
        return changes

    def apply(self, view: ThreadView, changes: list[StateChange]) -> None:
        for change in changes:
            if change.value is None:
                self.data.pop(change.key, None)
            else:
                self.data[change.key] = change.value
        view.changes_applied(changes)


class ScanCounting(Mapping[bytes, bytes]):
    """The store's dict, read through a mapping that counts `items()` calls."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __getitem__(self, key: bytes) -> bytes:
        return self.store.data[key]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.store.data)

    def __len__(self) -> int:
        return len(self.store.data)

    def items(self) -> ItemsView[bytes, bytes]:
        self.store.scans += 1
        return self.store.data.items()


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
                history.record(b"acme/t1", not_a_message),
                history.record(b"acme/t2", wrong_key)])
    assert (view.counts.threadless, view.counts.unusable, view.counts.applied) == (1, 3, 0)
    assert view.messages("acme", "t1") is Missing.THREAD
    assert view.read_offset(0) == 3  # read past them all the same


def test_a_record_without_timestamp_is_dated_by_the_clock() -> None:
    history = History()
    view = Store().view(clock=12.5)
    feed(view, [history.record(b"acme/t1",
                               HistoryMessage.encode("acme", "t1", "r1", 0, user("m1")),
                               timestamp=None)])
    feed(view, history.run("t1", "r1", [])[-1:])
    runs = view.runs("acme", "t1")
    assert isinstance(runs, list) and runs[0]["firstTime"] == 12_500


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
    assert restarted.read_offset(0) == first[-1].offset
    feed(restarted, first + second)  # delivered again from the committed offset
    assert restarted.counts.replayed == len(first)
    assert ids(restarted) == ["m1", "m2"]
    assert restarted.read_offset(0) == second[-1].offset
    feed(restarted, second)  # and again, before any commit
    assert restarted.counts.replayed == len(first) + len(second)


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
    assert view.read_offset(0) == 2
    assert view.read_offset(1) == NOTHING_READ


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
                                       "messageCount"]) | st.text(max_size=4),
                      children, max_size=6),
    max_leaves=12,
)


def _plausible(fields: dict[str, Any]) -> bytes:
    base: dict[str, Any] = {"schema": "agui.history.v1", "tenant": "acme", "threadId": "t1",
                            "runId": "r1", "kind": "message", "seq": 0, "message": user("m1")}
    return orjson.dumps({**base, **fields})


def _values() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=64),
        JSON.map(orjson.dumps),
        st.dictionaries(st.sampled_from(["threadId", "runId", "kind", "seq", "message",
                                         "outcome", "messageCount", "tenant"]),
                        JSON, max_size=3).map(_plausible),
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
    assert counts.applied + counts.threadless + counts.unusable == len(records)
    store.commit(view)
    view.expire(0, 2.0**41)
    view.forget()
    messages = view.messages("acme", "t1")
    assert isinstance(messages, list) or messages is Missing.THREAD

