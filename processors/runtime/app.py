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

import asyncio
import gc
import inspect
import logging
import os
import re
import sys
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, NamedTuple, NoReturn, cast

import faust
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from processors.config import Settings
from processors.metrics import Metrics
from processors.processing.outputs import Outgoing, OutputBuilder, incoming_record
from processors.processing.record_processor import (
    RecordProcessor,
    StateChange,
    StoredTables,
)
from processors.runtime.faust_adaptations import (
    AdaptedApp,
    CommitProducer,
    OutRecord,
    Placed,
    QuickStopTable,
    apply_each,
    resumed_coroutine,
    transactional_id,
)
from processors.runtime.health import Liveness
from processors.runtime.kafka_client import faust_credentials
from processors.runtime.view_service import measure_view, serve_thread_view
from processors.safe_logging import log_exception_kind
from processors.view.tenant_tokens import TenantTokens
from processors.view.thread_view import ThreadView
from topics.declarations import (
    STATE_TABLE,
    TABLE_NAMES,
    TEXT_TABLE,
    VIEW_TABLE,
    idle_ticks_topic,
)

log = logging.getLogger("agui_stream")

EXIT_UNSENT = 70  # EX_SOFTWARE: outputs could not be sent (see stop_without_commit)
# aiohttp takes the charset separately; Prometheus' text format is UTF-8 anyway.
_METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST.split(";")[0]


class WriteBehindTable(QuickStopTable):
    """A table the worker writes only through its changelog: what it sent, once
    delivered and committed, is applied to the local store the way Faust applies a
    changelog in recovery, `apply_changelog_batch` of `_SentEntry`s (never through
    `table[key] = value`, which would send a changelog record per write)."""


class _SentEntry:
    """A sent changelog record in the shape Faust's stores read in recovery
    (`event.key`, `event.value`, `event.message.{key,value,partition,offset,tp}`)."""

    __slots__ = ("key", "message", "offset", "partition", "tp", "value")

    def __init__(self, change: StateChange, batch: Any, place: int) -> None:
        """`batch`: the delivery metadata of the batch the change was sent in; `place`:
        the change's place in it."""
        self.key = change.key
        self.value = change.value
        self.partition = batch.partition
        self.offset = batch.offset + place
        self.tp = batch.topic_partition
        self.message = self


class PartitionBatch(NamedTuple):
    partition: int
    transaction: str | None  # None: no transactions (at_least_once)
    outgoing: list[Outgoing]
    changes: list[StateChange]


class WorkerCommitBatch:
    """One commit's outputs and state changes (a `CommitBatch`). Sent and applied
    while the agent goes on with later records: those only buffer, and no record
    reads a key's stored state while the key has changes in flight (it stays cached
    until `apply`, see RecordProcessor.drop_deleted_keys)."""

    def __init__(self, parts: list[PartitionBatch], producer: CommitProducer,
                 tables: dict[str, WriteBehindTable], app: AdaptedApp,
                 processor: RecordProcessor, view: ThreadView) -> None:
        self.parts = parts
        self.producer = producer
        self.tables = tables
        self.app = app
        self.processor = processor
        self.view = view
        self._sent: list[tuple[StateChange, Placed]] = []
        self._delivered: dict[asyncio.Future[Any], Any] = {}  # a batch's delivery -> metadata

    async def send(self) -> None:
        """Each partition's records in its own transaction (Faust's
        TransactionManager would pick it by the *output* record's partition; history
        is keyed by thread, so it would commit apart from the input offsets), waited
        for until the broker has them: offsets added to a transaction while its
        records are still being produced made the broker refuse them for a moment
        (NOT_ENOUGH_REPLICAS while it verifies the transaction), and the producer
        retried only after its backoff. If anything cannot be sent, exit without a
        commit (see stop_without_commit)."""
        changelogs = {name: table.changelog_topic.get_topic_name()
                      for name, table in self.tables.items()}

        async def send_part(part: PartitionBatch) -> list[Placed]:
            records = [OutRecord(item.topic, None, item.key, item.value, item.headers)
                       for item in part.outgoing]
            records += [OutRecord(changelogs[change.table], part.partition, change.key,
                                  change.value, None) for change in part.changes]
            return await self.producer.send_batched(records, part.transaction)

        try:
            # All partitions at once: one after another, each transaction's first
            # round trip waited for the sends of the partitions before it.
            placements = await asyncio.gather(*map(send_part, self.parts))
            for part, placed in zip(self.parts, placements, strict=True):
                self._delivered.update(dict.fromkeys(delivery for delivery, _place in placed))
                self._sent += zip(part.changes, placed[len(part.outgoing):], strict=True)
            for delivery in self._delivered:
                self._delivered[delivery] = await delivery
        except Exception as error:
            stop_without_commit("the records produced since the last commit", error)

    async def apply(self) -> None:
        """Apply the committed state changes to the local stores, as recovery would."""
        assigned = {tp.partition for tp in self.app.consumer.assignment()}
        # Faust's stores read only what _SentEntry has of an event.
        entries: dict[str, list[Any]] = {name: [] for name in self.tables}
        for change, (delivery, place) in self._sent:
            batch = self._delivered[delivery]
            if batch.partition in assigned:
                entries[change.table].append(_SentEntry(change, batch, place))
        for name, table in self.tables.items():
            table.apply_changelog_batch(entries[name])
        self.processor.drop_deleted_keys()
        self.view.changes_applied(entries[VIEW_TABLE])


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
        producer_max_request_size=settings.max_record_bytes + 65_536,
        # Batch what commits send (outputs, changelog entries) into few requests.
        producer_linger=0.05,
        producer_max_batch_size=512 * 1024,
        broker_commit_every=100_000,
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
        web_bind="0.0.0.0",
        autodiscover=False,
        loghandlers=[],
    )


