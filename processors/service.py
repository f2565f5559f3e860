"""The stream processor: a Faust app that is a thin shell around the engine.

Per raw record the agent decodes nothing itself beyond headers: it looks up
the key's engine (state from the `run-state` table, text from the `run-text`
table), feeds it the raw bytes, persists what changed, and sends what
`OutputBuilder` makes of the decisions. Faust's traps are handled here:

* the agent never raises (Faust would ack and drop the record): an unexpected
  error fails the key's run and sends the record to the dead-letter topic;
* values are raw bytes, decoded by the engine (Faust would commit past a
  decode error and only log it);
* the state value is rewritten only when the run's shape changes, and deltas
  go to their own table entries (no quadratic changelog);
* with `exactly_once` the table changelogs, outputs and input offsets commit
  in one Kafka transaction, so a crash replays onto consistent state.

Runs idle longer than the idle timeout are abandoned by a sweep that each
worker triggers with one tick record per partition it owns, on an internal
topic read by the same agent, so the sweep runs in the partition's own stream
(tables can only be changed there) and reaches partitions with no traffic.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import os
import re
import struct
import time
import traceback
from collections.abc import MutableMapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, NoReturn

import faust
from aiokafka.errors import IllegalOperation
from faust.types import TP
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from processors.config import Settings
from processors.engine.engine import KeyEngine
from processors.engine.state import KeyState, Phase
from processors.kafka_client import faust_credentials
from processors.metrics import Metrics
from processors.outputs import Incoming, Outgoing, OutputBuilder
from processors.table_content import Source, TableContentStore
from topics.declarations import TABLE_NAMES, idle_ticks_topic

log = logging.getLogger("agui_stream")

_PARTITION = struct.Struct(">I")
EXIT_UNSENT = 70  # EX_SOFTWARE: a record's outputs could not be sent (see stop_without_commit)
# aiohttp takes the charset separately; Prometheus' text format is UTF-8 anyway.
_METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST.split(";")[0]


@dataclass(slots=True)
class LiveKey:
    """A key's engine kept between records, with what the table last stored."""

    engine: KeyEngine
    progress: TableContentStore  # the engine's content store, with the replay guard
    stored: bytes | None
    partition: int
    last_seen: float


class RecordScopedTable(faust.Table[bytes, bytes]):
    """A Faust table whose changelog writes the agent sends itself.

    Faust queues a table's changelog writes in a producer buffer that a
    transactional commit does not drain, so a crash could commit a record's
    offset without its state. Here each write is kept in `unsent` and the
    agent sends it, awaited, in the record's own transaction before the
    record is acked.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unsent: list[tuple[int, bytes, bytes | None]] = []

    def send_changelog(self, partition: int | None, key: Any, value: Any,
                       key_serializer: Any = None, value_serializer: Any = None) -> Any:
        assert partition is not None  # always the partition of the record in progress
        self.unsent.append((partition, key, value))
        # Faust reads the partition back from what this returns.
        return SimpleNamespace(message=SimpleNamespace(partition=partition))

    def on_delivered(self, delivery: asyncio.Future[Any]) -> None:
        """What Faust's own send callback does: note the persisted offset."""
        if delivery.cancelled() or delivery.exception() is not None:
            return  # the transaction fails, and the record is processed again
        metadata = delivery.result()
        tp, offset = TP(metadata.topic, metadata.partition), metadata.offset
        if self.app.in_transaction:
            self.app.tables.persist_offset_on_commit(self.data, tp, offset)
        else:
            self.data.set_persisted_offset(tp, offset)


class RunStateStore:
    """The `run-state` table: per (tenant, key) the partition and the engine state."""

    def __init__(self, states: MutableMapping[bytes, bytes],
                 texts: MutableMapping[bytes, bytes]) -> None:
        self.states = states
        self.texts = texts

    def load(self, state_key: bytes, partition: int, now: float) -> LiveKey:
        stored = self.states.get(state_key)
        state = None if stored is None else KeyState.from_json(stored[_PARTITION.size:])
        return self._live(state_key, state, None if stored is None
                          else stored[_PARTITION.size:], partition, now)

    def reset(self, state_key: bytes, partition: int, now: float) -> LiveKey:
        """The key starts over in the failed phase (after an internal error)."""
        return self._live(state_key, KeyState(Phase.FAILED), None, partition, now)

    def _live(self, state_key: bytes, state: KeyState | None, stored: bytes | None,
              partition: int, now: float) -> LiveKey:
        content = TableContentStore(self.texts, state_key)
        return LiveKey(KeyEngine(state, content), content, stored, partition, now)

    def save(self, state_key: bytes, live: LiveKey) -> None:
        encoded = live.engine.state.to_json()
        if encoded != live.stored:
            self.states[state_key] = _PARTITION.pack(live.partition) + encoded
            live.stored = encoded

    def forget(self, state_key: bytes, live: LiveKey) -> None:
        self.states.pop(state_key, None)
        live.progress.forget()

    def keys_of_partition(self, partition: int) -> list[bytes]:
        """Every state key stored for `partition`."""
        return [state_key for state_key, value in list(self.states.items())
                if _PARTITION.unpack_from(value)[0] == partition]


