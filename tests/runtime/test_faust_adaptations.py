"""The Faust adaptations that can be shown without a broker."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiokafka.consumer.subscription_state import SubscriptionState
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import TopicPartition
from faust import streams as faust_streams
from faust.events import Event
from faust.tables.recovery import Recovery
from faust.transport import consumer as faust_consumer
from faust.transport.consumer import TransactionManager
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, Message
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.config import Settings
from processors.metrics import Metrics
from processors.runtime import faust_adaptations
from processors.runtime.app import PARTITION_FETCH_BYTES, create_app, faust_app
from processors.runtime.faust_adaptations import (
    AGENT_TURN_SECONDS,
    FETCH_MAX_WAIT_MS,
    LIVELOCK_CHECK_SECONDS,
    AdaptedApp,
    BatchedRecovery,
    CachedKeyPartitioner,
    CommitProducer,
    LeanMonitor,
    QuickStopRocksDBStore,
    QuickStopTable,
    RawRecords,
    UncheckedVersion,
    UnthreadedProducerBuffer,
    WholeRecordConsumer,
    apply_each,
    check_versions,
    transactional_id,
)


def test_resume_while_active_keeps_queued_records_and_after_suspension_clears() -> None:
    app = faust_app(Settings.from_env({}))
    # A queue managed like the agents' stream queues and the changelog queue.
    queue = app.FlowControlQueue(maxsize=10, clear_on_resume=True)
    app.flow_control.resume()  # the app starts suspended
    queue.put_nowait("record fetched after the input partitions resumed")
    app.flow_control.resume()  # what Faust does again when table recovery completes
    assert queue.qsize() == 1 and app.flow_control.is_active()
    app.flow_control.suspend()  # a rebalance
    app.flow_control.resume()
    assert queue.qsize() == 0  # what was queued before the suspension is discarded


def _event_of_generation(generation: int) -> Any:
    return SimpleNamespace(message=SimpleNamespace(generation_id=generation, acked=False))


def test_a_record_of_an_old_generation_never_enters_a_stream_queue() -> None:
    """Faust would skip it in the stream and ack it: its offset would commit with the
    record never processed. Dropped here, unacked, it is fetched again after the seek
    to the committed offset that every assignment makes."""
    app = faust_app(Settings.from_env({}))
    queue = app.FlowControlQueue(maxsize=4, clear_on_resume=True)
    app.flow_control.resume()
    app.consumer_generation_id = 3
    fetched_before, fetched_after = _event_of_generation(2), _event_of_generation(3)

    async def hand_over() -> None:
        queue.put_nowait_enhanced(fetched_before, on_pressure_high=lambda: None,
                                  on_pressure_drop=lambda: None)  # Faust's put with room
        await queue.put(fetched_before)  # the put that waited for room or for flow
        queue.force_put_nowait(fetched_after)
        await queue.put(fetched_after)

    asyncio.run(hand_over())
    assert [queue.get_nowait(), queue.get_nowait()] == [fetched_after, fetched_after]
    assert queue.empty() and not fetched_before.message.acked
    queue.put_nowait("a value without a message (a channel of plain values)")
    assert queue.qsize() == 1


def test_faust_s_pure_python_stream_acks_a_record_it_skips(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Why a commit caps every input and history offset at what processed records
    reach (WorkerCommitBatch.offsets_to_commit): without faust-streaming's compiled
    iterator, a record taken from the queue while flow is suspended (a rebalance, a
    stop) is acked, never handed to the agent."""
    monkeypatch.setattr(faust_streams, "_CStreamIterator", None)
    app = faust_app(Settings.from_env({}))
    acked: list[int] = []

    class RecordedEvent(Event):  # type: ignore[misc]
        def ack(self) -> bool:
            acked.append(self.message.offset)
            return True

    def event(offset: int) -> RecordedEvent:
        return RecordedEvent(app, b"k", b"v", [], Message(
            "events", 1, offset, 0.0, 0, [], b"k", b"v", None, generation_id=1))

    async def rebalance_while_the_agent_works() -> list[int]:
        app.consumer_generation_id = 1
        app.flow_control.resume()
        stream = app.channel().stream()
        handed: list[int] = []

        async def agent() -> None:
            async for _value in stream:
                handed.append(stream.current_event.message.offset)
                app.flow_control.suspend()  # a rebalance begins
                await asyncio.sleep(0)

        task = asyncio.ensure_future(agent())
        await asyncio.sleep(0)  # the agent waits on the stream's channel
        await stream.channel.put(event(7))
        await stream.channel.put(event(8))
        for _turn in range(10):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return handed

    assert asyncio.run(rebalance_while_the_agent_works()) == [7]
    assert acked == [7, 8]  # 8 acked, never processed