def create_app(settings: Settings, metrics: Metrics,
               tokens: TenantTokens | None = None) -> AdaptedApp:
    """The Faust app with its tables, agents, sweep timer and web pages; `tokens` are
    the thread API's (None: the API refuses every request)."""
    app: AdaptedApp = faust_app(settings)
    ticks = idle_ticks_topic(settings.app_id)
    own_topics = frozenset((ticks, settings.history_topic))  # written and read by workers
    if settings.input_pattern is not None:
        source = app.raw_topic(
            pattern=re.compile(rf"^{re.escape(ticks)}$|(?:{settings.input_pattern})"))
    else:
        source = app.raw_topic(*settings.input_topics, ticks)
    # key_type/value_type bytes is what makes Faust use the raw codec for the
    # changelog in both directions (a schema alone leaves recovery on JSON).
    tables = {
        name: WriteBehindTable(app, name=name, beacon=app.tables.beacon,
                               partitions=settings.partitions, key_type=bytes,
                               value_type=bytes)
        for name in TABLE_NAMES
    }
    for table in tables.values():
        app.tables.add(table)
    producer = cast(CommitProducer, app.producer)
    producer.commit_topics = (settings.history_topic, settings.deadletter_topic,
                              *sorted(app.tables.changelog_topics))
    builder = OutputBuilder(settings.history_topic, settings.deadletter_topic,
                            settings.max_record_bytes, metrics)
    processor = RecordProcessor(
        builder, metrics, StoredTables(tables[STATE_TABLE], tables[TEXT_TABLE]),
        tenant_header=settings.tenant_header, default_tenant=settings.default_tenant,
        idle_timeout=settings.idle_timeout_seconds)
    view = ThreadView(tables[VIEW_TABLE], partitions=settings.partitions,
                      retention_seconds=settings.view_retention_seconds)
    serve_thread_view(app, settings, metrics, view, tokens)
    # What each partition's records produced since the last commit.
    unsent: defaultdict[int, list[Outgoing]] = defaultdict(list)

    liveness = Liveness(settings.stall_seconds, time.monotonic())
    agent_streams: list[Any] = []  # (liveness: records queued for the agent)

    def apply(event: Any) -> None:
        """One record, start to ack. Synchronous: no commit can start while it runs."""
        clock = time.perf_counter()
        message = event.message
        record = incoming_record(message)
        if message.topic == ticks:
            now = time.time()
            produced = processor.sweep(message.partition, now, record)
            view.expire(message.partition, now)
            event.ack()
        else:
            produced = processor.process(record, time.time())
            event.ack()
            metrics.count_record(message.partition, time.perf_counter() - clock)
        if produced:
            unsent[message.partition].extend(produced)

    @app.agent(source)
    async def process(stream: Any) -> None:
        agent_streams.append(stream)
        if settings.test_stall_agent:  # test only: input waits, nothing is processed
            await asyncio.Event().wait()
        await apply_each(stream, app, apply)

    # Any topic of the agent's group gives a partition's transactional id.
    group_topic = settings.input_topics[0] if settings.input_topics else ticks

    def take_commit() -> WorkerCommitBatch:
        """Between two records: what the records since the last commit produced and
        changed, per partition, with the partition's transaction."""
        parts = []
        for partition in sorted(set(unsent) | set(processor.dirty_partitions())
                                | set(view.dirty_partitions())):
            transaction = (transactional_id(app, group_topic, partition)
                           if app.in_transaction else None)
            parts.append(PartitionBatch(partition, transaction, unsent.pop(partition, []),
                                        processor.changes(partition) + view.changes(partition)))
        return WorkerCommitBatch(parts, producer, tables, app, processor, view)

    app.take_commit = take_commit
    app.observe_commit = lambda phase, seconds: metrics.commit_seconds.labels(phase).observe(
        seconds)

    @app.timer(min(30.0, settings.idle_timeout_seconds / 4))  # type: ignore[untyped-decorator]
    async def tick_own_partitions() -> None:
        """Wake the idle sweep of every partition this worker owns.

        Ticks are sent outside any transaction. In one, a tick became visible
        only at the next commit, and with no input there was none: the
        transaction timed out (its producer fenced, the next record's sends
        failed) and idle runs were never abandoned. A tick carries only a time.
        """
        try:
            now = str(time.time()).encode()
            for tp in app.consumer.assignment():
                if tp.topic == ticks:
                    await producer.send(ticks, b"", now, tp.partition, None, None)
        except Exception as error:  # an exception in a Faust timer would crash the worker
            log_exception_kind(log, logging.WARNING, "could not send idle ticks", error)

    @app.timer(10.0)  # type: ignore[untyped-decorator]
    async def measure_lag() -> None:
        # An exception in a Faust timer crashes the worker: metrics never may.
        try:
            consumer = app.consumer
            committed = getattr(consumer, "_committed_offset", {})
            for tp in consumer.assignment():
                end = consumer.highwater(tp)
                if not _is_input(app, own_topics, tp.topic) or end is None:
                    continue  # internal, or not fetched yet
                lag = max(0, end - (committed.get(tp) or 0))
                metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(lag)
            measure_view(app, settings, metrics, view)
        except Exception as error:
            log_exception_kind(log, logging.WARNING, "could not measure consumer lag", error)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
        # Committed first (WholeRecordConsumer); anything since is processed again.
        unsent.clear()
        processor.forget()
        view.forget()

    assigned_once = {"done": False}

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
        assigned_once["done"] = True
        liveness.partitions_moved(time.monotonic())

    @app.timer(min(10.0, settings.stall_seconds / 3))  # type: ignore[untyped-decorator]
    async def check_progress() -> None:
        """Feed liveness: records processed so far, and the input partitions with
        records waiting (not yet fetched, or delivered and not yet processed)."""
        try:
            lagging = await _lagging_partitions(app, own_topics)
            queued = sum(stream.channel.queue.qsize() for stream in agent_streams)
            if queued:
                lagging.append(f"{queued} record(s) queued for the agent")
            liveness.observe(metrics.per_record.records(), lagging, time.monotonic())
        except Exception as error:  # an exception in a Faust timer would crash the worker
            log_exception_kind(log, logging.WARNING, "could not check progress", error)

    @app.page("/metrics")
    async def metrics_page(web: Any, request: Any) -> Any:
        return web.bytes(generate_latest(metrics.registry), content_type=_METRICS_CONTENT_TYPE)

    def alive() -> tuple[bool, str]:
        if app.should_stop:
            return False, "stopping"
        verdict = liveness.verdict(time.monotonic())
        return verdict.healthy, verdict.reason

    @app.page("/livez")
    async def liveness_page(web: Any, request: Any) -> Any:
        healthy, reason = alive()
        return web.json({"alive": healthy, "reason": reason}, status=200 if healthy else 503)

    @app.page("/readyz")
    async def readiness_page(web: Any, request: Any) -> Any:
        """Ready: in the group with its partitions assigned and its tables recovered."""
        reason = ("stopping" if app.should_stop
                  else "joining the consumer group" if not assigned_once["done"]
                  else "rebalancing" if app.rebalancing
                  else "recovering tables" if app.in_recovery else "")
        return web.json({"ready": not reason, "reason": reason or "ready",
                         "inputPartitions": _input_partitions(app, own_topics)},
                        status=503 if reason else 200)

    @app.page("/healthz")
    async def health_page(web: Any, request: Any) -> Any:
        """Liveness, with what a person checking a worker wants to see."""
        healthy, reason = alive()
        return web.json({"ok": healthy, "reason": reason,
                         "processed": metrics.per_record.records() > 0,
                         "inputPartitions": _input_partitions(app, own_topics)},
                        status=200 if healthy else 503)

    return app


