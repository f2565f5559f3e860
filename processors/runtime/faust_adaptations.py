"""Every change the worker makes to Faust, in one place, applied when the app is built.

Faust's `exactly_once` is marked experimental, and as shipped it did not hold
(the recovery tests found duplicates, lost state and stuck workers). Each
adaptation below is made through a Faust seam (a subclass Faust instantiates:
App, Transport, Consumer, consumer thread, flow control, table manager) and says
in one line what Faust does, what we do instead, and which test proves it. The
incidents that found them are told in docs/faust-adaptations.md.

They were written against the versions in `CHECKED_VERSIONS`; `check_versions`
refuses to start a worker on any other, since an upgrade that renames one
private attribute would silently disable a guarantee.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import inspect
import logging
import math
from collections.abc import Awaitable, Callable, Generator, Mapping
from itertools import repeat
from time import monotonic
from typing import Any, Final, NamedTuple, Protocol, cast

import aiokafka
import faust
import uvloop
from aiokafka.errors import IllegalOperation
from aiokafka.partitioner import DefaultPartitioner, murmur2
from faust.exceptions import ProducerSendError
from faust.sensors import Monitor
from faust.stores import by_url as store_class_by_url
from faust.stores import rocksdb as faust_rocksdb
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.transport.consumer import TopicPartitionGroup, TransactionManager
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.transport.producer import ProducerBuffer
from faust.types import TP, EventT, StoreT
from faust.utils.tracing import finish_span
from mode import Service
from mode.services import WaitResults
from mode.utils.queues import FlowControlEvent, FlowControlQueue, ThrowableQueue

from processors.runtime.committed_offsets import read_group_errors
from processors.runtime.web_server import HardenedWeb, WebLimits
from processors.runtime.worker_transactions import (
    GroupMember,
    WorkerTransactionManager,
    fetch_stable_offsets,
    member_fenced_producer,
    stable_ends,
)
from processors.safe_logging import log_exception_kind

log = logging.getLogger("agui_stream")

# The versions every adaptation here was checked against (pyproject pins them): Faust,
# its service library mode (whose queues, services and signals the adaptations
# subclass), and aiokafka.
CHECKED_VERSIONS: Final = {"faust-streaming": "0.15.3", "mode-streaming": "0.7.1",
                           "aiokafka": "0.14.0"}


class UncheckedVersion(RuntimeError):
    """An installed Faust, mode or aiokafka differs from the one the adaptations were
    checked on."""


def installed_version(distribution: str) -> str:
    """The installed version of a distribution, as pip knows it (mode's own
    `__version__` says 0.0.1 whatever is installed)."""
    return importlib.metadata.version(distribution)


def check_versions() -> None:
    """Refuse to run on a Faust, mode or aiokafka the adaptations were not checked
    against."""
    installed = {name: installed_version(name) for name in CHECKED_VERSIONS}
    wrong = {name: version for name, version in installed.items()
             if version != CHECKED_VERSIONS[name]}
    if wrong:
        found = ", ".join(f"{name} {version}" for name, version in sorted(wrong.items()))
        wanted = ", ".join(f"{name} {version}" for name, version in sorted(
            CHECKED_VERSIONS.items()))
        raise UncheckedVersion(
            f"installed {found}; the worker's Faust adaptations were checked against"
            f" {wanted} only (see processors/runtime/faust_adaptations.py). Install the pinned"
            " versions: pip install -e .")


def use_uvloop() -> None:
    """asyncio's own event loop spends more per record than Faust's stream machinery
    (tasks, futures and handles for every record); uvloop runs the same code with a
    loop written in C. Call before the first event loop is made.
    Proof: service_bench.py (the adapted floor)."""
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def transactional_id(app: faust.App, topic: str, partition: int) -> str:
    """The transactional id Faust gives a source partition, from Faust's own format."""
    group = app.assignor.group_for_topic(topic)
    return TransactionManager.transactional_id_format.format(
        group_id=app.conf.id, tpg=TopicPartitionGroup(topic, partition, group))


class ResumeOnlyWhenSuspended(FlowControlEvent):
    """Faust: every resume empties the agents' queues, and Faust resumes again after
    table recovery, dropping records already fetched past their offset. Here a resume
    empties them only after a suspension (Faust suspends for every rebalance).
    Proof: tests/runtime/test_faust_adaptations.py, the kill test."""

    def resume(self) -> None:
        if not self.is_active():
            super().resume()


