"""The thread view answers what the reference fold folds (topics/history_fold.py).

Random runs over a few threads — messages, inputs, continuations (of held messages,
of messages not held, ones that cannot apply), removals, messages the ag-ui-protocol
models do not parse, closing records of every outcome, late errors, v1 runs —
interleaved as concurrent runs' transactions are on a history partition, with
duplicates (at-least-once, a run published again). The view applies them in
arbitrary chunks with its write-behind commits: commits taken while records are
still being applied, crashes that drop what was not committed and deliver the
records again from the committed offsets, restarts from the stored table. After
every chunk, each thread's messages (all of them, and after a held message) and
run summaries are those `fold_history` gives for the thread's records so far, and
once all are in, every closed run is complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from processors.processing.outputs import Incoming
from processors.processing.record_processor import StateChange
from processors.view.thread_view import (
    Missing,
    ThreadView,
    history_partition,
    parses_as_message,
)
from tests.view_helpers import (
    HISTORY,
    T0,
    Store,
    closing_value,
    content_value,
    continued,
    removed,
    v1_run_values,
)
from tests.view_helpers import Content as Item
from topics.history_fold import fold_history
from topics.records import HistoryErasure

THREADS = [("acme", "t1"), ("acme", "t2"), ("globex", "t1")]
PARTITIONS = 4
IDS = ["m0", "m1", "m2", "m3", "m4"]
TEXT = st.sampled_from(["", "a", "é", "\U0001f600", "\\\"", "\u2028x"])


def _call(call_id: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": arguments}}


@st.composite
def messages(draw: st.DrawFn, message_id: str) -> dict[str, Any]:
    """A whole message; now and then one the ag-ui-protocol models do not parse."""
    role = draw(st.sampled_from(["user", "assistant", "reasoning", "activity", "tool", "?"]))
    message: dict[str, Any] = {"id": message_id, "role": role}
    if role == "activity":
        return {**message, "activityType": "plan", "content": {"step": draw(TEXT)}}
    if role == "tool":
        message["toolCallId"] = "c0"
    if role == "user" and draw(st.booleans()):
        message["content"] = [{"type": "text", "text": draw(TEXT)}]
    elif role != "assistant" or draw(st.booleans()):
        message["content"] = draw(TEXT)
    if role == "assistant" and draw(st.booleans()):
        message["toolCalls"] = [_call(c, draw(TEXT))
                                for c in draw(st.lists(st.sampled_from(["c1", "c2"]),
                                                       max_size=2, unique=True))]
    if role != "?" and draw(st.booleans()):
        message["encryptedValue"] = draw(TEXT)
        if draw(st.booleans()):
            message["encryptedValueType"] = draw(TEXT)
    if draw(st.booleans()):
        message["metadata"] = {draw(st.sampled_from("xy")): draw(TEXT)}
    return message


@st.composite
def additions(draw: st.DrawFn, message_id: str) -> dict[str, Any]:
    """A continuation's message: what a later run added."""
    addition: dict[str, Any] = {"id": message_id,
                                "role": draw(st.sampled_from(["assistant", "user",
                                                              "reasoning"]))}
    if draw(st.booleans()):
        addition["content"] = draw(TEXT)
    if draw(st.booleans()):
        calls = []
        for call_id in draw(st.lists(st.sampled_from(["c1", "c2", "c3"]), max_size=2,
                                     unique=True)):
            call: dict[str, Any] = (_call(call_id, draw(TEXT)) if draw(st.booleans())
                                    else {"id": call_id, "function": {"arguments": draw(TEXT)}})
            if draw(st.booleans()):
                call["encryptedValue"] = draw(TEXT)
                if draw(st.booleans()):
                    call["encryptedValueType"] = draw(TEXT)
            calls.append(call)
        addition["toolCalls"] = calls
    if draw(st.booleans()):
        addition["encryptedValue"] = draw(TEXT)
        if draw(st.booleans()):
            addition["encryptedValueType"] = draw(TEXT)
    if draw(st.booleans()):
        addition["metadata"] = {draw(st.sampled_from("xy")): draw(TEXT)}
    return addition


