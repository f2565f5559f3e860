"""From the engine's decisions about one input record to output records and metrics.

Pure apart from the metrics it counts: the Faust agent only sends what this
returns. Every warning and failure becomes one dead-letter record; every
concluded run becomes its message records and one closing record; history too
large for the sink is `not_storable` (a warning and a loss per value on it).
"""

from __future__ import annotations

import base64
import logging
from typing import Any, NamedTuple

import orjson

from processors.engine.codes import LossReason, WarningCode
from processors.engine.decisions import (
    Concluded,
    Discarded,
    EncryptedLost,
    Failed,
    RunIdentity,
    Step,
    Warned,
)
from processors.metrics import Metrics
from topics.records import (
    DeadLetter,
    HistoryMessage,
    HistoryRun,
    SourceCoordinates,
)
from topics.redaction import redact_event

Headers = list[tuple[str, bytes]]
log = logging.getLogger("agui_stream")


class Incoming(NamedTuple):
    """One raw record, as consumed."""

    topic: str
    partition: int
    offset: int
    timestamp: int | None
    key: bytes
    value: bytes
    headers: Headers


def incoming_record(message: Any) -> Incoming:
    """The `Incoming` of a consumed Faust message (its timestamp is in seconds)."""
    timestamp = message.timestamp
    return Incoming(message.topic, message.partition, message.offset,
                    None if timestamp is None else int(timestamp * 1000),
                    message.key or b"", message.value or b"", _header_list(message.headers))


def _header_list(headers: Any) -> Headers:
    if not headers:
        return []
    items = headers.items() if isinstance(headers, dict) else headers
    return [(str(name), bytes(value or b"")) for name, value in items]


class Outgoing(NamedTuple):
    topic: str
    key: bytes
    value: bytes
    headers: Headers


class OutputBuilder:
    def __init__(self, history_topic: str, deadletter_topic: str, max_record_bytes: int,
                 metrics: Metrics) -> None:
        self.history_topic = history_topic
        self.deadletter_topic = deadletter_topic
        self.max_record_bytes = max_record_bytes
        self.metrics = metrics

    def build(self, step: Step, record: Incoming, tenant: str) -> list[Outgoing]:
        metrics = self.metrics
        metrics.count_event(step.event_type)
        out: list[Outgoing] = []
        for decision in step.decisions:
            if isinstance(decision, Warned):
                metrics.warnings.labels(decision.code.value).inc()
                out.append(self._dead_letter("warning", decision.code.value, decision.reason,
                                             decision.run, record, tenant))
            elif isinstance(decision, EncryptedLost):
                metrics.encrypted_content_lost.labels(decision.reason.value).inc()
            elif isinstance(decision, Failed):
                metrics.run_failures.labels(decision.code.value).inc()
                metrics.runs.labels("failed").inc()
                out.append(self._dead_letter("failure", decision.code.value, decision.reason,
                                             decision.run, record, tenant))
            elif isinstance(decision, Concluded):
                metrics.runs.labels(decision.outcome.value).inc()
                out.extend(self._history(decision, record, tenant))
            elif isinstance(decision, Discarded):
                metrics.discarded_events.inc()
        return out

    def count_lost(self, reason: LossReason, values: int) -> None:
        """`values` encrypted values lost for `reason` (outside an engine decision)."""
        if values:
            self.metrics.encrypted_content_lost.labels(reason.value).inc(values)

    def dead_letter_for_exception(self, record: Incoming, tenant: str) -> Outgoing:
        """An unexpected error while processing: the run is failed, the record kept."""
        self.metrics.run_failures.labels("processing_error").inc()
        self.metrics.runs.labels("failed").inc()
        return self._dead_letter("failure", "processing_error",
                                 "internal error while processing this record; the run was"
                                 " failed and the record kept here", None, record, tenant)

    # --- history ----------------------------------------------------------------------

    def _history(self, concluded: Concluded, record: Incoming, tenant: str) -> list[Outgoing]:
        run = concluded.run
        thread_id = None if run is None else run.thread_id
        run_id = None if run is None else run.run_id
        key = f"{tenant}/{thread_id if thread_id is not None else ''}".encode()
        published: list[Outgoing] = []
        dead_letters: list[Outgoing] = []
        for message in concluded.messages:
            value = HistoryMessage.encode(tenant, thread_id, run_id, len(published), message)
            if len(value) + len(key) > self.max_record_bytes:
                dead_letters.append(self._not_storable(message, run, record, tenant))
                continue
            published.append(Outgoing(self.history_topic, key, value, []))
        closing = HistoryRun(
            tenant=tenant, threadId=thread_id, runId=run_id,
            outcome="success" if concluded.outcome.value == "finished" else "error",
            messageCount=len(published), usage=concluded.usage, error=concluded.error,
        ).to_bytes()
        published.append(Outgoing(self.history_topic, key, closing, []))
        self.metrics.history_records.inc(len(published))
        return [*dead_letters, *published]

    def _not_storable(self, message: dict[str, Any], run: RunIdentity | None, record: Incoming,
                      tenant: str) -> Outgoing:
        values = (1 if "encryptedValue" in message else 0) + sum(
            1 for call in message.get("toolCalls", ()) if "encryptedValue" in call
        )
        for _ in range(values):
            self.metrics.encrypted_content_lost.labels(LossReason.NOT_STORABLE.value).inc()
        self.metrics.warnings.labels(WarningCode.NOT_STORABLE.value).inc()
        reason = (f"history message {message['id']!r} exceeds {self.max_record_bytes} bytes;"
                  f" it was not published ({values} encrypted value(s) lost)")
        return self._dead_letter("warning", WarningCode.NOT_STORABLE.value, reason, run,
                                 record, tenant, include_event=False)

    # --- dead letters -------------------------------------------------------------------

    def _dead_letter(self, kind: str, code: str, reason: str, run: RunIdentity | None,
                     record: Incoming, tenant: str, include_event: bool = True) -> Outgoing:
        """The dead letter of `record`. Never raises: if the event copy cannot be
        built, the record still gets a minimal one (code, reason, tenant, source)."""
        self.metrics.deadletter_records.labels(kind).inc()
        source = SourceCoordinates(topic=record.topic, partition=record.partition,
                                   offset=record.offset, timestamp=record.timestamp)
        fields: dict[str, Any] = {
            "kind": kind, "code": code, "reason": reason, "tenant": tenant, "source": source,
            "threadId": None if run is None else run.thread_id,
            "runId": None if run is None else run.run_id,
        }
        try:
            event, raw = (_offending(record.value) if include_event else (None, None))
            value = DeadLetter(**fields, event=event, raw=raw).to_bytes()
        except Exception as error:
            # Log the kind of error only: its message could quote the event.
            log.error("could not copy the event into its dead letter (%s); sent without it",
                      type(error).__name__)
            value = DeadLetter(**fields).to_bytes()
        if len(value) + len(record.key) > self.max_record_bytes:
            value = DeadLetter(**fields, truncated=True).to_bytes()
        headers: Headers = [
            ("agui.dlq.code", code.encode()),
            ("agui.dlq.kind", kind.encode()),
            ("agui.dlq.topic", record.topic.encode()),
            ("agui.dlq.partition", str(record.partition).encode()),
            ("agui.dlq.offset", str(record.offset).encode()),
            *record.headers,
        ]
        return Outgoing(self.deadletter_topic, record.key, value, headers)


def _offending(value: bytes) -> tuple[Any, str | None]:
    """The event as received (redacted), or the raw bytes when it was not JSON."""
    try:
        event = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None, base64.b64encode(value).decode("ascii")
    return redact_event(event), None
