"""Poison input, tenants and idle runs through a running worker on a real broker."""

from __future__ import annotations

import base64
import os
import re
import signal
from itertools import zip_longest
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.service_harness import Consumed, Namespace, TopicReader, Worker, produce, wait_for

pytestmark = pytest.mark.kafka


def dumps(event: dict[str, Any]) -> bytes:
    return orjson.dumps(event)


def run_events(thread: str, run: str, *middle: dict[str, Any]) -> list[bytes]:
    return [dumps({"type": "RUN_STARTED", "threadId": thread, "runId": run}),
            *(dumps(e) for e in middle),
            dumps({"type": "RUN_FINISHED", "threadId": thread, "runId": run})]


def reasoning(message_id: str, *deltas: str) -> list[dict[str, Any]]:
    return [{"type": "REASONING_MESSAGE_START", "messageId": message_id, "role": "reasoning"},
            *({"type": "REASONING_MESSAGE_CONTENT", "messageId": message_id, "delta": d}
              for d in deltas),
            {"type": "REASONING_MESSAGE_END", "messageId": message_id}]


def encrypted(entity: str, value: str) -> dict[str, Any]:
    return {"type": "REASONING_ENCRYPTED_VALUE", "subtype": "message", "entityId": entity,
            "encryptedValue": value}


def counter_value(metrics: str, name: str, label: str | None = None) -> float:
    pattern = (rf'^{name}\{{\w+="{re.escape(label)}"\}} (\S+)$' if label
               else rf"^{name} (\S+)$")
    match = re.search(pattern, metrics, re.M)
    return float(match.group(1)) if match else 0.0


def closing(records: list[Consumed]) -> list[dict[str, Any]]:
    return [r.value for r in records if r.value["kind"] == "run"]