class CurrentGenerationQueue(ThrowableQueue[Any]):
    """Faust: a record's hand-over to its stream can wait across a rebalance (for
    room in the queue, in a task that outlives the cancelled hand-over, or for flow
    to resume); the record then enters the queue with the old generation, and the
    stream skips it *and acks it*, so its offset commits with the record never
    processed. Here a record of an old generation never enters the queue and is not
    acked: every assignment seeks back to the committed offset and fetches it again.
    Proof: tests/runtime/test_faust_adaptations.py; the join/leave test and stress."""

    def __init__(self, *args: Any, generation: Callable[[], int | None],
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._generation = generation

    def _is_stale(self, value: Any) -> bool:
        generation = getattr(getattr(value, "message", None), "generation_id", None)
        return generation is not None and generation != self._generation()

    def put_nowait(self, value: Any) -> None:  # the end of every awaited put
        if not self._is_stale(value):
            super().put_nowait(value)

    def force_put_nowait(self, value: Any) -> None:  # Faust's put when there is room
        if not self._is_stale(value):
            super().force_put_nowait(value)


# How long a fetch waits for records while some partitions wait for their stream's queue
# to drain (they are not in the fetch; one that resumes meanwhile joins the next).
_RESUME_POLL_SECONDS: Final = 0.05

# How long one fetch waits for records (Faust: 1 s; with none, Faust fetches again).
_FETCH_POLL_SECONDS: Final = 0.1

# While the agent drains a backlog, a timed commit waits up to this many intervals
# since the last one (`WholeRecordConsumer._commit_handler`).
BACKLOG_COMMIT_INTERVALS: Final = 5

# How often Faust's livelock detector walks the assigned partitions: 2.5 times its own
# default commit interval (2.8 s), whatever the worker's (`_commit_livelock_detector`).
LIVELOCK_CHECK_SECONDS: Final = 7.0

# How long the broker holds a fetch that finds no records (Faust: 1.5 s; aiokafka's own
# default is 0.5 s). An idle worker sends about ten empty fetches a second.
FETCH_MAX_WAIT_MS: Final = 100


class CommittedEndsConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust: with exactly_once, recovery reads each changelog up to the consumer's
    cached last stable offset, unknown (-1) right after an assignment, so it read
    nothing. Here it asks the broker (the consumer reads committed records only).
    And Faust waits to read the record just below that end, which in a transactional
    changelog is the last commit marker, never delivered: recovery only ended after
    two 5 s timeouts. Here a changelog's end is its last data record (below its
    marker); after an aborted tail Faust's timeout path still applies. Other
    topics' ends are the broker's.
    Proof: the join/leave test (runs on stale state failed as run_not_started);
    benchmarks/rebalance_pause.py (a join paused every partition 14 s)."""

    async def on_start(self) -> None:
        await super().on_start()
        consumer = self._ensure_consumer()
        if cast(AdaptedApp, self.consumer.app).worker_transactional_id is not None:
            fetch_stable_offsets(consumer)
        else:
            read_group_errors(consumer)

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        """Faust makes the broker hold a fetch that finds nothing for 1.5 s, and aiokafka
        sends a broker no fetch while one is in flight. So when table recovery, having
        read the changelogs to their ends, paused them and resumed the streams, the
        streams were fetched only once the changelogs' fetch had waited out its 1.5 s
        (every partition idle meanwhile, after "Worker ready"); likewise when recovery
        began. Here the broker holds an empty fetch `FETCH_MAX_WAIT_MS`.
        Proof: tests/runtime/test_faust_adaptations.py; benchmarks/rebalance_pause.py."""
        consumer: aiokafka.AIOKafkaConsumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # read when the consumer starts
        return consumer

    async def _fetch_records(self, consumer: aiokafka.AIOKafkaConsumer,
                             active_partitions: set[TP], timeout: float | None = None,
                             max_records: int | None = None) -> Any:
        """Faust: the fetch gets the live set of active partitions, which the app's
        loop empties and refills while the fetch waits (recovery pauses the
        changelogs before the streams resume), and aiokafka reads an *empty* set as
        every partition. Records of paused partitions came back, Faust skipped them
        as inactive, and the consumer's position had passed them: lost until the
        next seek, for good when none came (a partition stalled). Here aiokafka gets
        a copy taken when the fetch starts, and an empty one fetches nothing.
        Proof: tests/runtime/test_faust_adaptations.py; the join/leave stress.
        With that copy, a partition resumed while a fetch waits is fetched only by the
        next: when table recovery ended, the streams waited for a fetch of the paused
        changelogs to time out (Faust: 1 s, every partition idle after "Worker ready").
        Here a fetch waits at most `_FETCH_POLL_SECONDS`.
        Proof: tests/runtime/test_faust_adaptations.py; benchmarks/rebalance_pause.py."""
        wanted = set(active_partitions)  # one C-level copy: atomic under the GIL
        if not wanted:
            return {}
        timeout = _FETCH_POLL_SECONDS if timeout is None else min(timeout, _FETCH_POLL_SECONDS)
        if not self.consumer.app.in_recovery:
            timeout, max_records = self._paced(timeout, max_records)
        return await super()._fetch_records(consumer, wanted, timeout=timeout,
                                            max_records=max_records)

    def _paced(self, timeout: float, max_records: int | None) -> tuple[float, int | None]:
        """Faust takes all that aiokafka has buffered in one fetch (41,000 records here),
        far more than a stream's queue holds: the fetch's tail then waited for room
        record by record (a task each, and four more in `wait_first`: 17 % of the
        records). And while partitions wait for their queue to drain, a fetch of the
        others waits out its whole timeout (1 s) before a resumed one is fetched. Here
        a fetch takes at most what fits above the queue's pressure mark (where Faust
        stops fetching a partition), and waits at most `_RESUME_POLL_SECONDS` while a
        partition waits for its queue. Recovery's fetches are left as they are.
        Proof: service_bench.py (the adapted floor and the worker)."""
        headroom: int | None = self.__dict__.get("_adapted_headroom")
        if headroom is None:
            maxsize = self.consumer.app.conf.stream_buffer_maxsize
            headroom = max(1, maxsize - math.floor(maxsize / FlowControlQueue.pressure_high_ratio))
            self.__dict__["_adapted_headroom"] = headroom
        if self.consumer._buffered_partitions:
            timeout = min(timeout, _RESUME_POLL_SECONDS)
        return timeout, headroom if max_records is None else min(max_records, headroom)

    async def _highwaters(self, partitions: list[TP]) -> Any:
        consumer = self._ensure_consumer()
        changelogs = self.consumer.app.tables.changelog_topics
        recovering = any(tp.topic in changelogs for tp in partitions)
        if recovering and cast(AdaptedApp, self.consumer.app).worker_transactional_id:
            # One transaction per worker: wait out a transaction an earlier owner left
            # open (worker_transactions.stable_ends).
            ends = await stable_ends(consumer, partitions)
        else:
            ends = await consumer.end_offsets(partitions)
        if not self.consumer.in_transaction or not recovering:
            return ends
        starts = await consumer.beginning_offsets(partitions)
        # Every transaction ends with one marker after its records: two offsets at least.
        return {tp: end - 1 if tp.topic in changelogs and end - starts[tp] >= 2 else end
                for tp, end in ends.items()}


class LeanMonitor(Monitor):
    """Faust's monitor keeps statistics of every message, stream event and send for
    its own web pages, which the worker does not serve; here those per-record hooks
    do nothing (the worker exports its own metrics). Proof: service_bench.py."""

    def on_message_in(self, tp: TP, offset: int, message: Any) -> None:
        return None

    def on_stream_event_in(self, tp: TP, offset: int, stream: Any, event: Any) -> None:
        return None

    def on_stream_event_out(self, tp: TP, offset: int, stream: Any, event: Any,
                            state: Any = None) -> None:
        return None

    def on_message_out(self, tp: TP, offset: int, message: Any) -> None:
        return None

    def on_send_initiated(self, producer: Any, topic: str, message: Any, keysize: int,
                          valsize: int) -> None:
        return None

    def on_send_completed(self, producer: Any, state: Any, metadata: Any) -> None:
        return None


class RawRecords(faust.Schema[bytes, bytes]):
    """Faust decodes every record through its codec registry (a codec lookup and a
    payload check each for key and value) even with the raw codec; a topic with this
    schema hands each record's bytes to its stream as they are (the agents decode
    them themselves). Proof: service_bench.py (the adapted floor); the service tests."""

    def __init__(self) -> None:
        super().__init__(key_serializer="raw", value_serializer="raw")

    def compile(self, app: Any, *, on_key_decode_error: Any = None,
                on_value_decode_error: Any = None, default_propagate: bool = False) -> Any:
        create_event = app.create_event

        async def decode(message: Any, *, propagate: bool = False) -> Any:
            return create_event(message.key, message.value, message.headers, message)
        return decode


class CachedKeyPartitioner:
    """aiokafka's default partitioner hashes every keyed record's key with murmur2 (as
    Java's does) in pure Python: 10 us for a thread key, and a run's history records
    all share one. Here the hash of a recent key is remembered; partitions are the
    default partitioner's. Proof: tests/runtime/test_faust_adaptations.py; service_bench.py."""

    CAPACITY: Final = 65_536

    def __init__(self) -> None:
        self._default = DefaultPartitioner()
        self._hashes: dict[bytes, int] = {}

    def __call__(self, key: bytes | None, all_partitions: list[int],
                 available: list[int]) -> int:
        if key is None:
            return int(self._default(key, all_partitions, available))
        hashed = self._hashes.get(key)
        if hashed is None:
            if len(self._hashes) >= self.CAPACITY:
                self._hashes.clear()
            hashed = self._hashes[key] = murmur2(key) & 0x7FFFFFFF
        return all_partitions[hashed % len(all_partitions)]


class _Resumed:
    """A coroutine that has already run up to its first suspension, as an awaitable
    that goes on from there (what `yield from` would have done)."""

    __slots__ = ("_coroutine", "_pending")

    def __init__(self, coroutine: Any, pending: Any) -> None:
        self._coroutine = coroutine
        self._pending = pending

    def __await__(self) -> Generator[Any, None, Any]:
        coroutine, pending = self._coroutine, self._pending
        while True:
            try:
                yield pending
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as error:  # thrown in by the task: cancellation
                try:
                    pending = coroutine.throw(error)
                except StopIteration as finished:
                    return finished.value
            else:
                try:
                    pending = coroutine.send(None)
                except StopIteration as finished:
                    return finished.value


def resumed_coroutine(frame: Any) -> Any:
    """The coroutine a suspended `_Resumed` drives, given its frame (for task dumps)."""
    if frame.f_code is _Resumed.__await__.__code__:
        return frame.f_locals.get("coroutine")
    return None


def _client_assignment(client: aiokafka.AIOKafkaConsumer) -> Any:
    """aiokafka's current assignment (a new object at every rebalance); None: none."""
    subscription = client._subscription.subscription
    return None if subscription is None else subscription.assignment


class WholeRecordConsumer(faust_aiokafka.Consumer):
    """The consumer: commits cover whole records and carry the write-behind state."""

    app: AdaptedApp

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unsought: set[TP] = set()  # stream partitions not sought since their assignment
        self._held: set[TP] = set()  # of those, the ones Faust asked to resume
        self.fetches_begun = 0  # Faust's fetches so far (each hands out its batch)
        self._handed_out: dict[TP, int] = {}  # the last offset fetched, per partition

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return CommittedEndsConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        self._unsought = {tp for tp in assigned if not self._is_changelog_tp(tp)}
        self._held = set()
        self._handed_out.clear()  # every partition is sought again
        await super().on_partitions_assigned(assigned, generation_id)

    def resume_partitions(self, tps: Any) -> None:
        """Faust resumes an assignment's stream partitions and only then seeks them to
        their committed offsets. A partition the worker kept across the rebalance was
        fetched in between from where the consumer stood before it, past records
        fetched and dropped unprocessed at the revocation: later records of a run were
        processed before earlier ones (runs failed, and the earlier records, once read
        again, were skipped as replays; their outputs never existed). Here a stream
        partition stays paused until `perform_seek` has sought it.
        Proof: tests/runtime/test_faust_adaptations.py; the join/leave test and stress."""
        tps = list(tps)
        held = {tp for tp in tps if tp in self._unsought}
        self._held |= held
        super().resume_partitions([tp for tp in tps if tp not in held])
        self._pause_changelogs_in_client(tps, paused=False)

    def pause_partitions(self, tps: Any) -> None:
        tps = list(tps)
        super().pause_partitions(tps)
        self._pause_changelogs_in_client(tps, paused=True)

    def _pause_changelogs_in_client(self, tps: list[TP], *, paused: bool) -> None:
        """Faust pauses a partition in its own set of active partitions only: aiokafka
        goes on fetching it, and Faust never takes its records. After recovery every
        changelog partition is paused so, and the worker's own commits write to them:
        each one's first write since the assignment sat in aiokafka's buffer for good,
        and aiokafka sends a broker no fetch at all while a partition's records wait
        to be taken, up to its 100 ms prefetch backoff. At 128 partitions one idle
        turn in ten waited 100-200 ms for the fetches of its run and of its history.
        Here a changelog partition Faust pauses or resumes is paused or resumed in
        aiokafka too, on the consumer's thread and only in the assignment it was
        meant for (a newer one starts unpaused, and Faust pauses it again).
        Proof: tests/runtime/test_faust_adaptations.py; next_turn_bench.py --partitions 128."""
        changelogs = [tp for tp in tps if self._is_changelog_tp(tp)]
        thread: Any = self._thread
        client = getattr(thread, "_consumer", None)
        if not changelogs or client is None:
            return
        meant_for = _client_assignment(client)

        def apply() -> None:
            assignment = _client_assignment(client)
            if assignment is None or assignment is not meant_for or not assignment.active:
                return
            for tp in changelogs:
                if tp in assignment.tps:
                    state = assignment.state_value(tp)
                    if paused:
                        state.pause()
                    else:
                        state.resume()

        with contextlib.suppress(RuntimeError):  # the consumer thread's loop closed: stopping
            thread.thread_loop.call_soon_threadsafe(apply)

    async def perform_seek(self) -> None:
        generation = self.app.consumer_generation_id
        await super().perform_seek()
        if self.app.consumer_generation_id == generation:  # else: a newer assignment waits
            held, self._held, self._unsought = self._held, set(), set()
            super().resume_partitions(held)

    async def wait_first(self, *coros: Any, timeout: Any = None) -> WaitResults:
        """Faust hands each fetched record to its stream with `wait_first(delivery,
        flow suspended)`, which makes four tasks per record. When the consumer runs
        and flow is active, the delivery is first run directly: if it completes
        without suspending (the stream's queue has room) it won, and no task is made;
        otherwise it goes on, as Faust would, against the other conditions.
        Proof: service_bench.py (the adapted floor); the kill and join/leave tests."""
        first = coros[0] if coros else None
        if (timeout is not None or not inspect.iscoroutine(first) or self.should_stop
                or not self.flow_active):
            return await super().wait_first(*coros, timeout=timeout)
        try:
            pending = first.send(None)
        except BaseException as ended:
            for other in coros[1:]:
                if inspect.iscoroutine(other):
                    other.close()  # never started
            if isinstance(ended, StopIteration):
                return WaitResults([first], [ended.value], False)
            raise
        return await super().wait_first(_Resumed(first, pending), *coros[1:])

    async def _wait_next_records(self, timeout: float) -> Any:
        """Faust sleeps a whole second when every partition waits for its stream's
        queue to drain (no fetch to make), and the queue runs dry meanwhile; here it
        looks again after `_RESUME_POLL_SECONDS`.
        Proof: service_bench.py (the adapted floor).
        It also counts the fetches and keeps each partition's last offset fetched: a
        fetch begins only once the last one's records were all handed to the streams
        (`processors.runtime.view_catch_up` reads both)."""
        self.fetches_begun += 1
        if (self.flow_active and self._buffered_partitions
                and not self._get_active_partitions()):
            await self.sleep(_RESUME_POLL_SECONDS)
            return {}, set()
        records, active = await super()._wait_next_records(timeout)
        for tp, batch in (records or {}).items():
            if batch:
                self._handed_out[tp] = batch[-1].offset
        return records, active

    def fetch_position(self, tp: TP) -> int | None:
        """aiokafka's fetch position of `tp` (the next offset it fetches), read from its
        consumer's state without a round trip to the consumer thread (as Faust reads
        the group's generation there); None: not assigned, or not sought yet."""
        try:
            subscription = self._thread._ensure_consumer()._subscription
            if not subscription.is_assigned(tp):
                return None
            state = subscription.subscription.assignment.state_value(tp)
            return int(state.position) if state.has_valid_position else None
        except Exception:  # the assignment changed meanwhile: not known now
            return None

    def last_handed_out(self, tp: TP) -> int | None:
        """The last offset of `tp` fetched since the assignment (handed to its stream
        once the next fetch has begun); None: none."""
        return self._handed_out.get(tp)

    @Service.task
    async def _commit_handler(self) -> None:
        """Faust sleeps the commit interval after each commit ends, so commits start
        every interval plus the commit's own duration, and a record's outputs wait up
        to that long to become readable. Here a commit starts every commit interval
        (at once after one that took longer), and earlier when a record produced
        history (`commit_soon`: a caller may be waiting for it), though no sooner
        than a quarter interval after the last one began; the interval then counts
        from it. While the agent drains a backlog, a timed commit waits up to
        `BACKLOG_COMMIT_INTERVALS` intervals. Proof: tests/runtime/test_faust_adaptations.py;
        next_turn_bench.py; service_bench.py part 1."""
        interval = self.commit_interval
        start = monotonic() + interval
        began = -interval
        while True:
            await self._until_commit(start - monotonic(), began + interval / 4 - monotonic())
            if self.should_stop:
                return
            if (not self._commit_wanted().is_set() and self.app.backlogged()
                    and monotonic() - began < BACKLOG_COMMIT_INTERVALS * interval):
                # Draining a backlog: fewer, larger commits (each is a transaction per
                # partition; at 100 ms they cost a backlog a third of its rate), and
                # no caller waits for history that is still queued.
                start += interval
                continue
            self._commit_wanted().clear()
            began = monotonic()
            await self.commit()
            start = max(min(start, began) + interval, monotonic())

    @Service.task
    async def _commit_livelock_detector(self) -> None:
        """Faust checks every assigned partition's event path (it only logs what it
        finds) every 2.5 commit intervals: at the worker's 100 ms commits, four times a
        second, a walk over every partition with a loop turn each (4 % of a worker
        holding 128 input partitions: py-spy). Here it runs every
        `LIVELOCK_CHECK_SECONDS`, as at Faust's default interval; the worker's own
        liveness (/livez) watches its partitions. Proof: service_bench.py --partitions 128."""
        await self.sleep(LIVELOCK_CHECK_SECONDS)
        async for _sleep_time in self.itertimer(LIVELOCK_CHECK_SECONDS, name="livelock"):
            if not self.app.rebalancing:
                await self.verify_all_partitions_active()

    def commit_soon(self) -> None:
        """Start the next commit early (see `_commit_handler`)."""
        self._commit_wanted().set()

    async def _until_commit(self, timed: float, earliest: float) -> None:
        """Until the next timed commit, `timed` seconds from now, or, once `earliest`
        seconds have passed, until a commit is wanted soon."""
        wanted = self._commit_wanted()
        if earliest > 0 and timed > earliest:
            await self.sleep(earliest)
            timed -= earliest
        if timed > 0 and not wanted.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wanted.wait(), timed)

    def _commit_wanted(self) -> asyncio.Event:
        wanted: asyncio.Event | None = self.__dict__.get("_adapted_commit_wanted")
        if wanted is None:
            wanted = self.__dict__["_adapted_commit_wanted"] = asyncio.Event()
        return wanted

    async def force_commit(self, topics: Any = None, start_new_transaction: bool = True,
                           ) -> bool:
        """Faust commits on a timer, concurrently with the agent, so a commit could take
        a record's offset while its outputs were half sent, and the agent waits for
        none of it. Here a commit takes, between two records, the offsets acked so far
        and what those records produced and changed (`AdaptedApp.take_commit`); then,
        while the agent goes on with the next records (they only buffer), sends that
        and commits those offsets. Proof: the kill test (duplicates without it);
        service_bench.py (the agent waited 12 % of the time for commits)."""
        async with self._one_commit_at_a_time():
            started = monotonic()
            async with self.app.record_boundary:
                offsets, batch = self._take_commit(topics, not start_new_transaction)
            observe = self.app.observe_commit
            observe("take", monotonic() - started)
            return await self._complete_commit(offsets, batch, start_new_transaction,
                                               observe)

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        """Faust leaves open transactions open across a rebalance and forgets revoked
        partitions' acked offsets first; here everything is committed before any
        partition moves, as Kafka Streams does, with no record processed meanwhile
        (what is not committed is processed again by the next owner).
        Proof: the join/leave test."""
        if self.in_transaction:
            async with self._one_commit_at_a_time(), self.app.record_boundary:
                offsets, batch = self._take_commit(None, everything=True)
                await self._complete_commit(offsets, batch, True, _ignore_commit_phase)
        await super().on_partitions_revoked(revoked)

    def _one_commit_at_a_time(self) -> asyncio.Lock:
        lock: asyncio.Lock | None = self.__dict__.get("_adapted_commit_lock")
        if lock is None:
            lock = self.__dict__["_adapted_commit_lock"] = asyncio.Lock()
        return lock

    def _take_commit(self, topics: Any, everything: bool = False,
                     ) -> tuple[dict[TP, int], CommitBatch]:
        """Between two records: the offsets to commit and what their records left
        (`everything`: no state may wait for a checkpoint, see
        `AdaptedApp.take_commit`). The batch has the last word on the offsets: Faust's
        are those of the records acked, and a record acked may be covered by no
        stored state yet."""
        offsets = self._filter_committable_offsets(
            list(self._filter_tps_with_pending_acks(topics)))
        batch = self.app.take_commit(everything)
        return batch.offsets_to_commit(offsets, self._committed_offset), batch

    async def _complete_commit(self, offsets: dict[TP, int], batch: CommitBatch,
                               start_new_transaction: bool,
                               observe: Callable[[str, float], None]) -> bool:
        # Faust's own path would also publish its "attached" messages first; the
        # worker attaches none.
        started = monotonic()
        self.app.commit_in_flight = True
        try:
            await batch.send()
            sent = monotonic()
            committed = bool(offsets) and bool(await self._commit_offsets(
                offsets, start_new_transaction=start_new_transaction))
        finally:
            self.app.commit_in_flight = False
        observe("send", sent - started)
        observe("commit", monotonic() - sent)
        await batch.apply()
        return committed