def stop_without_commit(what: str, error: BaseException) -> NoReturn:
    """Exit at once: `what` could not be sent, so the records behind it must not commit.

    Faust would go on without them (and, on a graceful stop, commit past
    them). Exiting without a commit is what a kill -9 does, which the recovery
    test proves safe: the open transactions abort and the restarted worker
    processes the records again from the last commit. Only a producer that
    cannot send leads here, never a record's content.
    """
    # The exception's type and frames only: its message could quote content.
    log_exception_kind(log, logging.CRITICAL, f"could not send {what}; exiting without a"
                       " commit so that they are processed again after a restart", error)
    logging.shutdown()
    os._exit(EXIT_UNSENT)


def log_partition_state(app: faust.App) -> None:
    """Log where Faust's consumer and table recovery stand: partitions, offsets and
    flags only (what a stuck worker needs explained; never a record's content)."""
    def tps(partitions: Any) -> str:
        return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(partitions or ()))

    def offsets(mapping: Any) -> str:
        return ", ".join(f"{tp.topic}[{tp.partition}]={offset}"
                         for tp, offset in sorted(dict(mapping or {}).items()))

    try:
        consumer: Any = app.consumer
        recovery: Any = getattr(app.tables, "recovery", None)
        lines = [
            f"assigned: {tps(consumer.assignment())}",
            f"fetched (active): {tps(getattr(consumer, '_active_partitions', None))}",
            f"paused: {tps(getattr(consumer, '_paused_partitions', None))}",
            f"flow: consumer {consumer.flow_active}, app {app.flow_control.is_active()};"
            f" rebalancing {app.rebalancing}; in recovery {app.in_recovery}",
            f"recovery offsets: {offsets(getattr(recovery, 'active_offsets', None))}",
            f"recovery highwaters: {offsets(getattr(recovery, 'active_highwaters', None))}",
            f"read offsets: {offsets(getattr(consumer, '_read_offset', None))}",
            f"committed offsets: {offsets(getattr(consumer, '_committed_offset', None))}",
            *_kafka_client_state(consumer),
        ]
        log.warning("consumer state:\n%s", "\n".join(lines))
    except Exception as error:  # a diagnostic must never stop the worker
        log_exception_kind(log, logging.WARNING, "could not log the consumer state", error)