def state_key_for(tenant: str, key: bytes) -> bytes:
    return tenant.replace("\x00", "\ufffd").encode() + b"\x00" + key


def key_of(state_key: bytes) -> bytes:
    return state_key.split(b"\x00", 1)[1]


def tenant_of(state_key: bytes) -> str:
    return state_key.split(b"\x00", 1)[0].decode()


class Shell:
    """Everything the agent does for one record, apart from the Faust plumbing."""

    def __init__(self, settings: Settings, metrics: Metrics, store: RunStateStore) -> None:
        self.settings = settings
        self.metrics = metrics
        self.store = store
        self.builder = OutputBuilder(settings.history_topic, settings.deadletter_topic,
                                     settings.max_record_bytes, metrics)
        self.live: dict[bytes, LiveKey] = {}
        self.open_runs: dict[bytes, int] = {}  # state key -> partition, active runs only
        self.tenant_header = settings.tenant_header

    def tenant_of(self, headers: list[tuple[str, bytes]]) -> str:
        for name, value in headers:
            if name == self.tenant_header and value:
                return value.decode("utf-8", "replace")
        return self.settings.default_tenant

    def handle(self, record: Incoming, now: float) -> list[Outgoing]:
        tenant = self.tenant_of(record.headers)
        state_key = state_key_for(tenant, record.key)
        try:
            live = self.live.get(state_key)
            if live is None:
                live = self.live[state_key] = self.store.load(state_key, record.partition, now)
            live.last_seen = now
            source = Source(record.topic, record.partition, record.offset)
            if live.progress.already_applied(source):
                # Replayed from an older committed offset: applied and published.
                self.metrics.replayed_records.inc()
                return []
            step = live.engine.feed(record.value)
            self.store.save(state_key, live)
            live.progress.record_applied(source)
            self._track_open(state_key, live)
            return self.builder.build(step, record, tenant)
        except Exception as error:  # never let Faust ack-and-drop a record
            self._contain(error, state_key, record)
            return [self.builder.dead_letter_for_exception(record, tenant)]

    def sweep(self, partition: int, now: float, tick: Incoming) -> list[Outgoing]:
        """Abandon idle runs of `partition` and free idle keys' state."""
        out: list[Outgoing] = []
        for state_key in self.store.keys_of_partition(partition):
            live = self.live.get(state_key)
            if live is None:
                # Not seen since this worker got the partition: its clock starts now.
                live = self.live[state_key] = self.store.load(state_key, partition, now)
            if now - live.last_seen < self.settings.idle_timeout_seconds:
                if live.engine.state.run is not None:
                    self.open_runs[state_key] = partition
                continue
            if live.engine.state.run is not None:
                step = live.engine.abandon()
                abandoned = Incoming(tick.topic, tick.partition, tick.offset, tick.timestamp,
                                     key_of(state_key), b"", [])
                out.extend(self.builder.build(step, abandoned, tenant_of(state_key)))
            self.store.forget(state_key, live)
            self.live.pop(state_key, None)
            self.open_runs.pop(state_key, None)
        self.metrics.open_runs.set(len(self.open_runs))
        return out

    def forget_live(self) -> None:
        """A rebalance moved partitions: the tables are the truth again."""
        self.live.clear()
        self.open_runs.clear()
        self.metrics.open_runs.set(0)

    def _track_open(self, state_key: bytes, live: LiveKey) -> None:
        if live.engine.state.run is not None:
            if state_key not in self.open_runs:
                self.open_runs[state_key] = live.partition
                self.metrics.open_runs.set(len(self.open_runs))
        elif self.open_runs.pop(state_key, None) is not None:
            self.metrics.open_runs.set(len(self.open_runs))

    def _contain(self, error: Exception, state_key: bytes, record: Incoming) -> None:
        # Log where and what kind, never the message: it could quote content.
        frames = "".join(traceback.format_tb(error.__traceback__))
        log.error("processing error %s at %s[%d]@%d; the run was failed\n%s",
                  type(error).__name__, record.topic, record.partition, record.offset, frames)
        live = self.live.pop(state_key, None)
        if live is not None:
            live.engine.content.clear()
        replacement = self.store.reset(state_key, record.partition, time.time())
        self.store.save(state_key, replacement)
        replacement.progress.record_applied(Source(record.topic, record.partition,
                                                   record.offset))
        self.live[state_key] = replacement
        self.open_runs.pop(state_key, None)