class OutRecord(NamedTuple):
    """A record a commit sends; `partition` None: the producer's partitioner picks it."""

    topic: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None


# Where a sent record landed: its batch's delivery (the batch's first offset) and its
# place in the batch.
Placed = tuple["asyncio.Future[Any]", int]


class UnthreadedProducerBuffer(ProducerBuffer):
    """Faust's producer buffer measures itself before the conductor hands over each
    record, reading the `producer_threaded` setting through the settings registry
    every time (2-3 % of the worker's loop); the worker never threads its producer,
    so here its size is its queue's. Proof: service_bench.py (the adapted floor)."""

    @property
    def size(self) -> int:
        return self.pending.qsize()


class CommitProducer(faust_aiokafka.Producer):
    """The producer of the worker's commits."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.app.conf.producer_threaded:
            raise ValueError("the worker's producer is not threaded (producer_threaded)")
        buffer = UnthreadedProducerBuffer(loop=self.loop, beacon=self.beacon)
        buffer.app = self.app
        self.buffer = buffer
        # The topics the worker's commits write (`begin_transaction`).
        self.commit_topics: tuple[str, ...] = ()
        self._learning: set[asyncio.Future[None]] = set()

    async def begin_transaction(self, transactional_id: str) -> None:
        """Faust starts a partition's transactional producer knowing no topic, so each
        topic a commit first wrote (history, dead letters, each changelog) cost a
        metadata round trip in the middle of the commit's sends, and the sends after
        it a second AddPartitionsToTxn round trip: up to 30 ms in each of a new
        producer's first commits. Here a new producer learns the partitions of every
        topic in `commit_topics` (one metadata request) while the assignment goes on.
        Proof: tests/runtime/test_faust_adaptations.py; service_bench.py part 4 (history
        latency)."""
        starting = transactional_id not in self._transaction_producers
        await super().begin_transaction(transactional_id)
        producer = self._transaction_producers.get(transactional_id)
        if starting and producer is not None and self.commit_topics:
            learning = asyncio.ensure_future(self._learn_partitions(producer,
                                                                    transactional_id))
            self._learning.add(learning)
            learning.add_done_callback(self._learning.discard)

    def _new_producer(self, transactional_id: str | None = None) -> Any:
        """The worker's one transactional producer (AGUI_TRANSACTIONS=worker) fences by
        group member (processors.runtime.worker_transactions)."""
        app = cast(AdaptedApp, self.app)
        if transactional_id is None or transactional_id != app.worker_transactional_id:
            return super()._new_producer(transactional_id)
        return member_fenced_producer(app.group_member, transactional_id=transactional_id,
                                      **{**self._settings_default(), **self._settings_auth(),
                                         **self._settings_extra()})

    async def topic_names(self) -> set[str]:
        """The names of every topic the broker shows this principal, over the producer's
        own connection (a metadata request naming no topic: it creates none)."""
        metadata = await self._ensure_producer().client.fetch_all_metadata()
        return set(metadata.topics())

    async def _learn_partitions(self, producer: Any, transactional_id: str) -> None:
        try:
            await asyncio.gather(*(producer.partitions_for(topic)
                                   for topic in self.commit_topics))
        except Exception as error:  # a commit asks for what it needs itself
            log.info("the producer of %s did not learn its topics ahead (%s)",
                     transactional_id, type(error).__name__)

    async def send_batched(self, records: list[OutRecord],
                           transactional_id: str | None) -> list[Placed]:
        """Faust sends record by record: a lock, a signal, a future and a metadata
        tuple each, and the worker sends about one record per input record at a
        commit. Here a commit's records go to each partition as whole batches (one
        future each), in `transactional_id`'s transaction (None: none), and each
        record's place is returned in the order given.
        Faust also begins a partition's next transaction only after committing the
        last, so a commit failing in a rebalance left its producer between
        transactions and every later send failed; here the send begins it.
        Proof: the kill and join/leave tests; tests/runtime/test_service_transactions.py;
        service_bench.py."""
        producer: Any = (self._ensure_producer() if transactional_id is None
                         else self._transaction_producers.get(transactional_id))
        if producer is None:
            raise ProducerSendError(f"no producer for transaction {transactional_id}")
        partitioner = cast(Callable[..., int], self.partitioner)
        by_partition: dict[tuple[str, int], list[int]] = {}
        partitions_of: dict[str, list[int]] = {}
        for index, record in enumerate(records):
            partition = record.partition
            if partition is None:
                known = partitions_of.get(record.topic)
                if known is None:
                    known = partitions_of[record.topic] = sorted(
                        await producer.partitions_for(record.topic))
                partition = partitioner(record.key, known, known)
            by_partition.setdefault((record.topic, partition), []).append(index)
        placed: list[Placed | None] = [None] * len(records)
        for (topic, partition), indexes in by_partition.items():
            batch, in_batch = producer.create_batch(), list[int]()
            for index in indexes:
                record = records[index]
                # A batch takes records up to its size, and its first one always.
                while batch.append(timestamp=None, key=record.key, value=record.value,
                                   headers=record.headers) is None:
                    await self._send_batch(producer, transactional_id, topic, partition,
                                           batch, in_batch, placed)
                    batch, in_batch = producer.create_batch(), []
                in_batch.append(index)
            await self._send_batch(producer, transactional_id, topic, partition, batch,
                                   in_batch, placed)
        return cast(list[Placed], placed)

    async def _send_batch(self, producer: Any, transactional_id: str | None, topic: str,
                          partition: int, batch: Any, in_batch: list[int],
                          placed: list[Placed | None]) -> None:
        """Send a batch (complete, so it does not linger) and place its records."""
        batch.close()
        if transactional_id is None:
            delivery = await producer.send_batch(batch, topic, partition=partition)
        else:
            async def send() -> Any:
                async with self._trn_locks[transactional_id]:  # as Faust's own send
                    return await producer.send_batch(batch, topic, partition=partition)
            delivery = await _beginning_one_if_between(self, transactional_id, send)
        for place, index in enumerate(in_batch):
            placed[index] = (delivery, place)

    async def commit_transactions(self, tid_to_offset_map: Any, group_id: str,
                                  start_new_transaction: bool = True) -> None:
        """Faust commits each partition's transaction after the previous one (three
        round trips each, while the agent waits); here they commit concurrently, every
        one attempted, the first error raised after all have finished.
        Proof: the kill and join/leave tests; service_bench.py."""
        outcomes = await asyncio.gather(*(
            self._commit_transaction(transaction, offsets, group_id, start_new_transaction)
            for transaction, offsets in tid_to_offset_map.items()
        ), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _commit_transaction(self, transaction: str, offsets: Any, group_id: str,
                                  start_new_transaction: bool) -> None:
        """Faust ends every transaction when its streams are waited empty (at a stop,
        before the agents stop) and then commits the offsets of the records they
        processed after that: the commit raised "Not in the middle of a transaction",
        the consumer's stop failed, the worker never left the group and its partitions
        waited for the shutdown and session timeouts. Here such offsets are committed
        in a transaction begun for them (the error is raised before anything is sent).
        Proof: tests/runtime/test_service_transactions.py; rebalance_pause.py (the leave)."""
        commit = super().commit_transactions
        await _beginning_one_if_between(self, transaction, lambda: commit(
            {transaction: offsets}, group_id, start_new_transaction))


class QuickStopRocksDBStore(faust_rocksdb.Store):
    """Faust's rocksdb store stops by dropping its databases and then collecting
    garbage over the whole heap, and a stopping worker stops its tables before it
    leaves the group: 0.2-0.45 s per table (py-spy), about a second of a scale-in's
    pause with three tables. Here it only drops them: a database closes when its last
    reference goes (py-spy saw it close there), and the process exits next.
    Proof: tests/runtime/test_faust_adaptations.py; benchmarks/rebalance_pause.py (the leave)."""

    async def stop(self) -> None:
        self.logger.info("Closing rocksdb on stop")
        self._dbs.clear()


class QuickStopTable(faust.Table[bytes, bytes]):
    """A table whose rocksdb store is a `QuickStopRocksDBStore`."""

    def _new_store_by_url(self, url: Any) -> StoreT[bytes, bytes]:
        store_class = store_class_by_url(url)
        if store_class is faust_rocksdb.Store:
            store_class = QuickStopRocksDBStore
        return store_class(  # Faust's own arguments
            url, self.app, self, table_name=self.name, key_type=self.key_type,
            key_serializer=self.key_serializer, value_serializer=self.value_serializer,
            value_type=self.value_type, loop=self.loop, options=self.options)


# How long recovery waits for a changelog record before it checks whether recovery has
# ended (Faust's).
_CHANGELOG_WAIT_SECONDS: Final = 5.0


class BatchedRecovery(Recovery):
    """Faust's recovery takes changelog records from their queue one at a time, with
    `wait_for(queue.get())`: a task and three event-loop turns per record, while the
    agent takes a record every turn. The standbys fell behind what the other worker
    wrote (the queue stood full), and a leave restored up to 68,000 records first.
    Here, once a record is awaited, every record the queue holds is taken and applied
    without returning to the loop, each with Faust's bookkeeping (offset, table buffer,
    `on_changelog_event`, `apply_changelog_batch` at the buffer's size); recovery's end
    and the standbys' readiness are checked once per batch.
    Proof: tests/runtime/test_faust_adaptations.py; benchmarks/rebalance_pause.py (the leave)."""

    @Service.task
    async def _slurp_changelogs(self) -> None:
        queue = self.tables.changelog_queue
        timeouts = 0
        while not self.should_stop:
            try:
                self.signal_recovery_end.clear()
                if queue.empty():
                    try:
                        first = await asyncio.wait_for(queue.get(), _CHANGELOG_WAIT_SECONDS)
                    except TimeoutError:
                        timeouts += 1
                        if self.should_stop:
                            return
                        await self._end_recovery_if_done(timeouts)
                        continue
                else:
                    first = queue.get_nowait()
                timeouts = 0
                batch: list[EventT[Any]] = [first]
                try:
                    while not queue.empty():
                        batch.append(queue.get_nowait())
                finally:  # an error thrown into the queue: what came before it is applied
                    await self._apply_changelog_events(batch)
                await self._end_recovery_if_done(timeouts)
                self._note_standbys_ready()
            except Exception as error:  # as Faust: logged, and recovery goes on; by kind
                # only, as everywhere (a message may quote a record's content)
                log_exception_kind(log, logging.WARNING, "error in recovery", error)

    async def _apply_changelog_events(self, events: list[EventT[Any]]) -> None:
        """Faust's handling of each record, for a batch. A record of a changelog
        partition neither active nor standby is skipped (Faust applied it to the table
        of the record before it)."""
        now = monotonic()
        tp_to_table, buffers, buffer_sizes = self.tp_to_table, self.buffers, self.buffer_sizes
        active_tps, standby_tps = self.active_tps, self.standby_tps
        actives = 0
        for event in events:
            try:
                message = event.message
                tp, offset = message.tp, message.offset
                bufsize = buffer_sizes.get(tp)
                is_active = tp in active_tps
                if is_active:
                    table = tp_to_table[tp]
                    offsets = self.active_offsets
                    if bufsize is None:
                        bufsize = buffer_sizes[tp] = table.recovery_buffer_size
                    self._active_events_received_at[tp] = now
                elif tp in standby_tps:
                    table = tp_to_table[tp]
                    offsets = self.standby_offsets
                    if bufsize is None:
                        bufsize = buffer_sizes[tp] = table.standby_buffer_size
                        self._standby_events_received_at[tp] = now
                else:
                    log.warning("recovery unknown topic %s offset %s: skipped", tp, offset)
                    continue
                seen = offsets.get(tp)
                if seen is None or offset > seen:
                    offsets[tp] = offset
                    buffer = buffers[table]
                    buffer.append(event)
                    await table.on_changelog_event(event)  # Faust's tables: returns at once
                    if len(buffer) >= bufsize:
                        table.apply_changelog_batch(buffer)
                        buffer.clear()
                        self._last_flush_at = now
                    actives += is_active
            except Exception as error:  # as Faust: logged, and the next record goes on
                log_exception_kind(log, logging.WARNING, "error in recovery", error)
        if actives:
            self._note_processing_times(actives)

    def _note_processing_times(self, records: int) -> None:
        """Faust's samples for its estimate of the time recovery has left: each record
        applied since the last batch gets an equal share of the time since."""
        now = monotonic()
        last = self._last_active_event_processed_at
        if last is not None:
            samples, most = self._processing_times, self.num_samples_required_for_estimate
            samples.extend(repeat((now - last) / records, min(records, most)))
            while len(samples) > most:
                samples.popleft()
        self._last_active_event_processed_at = now

    async def _end_recovery_if_done(self, timeouts: int) -> None:
        """Faust's end of recovery: once the actives have reached their ends, apply what
        is buffered and signal it; after two waits for a record in vain, a partition
        whose position has passed its end is done (an aborted tail)."""
        if timeouts > 1 and self.app.in_transaction:
            offsets = self.active_offsets
            for tp, highwater in self.active_highwaters.items():
                if highwater is not None and offsets[tp] is not None and offsets[tp] < highwater:
                    position = await self.app.consumer.position(tp)
                    if position is not None and position >= highwater:
                        log.info("Aborted tx until highwater for %s", tp)
                        offsets[tp] = highwater
        if self.in_recovery and not self.need_recovery():
            self.flush_buffers()
            self._set_recovery_ended()
            if self._actives_span is not None:
                self._actives_span.set_tag("Actives-Ready", True)
            self.signal_recovery_end.set()

    def _note_standbys_ready(self) -> None:
        if self._standbys_span is None and self.tables.standbys_ready:
            return
        if not self.standby_remaining_total():
            if self._standbys_span:
                finish_span(self._standbys_span)
                self._standbys_span = None
            self.tables.on_standbys_ready()


class BatchedRecoveryTableManager(TableManager):
    """Faust's table manager, with `BatchedRecovery` as its recovery service."""

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = BatchedRecovery(self.app, self, beacon=self.beacon,
                                             loop=self.loop)
        return self._recovery