def _kafka_client_state(consumer: Any) -> list[str]:
    """What aiokafka's own consumer holds per partition, where Faust's view ends: its
    fetch position, pause flag and buffered fetch (read without the consumer thread's
    loop, so a snapshot that may be a moment old)."""
    client = getattr(getattr(consumer, "_thread", None), "_consumer", None)
    if client is None:
        return []
    subscription = client._subscription.subscription
    fetcher = client._fetcher
    states = []
    for tp in sorted(subscription.assignment.tps if subscription else ()):
        state = subscription.assignment.state_value(tp)
        position = state.position if state.has_valid_position else "none"
        states.append(f"{tp.topic}[{tp.partition}]={position}"
                      f"{' paused' if state.paused else ''}"
                      f"{' buffered' if tp in fetcher._records else ''}")
    return [f"kafka client positions: {', '.join(states)}",
            f"kafka client: reassignment in progress"
            f" {client._subscription.reassignment_in_progress},"
            f" fetches in flight to nodes {sorted(fetcher._in_flight)}"]


def log_task_stacks(app: faust.App | None = None) -> None:
    """Log where each asyncio task waits, on this loop and on the consumer thread's
    (which fetches and commits for it), and where each thread is: code locations
    only, never values."""
    lines = _task_lines(asyncio.all_tasks())
    log.warning("%d tasks:\n%s", len(lines), "\n".join(lines))
    thread_loop = getattr(getattr(getattr(app, "consumer", None), "_thread", None),
                          "thread_loop", None)
    if isinstance(thread_loop, asyncio.AbstractEventLoop):
        try:  # another thread's loop: its task set may change while it is read
            tasks = list(asyncio.all_tasks(thread_loop))
        except RuntimeError:
            tasks = []
        lines = _task_lines(tasks)
        log.warning("%d consumer thread tasks:\n%s", len(lines), "\n".join(lines))
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    lines = [f"{names.get(ident, ident)}: " + " -> ".join(
                 f"{frame.name} ({frame.filename}:{frame.lineno})"
                 for frame in traceback.extract_stack(top, limit=12))
             for ident, top in sys._current_frames().items()]
    log.warning("%d threads:\n%s", len(lines), "\n".join(sorted(lines)))


