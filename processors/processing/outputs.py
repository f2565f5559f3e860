"""From the engine's decisions about one input record to output records and metrics.

Pure apart from the metrics it counts: the Faust agent only sends what this
returns. Every warning and failure becomes one dead-letter record; every run
that ends becomes its history records (docs/topics.md: message, input,
continuation and removal records) and one closing record, a failed or abandoned
run only the closing record; history too large for the sink is `not_storable`
(a warning and a loss per value on it).
"""

from __future__ import annotations

import base64
import hashlib
import logging
from typing import Any, NamedTuple

import orjson

from processors.engine.codes import FailureCode, LossReason, Outcome, WarningCode
from processors.engine.decisions import (
    REMOVAL,
    Concluded,
    Discarded,
    EncryptedLost,
    Failed,
    RunIdentity,
    Step,
    Warned,
)
from processors.metrics import Metrics
from processors.processing.routing import TenantRouting
from topics.declarations import largest_record
from topics.records import (
    DeadLetter,
    HistoryMessage,
    HistoryRemoval,
    HistoryRun,
    RunFailure,
    SourceCoordinates,
)
from topics.redaction import redact_event

Headers = list[tuple[str, bytes]]
log = logging.getLogger("agui_stream")

# What a record costs on the wire beyond its key, value and headers' bytes: its own
# framing and its batch's (Kafka's record batch: a 61-byte header and a few varints
# per record and header), rounded up. A record alone in its batch is what a topic's
# max.message.bytes is compared with.
RECORD_OVERHEAD = 128
# A dead letter's reason, tenant and ids are cut to this many characters when the
# record is too large without its event and headers (a producer's id may be a megabyte).
_CUT = 1024


def record_bytes(key: bytes, value: bytes, headers: Headers) -> int:
    """The bytes a record is charged against its topic's max.message.bytes (an upper
    bound: uncompressed, with every varint at its widest)."""
    return (RECORD_OVERHEAD + len(key) + len(value)
            + sum(len(name.encode("utf-8", "surrogatepass")) + len(data) + 10
                  for name, data in headers))


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
                    message.key or b"", message.value or b"", header_list(message.headers))