def test_the_adapted_classes_are_the_ones_faust_instantiates() -> None:
    app = faust_app(Settings.from_env({}))
    assert isinstance(app, AdaptedApp)
    assert isinstance(app.consumer, WholeRecordConsumer)
    assert isinstance(app.producer, CommitProducer)
    assert app.consumer.transactions.producer is app.producer
    assert isinstance(app.monitor, LeanMonitor)
    assert isinstance(app.producer.partitioner, CachedKeyPartitioner)
    assert isinstance(app.producer.buffer, UnthreadedProducerBuffer)
    assert isinstance(app.tables.recovery, BatchedRecovery)


def test_a_fetch_waits_briefly_for_records_of_the_partitions_it_started_with() -> None:
    """A fetch takes the active partitions as they were when it started: when table
    recovery ended, the streams' records waited for a fetch of the paused changelogs
    to time out (Faust's 1 s)."""
    async def scenario() -> None:
        consumer = await _consumer()
        changelog, stream = TP("state-changelog", 0), TP("events", 0)

        class Waiting(_Fetcher):  # aiokafka's: waits out the timeout for the ones asked
            async def fetched_records(self, partitions: Any, timeout: float = 0,
                                      max_records: int | None = None,
                                      ) -> dict[TP, list[int]]:
                found = await super().fetched_records(partitions, timeout, max_records)
                if not found:
                    await asyncio.sleep(timeout)
                return found
        fetcher = Waiting({stream: [7]}, on_wait=lambda: None)  # the streams just resumed
        client: Any = SimpleNamespace(_closed=False, _fetcher=fetcher)
        consumer.app.in_recovery = True
        clock = asyncio.get_running_loop().time()
        assert await consumer._thread._fetch_records(client, {changelog}, timeout=1.0) == {}
        assert asyncio.get_running_loop().time() - clock < 0.5

    asyncio.run(scenario())


def test_a_rocksdb_table_stops_without_collecting_garbage(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Faust collected garbage over the whole heap for each table at a stop, before
    the worker left the group."""
    app = faust_app(Settings.from_env({"AGUI_STORE": "rocksdb://",
                                       "AGUI_DATA_DIR": str(tmp_path)}))
    table = QuickStopTable(app, name="state", partitions=1, key_type=bytes,
                           value_type=bytes)
    store = table._new_store()
    assert isinstance(store, QuickStopRocksDBStore)
    collected: list[int] = []
    monkeypatch.setattr(gc, "collect", lambda *args: collected.append(1) or 0)
    asyncio.run(store.stop())
    assert not collected and not store._dbs


def test_the_broker_holds_an_empty_fetch_briefly() -> None:
    """Faust's 1.5 s: after table recovery the streams' first fetch waited for the
    changelogs' empty one to come back, every partition idle meanwhile."""
    async def scenario() -> None:
        consumer = await _consumer()
        client = consumer._thread._create_worker_consumer(consumer.transport)
        assert client._fetch_max_wait_ms == FETCH_MAX_WAIT_MS <= 100
        await client.stop()  # never started: closes nothing but its client object

    asyncio.run(scenario())


def test_a_fetch_brings_a_few_hundred_records_per_partition() -> None:
    """aiokafka hands out a fetch's records one partition after another: with Faust's
    1 MiB per partition, each partition waited for the others' whole megabyte (a record
    larger than this still comes whole: the poison test's 150 KB delta)."""
    async def scenario() -> None:
        consumer = await _consumer()
        client = consumer._thread._create_worker_consumer(consumer.transport)
        assert client._max_partition_fetch_bytes == PARTITION_FETCH_BYTES <= 64 * 1024
        await client.stop()

    asyncio.run(scenario())


def test_a_leave_is_learnt_within_a_second() -> None:
    """The staying worker learns of a leave at its next heartbeat (it was every 3 s)."""
    app = faust_app(Settings.from_env({}))
    assert app.conf.broker_heartbeat_interval == 1.0


def test_a_raw_topic_hands_its_records_bytes_to_the_stream_as_they_are() -> None:
    app = faust_app(Settings.from_env({}))
    topic = app.raw_topic("events")
    assert isinstance(topic.schema, RawRecords)
    message = SimpleNamespace(key=b"\xffkey", value=b'{"not": json', headers=[("h", b"1")])
    event = asyncio.run(topic.decode(message))
    assert isinstance(event, app.conf.Event)
    assert (event.key, event.value, event.headers, event.message) == (
        b"\xffkey", b'{"not": json', {"h": b"1"}, message)
    empty = asyncio.run(topic.decode(SimpleNamespace(key=None, value=None, headers=[])))
    assert (empty.key, empty.value) == (None, None)


def test_the_unthreaded_producer_buffer_measures_its_queue() -> None:
    buffer = faust_app(Settings.from_env({})).producer.buffer
    assert buffer.size == 0
    buffer.pending.put_nowait(object())
    assert buffer.size == 1


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.binary(max_size=64), min_size=1, max_size=20),
       partitions=st.integers(1, 64))
