"""Prometheus metrics the service exports (contract: docs/topics.md, "Metrics").

Every label value comes from a closed set (codes, reasons, event types,
outcomes); tenants are never a label here, so the scrape stays bounded however
many tenants a fleet has. Nothing derived from event content (ids, text,
encrypted values) ever becomes a label.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from processors.engine.codes import FailureCode, LossReason, Outcome, WarningCode
from processors.tap.runs import DropReason, Fate
from topics.events import EVENT_TYPES

# The phases of a commit `agui_commit_seconds` times, in order.
COMMIT_PHASES = ("take", "send", "commit")


class Metrics:
    """One set of the service's metrics, registered on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.encrypted_content_lost = Counter(
            "agui_encrypted_content_lost",
            "Encrypted reasoning values that could not be preserved, by reason.",
            ["reason"],
            registry=r,
        )
        self.warnings = Counter(
            "agui_warnings", "Warnings (material stripped or dropped), by code.", ["code"],
            registry=r,
        )
        self.run_failures = Counter(
            "agui_run_failures", "Runs ended by a failure, by code.", ["code"], registry=r
        )
        self.runs = Counter(
            "agui_runs", "Runs concluded, by outcome.", ["outcome"], registry=r
        )
        self.history_records = Counter(
            "agui_history_records", "Records produced to the history topic.", registry=r
        )
        self.deadletter_records = Counter(
            "agui_deadletter_records", "Records produced to the dead-letter topic, by kind.",
            ["kind"], registry=r,
        )
        self.discarded_events = Counter(
            "agui_discarded_events",
            "Events discarded because their run had already failed.",
            registry=r,
        )
        self.replayed_records = Counter(
            "agui_replayed_records",
            "Records skipped because they were already applied (replay after a crash).",
            registry=r,
        )
        self.tenant_open_runs = Gauge(
            "agui_tenant_open_runs",
            "Runs open on this worker, by tenant (the first 50 tenants seen; the rest as"
            " other).", ["tenant"], registry=r)
        self.open_runs = Gauge(
            "agui_open_runs", "Runs started and not yet concluded on this worker.", registry=r
        )
        self.open_run_content = Gauge(
            "agui_open_run_content_chars",
            "Characters of text and tool-call arguments the open runs on this worker have"
            " streamed, held until each concludes (about 2 bytes of memory each).", registry=r)
        self.unread_topics = Gauge(
            "agui_unread_topics", "Raw topics the input pattern matches, and tenants' history"
            " topics, created after the worker started: read after its next restart",
            registry=r)
        self.consumer_lag = Gauge(
            "agui_consumer_lag_records",
            "Records behind the end of each assigned raw-topic partition.",
            ["topic", "partition"],
            registry=r,
        )
        self.view_lag = Gauge(
            "agui_view_lag_records",
            "Offsets of each owned history partition after the last record the thread"
            " view applied (when caught up: the commit markers after it).",
            ["partition"],
            registry=r,
        )
        self.view_threads = Gauge(
            "agui_view_threads", "Threads the thread view holds on this worker.", registry=r
        )
        self.api_request_seconds = Histogram(
            "agui_api_request_seconds",
            "Thread API requests answered by this worker, by route and status.",
            ["route", "status"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
            registry=r,
        )
        self.commit_seconds = Histogram(
            "agui_commit_seconds",
            "This worker's timed commits, by phase: take (waiting for the record being"
            " processed, then gathering what the records since the last commit left),"
            " send (producing it until the broker has it), commit (the offsets and the"
            " transactions' end). A record's outputs are readable after its commit.",
            ["phase"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.3, 0.5, 1.0,
                     2.5, 10.0),
            registry=r,
        )
        self.per_record = PerRecordTallies()
        r.register(self.per_record)
        # One raw input record of a partition processed in some seconds (per record:
        # the tally's own method, no layer in between).
        self.count_record = self.per_record.record
        self._expose_every_label()

    def count_event(self, event_type: str) -> None:
        """One raw record of `event_type` consumed."""
        tally = self.per_record.events
        tally[event_type] = tally.get(event_type, 0) + 1

    def _expose_every_label(self) -> None:
        """Export every series of the closed label sets from the start, at 0.

        Dashboards then show every code, and `increase()` sees the first loss
        (a series that appears at 1 has no increase to Prometheus).
        """
        for reason in LossReason:
            self.encrypted_content_lost.labels(reason.value)
        for warning in WarningCode:
            self.warnings.labels(warning.value)
        for failure in (*FailureCode, "processing_error"):
            self.run_failures.labels(str(failure))
        for event_type in (*sorted(EVENT_TYPES), "unknown", "undecodable", "abandoned"):
            self.per_record.events[event_type] = 0
        for outcome in Outcome:
            self.runs.labels(outcome.value)
        for kind in ("failure", "warning"):
            self.deadletter_records.labels(kind)
        for phase in COMMIT_PHASES:
            self.commit_seconds.labels(phase)


# `agui-stream tap`'s closed label sets (docs/tap.md, *Metrics*).
TAP_RESPONSE_KINDS = ("tapped", "untenanted", "not_sse", "upstream_error")
TAP_UPSTREAM_ERRORS = ("unreachable", "timeout", "status", "broken")
TAP_EVENT_RESULTS = ("published", "dropped", "unattributed")


class TapMetrics:
    """The metrics of `agui-stream tap`, on their own registry."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.responses = Counter(
            "agui_tap_responses", "Responses proxied, by kind: tapped (an SSE response"
            " published), untenanted (SSE, no tenant: not published), not_sse, upstream_error"
            " (an error status, or the tap's own 502/504).", ["kind"], registry=r)
        self.upstream_errors = Counter(
            "agui_tap_upstream_errors", "Upstream failures, by kind.", ["kind"], registry=r)
        self.runs = Counter(
            "agui_tap_runs", "Runs seen in tapped responses, by fate.", ["fate"], registry=r)
        self.dropped_runs = Counter(
            "agui_tap_dropped_runs", "Runs whose publication was dropped, by reason.",
            ["reason"], registry=r)
        self.events = Counter(
            "agui_tap_events", "SSE events of tapped responses, by result: published (handed"
            " to the producer), dropped (of a dropped run), unattributed (no run key).",
            ["result"], registry=r)
        self.event_bytes = Counter(
            "agui_tap_event_bytes", "Bytes of records handed to the producer.", registry=r)
        self.forwarded_bytes = Counter(
            "agui_tap_forwarded_bytes", "Response body bytes forwarded to clients.", registry=r)
        self.publish_errors = Counter(
            "agui_tap_publish_errors", "Records Kafka did not take.", registry=r)
        self.publish_lag = Histogram(
            "agui_tap_publish_lag_seconds", "Time from an event read from the upstream to"
            " Kafka acknowledging its record (acks=all).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                     10.0, 30.0, 60.0),
            registry=r)
        self.buffered_bytes = Gauge(
            "agui_tap_buffered_bytes", "Bytes of records waiting for Kafka.", registry=r)
        self.publishing = Gauge(
            "agui_tap_publishing", "1 while Kafka takes the tap's records, 0 while it is"
            " unreachable or refusing them.", registry=r)
        for kind in TAP_RESPONSE_KINDS:
            self.responses.labels(kind)
        for error in TAP_UPSTREAM_ERRORS:
            self.upstream_errors.labels(error)
        for fate in Fate:
            self.runs.labels(fate.value)
        for reason in DropReason:
            self.dropped_runs.labels(reason.value)
        for result in TAP_EVENT_RESULTS:
            self.events.labels(result)


class PerRecordTallies(Collector):
    """The series counted once per record: raw records by event type
    (`agui_events_total`) and by input partition (`agui_partition_records_total`),
    and the processing latency histogram (`agui_processing_latency_seconds`).

    They are plain integers, exported when scraped: a prometheus_client child takes
    a lock for every increment, three of them per record. Only the event loop that
    processes records (and serves the scrape) may count them.
    """

    BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

    def __init__(self) -> None:
        self.events: dict[str, int] = {}
        self.partitions: dict[int, int] = {}
        self.latency_buckets = [0] * (len(self.BUCKETS) + 1)  # the last one is +Inf
        self.latency_sum = 0.0

    def records(self) -> int:
        """Input records processed so far."""
        return sum(self.partitions.values())

    def record(self, partition: int, latency: float) -> None:
        partitions = self.partitions
        partitions[partition] = partitions.get(partition, 0) + 1
        self.latency_buckets[bisect_left(self.BUCKETS, latency)] += 1
        self.latency_sum += latency

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily("agui_events", "Raw records consumed, by event type.",
                                     labels=["type"])
        for event_type, count in self.events.items():
            events.add_metric([event_type], count)
        yield events
        partitions = CounterMetricFamily(
            "agui_partition_records",
            "Raw records processed by this worker, by input partition number (bounded by"
            " AGUI_PARTITIONS).", labels=["partition"])
        for partition, count in sorted(self.partitions.items()):
            partitions.add_metric([str(partition)], count)
        yield partitions
        cumulative = 0
        buckets = []
        for bound, count in zip((*map(str, self.BUCKETS), "+Inf"), self.latency_buckets,
                                strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        yield HistogramMetricFamily(
            "agui_processing_latency_seconds",
            "Time from consuming a raw record to having produced its outputs.",
            buckets=buckets, sum_value=self.latency_sum)