def header_list(headers: Any) -> Headers:
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
    """`routing`: the per-tenant layout (None: every tenant's outputs go to
    `history_topic` and `deadletter_topic`)."""

    def __init__(self, history_topic: str, deadletter_topic: str, max_record_bytes: int,
                 metrics: Metrics, routing: TenantRouting | None = None) -> None:
        self.history_topic = history_topic
        self.deadletter_topic = deadletter_topic
        self.max_record_bytes = max_record_bytes  # the largest history message published
        self.metrics = metrics
        self.routing = routing
        # The largest record each output topic takes, as the broker says
        # (`set_topic_limit`); until it has, what `create-topics` gives them.
        self.default_limit = largest_record(max_record_bytes)
        self.topic_limits: dict[str, int] = {}

    def set_topic_limit(self, topic: str, limit: int) -> None:
        """The broker's max.message.bytes for `topic` (with the producer's request
        limit, the smaller): every record built for it from now on fits."""
        self.topic_limits[topic] = limit

    def _fits(self, topic: str, key: bytes, value: bytes, headers: Headers) -> bool:
        return (record_bytes(key, value, headers)
                <= self.topic_limits.get(topic, self.default_limit))

    def _history_topic(self, tenant: str) -> str:
        if self.routing is None:
            return self.history_topic
        return self.routing.topics(tenant).history or self.history_topic  # (not routable)

    def _deadletter_topic(self, tenant: str) -> str:
        if self.routing is None:
            return self.deadletter_topic
        return self.routing.topics(tenant).deadletter or self.deadletter_topic

    def build(self, step: Step, record: Incoming, tenant: str) -> list[Outgoing]:
        runs = (getattr(decision, "run", None) for decision in step.decisions)
        run = next((run for run in runs if run is not None), None)
        return self._published(self._build(step, record, tenant), record, tenant, run)

    def _published(self, out: list[Outgoing], record: Incoming, tenant: str,
                   run: RunIdentity | None) -> list[Outgoing]:
        """`out`, or when the tenant's topics do not exist, the one dead letter that
        says so; counted (history records, dead letters by kind)."""
        if out and self.routing is not None and self.routing.missing(tenant):
            out = [self._tenant_topic_missing(out, record, tenant, run)]
        for outgoing in out:
            if outgoing.headers and outgoing.headers[0][0] == _DLQ_CODE:
                self.metrics.deadletter_records.labels(outgoing.headers[1][1].decode()).inc()
            else:
                self.metrics.history_records.inc()
        return out

    def _build(self, step: Step, record: Incoming, tenant: str) -> list[Outgoing]:
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
                outcome = (Outcome.ABANDONED if decision.code is FailureCode.RUN_ABANDONED
                           else Outcome.FAILED)
                metrics.runs.labels(outcome.value).inc()
                out.append(self._dead_letter("failure", decision.code.value, decision.reason,
                                             decision.run, record, tenant))
                if decision.run is not None:  # a run ended: its closing record says how
                    out.append(self._closing(tenant, decision.run, HistoryRun(
                        tenant=tenant, threadId=decision.run.thread_id,
                        runId=decision.run.run_id, outcome=outcome.value, messageCount=0,
                        failure=RunFailure(code=decision.code.value)), record))
            elif isinstance(decision, Concluded):
                if not decision.late:  # a late error was counted when the run finished
                    metrics.runs.labels(decision.outcome.value).inc()
                out.extend(self._history(decision, record, tenant))
            elif isinstance(decision, Discarded):
                metrics.discarded_events.inc()
        return out

    def count_lost(self, reason: LossReason, values: int) -> None:
        """`values` encrypted values lost for `reason` (outside an engine decision)."""
        if values:
            self.metrics.encrypted_content_lost.labels(reason.value).inc(values)

    def outputs_for_exception(self, record: Incoming, tenant: str,
                              run: RunIdentity | None) -> list[Outgoing]:
        """An unexpected error while processing: the run is failed (its closing record,
        when it was known), the record kept in a dead letter."""
        self.metrics.run_failures.labels("processing_error").inc()
        self.metrics.runs.labels("failed").inc()
        out = [self._dead_letter("failure", "processing_error",
                                 "internal error while processing this record; the run was"
                                 " failed and the record kept here", run, record, tenant)]
        if run is not None:
            out.append(self._closing(tenant, run, HistoryRun(
                tenant=tenant, threadId=run.thread_id, runId=run.run_id, outcome="failed",
                messageCount=0, failure=RunFailure(code="processing_error")), record))
        return self._published(out, record, tenant, run)

    def _tenant_topic_missing(self, unpublished: list[Outgoing], record: Incoming,
                              tenant: str, run: RunIdentity | None) -> Outgoing:
        """The tenant's topics do not exist: what its record produced cannot be
        published (a partition never waits for an operator). One dead letter in the
        shared topic instead, naming what to create; nothing of the tenant's content
        in it (the per-tenant layout keeps that out of shared topics)."""
        assert self.routing is not None
        missing = self.routing.missing(tenant)
        history = [out for out in unpublished if out.topic != self._deadletter_topic(tenant)]
        values = sum(_encrypted_values(orjson.loads(out.value).get("message", {}))
                     for out in history)
        self.count_lost(LossReason.TENANT_TOPIC_MISSING, values)
        self.metrics.warnings.labels(WarningCode.TENANT_TOPIC_MISSING.value).inc()
        if "" in missing:
            cause = ("the tenant's name is too long for a topic name (Kafka allows 249"
                     " characters): its outputs cannot be published in this layout")
        else:
            cause = (f"topic(s) {', '.join(missing)} do not exist: an administrator creates"
                     " them with agui-stream create-topics --tenant")
        reason = (f"{cause}; {len(history)} history record(s) and"
                  f" {len(unpublished) - len(history)} dead letter(s) of this record were"
                  f" not published ({values} encrypted value(s) lost)")
        return self._dead_letter("warning", WarningCode.TENANT_TOPIC_MISSING.value, reason,
                                 run, record, tenant, include_event=False,
                                 topic=self.deadletter_topic)

    # --- history ----------------------------------------------------------------------

    def _history(self, concluded: Concluded, record: Incoming, tenant: str) -> list[Outgoing]:
        run = concluded.run
        thread_id = None if run is None else run.thread_id
        run_id = None if run is None else run.run_id
        key = _history_key(tenant, thread_id)
        topic = self._history_topic(tenant)
        published: list[Outgoing] = []
        dead_letters: list[Outgoing] = []
        for entry in concluded.entries:
            seq = len(published)
            if entry.kind == REMOVAL:
                value = HistoryRemoval(tenant=tenant, threadId=thread_id, runId=run_id,
                                       seq=seq, messageId=entry.message["id"]).to_bytes()
            else:
                value = HistoryMessage.encode(tenant, thread_id, run_id, seq, entry.message,
                                              entry.kind)  # type: ignore[arg-type]
            if (len(value) + len(key) > self.max_record_bytes
                    or not self._fits(topic, key, value, [])):
                dead_letters.append(self._not_storable(entry.message, run, record, tenant))
                continue
            published.append(Outgoing(topic, key, value, []))
        detail = concluded.detail or {}
        closing = HistoryRun(
            tenant=tenant, threadId=thread_id, runId=run_id, outcome=concluded.outcome.value,
            messageCount=None if concluded.late else len(published),
            pendingToolCallIds=detail.get("pendingToolCallIds"),
            interrupts=detail.get("interrupts"), usage=concluded.usage, error=concluded.error,
            inputEchoed=concluded.input_echoed, late=True if concluded.late else None,
        )
        closed = self._closing(tenant, run, closing, record)
        return [*dead_letters, *published, closed]

    def _closing(self, tenant: str, run: RunIdentity | None, closing: HistoryRun,
                 record: Incoming) -> Outgoing:
        """The closing record, sized: optional fields that do not fit are left out
        (`truncated` names them), largest first; if even the bare record cannot be
        sent (a thread id of a megabyte), a `not_storable` dead letter instead."""
        key = _history_key(tenant, None if run is None else run.thread_id)
        topic = self._history_topic(tenant)
        value = closing.to_bytes()
        left_out: list[str] = []
        while not self._fits(topic, key, value, []):
            optional = {name: len(orjson.dumps(getattr(closing, name)))
                        for name in _CLOSING_OPTIONAL if getattr(closing, name) is not None}
            if not optional:
                self.metrics.warnings.labels(WarningCode.NOT_STORABLE.value).inc()
                return self._dead_letter(
                    "warning", WarningCode.NOT_STORABLE.value,
                    "the run's closing record exceeds the history topic's largest record"
                    " even without its optional fields (its thread id is that long); it was"
                    " not published", run, record, tenant, include_event=False)
            largest = max(optional, key=optional.__getitem__)
            left_out.append(largest)
            closing = closing.model_copy(update={largest: None, "truncated": left_out})
            value = closing.to_bytes()
        return Outgoing(topic, key, value, [])

    def _not_storable(self, message: dict[str, Any], run: RunIdentity | None, record: Incoming,
                      tenant: str) -> Outgoing:
        values = _encrypted_values(message)
        for _ in range(values):
            self.metrics.encrypted_content_lost.labels(LossReason.NOT_STORABLE.value).inc()
        self.metrics.warnings.labels(WarningCode.NOT_STORABLE.value).inc()
        reason = (f"history message {message['id']!r} exceeds {self.max_record_bytes} bytes;"
                  f" it was not published ({values} encrypted value(s) lost)")
        return self._dead_letter("warning", WarningCode.NOT_STORABLE.value, reason, run,
                                 record, tenant, include_event=False)

    # --- dead letters -------------------------------------------------------------------

    def _dead_letter(self, kind: str, code: str, reason: str, run: RunIdentity | None,
                     record: Incoming, tenant: str, include_event: bool = True,
                     topic: str | None = None) -> Outgoing:
        """The dead letter of `record`, to `topic` (None: the tenant's). Never raises:
        if the event copy cannot be built, the record still gets a minimal one (code,
        reason, tenant, source)."""
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
        own: Headers = [  # code and kind first (`_published` counts by them)
            (_DLQ_CODE, code.encode()),
            ("agui.dlq.kind", kind.encode()),
            ("agui.dlq.topic", record.topic.encode()),
            ("agui.dlq.partition", str(record.partition).encode()),
            ("agui.dlq.offset", str(record.offset).encode()),
        ]
        key, headers = record.key, [*own, *record.headers]
        topic = topic or self._deadletter_topic(tenant)
        # Sized before it is sent, headers included: what does not fit is left out, and
        # the record says so (topics/records.py, DeadLetter). Never an unsendable record.
        if not self._fits(topic, key, value, headers):
            fields["truncated"] = True
            value = DeadLetter(**fields).to_bytes()
        if not self._fits(topic, key, value, headers) and record.headers:
            fields["headersDropped"] = len(record.headers)
            headers = own
            value = DeadLetter(**fields).to_bytes()
        if not self._fits(topic, key, value, headers):
            for name in ("reason", "tenant", "threadId", "runId"):
                if fields[name] is not None:
                    fields[name] = fields[name][:_CUT]
            fields["cut"] = True
            value = DeadLetter(**fields).to_bytes()
        if not self._fits(topic, key, value, headers):  # the input's key alone is too large
            key = hashlib.sha256(key).hexdigest().encode()
            headers = [*own, ("agui.dlq.key-sha256", key)]
        return Outgoing(topic, key, value, headers)


_DLQ_CODE = "agui.dlq.code"
# A closing record's optional fields, which it may leave out to fit its topic.
_CLOSING_OPTIONAL = ("interrupts", "usage", "error", "pendingToolCallIds")


def _encrypted_values(message: dict[str, Any]) -> int:
    """The encrypted values a history message carries (its own, its tool calls')."""
    return (1 if "encryptedValue" in message else 0) + sum(
        1 for call in message.get("toolCalls", ()) if "encryptedValue" in call)


def _history_key(tenant: str, thread_id: str | None) -> bytes:
    """A thread's history records are keyed `<tenant>/<threadId>` (docs/topics.md)."""
    return f"{tenant}/{thread_id if thread_id is not None else ''}".encode()


def _offending(value: bytes) -> tuple[Any, str | None]:
    """The event as received (redacted), or the raw bytes when it was not JSON."""
    try:
        event = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None, base64.b64encode(value).decode("ascii")
    return redact_event(event), None