@st.composite
def items(draw: st.DrawFn) -> dict[str, Any] | Item:
    message_id = draw(st.sampled_from(IDS))
    kind = draw(st.sampled_from(["message", "message", "input", "continuation",
                                 "continuation", "removal"]))
    if kind == "removal":
        return removed(message_id)
    if kind == "continuation":
        return continued(draw(additions(message_id)))
    message = draw(messages(message_id))
    return message if kind == "message" else Item("input", message)


@st.composite
def closings(draw: st.DrawFn) -> dict[str, Any]:
    outcome = draw(st.sampled_from(["success", "interrupt", "cancelled", "error", "failed",
                                    "abandoned"]))
    fields: dict[str, Any] = {"outcome": outcome}
    if outcome == "success" and draw(st.booleans()):
        fields["pendingToolCallIds"] = ["c1"]
    if outcome == "interrupt":
        fields["interrupts"] = [{"id": "i1"}]
    if outcome == "error":
        fields["error"] = {"message": "e", "code": "E"}
    if outcome in ("failed", "abandoned"):
        fields["failure"] = {"code": "run_abandoned" if outcome == "abandoned" else "x"}
    if draw(st.booleans()):
        fields["inputEchoed"] = draw(st.booleans())
    if draw(st.booleans()):
        fields["usage"] = [{"tokens": 1}]
    return fields


@dataclass
class Run:
    tenant: str
    thread: str
    values: list[bytes]  # in the order the worker writes them


@st.composite
def runs(draw: st.DrawFn, number: int) -> Run:
    tenant, thread = draw(st.sampled_from(THREADS))
    run_id = f"r{number}"
    if draw(st.integers(0, 9)) == 0:  # a v1 run, still in the topic after the upgrade
        plain = [m for m in draw(st.lists(items(), max_size=3)) if isinstance(m, dict)]
        return Run(tenant, thread, v1_run_values(tenant, thread, run_id, plain,
                                                 draw(st.sampled_from(["finished", "error"]))))
    content = draw(st.lists(items(), max_size=5))
    closing = draw(closings())
    failed = closing["outcome"] in ("failed", "abandoned")
    if failed:
        content = []
    values = [content_value(tenant, thread, run_id, seq, item)
              for seq, item in enumerate(content)]
    values.append(closing_value(tenant, thread, run_id, messageCount=len(content), **closing))
    if not failed and closing["outcome"] != "error" and draw(st.integers(0, 3)) == 0:
        values.append(closing_value(tenant, thread, run_id, outcome="error", late=True,
                                    error={"message": "late"}))
    return Run(tenant, thread, values)


@st.composite
def segments(draw: st.DrawFn, first_run: int, most_runs: int) -> list[tuple[str, str, bytes]]:
    """Runs' records interleaved (each run's in order), with duplicates of records
    already written; run numbers from `first_run`."""
    pending = [draw(runs(number))
               for number in range(first_run, first_run + draw(st.integers(1, most_runs)))]
    cursors = [0] * len(pending)
    topic: list[tuple[str, str, bytes]] = []
    while any(cursor < len(run.values) for cursor, run in zip(cursors, pending, strict=True)):
        if topic and draw(st.integers(0, 7)) == 0:  # an at-least-once duplicate
            topic.append(topic[draw(st.integers(0, len(topic) - 1))])
            continue
        open_runs = [n for n, run in enumerate(pending) if cursors[n] < len(run.values)]
        n = draw(st.sampled_from(open_runs))
        run = pending[n]
        topic.append((run.tenant, run.thread, run.values[cursors[n]]))
        cursors[n] += 1
    if draw(st.booleans()):  # a run published again, whole (a reprocessing)
        run = draw(st.sampled_from(pending))
        topic += [(run.tenant, run.thread, value) for value in run.values]
    return topic