def faust_app(settings: Settings) -> faust.App:
    """The bare Faust app as the worker configures it: no tables, agents or pages."""
    app = faust.App(
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
        # Batch what records produce (outputs, changelog entries) into few
        # requests. With exactly_once nothing is visible before the commit, and
        # a commit sends the lingering batches at once (at_least_once: <= 50 ms later).
        producer_linger=0.05,
        consumer_auto_offset_reset="earliest",
        consumer_group_instance_id=settings.group_instance_id,
        broker_session_timeout=settings.session_timeout_seconds,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_seconds / 3),
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=True,
        web_port=settings.metrics_port,
        web_bind="0.0.0.0",
        autodiscover=False,
        loghandlers=[],
    )
    resume_flow_keeping_queued_records(app)
    return app


def resume_flow_keeping_queued_records(app: faust.App) -> None:
    """Clear the agents' and table recovery's queues on resume only after a suspension.

    mode's flow control empties every stream queue (and the changelog queue)
    on each resume, and Faust resumes again when table recovery completes,
    after it has resumed the input partitions: a record fetched in between,
    with the read offset already past it, was dropped unprocessed and its
    offset committed (the kill -9 stress test lost one delta of a run this
    way). Faust empties the queues itself when it suspends flow for a
    rebalance, so a resume while flow is active has nothing to discard.
    """
    flow_control = app.flow_control
    resume = flow_control.resume

    def resume_if_suspended() -> None:
        if not flow_control.is_active():
            resume()

    flow_control.resume = resume_if_suspended  # type: ignore[method-assign]


def create_app(settings: Settings, metrics: Metrics) -> faust.App:
    """The Faust app with its tables, agent, sweep timer and web pages."""
    app = faust_app(settings)
    raw: dict[str, Any] = {"key_serializer": "raw", "value_serializer": "raw"}
    ticks = idle_ticks_topic(settings.app_id)
    if settings.input_pattern is not None:
        source = app.topic(
            pattern=re.compile(rf"^{re.escape(ticks)}$|(?:{settings.input_pattern})"), **raw
        )
    else:
        source = app.topic(*settings.input_topics, ticks, **raw)
    # key_type/value_type bytes is what makes Faust use the raw codec for the
    # changelog in both directions (a schema alone leaves recovery on JSON).
    tables: list[RecordScopedTable] = [
        RecordScopedTable(
            app, name=name, beacon=app.tables.beacon, partitions=settings.partitions,
            key_type=bytes, value_type=bytes,
        )
        for name in TABLE_NAMES
    ]
    for table in tables:
        app.tables.add(table)
    store = RunStateStore(*tables)
    shell = Shell(settings, metrics, store)
    started = {"ready": False}

    # One record's processing (state, outputs, ack) and a commit never interleave:
    # see `commit_whole_records`.
    record_boundary = asyncio.Lock()

    @app.agent(source)
    async def process(stream: Any) -> None:
        if app.in_transaction:
            adapt_exactly_once(app, record_boundary)
        async for event in stream.events():
            async with record_boundary:
                clock = time.perf_counter()
                message = event.message
                record = Incoming(
                    message.topic, message.partition, message.offset,
                    None if message.timestamp is None else int(message.timestamp * 1000),
                    message.key or b"", message.value or b"",
                    _header_list(message.headers),
                )
                # Once per record, not per send: Faust's group lookup is not free.
                transaction = (_transactional_id(app, message.topic, message.partition)
                               if app.in_transaction else None)
                try:
                    # The shell turns a record's errors into dead letters; an exception
                    # out of it means the tables failed, and Faust would drop the record.
                    if message.topic == ticks:
                        sent = shell.sweep(message.partition, _tick_time(record.value), record)
                    else:
                        sent = shell.handle(record, time.time())
                    for item in sent:
                        await send(item.topic, item.key, item.value, item.headers, None,
                                   transaction)
                    for table in tables:
                        for partition, key, value in table.unsent:
                            delivery = await send(table.changelog_topic.get_topic_name(), key,
                                                  value, None, partition, transaction)
                            delivery.add_done_callback(table.on_delivered)
                        table.unsent.clear()
                except Exception:
                    stop_without_commit(message)
                event.ack()
                metrics.processing_latency.observe(time.perf_counter() - clock)
                started["ready"] = True

    producer = app.producer

    async def send(topic: str, key: bytes, value: bytes | None,
                   headers: list[tuple[str, bytes]] | None, partition: int | None,
                   transaction: str | None) -> Any:
        """Enqueue a record; it commits with the source record's offset.

        Faust's TransactionManager would pick the transaction by the *output*
        record's partition, so an output keyed differently from its input
        (history is keyed by thread) would commit apart from the input
        offset. Every record a source record causes goes in the source
        partition's transaction (`transaction`, None without exactly_once).
        """
        if transaction is None:
            return await producer.send(topic, key, value, partition, None, headers)
        return await send_in_transaction(app.consumer.transactions.producer, transaction,
                                         topic, key, value, partition, headers)

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
                    await send(ticks, b"", now, None, tp.partition, None)
        except Exception:  # an exception in a Faust timer would crash the worker
            log.warning("could not send idle ticks", exc_info=True)

    @app.timer(10.0)  # type: ignore[untyped-decorator]
    async def measure_lag() -> None:
        # An exception in a Faust timer crashes the worker: metrics never may.
        try:
            consumer = app.consumer
            committed = getattr(consumer, "_committed_offset", {})
            for tp in consumer.assignment():
                end = consumer.highwater(tp)
                if not _is_input(app, ticks, tp.topic) or end is None:
                    continue  # internal, or not fetched yet
                lag = max(0, end - (committed.get(tp) or 0))
                metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(lag)
        except Exception:
            log.warning("could not measure consumer lag", exc_info=True)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
        shell.forget_live()

    owned_producers: set[str] = set()

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
        if app.in_transaction:
            await stop_producers_of_lost_partitions(app, assigned, owned_producers)

    @app.page("/metrics")
    async def metrics_page(web: Any, request: Any) -> Any:
        return web.bytes(generate_latest(metrics.registry), content_type=_METRICS_CONTENT_TYPE)

    @app.page("/healthz")
    async def health_page(web: Any, request: Any) -> Any:
        healthy = not app.should_stop
        return web.json({"ok": healthy, "processed": started["ready"],
                         "inputPartitions": _input_partitions(app, ticks)},
                        status=200 if healthy else 503)

    return app