def test_the_cached_partitioner_partitions_as_kafka_s_default(
    keys: list[bytes], partitions: int
) -> None:
    cached, default = CachedKeyPartitioner(), DefaultPartitioner()
    all_partitions = list(range(partitions))
    for key in [*keys, *keys]:  # the second time from its cache
        assert cached(key, all_partitions, all_partitions) == default(
            key, all_partitions, all_partitions)
    assert cached(None, all_partitions, [partitions - 1]) == partitions - 1


def test_the_transactional_id_is_faust_s_own(monkeypatch: pytest.MonkeyPatch) -> None:
    app = faust_app(Settings.from_env({"AGUI_APP_ID": "agui"}))
    monkeypatch.setattr(app.assignor, "group_for_topic", lambda topic: 2)
    monkeypatch.setattr(TransactionManager, "transactional_id_format",
                        "{group_id}/{tpg.topic}/{tpg.group}/{tpg.partition}")
    assert transactional_id(app, "agui.events", 3) == "agui/agui.events/2/3"


@pytest.mark.parametrize("distribution", ["faust-streaming", "mode-streaming", "aiokafka"])
def test_a_worker_refuses_unchecked_faust_mode_and_aiokafka_versions(
    monkeypatch: pytest.MonkeyPatch, distribution: str,
) -> None:
    check_versions()  # the pinned ones pass
    installed = faust_adaptations.installed_version
    monkeypatch.setattr(faust_adaptations, "installed_version", lambda name: (
        "9.9.9" if name == distribution else installed(name)))
    with pytest.raises(UncheckedVersion, match=rf"installed {distribution} 9\.9\.9;"):
        check_versions()


async def _consumer() -> WholeRecordConsumer:
    app = faust_app(Settings.from_env({}))
    consumer = app.consumer
    assert isinstance(consumer, WholeRecordConsumer)
    consumer.flow_active = True
    return consumer