@st.composite
def topics(draw: st.DrawFn) -> list[tuple[str, str, bytes]]:
    """The history topic: segments of runs, and between two segments a tenant's
    erasure of a thread. (An erasure between the records of a run, or duplicates of
    its records after it, are outside the view's promise: docs/thread-view.md,
    *Deleting a thread*.)"""
    topic = draw(segments(0, 8))
    for erasure in range(draw(st.integers(0, 2))):
        tenant, thread = draw(st.sampled_from(THREADS))
        topic.append((tenant, thread, HistoryErasure(tenant=tenant, threadId=thread,
                                                     erasedAt=T0).to_bytes()))
        topic += draw(segments(10 * (erasure + 1), 3))
    return topic


def as_records(topic: list[tuple[str, str, bytes]]) -> list[Incoming]:
    offsets = [0] * PARTITIONS
    records = []
    for at, (tenant, thread, value) in enumerate(topic):
        partition = history_partition(tenant, thread, PARTITIONS)
        records.append(Incoming(HISTORY, partition, offsets[partition], T0 + at,
                                f"{tenant}/{thread}".encode(), value, []))
        offsets[partition] += 1
    return records


def check(view: ThreadView, topic: list[tuple[str, str, bytes]]) -> None:
    """The view holds what the fold folds from `topic`, thread by thread."""
    for tenant, thread in THREADS:
        folded = fold_history([orjson.loads(value) for t, th, value in topic
                               if (t, th) == (tenant, thread)], parses_as_message)
        held = view.messages(tenant, thread)
        summaries = view.runs(tenant, thread)
        if held is Missing.THREAD:
            assert folded.messages == [] and folded.runs == {}
            assert summaries is Missing.THREAD
            continue
        assert held == folded.messages
        assert isinstance(summaries, list)
        assert {s["runId"]: {k: v for k, v in s.items()
                             if k not in ("runId", "firstTime", "lastTime")}
                for s in summaries} == folded.runs
        assert [s["runId"] for s in summaries] == list(folded.runs)
        for position, message in enumerate(folded.messages):
            assert view.messages(tenant, thread, message["id"]) == folded.messages[
                position + 1:]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topics(), st.data())
def test_the_view_answers_what_the_fold_folds(topic: list[tuple[str, str, bytes]],
                                               data: st.DataObject) -> None:
    records = as_records(topic)
    store = Store()
    view = store.view()
    committed = 0  # records[:committed] are in the store
    at = 0
    in_flight: tuple[list[StateChange], int] | None = None
    while at < len(records):
        end = min(len(records), at + data.draw(st.integers(1, 6)))
        for record in records[at:end]:
            view.apply(record)
        at = end
        check(view, topic[:at])
        step = data.draw(st.sampled_from(["commit", "take", "send", "crash", "restart",
                                          "none"]))
        if step == "commit" and in_flight is None:
            store.commit(view)
            committed = at
        elif step == "take" and in_flight is None:  # a commit starts; records go on
            in_flight = ([c for p in view.dirty_partitions() for c in view.changes(p)], at)
        elif step == "send" and in_flight is not None:  # and ends
            store.apply(view, in_flight[0])
            committed, in_flight = in_flight[1], None
        elif step == "crash":  # what was not committed is lost and delivered again
            if in_flight is not None:
                in_flight = None
            view.forget()
            at = committed
        elif step == "restart" and in_flight is None:
            store.commit(view)
            committed = at
            view = store.view()
    if in_flight is not None:
        store.apply(view, in_flight[0])
    store.commit(view)
    check(view, topic)
    for name in ("ignored", "duplicates"):  # --hypothesis-show-statistics
        event(f"{name} > 0: {getattr(view.counts, name) > 0}")
    reloaded = store.view()
    check(reloaded, topic)
    for tenant, thread in THREADS:
        for run_id in fold_history([orjson.loads(value) for t, th, value in topic
                                    if (t, th) == (tenant, thread)]).runs:
            status = reloaded.run_status(tenant, thread, run_id)
            assert status is not None and status.complete, (tenant, thread, run_id)
