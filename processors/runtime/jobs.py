"""The jobs of one worker, as one object: the agent that applies each record, the
commit's take, the timers (idle ticks, lag, progress), the rebalance callbacks and
the health and metrics pages.

`WorkerJobs` is built with what the jobs share (the app, the record processor, the
thread view, the tables, the metrics) and registered on the Faust app by
`processors.runtime.app.create_app`; Faust's decorators call its methods. A method
that needs no broker (apply, take_commit, the rebalance callbacks, the pages) can
be called on its own in a test.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable
from typing import Any, Final

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from processors.config import Settings
from processors.metrics import Metrics
from processors.processing.outputs import Outgoing, header_list, incoming_record
from processors.processing.record_processor import RecordProcessor
from processors.runtime.commit import PartitionBatch, WorkerCommitBatch, WriteBehindTable
from processors.runtime.exits import stop_for_configuration
from processors.runtime.faust_adaptations import (
    AdaptedApp,
    CommitProducer,
    apply_each,
    transactional_id,
)
from processors.runtime.health import Liveness
from processors.runtime.topic_admin import existing_topics, input_topics_now, output_limits
from processors.runtime.view_service import is_history, measure_view
from processors.safe_logging import log_exception_kind
from processors.view.thread_view import ThreadView
from topics.declarations import idle_ticks_topic

log = logging.getLogger("agui_stream")

# aiohttp takes the charset separately; Prometheus' text format is UTF-8 anyway.
_METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST.split(";")[0]

# The least time between two look-ups of tenants' topics outside the refresh. A
# record that needs one waits for it, but a look-up settles every record fetched
# before it began: a producer naming a new tenant in every record makes the worker
# wait at most this long per look-up, with a fetch's worth of records behind it.
TOPIC_LOOKUP_SECONDS: Final = 1.0

# Input records not processed yet from which a worker counts as draining a backlog
# (about a fifth of a second of its work).
BACKLOG_RECORDS: Final = 2_048
# How long an answer of `backlogged` stands: it is asked at every run's end, and
# over 128 partitions a sum over them all at each was a fifth of the worker's time.
BACKLOG_CHECK_SECONDS: Final = 0.01


class WorkerJobs:
    """What one worker does, job by job; the state the jobs share is its attributes."""

    def __init__(self, app: AdaptedApp, settings: Settings, metrics: Metrics,
                 processor: RecordProcessor, view: ThreadView, producer: CommitProducer,
                 tables: dict[str, WriteBehindTable], liveness: Liveness) -> None:
        self.app = app
        self.settings = settings
        self.metrics = metrics
        self.processor = processor
        self.view = view
        self.producer = producer
        self.tables = tables
        self.liveness = liveness
        self.ticks = idle_ticks_topic(settings.app_id)
        # Written and read by workers: never an input (nor a history topic).
        self.own_topics = frozenset((self.ticks, settings.history_topic))
        self.routing = processor.builder.routing
        self.last_lookup = -TOPIC_LOOKUP_SECONDS
        self.listing = asyncio.Lock()  # a look-up and the refresh, one at a time
        # Any topic of the agent's group gives a partition's transactional id: the
        # ticks', always read (with AGUI_INPUT_PATTERN no named input may be).
        self.group_topic = self.ticks
        # The raw and history topics Faust subscribed to at start (it subscribes to
        # names, once): `note_unread_topics`.
        self.subscribed: frozenset[str] = frozenset()
        self.unread: set[str] = set()
        # What each partition's records produced since the last commit.
        self.unsent: defaultdict[int, list[Outgoing]] = defaultdict(list)
        self.agent_streams: list[Any] = []  # (liveness: records queued for the agent)
        # The assigned input and history partitions and the group generation they were
        # read in, read again after each rebalance: Faust's `assignment()` builds a new
        # set of every partition assigned at each call.
        self._assigned: tuple[list[Any], list[Any]] | None = None
        self._assigned_generation: int | None = None
        self._backlog_checked = -BACKLOG_CHECK_SECONDS
        self._backlogged = False
        self.assigned_once = False
        self.checked_topics: set[str] = set()  # topics whose partition count was checked

    # --- the agent ------------------------------------------------------------------

    def apply(self, event: Any) -> None:
        """One record, start to ack. Synchronous: no commit can start while it runs."""
        clock = time.perf_counter()
        message = event.message
        record = incoming_record(message)
        if message.topic == self.ticks:
            now = time.time()
            produced = self.processor.sweep(message.partition, now, record)
            self.view.expire(message.partition, now)
            event.ack()
        else:
            produced = self.processor.process(record, time.time())
            event.ack()
            self.metrics.count_record(message.partition, time.perf_counter() - clock)
        if produced:
            self.unsent[message.partition].extend(produced)
            if (any(is_history(self.settings, out.topic) for out in produced)
                    and not self.backlogged()):
                # A run ended: its next turn may be waiting for its history. (Draining
                # a backlog, commits back to back would halve the worker's rate, and
                # the timed one comes soon enough.)
                self.app.commit_soon()

    def records_queued(self) -> int:
        """Records fetched and waiting for the agent."""
        return sum(stream.channel.queue.qsize() for stream in self.agent_streams)

    def backlogged(self) -> bool:
        """Draining a backlog: `BACKLOG_RECORDS` or more input records not processed yet
        (up to the partitions' ends as last fetched), as counted at most
        `BACKLOG_CHECK_SECONDS` ago. A worker keeping up with its input is a fetch or
        so behind; its queue alone says little, filling and emptying with every fetch."""
        now = time.monotonic()
        if now - self._backlog_checked >= BACKLOG_CHECK_SECONDS:
            self._backlog_checked = now
            self._backlogged = self._records_behind_reach(BACKLOG_RECORDS)
        return self._backlogged

    def _records_behind_reach(self, records: int) -> bool:
        """Whether the input records not processed yet number `records` or more."""
        highwater, processed = self.app.consumer.highwater, self.processor.processed_offset
        behind = 0
        for tp in self.input_assignment():
            end, done = highwater(tp), processed(tp.topic, tp.partition)
            if end is not None and done is not None:
                behind += max(0, end - done)
                if behind >= records:
                    return True
        return False

    def input_assignment(self) -> list[Any]:
        """The input partitions assigned to the worker (read again once the group's
        generation moved, even before the rebalance callbacks ran: a commit must never
        take a partition's offsets by an older assignment)."""
        return self._assignment()[0]

    def history_assignment(self) -> list[Any]:
        """The history partitions assigned to the worker (the thread view reads them)."""
        return self._assignment()[1]

    def _assignment(self) -> tuple[list[Any], list[Any]]:
        generation = self.app.consumer_generation_id
        if self._assigned is None or generation != self._assigned_generation:
            self._assigned_generation = generation
            assigned = self.app.consumer.assignment()
            self._assigned = ([tp for tp in assigned if self.is_input(tp.topic)],
                              [tp for tp in assigned if is_history(self.settings, tp.topic)])
        return self._assigned

    def written_ends(self) -> dict[tuple[str, int], int]:
        """Each assigned input partition's end as last fetched (its high watermark: every
        record below it had been written by then); those not fetched yet are left out."""
        highwater = self.app.consumer.highwater
        ends = {}
        for tp in self.input_assignment():
            end = highwater(tp)
            if end is not None:
                ends[(tp.topic, tp.partition)] = end
        return ends

    async def process(self, stream: Any) -> None:
        """The agent of the input topics and the idle ticks."""
        self.agent_streams.append(stream)
        if self.settings.test_stall_agent:  # test only: input waits, nothing is processed
            await asyncio.Event().wait()
        prepare = None if self.routing is None else self.prepare
        await apply_each(stream, self.app, self.apply, prepare=prepare)

    def prepare(self, event: Any) -> Awaitable[None] | None:
        """Per-tenant topics: before a record of a tenant whose topics were not there
        at the last refresh, look once more (an administrator may just have created
        them), so that its run is not taken for unpublishable, unless a listing made
        since the record was written said so already (`TenantRouting.needs_look_up`).
        None: nothing to wait for."""
        assert self.routing is not None
        message = event.message
        if message.topic == self.ticks:
            return None
        tenant = self.processor.tenant(header_list(message.headers))
        if not self.routing.needs_look_up(tenant, (message.topic, message.partition),
                                          message.offset):
            return None
        return self.look_up_tenant_topics(tenant)

    async def look_up_tenant_topics(self, tenant: str) -> None:
        """List the topics, `TOPIC_LOOKUP_SECONDS` after the last look-up at the
        earliest. Waited for, never skipped: a tenant provisioned just before its
        first record came within a second of another tenant's look-up, and all its
        runs were dead-lettered as `tenant_topic_missing`."""
        assert self.routing is not None
        await asyncio.sleep(max(0.0, self.last_lookup + TOPIC_LOOKUP_SECONDS - time.monotonic()))
        async with self.listing:
            self.last_lookup = time.monotonic()
            written = self.written_ends()
            try:
                names = await self.producer.topic_names()
            except Exception as error:  # the record goes on: its topics count as missing
                log_exception_kind(log, logging.WARNING, "could not look up a tenant's topics",
                                   error)
                return
            self.routing.looked_up(tenant, names, written)

    # --- the commit -----------------------------------------------------------------

    def take_commit(self, everything: bool = False) -> WorkerCommitBatch:
        """Between two records: what the records since the last commit produced and
        changed, per partition, with the partition's transaction (`everything`: no
        key waits for its checkpoint)."""
        parts = []
        now = time.time()
        for partition in sorted(set(self.unsent) | set(self.processor.dirty_partitions())
                                | set(self.view.dirty_partitions())):
            transaction = (None if not self.app.in_transaction
                           else self.app.worker_transactional_id
                           or transactional_id(self.app, self.group_topic, partition))
            outgoing = self.unsent.pop(partition, [])
            changes = (self.processor.changes(partition, now, everything)
                       + self.view.changes(partition))
            if outgoing or changes:
                parts.append(PartitionBatch(partition, transaction, outgoing, changes))
        # How far each assigned input and history partition's processed records reach
        # (None: none processed since the partitions last moved). (A revoked
        # partition's offsets are committed by no one here.)
        starts = self.processor.replay_starts()
        reach = {(tp.topic, tp.partition): starts.get((tp.topic, tp.partition))
                 for tp in self.input_assignment()}
        for tp in self.history_assignment():
            reach[(tp.topic, tp.partition)] = self.view.reach(tp.topic, tp.partition)
        return WorkerCommitBatch(parts, self.producer, self.tables, self.app,
                                 self.processor, self.view, reach)

    def observe_commit(self, phase: str, seconds: float) -> None:
        self.metrics.commit_seconds.labels(phase).observe(seconds)

    # --- timers ---------------------------------------------------------------------

    async def tick_own_partitions(self) -> None:
        """Wake the idle sweep of every partition this worker owns.

        Ticks are sent outside any transaction. In one, a tick became visible
        only at the next commit, and with no input there was none: the
        transaction timed out (its producer fenced, the next record's sends
        failed) and idle runs were never abandoned. A tick carries only a time.
        """
        try:
            now = str(time.time()).encode()
            for tp in self.app.consumer.assignment():
                if tp.topic == self.ticks:
                    await self.producer.send(self.ticks, b"", now, tp.partition, None, None)
        except Exception as error:  # an exception in a Faust timer would crash the worker
            log_exception_kind(log, logging.WARNING, "could not send idle ticks", error)

    async def measure_lag(self) -> None:
        # An exception in a Faust timer crashes the worker: metrics never may.
        try:
            consumer = self.app.consumer
            committed = getattr(consumer, "_committed_offset", {})
            for tp in consumer.assignment():
                end = consumer.highwater(tp)
                if not self.is_input(tp.topic) or end is None:
                    continue  # internal, or not fetched yet
                # Processed, not committed: a commit's offset may stay up to a
                # checkpoint behind what was processed (RecordProcessor.replay_starts).
                done = self.processor.processed_offset(tp.topic, tp.partition)
                lag = max(0, end - (done if done is not None else committed.get(tp) or 0))
                self.metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(lag)
            measure_view(self.app, self.settings, self.metrics, self.view)
        except Exception as error:
            log_exception_kind(log, logging.WARNING, "could not measure consumer lag", error)

    async def refresh_topic_limits(self) -> None:
        """Learn again the largest record each output topic takes (an operator may
        change a topic's max.message.bytes), so that every record built fits; with
        per-tenant topics, which tenants' topics exist."""
        try:
            # Not while a look-up for a tenant runs: its answer, newer than this
            # listing, would be overwritten by it.
            async with self.listing:
                written = self.written_ends()
                existing = await existing_topics(self.settings)
                limits = await output_limits(self.settings, existing)
                for topic, limit in limits.items():
                    self.processor.builder.set_topic_limit(topic, limit)
                if self.routing is not None:
                    self.routing.learn(limits, written)
            if self.settings.input_pattern is not None or self.routing is not None:
                self.note_unread_topics(existing)
        except Exception as error:  # an exception in a Faust timer would crash the worker
            log_exception_kind(log, logging.WARNING, "could not read the topics' limits", error)

    def note_unread_topics(self, existing: list[str]) -> None:
        """Raw topics AGUI_INPUT_PATTERN matches, and tenants' history topics, that were
        created after the start: Faust subscribes once, at start, so the workers read
        them after their next (rolling) restart. Each is said once, and counted."""
        readable = {*input_topics_now(self.settings, existing)}
        if self.routing is not None:
            readable |= {name for name in existing if is_history(self.settings, name)}
        for topic in sorted(readable - self.subscribed - self.unread):
            log.warning("topic %s appeared after the start; the workers read it after their"
                        " next restart (a rolling restart: docs/operations.md)", topic)
        self.unread = readable - self.subscribed
        self.metrics.unread_topics.set(len(self.unread))

    async def check_progress(self) -> None:
        """Feed liveness: records processed so far, and the input partitions with
        records waiting (not yet fetched, or delivered and not yet processed)."""
        try:
            lagging = await self.lagging_partitions()
            queued = self.records_queued()
            if queued:
                lagging.append(f"{queued} record(s) queued for the agent")
            self.liveness.observe(self.metrics.per_record.records(), lagging, time.monotonic())
        except Exception as error:  # an exception in a Faust timer would crash the worker
            log_exception_kind(log, logging.WARNING, "could not check progress", error)

    # --- rebalances -----------------------------------------------------------------

    async def on_partitions_revoked(self, sender: Any, revoked: Any, **kwargs: Any) -> None:
        # Committed first (WholeRecordConsumer); anything since is processed again.
        self._assigned = None
        self.unsent.clear()
        self.processor.forget()
        self.view.forget()

    async def on_partitions_assigned(self, sender: Any, assigned: Any, **kwargs: Any) -> None:
        self.assigned_once = True
        self._assigned = None
        self.liveness.partitions_moved(time.monotonic())
        self.refuse_foreign_partition_counts(assigned)

    def refuse_foreign_partition_counts(self, assigned: Any) -> None:
        """A raw topic the pattern matched, or a tenant's history topic created, since
        the start must have AGUI_PARTITIONS partitions like the rest
        (processors.runtime.topic_admin): otherwise the worker stops at once, exit 2,
        without a commit (what a kill does, which is safe)."""
        for topic in sorted({tp.topic for tp in assigned} - self.checked_topics):
            self.checked_topics.add(topic)
            if not (self.is_input(topic) or is_history(self.settings, topic)):
                continue
            partitions = self.app.consumer.topic_partitions(topic)
            if partitions is not None and partitions != self.settings.partitions:
                stop_for_configuration(
                    f"topic {topic} has {partitions} partitions; AGUI_PARTITIONS is"
                    f" {self.settings.partitions}, and every raw and history topic must have"
                    " that many")

    # --- pages ----------------------------------------------------------------------

    async def metrics_page(self, web: Any, request: Any) -> Any:
        return web.bytes(generate_latest(self.metrics.registry),
                         content_type=_METRICS_CONTENT_TYPE)

    def alive(self) -> tuple[bool, str]:
        if self.app.should_stop:
            return False, "stopping"
        verdict = self.liveness.verdict(time.monotonic())
        return verdict.healthy, verdict.reason

    async def liveness_page(self, web: Any, request: Any) -> Any:
        healthy, reason = self.alive()
        return web.json({"alive": healthy, "reason": reason}, status=200 if healthy else 503)

    async def readiness_page(self, web: Any, request: Any) -> Any:
        """Ready: in the group with its partitions assigned and its tables recovered."""
        app = self.app
        reason = ("stopping" if app.should_stop
                  else "joining the consumer group" if not self.assigned_once
                  else "rebalancing" if app.rebalancing
                  else "recovering tables" if app.in_recovery else "")
        return web.json({"ready": not reason, "reason": reason or "ready",
                         "inputPartitions": self.input_partitions()},
                        status=503 if reason else 200)

    async def health_page(self, web: Any, request: Any) -> Any:
        """Liveness, with what a person checking a worker wants to see."""
        healthy, reason = self.alive()
        return web.json({"ok": healthy, "reason": reason,
                         "processed": self.metrics.per_record.records() > 0,
                         "inputPartitions": self.input_partitions()},
                        status=200 if healthy else 503)

    # --- the assignment -------------------------------------------------------------

    def is_input(self, topic: str) -> bool:
        """A raw event topic: not one the workers write themselves (idle ticks, history),
        nor a table changelog."""
        return (topic not in self.own_topics and topic not in self.app.tables.changelog_topics
                and not is_history(self.settings, topic))

    def input_partitions(self) -> int:
        """How many input partitions this worker owns now (0 before it joined the group)."""
        try:
            return sum(self.is_input(tp.topic) for tp in self.app.consumer.assignment())
        except Exception:  # no consumer yet: starting
            return 0

    async def lagging_partitions(self) -> list[str]:
        """Assigned input partitions with records waiting for this worker: records not
        yet handed to the agent (the consumer's position below the partition's end),
        or handed over and not yet processed (unacked: the worker acks each record as
        it processes it). Transaction markers and aborted records move the position
        past them, so they never count."""
        consumer = self.app.consumer
        waiting = {message.tp for message in list(getattr(consumer, "_unacked_messages", ()))
                   if not message.acked}
        lagging: list[str] = []
        inputs = [tp for tp in sorted(consumer.assignment()) if self.is_input(tp.topic)]
        ends = await consumer.highwaters(*inputs) if inputs else {}
        for tp in inputs:
            end, position = ends.get(tp), await consumer.position(tp)
            if tp in waiting or (end is not None and position is not None and position < end):
                lagging.append(f"{tp.topic}[{tp.partition}]")
        return lagging