class AdaptedTransport(faust_aiokafka.Transport):
    Consumer = WholeRecordConsumer
    Producer = CommitProducer

    def create_transaction_manager(self, consumer: Any, producer: Any,
                                   **kwargs: Any) -> Any:
        """One transaction per worker when the app has a worker transactional id
        (AGUI_TRANSACTIONS=worker, processors.runtime.worker_transactions)."""
        transactional_id = cast(AdaptedApp, self.app).worker_transactional_id
        if transactional_id is None:
            return super().create_transaction_manager(consumer, producer, **kwargs)
        manager = WorkerTransactionManager(self, consumer=consumer, producer=producer,
                                           **kwargs)
        manager.transactional_id = transactional_id
        return manager


class CommitBatch(Protocol):
    """What the records of one commit produced and changed, taken between two records."""

    async def send(self) -> None:
        """Send it, in the transactions of the commit, and wait until the broker has it
        (before its offsets commit)."""

    async def apply(self) -> None:
        """The commit is done: apply what it persisted to the local stores."""

    def offsets_to_commit(self, acked: dict[TP, int],
                          committed: Mapping[TP, int | None]) -> dict[TP, int]:
        """The offsets the commit takes, given those of the records acked since the
        last commit and those committed."""


class _EmptyCommitBatch:
    async def send(self) -> None:
        return None

    def offsets_to_commit(self, acked: dict[TP, int],
                          committed: Mapping[TP, int | None]) -> dict[TP, int]:
        return acked

    async def apply(self) -> None:
        return None