def test_poison_input_reaches_the_dead_letter_topic_and_the_worker_goes_on(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    namespace = Namespace(kafka_bootstrap)
    namespace.create_topics()
    secret = "enc-SECRET-" + "Q" * 40
    big = "x" * 150_000
    poison: list[tuple[bytes, bytes, list[tuple[str, bytes]]]] = [
        (b"bytes", b"\x00\xff\xfe random \x80 bytes", []),
        (b"array", b"[1, 2, 3]", []),
        (b"number", b"42", []),
        (b"no-type", b'{"messageId": "m"}', []),
        (b"type-not-string", b'{"type": 7}', []),
        (b"empty", b"", []),
        (b"", dumps({"type": "RUN_STARTED", "threadId": "t", "runId": "keyless"}), []),
        (b"bad-tenant", dumps({"type": "CUSTOM", "name": "x", "value": 1}),
         [("tenant", b"\xff\xfe")]),
        *((b"wrong-types", value, []) for value in [
            dumps({"type": "RUN_STARTED", "threadId": "t", "runId": "wt"}),
            dumps({**encrypted("rm", secret), "metadata": None}),
        ]),
        # A run whose reasoning message is too large for the history sink.
        *((b"huge", value, []) for value in run_events(
            "t", "huge", *reasoning("rm-big", big), encrypted("rm-big", secret))),
    ]
    valid = [(b"after-the-poison", value, []) for value in run_events(
        "t-ok", "ok", *reasoning("rm-ok", "fine"), encrypted("rm-ok", "enc-ok"))]
    # A run holding more encrypted values than one changelog record takes (1.25 MB,
    # open across commits): its state entry is stored split, not refused by the broker.
    held = [f"{number:03d}-" + "E" * 5_000 for number in range(250)]
    *holding, held_end = run_events("t", "held", *(event for number, value in enumerate(held)
                                                  for event in (*reasoning(f"h{number}", "r"),
                                                                encrypted(f"h{number}", value))))
    produce(kafka_bootstrap, namespace.events,
            [*poison, *((b"held", value, []) for value in holding), *valid])

    worker = Worker(namespace, tmp_path, AGUI_MAX_RECORD_BYTES="100000").start()
    try:
        history = TopicReader(kafka_bootstrap, namespace.history).wait_until(
            lambda recs: {r["runId"] for r in closing(recs)} >= {"ok", "huge"}, 120,
            "the valid run and the huge run to conclude", worker.log_tail)
        dead = TopicReader(kafka_bootstrap, namespace.deadletter).wait_until(
            lambda recs: len(recs) >= 9, 60, "the dead letters", worker.log_tail)
        produce(kafka_bootstrap, namespace.events, [(b"held", held_end, [])])
        history = TopicReader(kafka_bootstrap, namespace.history).wait_until(
            lambda recs: "held" in {r["runId"] for r in closing(recs)}, 60,
            "the run holding 250 encrypted values to conclude", worker.log_tail)
        metrics = worker.metrics()
        assert worker.process is not None and worker.process.poll() is None  # still running
    finally:
        worker.stop()

    by_key = {r.key: r.value for r in dead if r.value["kind"] == "failure"}
    for key in (b"bytes", b"array", b"number", b"no-type", b"type-not-string", b"empty"):
        assert by_key[key]["code"] == "undecodable_record", key
    assert base64.b64decode(by_key[b"bytes"]["raw"]) == b"\x00\xff\xfe random \x80 bytes"
    # JSON but not an event: it travels as a marker of its type and size only.
    assert by_key[b"array"]["event"] == {"redacted": True, "type": "array", "bytes": 7}
    assert by_key[b"bad-tenant"]["code"] == "run_not_started"
    assert by_key[b"bad-tenant"]["tenant"] == "\ufffd\ufffd"
    assert by_key[b"wrong-types"]["code"] == "malformed_event"
    # No encrypted value ever reaches the dead-letter topic.
    assert by_key[b"wrong-types"]["event"]["encryptedValue"] == {
        "redacted": True, "type": "string", "bytes": len(secret)}
    for record in dead:
        assert secret not in orjson.dumps(record.value).decode()
        assert record.headers["agui.dlq.kind"].decode() == record.value["kind"]
    not_storable = [r.value for r in dead if r.value["code"] == "not_storable"]
    assert len(not_storable) == 1 and "event" not in not_storable[0]
    huge_run = next(r for r in closing(history) if r["runId"] == "huge")
    assert huge_run["messageCount"] == 0  # the one message could not be carried
    assert counter_value(metrics, "agui_encrypted_content_lost_total", "not_storable") == 1
    ok_messages = [r.value["message"] for r in history
                   if r.value["kind"] == "message" and r.value.get("runId") == "ok"]
    assert ok_messages == [{"id": "rm-ok", "role": "reasoning", "content": "fine",
                            "encryptedValue": "enc-ok"}]
    assert [r.value["message"]["encryptedValue"] for r in history
            if r.value["kind"] == "message" and r.value.get("runId") == "held"] == held


def test_a_worker_at_debug_level_prints_none_of_the_secrets_it_processes(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Valid runs full of reasoning, encrypted values and text, and malformed
    events with secrets in every shape that leaked before, through a worker
    logging at debug level: no secret in its whole log, its metrics page or a
    dead-letter record (history is where content belongs)."""
    secrets = [f"S3CR3T-{n:04d}-planted" for n in range(16)]
    namespace = Namespace(kafka_bootstrap)
    namespace.create_topics()
    valid = run_events(
        "t-valid", "valid", *reasoning("rm", secrets[0], secrets[1]), encrypted("rm", secrets[2]),
        {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": secrets[3]},
        {"type": "TEXT_MESSAGE_END", "messageId": "m"},
        {"type": "CUSTOM", "name": "c", "value": {"v": secrets[4]},
         "rawEvent": {"chunk": secrets[5]}})
    malformed = [
        {**encrypted("rm", ""), "encryptedValue": [secrets[6]]},
        {"type": "REASONING_MESSAGE_CONTENT", "messageId": "rm", "delta": {"t": secrets[7]}},
        {"type": "REASONING_MESSAGE_START", "messageId": "x", "role": "reasoning",
         "unknownField": secrets[8], "rawEvent": secrets[9]},
        {"type": ["CUSTOM"], "name": secrets[10], "value": 1},
        {"type": {"t": secrets[11]}},
        {"type": "NOT_AN_AG_UI_TYPE", "payload": secrets[12]},
        {"type": "RUN_ERROR", "message": secrets[13], "code": 7},
        {"type": "TOOL_CALL_ARGS", "toolCallId": "nope", "delta": secrets[14]},
        {"type": "REASONING_MESSAGE_CHUNK", "messageId": {"id": secrets[15]}, "delta": "d"},
    ]
    poison = [dumps({"type": "RUN_STARTED", "threadId": "t-bad", "runId": f"bad-{n}"})
              for n in range(len(malformed))]
    records = [(b"valid", value, []) for value in valid]
    for n, (start, event) in enumerate(zip(poison, malformed, strict=True)):
        records += [(b"bad-%d" % n, start, []), (b"bad-%d" % n, dumps(event), [])]
    produce(kafka_bootstrap, namespace.events, records)
    worker = Worker(namespace, tmp_path, AGUI_LOG_LEVEL="debug").start()
    try:
        TopicReader(kafka_bootstrap, namespace.history).wait_until(
            lambda recs: {r["runId"] for r in closing(recs)} >= {"valid"}, 120,
            "the valid run to conclude", worker.log_tail)
        dead = TopicReader(kafka_bootstrap, namespace.deadletter).wait_until(
            lambda recs: len({r.key for r in recs}) >= len(malformed), 120,
            "a dead letter for every malformed event", worker.log_tail)
        metrics = worker.metrics()
    finally:
        worker.stop()
    log = worker.log_path.read_bytes()
    assert b"DEBUG" in log or b"debug" in log.lower()  # it did log at debug level
    dead_bytes = b"".join(r.key + orjson.dumps(r.value) + b"".join(
        n.encode() + v for n, v in r.headers.items()) for r in dead)
    for secret in secrets:
        for where, data in (("log", log), ("metrics", metrics.encode()),
                            ("dead letters", dead_bytes)):
            assert secret.encode() not in data, f"{secret} in the worker's {where}"


NON_STRING_JSON: list[Any] = [None, True, 3, 2.5, ["x"], {"a": "b"}]


def test_poison_shapes_get_one_dead_letter_each_and_the_runs_around_them_are_whole(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A `type` that is a list, an object or a number; `role`, `delta` and
    `encryptedValue` of every other JSON type: each inside a run between two valid
    runs of its key. One dead letter each, no restart, the valid runs whole."""
    start = {"type": "REASONING_MESSAGE_START", "messageId": "rm", "role": "reasoning"}
    shapes: dict[str, list[dict[str, Any]]] = {
        **{f"type-{i}": [{"type": bad, "name": "x", "value": 1}]
           for i, bad in enumerate([["CUSTOM"], {"CUSTOM": 1}, 7])},
        **{f"role-{i}": [{**start, "role": bad}] for i, bad in enumerate(NON_STRING_JSON)},
        **{f"delta-{i}": [start, {"type": "REASONING_MESSAGE_CONTENT", "messageId": "rm",
                                  "delta": bad}] for i, bad in enumerate(NON_STRING_JSON)},
        **{f"enc-{i}": [start, {**encrypted("rm", "x"), "encryptedValue": bad}]
           for i, bad in enumerate(NON_STRING_JSON)},
    }
    records: list[tuple[bytes, bytes, list[tuple[str, bytes]]]] = []
    for name, middle in shapes.items():
        key = name.encode()
        for value in [*run_events(f"t-{name}", f"{name}-before", *reasoning("a", "whole")),
                      *run_events(f"t-{name}", f"{name}-poisoned", *middle),
                      *run_events(f"t-{name}", f"{name}-after", *reasoning("b", "whole"))]:
            records.append((key, value, []))
    namespace = Namespace(kafka_bootstrap)
    namespace.create_topics()
    produce(kafka_bootstrap, namespace.events, records)
    worker = Worker(namespace, tmp_path).start()
    try:
        expected = {f"{name}-{when}" for name in shapes for when in ("before", "after")}
        history = TopicReader(kafka_bootstrap, namespace.history).wait_until(
            lambda recs: {r["runId"] for r in closing(recs)} >= expected, 120,
            "every valid run to conclude", worker.log_tail)
        dead = TopicReader(kafka_bootstrap, namespace.deadletter).wait_until(
            lambda recs: len(recs) >= len(shapes), 60, "the dead letters", worker.log_tail)
        assert worker.process is not None and worker.process.poll() is None
        assert worker.starts == 1
    finally:
        worker.stop()
    assert sorted(r.key.decode() for r in dead) == sorted(shapes)
    assert all(r.value["code"] in ("malformed_event", "undecodable_record") for r in dead)
    # Every run that ends gets a closing record: the poisoned ones say they failed.
    assert {r["runId"] for r in closing(history) if r["outcome"] == "success"} == expected
    assert {r["runId"]: r["failure"]["code"] for r in closing(history)
            if r["outcome"] == "failed"} == {f"{name}-poisoned": dead_letter.value["code"]
                                             for name in shapes for dead_letter in dead
                                             if dead_letter.key.decode() == name}
    for record in history:
        if record.value["kind"] == "message":
            assert record.value["message"]["content"] == "whole"
    assert "processing error" not in worker.log_path.read_text()


def test_tenants_with_the_same_run_key_never_see_each_other(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    namespace = Namespace(kafka_bootstrap)
    namespace.create_topics()
    acme = run_events("thread", "run", *reasoning("rm", "acme thinks"), encrypted("rm", "e-a"))
    globex = run_events("thread", "run", *reasoning("rm", "globex thinks"))
    interleaved = []
    for a, g in zip_longest(acme, globex):
        interleaved += [(b"same-key", value, [("tenant", tenant)])
                        for value, tenant in ((a, b"acme"), (g, b"globex")) if value is not None]
    interleaved += [(b"same-key", e, []) for e in run_events("thread", "run")]  # default tenant
    produce(kafka_bootstrap, namespace.events, interleaved)
    worker = Worker(namespace, tmp_path).start()
    try:
        history = TopicReader(kafka_bootstrap, namespace.history).wait_until(
            lambda recs: len(closing(recs)) >= 3, 120, "three closing records", worker.log_tail)
    finally:
        worker.stop()
    messages = {r.value["tenant"]: r.value["message"] for r in history
                if r.value["kind"] == "message"}
    assert messages == {
        "acme": {"id": "rm", "role": "reasoning", "content": "acme thinks",
                 "encryptedValue": "e-a"},
        "globex": {"id": "rm", "role": "reasoning", "content": "globex thinks"},
    }
    assert {r.key for r in history} == {b"acme/thread", b"globex/thread", b"default/thread"}
    assert sorted(r["outcome"] for r in closing(history)) == ["success"] * 3


# Ticks come every idle timeout / 4. At 16 s they are sparser than the commits
# (every 2.8 s): a tick sent inside a transaction was never committed once the
# input stopped, so the run was never abandoned (and the transaction timed out).
@pytest.mark.parametrize("idle_timeout", ["2", "16"])
def test_idle_runs_are_abandoned_and_their_state_freed(
    kafka_bootstrap: str, tmp_path: Path, idle_timeout: str
) -> None:
    namespace = Namespace(kafka_bootstrap)
    namespace.create_topics()
    never_finished = run_events("t", "stuck", *reasoning("rm", "thinking"),
                                encrypted("rm", "enc-held"))[:-1]
    produce(kafka_bootstrap, namespace.events, [(b"stuck", e, []) for e in never_finished])
    worker = Worker(namespace, tmp_path, AGUI_IDLE_TIMEOUT_SECONDS=idle_timeout).start()
    try:
        dead = TopicReader(kafka_bootstrap, namespace.deadletter).wait_until(
            lambda recs: any(r.value["code"] == "run_abandoned" for r in recs), 120,
            "run_abandoned", worker.log_tail)
        wait_for(lambda: "agui_open_runs 0.0" in worker.metrics(), 30, "open runs back to 0")
        metrics = worker.metrics()
        # The key's state was freed: the same key starts afresh.
        produce(kafka_bootstrap, namespace.events,
                [(b"stuck", e, []) for e in run_events("t", "again")])
        history = TopicReader(kafka_bootstrap, namespace.history).wait_until(
            lambda recs: len(closing(recs)) >= 2, 60, "the fresh run", worker.log_tail)
    finally:
        worker.stop()
    abandoned = next(r.value for r in dead if r.value["code"] == "run_abandoned")
    assert abandoned["kind"] == "failure" and abandoned["runId"] == "stuck"
    assert counter_value(metrics, "agui_encrypted_content_lost_total", "run_abandoned") == 1
    assert counter_value(metrics, "agui_run_failures_total", "run_abandoned") == 1
    # The abandoned run's closing record says so; the fresh run concludes on its own.
    assert [(r["runId"], r["outcome"]) for r in closing(history)] == [
        ("stuck", "abandoned"), ("again", "success")]


def test_signals_log_where_tasks_wait_and_never_reasoning(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """SIGUSR1 logs code locations (mode's default dumped every frame's locals);
    SIGUSR2 neither stops the worker nor starts a debugger."""
    secret = "reasoning-SECRET-" + "Z" * 40
    namespace = Namespace(kafka_bootstrap)
    namespace.create_topics()
    worker = Worker(namespace, tmp_path).start()
    try:
        open_run = [dumps({"type": "RUN_STARTED", "threadId": "t", "runId": "r"}),
                    *(dumps(e) for e in reasoning("rm", secret)[:2])]  # held, never finished
        produce(kafka_bootstrap, namespace.events, [(b"k", value, []) for value in open_run])
        wait_for(lambda: worker.processed() >= len(open_run), 60, "the open run's records",
                 worker.log_tail)
        assert worker.process is not None
        os.kill(worker.process.pid, signal.SIGUSR1)
        wait_for(lambda: " tasks:" in worker.log_path.read_text(), 30, "the task dump",
                 worker.log_tail)
        os.kill(worker.process.pid, signal.SIGUSR2)
        wait_for(lambda: "SIGUSR2 ignored" in worker.log_path.read_text(), 30,
                 "SIGUSR2 to be ignored", worker.log_tail)
        assert worker.processed() >= len(open_run)  # still serving /metrics
        log = worker.log_path.read_text()
        assert "processors/runtime/jobs.py" in log  # the agent's await path is in the dump
        assert secret not in log
    finally:
        worker.stop()