def stop_without_commit(message: Any) -> NoReturn:
    """Exit at once: `message` could not be applied, or what it produced not all sent.

    Faust would ack the record and go on without its outputs (and, on a
    graceful stop, commit past it). Exiting without a commit is what a kill -9
    does, which the recovery test proves safe: the open transactions abort and
    the restarted worker processes the record again from the last commit.
    """
    log.critical("could not apply %s[%d]@%d or send what it produced; exiting without a"
                 " commit so that it is processed again after a restart", message.topic,
                 message.partition, message.offset, exc_info=True)
    logging.shutdown()
    os._exit(EXIT_UNSENT)


async def send_in_transaction(producer: Any, transactional_id: str, topic: str,
                              key: bytes, value: bytes | None, partition: int | None,
                              headers: list[tuple[str, bytes]] | None) -> Any:
    """Send with Faust's producer in `transactional_id`'s transaction, begun if need be.

    Faust begins a partition's next transaction only after committing the last
    one; a commit that fails during a rebalance leaves the partition's producer
    between transactions, and every later send of the partition failed (the
    agent crash-looped). Beginning the transaction here is what the failed
    commit would have done; the records sent commit with the next commit.
    """
    try:
        return await producer.send(topic, key, value, partition, None, headers,
                                   transactional_id=transactional_id)
    except IllegalOperation:  # "Can't send messages while not in transaction"
        log.warning("producer %s was between transactions: beginning one", transactional_id)
        await producer.maybe_begin_transaction(transactional_id)
        return await producer.send(topic, key, value, partition, None, headers,
                                   transactional_id=transactional_id)


async def stop_producers_of_lost_partitions(app: faust.App, assigned: Any,
                                            ever_owned: set[str]) -> None:
    """Stop the transactional producers of the partitions this worker no longer owns.

    Faust (0.15.3) did not stop them on a rebalance (the join/leave test): the
    new owner's producer fences ours, and when the partition comes back Faust
    begins its next transaction on the fenced producer, so every send of the
    partition fails. Stopped here, Faust starts a fresh producer when the
    partition comes back. `commit_before_revoking` has committed their transactions.
    `ever_owned` collects the producers' ids across rebalances.
    """
    changelogs = app.tables.changelog_topics
    owned = {_transactional_id(app, tp.topic, tp.partition) for tp in assigned
             if tp.topic not in changelogs and not app.assignor.is_standby(tp)}
    for transactional_id in sorted(ever_owned - owned):
        await app.producer.stop_transaction(transactional_id)
    ever_owned.clear()
    ever_owned.update(owned)