def _ignore_commit_phase(phase: str, seconds: float) -> None:
    return None


class AdaptedApp(faust.App):
    """A Faust app with the adaptations above; `take_commit` is the worker's hook that
    hands every commit what to send with it."""

    web_limits: WebLimits | None = None  # set before the first page is added
    # One transaction per worker (AGUI_TRANSACTIONS=worker): its transactional id, set
    # before the app starts; None: one per partition, Faust's.
    worker_transactional_id: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("Monitor", LeanMonitor)
        kwargs.setdefault("producer_partitioner", CachedKeyPartitioner())
        kwargs.setdefault("TableManager", BatchedRecoveryTableManager)
        super().__init__(*args, **kwargs)
        # Held while a commit takes its offsets and batch, and while a rebalance
        # commits: a record waits for it (see WholeRecordConsumer.force_commit).
        self.record_boundary = asyncio.Lock()
        # A commit is sending its batch or committing its offsets (`apply_each`).
        self.commit_in_flight = False
        # Called between two records with `everything` True when no state may wait
        # for a checkpoint (partitions about to move, a stop).
        self.take_commit: Callable[[bool], CommitBatch] = lambda everything: _EmptyCommitBatch()
        # Whether the agent is draining a backlog (which stretches the commit interval).
        self.backlogged: Callable[[], bool] = lambda: False
        # Told each timed commit's phases ("take", "send", "commit") and their seconds.
        self.observe_commit: Callable[[str, float], None] = _ignore_commit_phase
        self._owned_producers: set[str] = set()
        self.on_partitions_assigned.connect(
            self._stop_producers_of_lost_partitions)  # type: ignore[arg-type]

    def group_member(self) -> GroupMember:
        """The consumer's generation and member id now (read from the consumer's
        thread: plain attributes, each read whole)."""
        coordinator = cast(WholeRecordConsumer, self.consumer)._thread._ensure_consumer(
            )._coordinator
        return GroupMember(coordinator.generation, coordinator.member_id,
                           coordinator._group_instance_id)

    def commit_soon(self) -> None:
        """A record produced history: start the next commit early
        (`WholeRecordConsumer._commit_handler`)."""
        consumer = self.consumer
        if isinstance(consumer, WholeRecordConsumer):
            consumer.commit_soon()

    def _new_web(self) -> Any:
        """Faust's web driver, hardened (`web_server.HardenedWeb`) once the worker has
        set `web_limits`."""
        if self.web_limits is None:
            return super()._new_web()
        return HardenedWeb(self, self.web_limits)

    def raw_topic(self, *topics: str, pattern: Any = None) -> Any:
        """A topic whose records reach the agent as bytes (`RawRecords`)."""
        return self.topic(*topics, pattern=pattern, schema=RawRecords())

    def create_event(self, key: Any, value: Any, headers: Any, message: Any) -> Any:
        """Faust looks its Event class up in the settings registry for every record;
        here once. Proof: service_bench.py (the adapted floor)."""
        event_class: Any = self.__dict__.get("_adapted_event_class")
        if event_class is None:
            event_class = self.__dict__["_adapted_event_class"] = self.conf.Event
        return event_class(self, key, value, headers, message)

    def _new_transport(self) -> Any:
        return AdaptedTransport(self.conf.broker_consumer, self)

    def _new_producer_transport(self) -> Any:
        return AdaptedTransport(self.conf.broker_producer, self)

    def FlowControlQueue(self, maxsize: int | None = None, *,
                         clear_on_resume: bool = False) -> ThrowableQueue[Any]:
        return CurrentGenerationQueue(
            maxsize=maxsize, flow_control=self.flow_control, clear_on_resume=clear_on_resume,
            generation=lambda: self.consumer_generation_id)

    @property
    def flow_control(self) -> FlowControlEvent:
        flow = self.__dict__.get("_adapted_flow_control")
        if flow is None:
            flow = self.__dict__["_adapted_flow_control"] = ResumeOnlyWhenSuspended(
                loop=self.loop)
        return flow

    async def _stop_producers_of_lost_partitions(self, sender: Any, assigned: Any,
                                                 **kwargs: Any) -> None:
        """Faust does not stop the transactional producers of partitions a rebalance
        took away; the new owner fences them, and when a partition comes back every
        send of it fails. Here they are stopped (Faust starts fresh ones on return).
        Proof: the join/leave test."""
        if not self.in_transaction or self.worker_transactional_id is not None:
            return
        changelogs = self.tables.changelog_topics
        owned = {transactional_id(self, tp.topic, tp.partition) for tp in assigned
                 if tp.topic not in changelogs and not self.assignor.is_standby(tp)}
        for lost in sorted(self._owned_producers - owned):
            await self.producer.stop_transaction(lost)
        self._owned_producers = owned