def test_an_assigned_stream_partition_is_fetched_only_after_its_seek(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Faust resumes a kept partition before seeking it, and it was fetched from where
    the consumer stood before the rebalance: later records of a run were processed
    before earlier ones. Here it stays paused until sought; changelogs resume at once."""
    async def scenario() -> None:
        consumer = await _consumer()
        app = consumer.app
        app.Table("state", partitions=2)
        stream, changelog = TP("events", 0), TP(f"{app.conf.id}-state-changelog", 0)
        assert consumer._is_changelog_tp(changelog)

        async def faust_assignment(self: Any, assigned: set[TP], generation_id: int) -> None:
            self.pause_partitions(assigned)  # what Faust's assignment callbacks do
        monkeypatch.setattr(faust_consumer.Consumer, "on_partitions_assigned",
                            faust_assignment)
        reassigned_meanwhile = False

        async def seek_to_committed() -> dict[TP, int]:
            if reassigned_meanwhile:
                app.consumer_generation_id += 1
            return {stream: 5}
        monkeypatch.setattr(consumer, "seek_to_committed", seek_to_committed)

        await consumer.on_partitions_assigned({stream, changelog}, 1)
        consumer.resume_partitions({stream, changelog})  # as recovery does, then it seeks
        assert consumer._get_active_partitions() == {changelog}
        await consumer.perform_seek()
        assert consumer._get_active_partitions() == {stream, changelog}

        await consumer.on_partitions_assigned({stream}, 2)
        consumer.resume_partitions({stream})
        reassigned_meanwhile = True  # a seek of an older assignment releases nothing
        await consumer.perform_seek()
        assert consumer._get_active_partitions() == {changelog}  # (Faust's own set)
        reassigned_meanwhile = False
        await consumer.perform_seek()
        assert stream in consumer._get_active_partitions()
        consumer.pause_partitions({stream})
        consumer.resume_partitions({stream})  # sought: resumes at once
        assert stream in consumer._get_active_partitions()

    asyncio.run(scenario())


def test_a_changelog_partition_faust_pauses_is_paused_in_aiokafka_too() -> None:
    """Faust paused a partition in its own set only: aiokafka went on fetching the
    paused changelogs, their records sat in its buffer, and it sent the broker no
    fetch for 100 ms each time one came (idle turns at 128 partitions waited 220 ms).
    Here Faust's pauses and resumes of changelog partitions reach aiokafka, on its
    thread's loop, for the assignment they were meant for only."""
    async def scenario() -> None:
        consumer = await _consumer()
        app = consumer.app
        app.Table("state", partitions=2)
        stream, changelog = TP("events", 0), TP(f"{app.conf.id}-state-changelog", 0)
        client_state = SubscriptionState()
        client_state.subscribe({stream.topic, changelog.topic})
        client_state.assign_from_subscribed({TopicPartition(*stream),
                                             TopicPartition(*changelog)})
        thread: Any = consumer._thread
        thread._consumer = SimpleNamespace(_subscription=client_state)
        thread.thread_loop = asyncio.get_running_loop()  # the consumer thread's loop

        consumer.pause_partitions({stream, changelog})
        assert not client_state.paused_partitions()  # not before the thread's loop runs it
        await asyncio.sleep(0)
        assert client_state.paused_partitions() == {changelog}  # streams: Faust's own
        consumer.resume_partitions({stream, changelog})
        await asyncio.sleep(0)
        assert not client_state.paused_partitions()

        consumer.pause_partitions({changelog})
        client_state.assign_from_subscribed({TopicPartition(*changelog)})  # a rebalance
        await asyncio.sleep(0)
        assert not client_state.paused_partitions()  # meant for the older assignment

        stopped = asyncio.new_event_loop()
        stopped.close()
        thread.thread_loop = stopped  # the consumer thread has stopped: nothing to pause
        consumer.pause_partitions({changelog})

    asyncio.run(scenario())


class _Fetcher:
    """aiokafka's fetcher as the consumer thread uses it: an empty partition set means
    every partition. While it waits, the app's loop pauses partitions."""

    def __init__(self, buffered: dict[TP, list[int]], on_wait: Any) -> None:
        self._closed = False
        self._subscriptions = SimpleNamespace(fetch_context=contextlib.nullcontext)
        self.buffered = buffered
        self.on_wait = on_wait

    async def fetched_records(self, partitions: Any, timeout: float = 0,
                              max_records: int | None = None) -> dict[TP, list[int]]:
        self.on_wait()
        return {tp: offsets for tp, offsets in self.buffered.items()
                if not partitions or tp in partitions}


def test_a_fetch_takes_only_the_partitions_active_when_it_starts() -> None:
    """Faust handed aiokafka the live set of active partitions; emptied while the
    fetch waited, it meant every partition, and the records of paused partitions
    came back, were skipped as inactive and were never fetched again."""
    async def scenario() -> None:
        consumer = await _consumer()
        stream, changelog = TP("events", 0), TP("state-changelog", 0)
        active = {changelog}
        fetcher = _Fetcher({stream: [7, 8], changelog: [3]}, on_wait=active.clear)
        client: Any = SimpleNamespace(_closed=False, _fetcher=fetcher)
        thread = consumer._thread
        assert await thread._fetch_records(client, active, timeout=1.0) == {changelog: [3]}
        fetcher.on_wait = lambda: None
        assert await thread._fetch_records(client, set(), timeout=1.0) == {}

    asyncio.run(scenario())


def test_a_fetch_takes_what_fits_above_the_pressure_mark_and_polls_while_one_waits(
) -> None:
    """Faust took every buffered record in one fetch, and its tail waited for room in
    the stream's queue record by record; and while a partition waited for its queue
    to drain, a fetch of the others waited out its whole timeout."""
    async def scenario() -> None:
        consumer = await _consumer()
        asked: list[tuple[float, int | None]] = []

        class Recording(_Fetcher):
            async def fetched_records(self, partitions: Any, timeout: float = 0,
                                      max_records: int | None = None,
                                      ) -> dict[TP, list[int]]:
                asked.append((timeout, max_records))
                return {}
        client: Any = SimpleNamespace(
            _closed=False, _fetcher=Recording({}, on_wait=lambda: None))
        thread, stream = consumer._thread, TP("events", 0)
        maxsize = consumer.app.conf.stream_buffer_maxsize  # 4096; pressure mark 3276
        headroom = maxsize - int(maxsize / 1.25)
        await thread._fetch_records(client, {stream}, timeout=1.0)
        await thread._fetch_records(client, {stream}, timeout=1.0, max_records=10)
        consumer._buffered_partitions.add(TP("events", 1))  # its queue is under pressure
        await thread._fetch_records(client, {stream}, timeout=1.0)
        consumer.app.in_recovery = True  # recovery's fetches are left as they are
        await thread._fetch_records(client, {stream}, timeout=1.0)
        assert asked == [(0.1, headroom), (0.1, 10), (0.05, headroom), (0.1, None)]

    asyncio.run(scenario())


def test_with_every_partition_waiting_for_its_queue_the_consumer_looks_again_soon(
) -> None:
    """Faust slept a whole second when no partition was left to fetch."""
    async def scenario() -> None:
        consumer = await _consumer()
        stream = TP("events", 0)
        consumer._buffered_partitions.add(stream)  # and none active
        clock = asyncio.get_running_loop().time()
        assert await consumer._wait_next_records(1.0) == ({}, set())
        assert asyncio.get_running_loop().time() - clock < 0.5

    asyncio.run(scenario())


def _commit_starts(monkeypatch: pytest.MonkeyPatch, interval: float, commits: int,
                   commit_takes: Callable[[int], float], *, backlogged: bool = False,
                   wanted: bool = False) -> list[float]:
    """When the commit handler starts its first `commits` commits, on a fake clock: a
    commit takes `commit_takes(n)` seconds (n counts from 1). `wanted`: a commit is
    wanted early from the start and again during every commit (each one's records
    ended a run); otherwise none is, and the handler's wait is the timed one."""
    clock = [0.0]
    monkeypatch.setattr("processors.runtime.faust_adaptations.monotonic", lambda: clock[0])
    starts: list[float] = []

    class Enough(Exception):
        pass

    async def scenario() -> None:
        consumer = await _consumer()
        consumer.commit_interval = interval
        consumer.app.backlogged = lambda: backlogged

        async def sleep(seconds: float) -> None:
            clock[0] += max(seconds, 0.0)

        async def until_commit(timed: float, earliest: float) -> None:
            clock[0] += max(timed, 0.0)  # nothing wanted early

        async def commit(*args: Any, **kwargs: Any) -> bool:
            starts.append(clock[0])
            clock[0] += commit_takes(len(starts))
            if wanted:
                consumer.commit_soon()
            if len(starts) == commits:
                raise Enough
            return True

        monkeypatch.setattr(consumer, "sleep", sleep)
        if wanted:
            consumer.commit_soon()
        else:
            monkeypatch.setattr(consumer, "_until_commit", until_commit)
        monkeypatch.setattr(consumer, "commit", commit)
        with pytest.raises(Enough):
            await WholeRecordConsumer._commit_handler.fun(consumer)

    asyncio.run(scenario())
    return starts


def test_commits_start_every_commit_interval_however_long_each_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Faust slept the interval after each commit: commits started every interval plus
    the commit's duration, and a record's history waited that much longer."""
    starts = _commit_starts(monkeypatch, 2.0, 5,
                            lambda n: 0.5 if n < 3 else 3.0)  # the third overruns
    assert starts == [2.0, 4.0, 6.0, 9.0, 12.0]


def test_a_backlog_stretches_the_commit_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """Draining a backlog, commits every interval cost a third of the rate: a timed
    commit then waits up to five intervals."""
    starts = _commit_starts(monkeypatch, 1.0, 3, lambda n: 0.0, backlogged=True)
    assert starts == [4.0, 9.0, 14.0]  # every five intervals


def test_a_commit_wanted_soon_starts_once_a_quarter_interval_has_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record that produced history wants the next commit early: it starts as soon
    as a quarter interval has passed since the last one began, not at the interval,
    backlog or not (a wanted commit is never stretched)."""
    assert _commit_starts(monkeypatch, 2.0, 3, lambda n: 0.1, wanted=True,
                          backlogged=True) == [0.0, 0.5, 1.0]


def test_a_timed_commit_tells_how_long_each_phase_took(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record's outputs are readable after its commit; each phase is timed, and the
    agents know while it sends and commits (`apply_each`)."""
    clock = [0.0]
    monkeypatch.setattr("processors.runtime.faust_adaptations.monotonic", lambda: clock[0])
    observed: list[tuple[str, float]] = []
    steps: list[tuple[str, bool]] = []  # (step, a commit in flight)

    async def scenario() -> None:
        consumer = await _consumer()
        app = consumer.app

        class Batch:
            async def send(self) -> None:
                steps.append(("send", app.commit_in_flight))
                clock[0] += 0.25

            async def apply(self) -> None:
                steps.append(("apply", app.commit_in_flight))
                clock[0] += 8.0  # after the commit: not part of any phase

            def offsets_to_commit(self, acked: Any, committed: Any) -> Any:
                return acked

        def take(everything: bool) -> Batch:
            clock[0] += 0.125
            return Batch()

        async def commit_offsets(offsets: Any, start_new_transaction: bool) -> bool:
            steps.append(("offsets", app.commit_in_flight))
            clock[0] += 0.5
            return True

        app.take_commit = take
        app.observe_commit = lambda phase, seconds: observed.append((phase, seconds))
        monkeypatch.setattr(consumer, "_filter_tps_with_pending_acks", lambda topics: [])
        monkeypatch.setattr(consumer, "_filter_committable_offsets",
                            lambda tps: {TP("events", 0): 7})
        monkeypatch.setattr(consumer, "_commit_offsets", commit_offsets)
        assert await consumer.force_commit() is True

    asyncio.run(scenario())
    assert steps == [("send", True), ("offsets", True), ("apply", False)]
    assert observed == [("take", 0.125), ("send", 0.25), ("commit", 0.5)]


class _BusyStream:
    """A stream whose queue never runs dry: its records come without suspending."""

    def __init__(self, records: int) -> None:
        self.records = records
        self.current_event: int | None = None

    def __aiter__(self) -> _BusyStream:
        return self

    async def __anext__(self) -> int:
        if self.current_event == self.records - 1:
            raise StopAsyncIteration
        self.current_event = 0 if self.current_event is None else self.current_event + 1
        return self.current_event


def _agent_turns(committing: bool) -> list[int]:
    """How many records an agent had applied each time another task got a turn, with
    twenty records of 0.6 ms each in its stream's queue."""
    async def scenario() -> list[int]:
        now = [0.0]
        applied: list[int] = []
        looked_in: list[int] = []  # records applied when another task got to run

        def apply(event: int) -> None:
            applied.append(event)
            now[0] += 0.0006  # each record takes 0.6 ms

        async def other_task() -> None:
            while len(applied) < 20:
                looked_in.append(len(applied))
                await asyncio.sleep(0)

        app = SimpleNamespace(record_boundary=asyncio.Lock(), commit_in_flight=committing)
        other = asyncio.ensure_future(other_task())
        await asyncio.sleep(0)  # the other task starts
        await apply_each(_BusyStream(20), cast(Any, app), apply, clock=lambda: now[0])
        await other
        assert applied == list(range(20))
        return looked_in

    return asyncio.run(scenario())


def test_an_agent_lets_the_loop_run_after_each_turn_of_records() -> None:
    # AGENT_TURN_SECONDS (2 ms) is four records; Faust's loop gave the other task no
    # turn before the stream ran dry ([0]).
    assert AGENT_TURN_SECONDS == 0.002
    assert _agent_turns(committing=False) == [0, 4, 8, 12, 16]


def test_while_a_commit_is_in_flight_an_agent_lets_the_loop_run_after_each_record() -> None:
    """Each of the commit's round trips goes on as soon as its answer arrives."""
    assert _agent_turns(committing=True) == list(range(20))


class _TransactionProducer:
    """An aiokafka producer as far as learning partitions goes."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def partitions_for(self, topic: str) -> set[int]:
        self.asked.append(topic)
        return {0, 1}


def test_a_new_transactional_producer_learns_the_partitions_of_the_commit_topics(
        monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[_TransactionProducer] = []

    async def faust_begin(self: Any, transactional_id: str) -> None:
        if transactional_id not in self._transaction_producers:  # Faust starts one
            started.append(_TransactionProducer())
            self._transaction_producers[transactional_id] = started[-1]

    monkeypatch.setattr(faust_aiokafka.Producer, "begin_transaction", faust_begin)

    async def scenario() -> None:
        producer = faust_app(Settings.from_env({})).producer
        producer._transaction_producers = {}  # Faust's default is one dict for every app
        producer.commit_topics = ("history", "deadletters", "app-run-state-changelog")
        await producer.begin_transaction("app-0-0")
        await producer.begin_transaction("app-0-0")  # the same producer's next one
        await asyncio.sleep(0)  # the assignment goes on meanwhile
        await asyncio.sleep(0)
        assert [p.asked for p in started] == [
            ["history", "deadletters", "app-run-state-changelog"]]

    asyncio.run(scenario())


def test_a_delivery_that_completes_at_once_wins_without_a_task() -> None:
    async def scenario() -> None:
        consumer = await _consumer()
        tasks_before = len(asyncio.all_tasks())
        suspended = asyncio.Event()

        async def delivered() -> str:
            return "delivered"

        flow = suspended.wait()
        results = await consumer.wait_first(delivered(), flow)
        assert results.results == ["delivered"] and not results.stopped
        assert flow.cr_frame is None  # closed, never started
        assert len(asyncio.all_tasks()) == tasks_before

    asyncio.run(scenario())


def test_a_delivery_that_suspends_goes_on_against_the_other_conditions() -> None:
    async def scenario() -> None:
        consumer = await _consumer()
        room, suspended = asyncio.Event(), asyncio.Event()
        steps: list[str] = []

        async def delivery() -> str:
            steps.append("started")
            await room.wait()  # the stream's queue is full
            steps.append("put")
            return "delivered"

        waiting = asyncio.ensure_future(consumer.wait_first(delivery(), suspended.wait()))
        await asyncio.sleep(0.01)
        assert steps == ["started"] and not waiting.done()
        room.set()
        results = await waiting
        assert results.results == ["delivered"] and steps == ["started", "put"]

        # A delivery still blocked when flow is suspended loses, and is cancelled.
        room.clear()
        cancelled: list[bool] = []

        async def blocked() -> None:
            try:
                await room.wait()
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        waiting = asyncio.ensure_future(consumer.wait_first(blocked(), suspended.wait()))
        await asyncio.sleep(0.01)
        suspended.set()
        results = await waiting
        assert results.results == [True]
        await asyncio.sleep(0)
        assert cancelled == [True]

    asyncio.run(scenario())


def test_a_delivery_error_propagates_from_either_path() -> None:
    async def scenario() -> None:
        consumer = await _consumer()

        async def at_once() -> Any:
            raise ValueError("at once")

        async def later() -> Any:
            await asyncio.sleep(0)
            raise ValueError("later")

        for failing in (at_once, later):
            flow = asyncio.Event()
            with pytest.raises(ValueError, match=failing.__name__.replace("_", " ")):
                await consumer.wait_first(failing(), flow.wait())

    asyncio.run(scenario())


class _ChangelogTable:
    """What recovery uses of a table: its buffer sizes, the event hook and the batch
    apply (here recorded)."""

    def __init__(self, recovery_buffer_size: int = 1000, standby_buffer_size: int = 1000,
                 ) -> None:
        self.recovery_buffer_size = recovery_buffer_size
        self.standby_buffer_size = standby_buffer_size
        self.hooked: list[int] = []
        self.applied: list[list[int]] = []

    async def on_changelog_event(self, event: Any) -> None:
        self.hooked.append(event.message.offset)

    def apply_changelog_batch(self, events: list[Any]) -> None:
        if events:
            self.applied.append([event.message.offset for event in events])


def _changelog_event(tp: TP, offset: int) -> Any:
    return SimpleNamespace(message=SimpleNamespace(tp=tp, offset=offset))


async def _recovering(active: _ChangelogTable, standby: _ChangelogTable,
                      ) -> tuple[Any, TP, TP]:
    """The app's recovery in active recovery of `active`'s partition (to offset 9), with
    `standby`'s partition a standby read up to offset 6 (its end: 12)."""
    app = faust_app(Settings.from_env({}))
    app.flow_control.resume()
    recovery = app.tables.recovery
    active_tp, standby_tp = TP("state-changelog", 0), TP("text-changelog", 1)
    recovery.tp_to_table.update({active_tp: active, standby_tp: standby})
    recovery.active_tps.add(active_tp)
    recovery.standby_tps.add(standby_tp)
    recovery.active_offsets[active_tp] = -1
    recovery.active_highwaters[active_tp] = 9
    recovery.standby_offsets[standby_tp] = 6
    recovery.standby_highwaters[standby_tp] = 12
    recovery._set_recovery_started()
    return recovery, active_tp, standby_tp


async def _stopped(slurp: asyncio.Future[None]) -> None:
    """Cancel the recovery loop (a cancellation can be lost in `wait_for` when its
    record arrives at the same time: Python 3.11's wait_for, in Faust's loop too)."""
    while not slurp.done():
        slurp.cancel()
        await asyncio.wait([slurp], timeout=0.1)


def test_recovery_applies_all_queued_changelog_records_in_one_loop_turn() -> None:
    """Faust took one changelog record per `wait_for(queue.get())`, a task and several
    loop turns each, while the agent takes a record every turn: the standbys fell
    behind. Here every queued record is applied before the loop runs anything else,
    with Faust's bookkeeping: offsets per partition, records at or below a
    partition's offset skipped, each table's buffer applied at its size, the rest
    applied when the actives reach their ends and recovery's end signalled."""
    active = _ChangelogTable(recovery_buffer_size=4)
    standby = _ChangelogTable(standby_buffer_size=3)

    async def scenario() -> list[int]:
        recovery, active_tp, standby_tp = await _recovering(active, standby)
        queue = recovery.tables.changelog_queue
        slurp = asyncio.ensure_future(type(recovery)._slurp_changelogs.fun(recovery))
        ended = asyncio.ensure_future(recovery.signal_recovery_end.wait())
        await asyncio.sleep(0)  # the loop now waits for a record
        for offset in range(10):
            queue.put_nowait(_changelog_event(active_tp, offset))
            if offset >= 5:
                queue.put_nowait(_changelog_event(standby_tp, offset))
        queue.put_nowait(_changelog_event(TP("gone-changelog", 0), 3))  # revoked meanwhile
        hooked_per_turn = []
        for _turn in range(6):  # what another task (the agent) sees, turn by turn
            await asyncio.sleep(0)
            hooked_per_turn.append(len(active.hooked) + len(standby.hooked))
        assert ended.done() and not recovery.in_recovery
        assert recovery.active_offsets[active_tp] == 9
        assert recovery.standby_offsets[standby_tp] == 9
        assert not recovery.tables.standbys_ready  # 3 records short of the standby's end
        assert queue.empty()
        await _stopped(slurp)
        return hooked_per_turn

    hooked_per_turn = asyncio.run(scenario())
    # None, then all at once: no other task ran while they were applied.
    assert set(hooked_per_turn) == {0, 13} and hooked_per_turn[-1] == 13
    assert active.hooked == list(range(10)) and standby.hooked == [7, 8, 9]
    assert active.applied == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # the last at the end
    assert standby.applied == [[7, 8, 9]]


def test_faust_s_recovery_takes_a_changelog_record_every_few_loop_turns() -> None:
    """What the batched recovery replaces (if a Faust upgrade batches by itself, this
    adaptation can go)."""
    active, standby = _ChangelogTable(), _ChangelogTable()

    async def scenario() -> int:
        recovery, active_tp, _standby_tp = await _recovering(active, standby)
        queue = recovery.tables.changelog_queue
        slurp = asyncio.ensure_future(Recovery._slurp_changelogs.fun(recovery))
        await asyncio.sleep(0)
        for offset in range(10):
            queue.put_nowait(_changelog_event(active_tp, offset))
        for _turn in range(6):
            await asyncio.sleep(0)
        hooked = len(active.hooked)
        await _stopped(slurp)
        return hooked

    assert asyncio.run(scenario()) < 4


def test_each_rocksdb_table_uses_the_memory_it_is_given(tmp_path: Any) -> None:
    """Faust's defaults: a 2 GiB block cache and three 64 MiB write buffers per table
    and partition, which a worker's memory followed until each flush."""
    configured = Settings.from_env({"AGUI_STORE": "rocksdb://",
                                    "AGUI_DATA_DIR": str(tmp_path),
                                    "AGUI_ROCKSDB_MEMORY_MIB": "16"})
    app = create_app(configured, Metrics())
    for table in app.tables.values():
        store = table._new_store()
        options = store.rocksdb_options
        assert (options.block_cache_size, options.write_buffer_size,
                options.max_write_buffer_number) == (8 * 2**20, 4 * 2**20, 2)
        store._open_for_partition(0)  # RocksDB takes them
        asyncio.run(store.stop())


def test_faust_s_livelock_detector_keeps_its_own_pace_whatever_the_commit_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Faust walks every assigned partition every 2.5 commit intervals: at 100 ms
    commits four times a second, 4 % of a worker holding 128 input partitions."""
    waits: list[float] = []

    class Enough(Exception):
        pass

    async def scenario() -> None:
        consumer = await _consumer()
        consumer.commit_interval = 0.1

        async def sleep(seconds: float) -> None:
            waits.append(seconds)
            raise Enough

        monkeypatch.setattr(consumer, "sleep", sleep)
        with pytest.raises(Enough):
            await WholeRecordConsumer._commit_livelock_detector.fun(consumer)

    asyncio.run(scenario())
    assert waits == [LIVELOCK_CHECK_SECONDS]
