"""The stream processor: a Faust app around `RecordProcessor`.

The agent only decodes the Faust message into an `Incoming`, calls the
processor (which never raises) and keeps what it returns for the record's
partition. Nothing is awaited per record. When Faust commits, the worker first
sends, per partition, the records its inputs produced and the state they
changed (write-behind: at most one state entry and one text chunk per key, a
chunk split to stay within the largest record),
each in the source partition's transaction, then Faust commits the offsets:
with `exactly_once`, state, outputs and offsets are one Kafka transaction, so
a crash replays onto consistent state. Faust's traps and the adaptations that
avoid them are in `processors.runtime.faust_adaptations`.

Runs idle longer than the idle timeout are abandoned by a sweep that each
worker triggers with one tick record per partition it owns, on an internal
topic read by the same agent, so the sweep runs in the partition's own stream
and reaches partitions with no traffic.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import faust

from processors.config import Settings
from processors.engine.limits import RunLimits
from processors.metrics import Metrics
from processors.processing.outputs import OutputBuilder
from processors.processing.record_processor import RecordProcessor, StoredTables
from processors.processing.routing import TenantRouting
from processors.runtime.commit import WriteBehindTable
from processors.runtime.faust_adaptations import AdaptedApp, CommitProducer
from processors.runtime.health import Liveness
from processors.runtime.jobs import WorkerJobs
from processors.runtime.kafka_client import faust_credentials
from processors.runtime.view_service import is_history, serve_thread_view
from processors.runtime.web_server import WebLimits
from processors.runtime.worker_transactions import worker_transactional_id
from processors.view.tenant_tokens import TenantTokens
from processors.view.thread_view import ThreadView
from topics.declarations import (
    STATE_TABLE,
    TABLE_NAMES,
    TEXT_TABLE,
    VIEW_TABLE,
    idle_ticks_topic,
    largest_record,
)

log = logging.getLogger("agui_stream")

# What one fetch brings per partition (Faust: 1 MiB). aiokafka hands out a fetch's
# records one partition after another, so under a backlog each partition waited for
# the others' whole megabyte: 4-6 s with 8 partitions, most of a rebalance's pause
# (issue 9). 64 KiB is a few hundred records; a larger record still comes whole.
PARTITION_FETCH_BYTES = 64 * 1024


def faust_app(settings: Settings, app_class: type[faust.App] = AdaptedApp) -> Any:
    """The bare Faust app as the worker configures it: no tables, agents or pages.

    `app_class` faust.App gives stock Faust with the same settings (benchmarks)."""
    return app_class(
        settings.app_id,
        broker=settings.broker_url,
        broker_credentials=faust_credentials(settings),
        store="memory://" if settings.store == "memory://" else "rocksdb://",
        datadir=settings.data_dir,
        processing_guarantee=settings.processing_guarantee,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        topic_disable_leader=True,
        producer_max_request_size=largest_record(settings.max_record_bytes),
        # Batch what commits send (outputs, changelog entries) into few requests.
        producer_linger=0.05,
        producer_max_batch_size=512 * 1024,
        broker_commit_every=100_000,
        broker_commit_interval=settings.commit_interval_seconds,
        consumer_max_fetch_size=PARTITION_FETCH_BYTES,
        consumer_auto_offset_reset="earliest",
        consumer_group_instance_id=settings.group_instance_id,
        broker_session_timeout=settings.session_timeout_seconds,
        # A leave is learnt at the next heartbeat: with 3 s between heartbeats that
        # was up to 3 s of the pause a scale-in makes (issue 9); a heartbeat is tiny.
        broker_heartbeat_interval=min(1.0, settings.session_timeout_seconds / 3),
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=True,
        web_port=settings.metrics_port,
        web_bind=settings.api_bind,
        autodiscover=False,
        loghandlers=[],
    )


def rocksdb_options(memory_mib: int) -> dict[str, int]:
    """Faust opens one RocksDB per table and partition with a 2 GiB block cache and
    three 64 MiB write buffers each: a worker's memory would follow the writes of the
    last flush, up to gigabytes per partition. Bounded: half block cache, half two
    write buffers (docs/operations.md, *Sizing*)."""
    budget = memory_mib * 2**20
    return {"block_cache_size": budget // 2, "write_buffer_size": budget // 4,
            "max_write_buffer_number": 2}


def create_app(settings: Settings, metrics: Metrics, tokens: TenantTokens | None = None,
               topic_limits: dict[str, int] | None = None,
               matched_inputs: list[str] | None = None) -> AdaptedApp:
    """The Faust app with its tables, agents, sweep timer and web pages; `tokens` are
    the thread API's (None: the API refuses every request); `topic_limits` the
    largest record each output topic that exists takes, as the broker said at start
    (with per-tenant topics, which tenants' topics exist); `matched_inputs` the raw
    topics AGUI_INPUT_PATTERN matched at start."""
    app: AdaptedApp = faust_app(settings)
    if settings.one_transaction_per_worker:
        app.worker_transactional_id = worker_transactional_id(settings.app_id,
                                                              settings.group_instance_id)
        log.warning("AGUI_TRANSACTIONS=worker is experimental: a known bug lost runs in a"
                    " rolling restart (docs/next-turn.md); not for production")
    app.web_limits = WebLimits(settings.api_bind, settings.metrics_port,
                               settings.api_max_connections)  # before any page
    ticks = idle_ticks_topic(settings.app_id)
    # By names, also for AGUI_INPUT_PATTERN: Faust's aiokafka driver subscribes to a
    # topic's names only, and a topic made with a pattern has none (it read nothing).
    inputs = (settings.input_topics if settings.input_pattern is None
              else tuple(matched_inputs or ()))
    source = app.raw_topic(*inputs, ticks)
    # key_type/value_type bytes is what makes Faust use the raw codec for the
    # changelog in both directions (a schema alone leaves recovery on JSON).
    tables = {
        name: WriteBehindTable(app, name=name, beacon=app.tables.beacon,
                               partitions=settings.partitions, key_type=bytes,
                               value_type=bytes,
                               options=rocksdb_options(settings.rocksdb_memory_mib))
        for name in TABLE_NAMES
    }
    for table in tables.values():
        app.tables.add(table)
    producer = cast(CommitProducer, app.producer)
    templates = settings.tenant_templates
    routing = None if templates is None else TenantRouting(*templates.both)
    # (A tenant's topics are learnt by the first commit that writes them: with many
    # tenants, learning them all ahead would cost each new producer more than it saves.)
    shared = ((settings.history_topic,) if routing is None else ()) + (
        settings.deadletter_topic,)
    producer.commit_topics = (*shared, *sorted(app.tables.changelog_topics))
    builder = OutputBuilder(settings.history_topic, settings.deadletter_topic,
                            settings.max_record_bytes, metrics, routing)
    for topic, limit in (topic_limits or {}).items():
        builder.set_topic_limit(topic, limit)
    if routing is not None:
        routing.learn(topic_limits or {}, {})  # (nothing fetched yet)
    processor = RecordProcessor(
        builder, metrics, StoredTables(tables[STATE_TABLE], tables[TEXT_TABLE]),
        tenant_header=settings.tenant_header, default_tenant=settings.default_tenant,
        idle_timeout=settings.idle_timeout_seconds,
        limits=RunLimits(settings.run_max_events, settings.run_max_content_chars,
                         settings.run_max_items),
        tenant_open_runs=settings.tenant_max_open_runs,
        checkpoint_seconds=settings.checkpoint_seconds)
    view = ThreadView(tables[VIEW_TABLE], partitions=settings.partitions,
                      retention_seconds=settings.view_retention_seconds,
                      history_topic=settings.history_topic,
                      tenant_topic=None if templates is None else templates.history.topic)
    view_topics = sorted(name for name in topic_limits or {}
                         if templates is not None and is_history(settings, name))
    serve_thread_view(app, settings, metrics, view, tokens, view_topics)
    jobs = WorkerJobs(app, settings, metrics, processor, view, producer, tables,
                      Liveness(settings.stall_seconds, time.monotonic()))

    jobs.subscribed = frozenset((*inputs, *view_topics))
    app.agent(source, name="run-events")(jobs.process)
    app.take_commit = jobs.take_commit
    app.observe_commit = jobs.observe_commit
    app.backlogged = jobs.backlogged
    app.timer(min(30.0, settings.idle_timeout_seconds / 4))(jobs.tick_own_partitions)
    app.timer(10.0)(jobs.measure_lag)
    app.timer(min(10.0, settings.stall_seconds / 3))(jobs.check_progress)
    app.timer(60.0)(jobs.refresh_topic_limits)
    app.on_partitions_revoked.connect(jobs.on_partitions_revoked)  # type: ignore[arg-type]
    app.on_partitions_assigned.connect(jobs.on_partitions_assigned)  # type: ignore[arg-type]
    app.page("/metrics")(_page(jobs.metrics_page))
    app.page("/livez")(_page(jobs.liveness_page))
    app.page("/readyz")(_page(jobs.readiness_page))
    app.page("/healthz")(_page(jobs.health_page))
    return app


def _page(handler: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
    """A bound method as a Faust page: Faust makes a view class whose `get` is the
    function it is given, called with the view as its first argument."""
    @functools.wraps(handler)
    async def page(web: Any, request: Any) -> Any:
        return await handler(web, request)
    return page