# How long an agent applies records before it lets the event loop run the rest.
AGENT_TURN_SECONDS: Final = 0.002


async def apply_each(stream: Any, app: AdaptedApp, apply: Callable[[Any], None],
                     clock: Callable[[], float] = monotonic,
                     prepare: Callable[[Any], Awaitable[None] | None] | None = None) -> None:
    """An agent's loop: `apply` each event of the stream (synchronous, so no commit
    starts while it runs), waiting while a commit takes its batch (`force_commit`).
    It iterates the stream itself, not `stream.events()` (one async generator less
    per record); the stream's current event is the record's.

    A Faust agent gives the event loop back only when its stream's queue is empty,
    and a fetch fills it with hundreds of records: the loop stalled for up to 0.2 s
    at a time, and each of a commit's five broker round trips, and the commit timer
    itself, waited behind such stalls (a commit took 0.15-0.5 s, most of the history
    latency above the commit interval). Here the agent gives the loop a turn after
    every `AGENT_TURN_SECONDS` of records, and after every record while a commit is
    in flight (its records are readable only after the next commit anyway), so that
    each of the commit's round trips goes on as soon as its answer arrives.
    Proof: tests/runtime/test_faust_adaptations.py; service_bench.py part 4 (history latency).
    `prepare(event)`, if given, is awaited before the record is applied when it
    returns an awaitable (the worker looks up a tenant's topics so)."""
    boundary = app.record_boundary
    turn_ends = clock() + AGENT_TURN_SECONDS
    async for _value in stream:
        event = stream.current_event
        if prepare is not None:
            waiting = prepare(event)
            if waiting is not None:
                await waiting
        if boundary.locked():
            async with boundary:
                apply(event)
        else:
            apply(event)
        if app.commit_in_flight or clock() >= turn_ends:
            await asyncio.sleep(0)
            turn_ends = clock() + AGENT_TURN_SECONDS


async def _beginning_one_if_between(producer: Any, transaction: str,
                                    operation: Callable[[], Awaitable[Any]]) -> Any:
    """Run a send or commit of `transaction`; when its producer is between transactions
    (aiokafka raises before sending anything), begin one and run it again."""
    try:
        return await operation()
    except IllegalOperation:  # "... not in transaction" / "Not in the middle of a transaction"
        log.warning("producer %s was between transactions: beginning one", transaction)
        await producer.maybe_begin_transaction(transaction)
        return await operation()