def _task_lines(tasks: Iterable[asyncio.Task[Any]]) -> list[str]:
    return sorted(f"{task.get_name()}: {await_path(task)}" for task in tasks)


def await_path(task: asyncio.Task[Any]) -> str:
    """The task's coroutine and, link by link, what it awaits (outermost first).

    `Task.get_stack()` shows only the outermost coroutine; the place a stuck
    task waits is at the end of its await chain.
    """
    places: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None:
        frame = (getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
                 or getattr(awaited, "gi_frame", None))
        if frame is None:
            inner = _driven_by(awaited)
            if inner is None:
                places.append(type(awaited).__name__)  # a future, or a finished coroutine
                break
            awaited = inner
            continue
        places.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno})")
        awaited = (getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
                   or getattr(awaited, "gi_yieldfrom", None) or resumed_coroutine(frame))
    return " -> ".join(places)


def _driven_by(awaitable: Any) -> Any:
    """The coroutine or generator an await wrapper drives (`__await__()` of a
    coroutine, an async generator's `asend`), which no public attribute names."""
    if isinstance(awaitable, asyncio.Future) or type(awaitable).__name__ == "FutureIter":
        return None
    for referent in gc.get_referents(awaitable):
        if (inspect.iscoroutine(referent) or inspect.isasyncgen(referent)
                or inspect.isgenerator(referent)):
            return referent
    return None


def _input_partitions(app: faust.App, own_topics: frozenset[str]) -> int:
    """How many input partitions this worker owns now (0 before it joined the group)."""
    try:
        return sum(_is_input(app, own_topics, tp.topic) for tp in app.consumer.assignment())
    except Exception:  # no consumer yet: starting
        return 0


async def _lagging_partitions(app: faust.App, own_topics: frozenset[str]) -> list[str]:
    """Assigned input partitions with records waiting for this worker: records not
    yet handed to the agent (the consumer's position below the partition's end),
    or handed over and not yet processed (unacked: the worker acks each record as
    it processes it). Transaction markers and aborted records move the position
    past them, so they never count."""
    consumer = app.consumer
    waiting = {message.tp for message in list(getattr(consumer, "_unacked_messages", ()))
               if not message.acked}
    lagging: list[str] = []
    inputs = [tp for tp in sorted(consumer.assignment())
              if _is_input(app, own_topics, tp.topic)]
    ends = await consumer.highwaters(*inputs) if inputs else {}
    for tp in inputs:
        end, position = ends.get(tp), await consumer.position(tp)
        if tp in waiting or (end is not None and position is not None and position < end):
            lagging.append(f"{tp.topic}[{tp.partition}]")
    return lagging


def _is_input(app: faust.App, own_topics: frozenset[str], topic: str) -> bool:
    """A raw event topic: not one the workers write themselves (idle ticks, history),
    nor a table changelog."""
    return topic not in own_topics and topic not in app.tables.changelog_topics