def adapt_exactly_once(app: faust.App, record_boundary: asyncio.Lock) -> None:
    """Work around Faust's exactly_once gaps, once per consumer (an agent that
    Faust restarts calls this again)."""
    consumer: Any = app.consumer
    if getattr(consumer, "_agui_adapted", False):
        return
    commit_whole_records(app, record_boundary)
    commit_before_revoking(app)
    recover_up_to_the_committed_end(app)
    consumer._agui_adapted = True


def commit_before_revoking(app: faust.App) -> None:
    """Commit every partition's transaction before a rebalance takes partitions away.

    Faust leaves the open transactions open across a rebalance, then rolls kept
    partitions' tables back to the committed changelog and reprocesses into the
    same transaction: records published twice. Committing first (as Kafka
    Streams does) makes state, offsets and outputs agree before any partition
    moves. Faust forgets a revoked partition's acked offsets before its revoke
    signal, so the commit runs here, ahead of Faust's own handler.
    """
    consumer: Any = app.consumer
    on_partitions_revoked = consumer.on_partitions_revoked

    async def commit_then_revoke(revoked: Any) -> None:
        await consumer.commit()
        await on_partitions_revoked(revoked)

    consumer.on_partitions_revoked = commit_then_revoke


def recover_up_to_the_committed_end(app: faust.App) -> None:
    """Have table recovery read each changelog up to its last stable offset.

    With exactly_once, Faust (0.15.3) takes a changelog's end from the
    consumer's cached last stable offset, which is unknown (read as -1) for a
    partition not fetched since the assignment: recovery then read nothing,
    and a partition that moved between workers ran on empty or stale state
    (runs failed as not started, in the join/leave test). The consumer reads
    committed records only, so its end_offsets() asks the broker for exactly
    the last stable offset.
    """
    thread: Any = app.consumer._thread  # type: ignore[attr-defined]

    async def committed_ends(partitions: list[TP]) -> Any:
        return await thread._ensure_consumer().end_offsets(partitions)

    thread._highwaters = committed_ends


def _transactional_id(app: faust.App, topic: str, partition: int) -> str:
    """Faust's transactional id for a source partition (TransactionManager's format)."""
    return f"{app.conf.id}-{app.assignor.group_for_topic(topic)}-{partition}"


def commit_whole_records(app: faust.App, record_boundary: asyncio.Lock) -> None:
    """Make Faust's exactly-once commit cover whole records.

    Faust commits on a timer, concurrently with the agent: it picks offsets
    from the acked records while the agent may already have sent part of the
    next record's outputs into the same transaction, so a crash replayed a
    record whose outputs were committed (duplicates in the kill -9 test).
    The commit now waits until the record in progress is sent and acked.
    """
    consumer: Any = app.consumer  # force_commit is the concrete Consumer's
    force_commit = consumer.force_commit

    async def commit_after_record(*args: Any, **kwargs: Any) -> bool:
        async with record_boundary:
            return bool(await force_commit(*args, **kwargs))

    consumer.force_commit = commit_after_record


def log_task_stacks() -> None:
    """Log where each asyncio task waits: code locations only, never values."""
    lines = sorted(f"{task.get_name()}: {await_path(task)}" for task in asyncio.all_tasks())
    log.warning("%d tasks:\n%s", len(lines), "\n".join(lines))


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
                   or getattr(awaited, "gi_yieldfrom", None))
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


def _input_partitions(app: faust.App, ticks: str) -> int:
    """How many input partitions this worker owns now (0 before it joined the group)."""
    try:
        return sum(_is_input(app, ticks, tp.topic) for tp in app.consumer.assignment())
    except Exception:  # no consumer yet: starting
        return 0


def _is_input(app: faust.App, ticks: str, topic: str) -> bool:
    """A raw event topic: neither the idle-ticks topic nor a table changelog."""
    return topic != ticks and topic not in app.tables.changelog_topics


def _header_list(headers: Any) -> list[tuple[str, bytes]]:
    if not headers:
        return []
    items = headers.items() if isinstance(headers, dict) else headers
    return [(str(name), bytes(value or b"")) for name, value in items]


def _tick_time(value: bytes) -> float:
    try:
        return float(value)
    except ValueError:
        return time.time()
