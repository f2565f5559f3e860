"""Every output is sized before it is sent, headers included, against the largest
record its topic takes: what does not fit is left out and the record says so; no
content can make a record the broker refuses (which would stop the worker)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.engine.codes import FailureCode, Outcome, WarningCode
from processors.engine.decisions import (
    Concluded,
    Failed,
    HistoryEntry,
    RunIdentity,
    Step,
    Warned,
)
from processors.metrics import Metrics
from processors.processing.outputs import Incoming, Outgoing, OutputBuilder, record_bytes

HISTORY, DEADLETTER = "history", "deadletter"
LIMIT = 1_000_000 + 65_536  # what create-topics gives the output topics by default


def builder(limit: int = LIMIT, max_record_bytes: int = 1_000_000) -> OutputBuilder:
    built = OutputBuilder(HISTORY, DEADLETTER, max_record_bytes, Metrics())
    for topic in (HISTORY, DEADLETTER):
        built.set_topic_limit(topic, limit)
    return built


def incoming(value: bytes = b"{}", key: bytes = b"run-1",
             headers: list[tuple[str, bytes]] | None = None) -> Incoming:
    return Incoming("events", 3, 42, 1_700_000_000_000, key, value, headers or [])


def fits(out: list[Outgoing], built: OutputBuilder) -> None:
    for record in out:
        assert record_bytes(record.key, record.value, record.headers) <= (
            built.topic_limits[record.topic]), record.topic


def failed(reason: str = "bad", run: RunIdentity | None = None) -> Step:
    return Step("undecodable", (Failed(FailureCode.UNDECODABLE_RECORD, reason, run),))


def test_an_undecodable_record_with_a_large_header_gets_a_dead_letter_that_fits() -> None:
    # The record that crash-looped a partition: ~740 KB of undecodable bytes and an 80 KB
    # header, accepted by the broker's default limit; its dead letter was 1,067,170 bytes.
    built = builder()
    record = incoming(b"\xff" * 740_000, headers=[("trace", b"x" * 80_000)])
    out = built.build(failed(), record, "acme")
    fits(out, built)
    letter = orjson.loads(out[0].value)
    assert letter["truncated"] is True and "raw" not in letter
    assert ("trace", b"x" * 80_000) in out[0].headers  # they fit once the copy is gone
    assert (letter["code"], letter["source"]["offset"]) == ("undecodable_record", 42)


def test_headers_that_do_not_fit_are_dropped_and_counted() -> None:
    built = builder(limit=50_000)
    record = incoming(b"\xff" * 10, headers=[("a", b"x" * 30_000), ("b", b"y" * 30_000)])
    out = built.build(failed(), record, "acme")
    fits(out, built)
    letter = orjson.loads(out[0].value)
    assert letter["headersDropped"] == 2
    assert [name for name, _ in out[0].headers] == [
        "agui.dlq.code", "agui.dlq.kind", "agui.dlq.topic", "agui.dlq.partition",
        "agui.dlq.offset"]


def test_a_reason_tenant_and_ids_of_a_megabyte_are_cut() -> None:
    built = builder(limit=80_000)
    huge = "i" * 1_000_000
    out = built.build(failed(reason=f"names {huge}", run=RunIdentity(huge, huge)),
                      incoming(), huge)
    fits(out, built)
    dead = [o for o in out if o.topic == DEADLETTER]
    letter = orjson.loads(dead[0].value)
    assert letter["cut"] is True and len(letter["reason"]) == 1024
    assert len(letter["threadId"]) == len(letter["tenant"]) == 1024


def test_a_key_too_large_for_the_topic_is_replaced_by_its_digest() -> None:
    built = builder(limit=20_000)
    out = built.build(failed(), incoming(key=b"k" * 30_000), "acme")
    fits(out, built)
    assert len(out[0].key) == 64
    assert dict(out[0].headers)["agui.dlq.key-sha256"] == out[0].key


def concluded(**fields: Any) -> Step:
    decision = Concluded(Outcome.SUCCESS, RunIdentity("t1", "r1"),
                         [HistoryEntry("message", {"id": "m", "role": "user", "content": "q"})],
                         **fields)
    return Step("RUN_FINISHED", (decision,))


def test_a_closing_record_leaves_out_its_largest_optional_fields_first() -> None:
    built = builder(limit=60_000)
    usage = [{"provider": "p" * 70_000}]
    out = built.build(concluded(usage=usage, error=None,
                                detail={"pendingToolCallIds": ["c1"]}), incoming(), "acme")
    fits(out, built)
    closing = orjson.loads(out[-1].value)
    assert closing["truncated"] == ["usage"] and closing["pendingToolCallIds"] == ["c1"]
    assert closing["messageCount"] == 1


def test_a_closing_record_that_cannot_fit_is_a_not_storable_warning() -> None:
    built = builder(limit=30_000)
    decision = Concluded(Outcome.SUCCESS, RunIdentity("t" * 40_000, "r1"), [], None, None)
    out = built.build(Step("RUN_FINISHED", (decision,)), incoming(), "acme")
    fits(out, built)
    assert [o.topic for o in out] == [DEADLETTER]
    assert orjson.loads(out[0].value)["code"] == WarningCode.NOT_STORABLE.value


@settings(max_examples=60, deadline=None)
@given(value=st.integers(0, 1_200_000), key=st.integers(0, 40_000),
       headers=st.lists(st.integers(0, 400_000), max_size=4), tenant=st.integers(0, 200_000),
       reason=st.integers(0, 200_000), limit=st.integers(20_000, 1_200_000),
       thread=st.integers(1, 200_000))
def test_no_content_makes_an_output_larger_than_its_topic_takes(
        value: int, key: int, headers: list[int], tenant: int, reason: int, limit: int,
        thread: int) -> None:
    built = builder(limit=limit, max_record_bytes=max(10_000, limit - 65_536))
    record = incoming(b"\xfe" * value, b"k" * key,
                      [(f"h{i}", b"v" * size) for i, size in enumerate(headers)])
    run = RunIdentity("t" * thread, "r")
    steps = [
        failed("r" * reason, run),
        Step("X", (Warned(WarningCode.UNKNOWN_FIELD, "r" * reason, run),)),
        Step("RUN_FINISHED", (Concluded(Outcome.ERROR, run, [HistoryEntry(
            "message", {"id": "m", "role": "user", "content": "c" * value})],
            [{"provider": "p" * reason}], {"message": "e" * reason}),)),
    ]
    for step in steps:
        fits(built.build(step, record, "t" * tenant), built)
