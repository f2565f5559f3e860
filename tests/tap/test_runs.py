"""The tap's publication plan, without a socket or a broker: run keys, the input
echo, the buffer bound, whole runs or a RUN_ERROR, cut runs; and that the records
it plans are ones the engine accepts."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from processors.engine.engine import KeyEngine
from processors.tap.runs import (
    CODE_CLIENT_GONE,
    CODE_DROPPED,
    CODE_INTERRUPTED,
    CODE_TRUNCATED,
    Budget,
    Cut,
    DropReason,
    EchoMode,
    Fate,
    OpenRuns,
    ResponseTap,
    RunRequest,
    Step,
)

INPUT = {"threadId": "t1", "runId": "r1", "messages": [{"id": "u1", "role": "user",
                                                       "content": "Hi"}],
         "tools": [], "context": [], "state": {"s": 1}, "forwardedProps": {}}
RUN = [
    {"type": "RUN_STARTED", "threadId": "t1", "runId": "r1"},
    {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
    {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "Hello"},
    {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
    {"type": "RUN_FINISHED", "threadId": "t1", "runId": "r1"},
]


def sse(events: list[dict[str, object]]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)


def tap(budget: int = 1 << 20, mode: EchoMode = EchoMode.MESSAGES,
        body: bytes = orjson.dumps(INPUT), bound: int = 10_000) -> ResponseTap:
    return ResponseTap(RunRequest.parse(body, mode), Budget(budget), bound)


def values(step: Step) -> list[dict[str, object]]:
    return [orjson.loads(r.value) for r in step.records]


def test_a_run_is_keyed_and_its_started_event_carries_the_request_messages() -> None:
    step = tap().feed(sse(RUN))
    assert {r.run.key for r in step.records} == {b"t1/r1"}
    published = values(step)
    assert published[0]["input"] == {k: INPUT[k] for k in ("threadId", "runId", "messages")}
    assert published[1:] == RUN[1:]
    assert step.fates == [Fate.FINISHED]
    # the rest of the event is its original bytes: only `input` was spliced in
    assert step.records[0].value.startswith(orjson.dumps(RUN[0])[:-1] + b',"input":')


def test_the_whole_input_when_asked_and_no_echo_over_an_echo_or_for_another_run() -> None:
    assert values(tap(mode=EchoMode.INPUT).feed(sse(RUN[:1])))[0]["input"] == INPUT
    echoed = {**RUN[0], "input": {"threadId": "t1", "runId": "r1", "messages": []}}
    assert values(tap().feed(sse([echoed])))[0] == echoed
    other = {"type": "RUN_STARTED", "threadId": "t1", "runId": "r0"}
    assert values(tap().feed(sse([other])))[0] == other
    assert values(tap(body=b"not json").feed(sse(RUN[:1])))[0] == RUN[0]
    assert values(tap(bound=120).feed(sse(RUN[:1])))[0] == RUN[0]  # the echo would not fit


def test_the_engine_takes_the_planned_run_with_its_echo() -> None:
    engine = KeyEngine()
    decisions = [d for r in tap().feed(sse(RUN)).records
                 for d in engine.feed(r.value).decisions]
    assert [type(d).__name__ for d in decisions] == ["Concluded"], decisions
    assert decisions[0].input_echoed is True


def test_several_runs_on_one_stream_and_events_before_run_started() -> None:
    replayed = [{"type": "RUN_STARTED", "threadId": "t1", "runId": "r0"},
                {"type": "RUN_FINISHED", "threadId": "t1", "runId": "r0"}]
    step = tap().feed(sse([*replayed, *RUN]))
    assert [r.run.key for r in step.records] == [b"t1/r0"] * 2 + [b"t1/r1"] * 5
    early = tap().feed(sse([{"type": "RUN_ERROR", "message": "refused"}]))
    assert [r.run.key for r in early.records] == [b"t1/r1"]
    orphan = tap(body=b"[]").feed(sse([{"type": "RUN_ERROR", "message": "refused"}]))
    assert (orphan.records, orphan.unattributed_events) == ([], 1)


def test_a_run_left_open_gets_a_run_error_saying_how() -> None:
    for cut, code, fate in ((Cut.UPSTREAM_CLOSED, CODE_TRUNCATED, Fate.TRUNCATED),
                            (Cut.UPSTREAM_FAILED, CODE_TRUNCATED, Fate.TRUNCATED),
                            (Cut.CLIENT_GONE, CODE_CLIENT_GONE, Fate.CLIENT_GONE)):
        response = tap()
        response.feed(sse(RUN[:3]) + b"data: {\"type\":\"TEXT_MES")
        end = response.end(cut)
        assert [(v["type"], v["code"]) for v in values(end)] == [("RUN_ERROR", code)]
        assert end.fates == [fate]
    finished = tap()
    finished.feed(sse(RUN))
    assert finished.end(Cut.CLIENT_GONE).records == []
    superseded = tap().feed(sse([*RUN[:2], {"type": "RUN_STARTED", "threadId": "t1",
                                            "runId": "r2"}]))
    assert [(r.run.key, orjson.loads(r.value).get("code")) for r in superseded.records][2:] == [
        (b"t1/r1", CODE_TRUNCATED), (b"t1/r2", None)]


def test_a_full_buffer_drops_the_run_whole_or_says_so() -> None:
    nothing_out = tap(budget=10)
    step = nothing_out.feed(sse(RUN))
    assert (step.records, step.drops, step.fates, step.dropped_events) == (
        [], [DropReason.BUFFER_FULL], [Fate.DROPPED], 5)
    assert nothing_out.end(Cut.UPSTREAM_CLOSED).records == []
    budget = tap().feed(sse(RUN[:1])).records[0].size  # the echoed RUN_STARTED, no more
    part_out = tap(budget=budget).feed(sse(RUN))
    kinds = [(v["type"], v.get("code")) for v in values(part_out)]
    assert kinds == [("RUN_STARTED", None), ("RUN_ERROR", CODE_DROPPED)]
    assert part_out.dropped_events == 4


def test_an_oversized_event_or_a_refused_record_drops_the_rest() -> None:
    response = tap(bound=300)
    step = response.feed(sse(RUN[:2]) + b"data: " + b"x" * 400 + b"\n\n" + sse(RUN[2:]))
    assert [v["type"] for v in values(step)] == ["RUN_STARTED", "TEXT_MESSAGE_START",
                                                 "RUN_ERROR"]
    assert step.drops == [DropReason.EVENT_TOO_LARGE]
    refused = tap()
    sent = refused.feed(sse(RUN[:2]))
    after = Step()
    sent.records[1].run.drop(DropReason.PUBLISH_FAILED, after)
    sent.records[0].run.drop(DropReason.PUBLISH_FAILED, after)  # once per run
    assert [v["code"] for v in values(after)] == [CODE_DROPPED]
    assert refused.feed(sse(RUN[2:])).records == []


def test_the_budget_is_given_back_record_by_record() -> None:
    budget = Budget(1 << 20)
    response = ResponseTap(RunRequest.parse(orjson.dumps(INPUT), EchoMode.MESSAGES), budget,
                           10_000)
    records = response.feed(sse(RUN)).records
    assert budget.used == sum(r.size for r in records)
    for record in records:
        budget.give_back(record.size)
    assert budget.used == 0


@given(st.lists(st.one_of(st.binary(max_size=200), st.sampled_from([sse(RUN), sse(RUN[:2])])),
                max_size=12),
       st.sampled_from(list(Cut)), st.binary(max_size=300))
def test_no_stream_or_request_makes_it_raise(chunks: list[bytes], cut: Cut, body: bytes) -> None:
    response = tap(budget=2_000, body=body, bound=500)
    for chunk in chunks:
        response.feed(chunk)
    response.end(cut)


def test_runs_left_open_when_the_tap_stops_get_a_run_error_each() -> None:
    runs = OpenRuns()
    runs.handed(b"t/done", b"acme", b'{"type":"RUN_STARTED"}')
    runs.handed(b"t/done", b"acme", b'{"type":"RUN_FINISHED"}')
    runs.handed(b"t/failed", b"acme", b'{"type":"RUN_STARTED"}')
    runs.handed(b"t/failed", b"acme", b'{"type":"RUN_ERROR","message":"m"}')
    runs.handed(b"t/open", b"globex", b'{"type":"TEXT_MESSAGE_CONTENT"}')
    runs.handed(b"t/odd", b"acme", b"not json")
    runs.handed(b"t/list", b"acme", b"[1]")
    interrupted = runs.interrupted()
    assert [(key, tenant) for key, tenant, _ in interrupted] == [
        (b"t/open", b"globex"), (b"t/odd", b"acme"), (b"t/list", b"acme")]
    assert all(orjson.loads(value) == {"type": "RUN_ERROR", "code": CODE_INTERRUPTED,
                                       "message": orjson.loads(value)["message"]}
               for _, _, value in interrupted)
    assert runs.interrupted() == []
