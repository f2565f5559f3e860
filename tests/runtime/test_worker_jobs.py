"""The worker's jobs without a broker: a real record processor and thread view, a
stand-in for the few things of the Faust app they read."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any, cast

import orjson
from faust.types import TP

from processors.config import Settings
from processors.metrics import Metrics
from processors.processing.outputs import OutputBuilder, incoming_record
from processors.processing.record_processor import RecordProcessor, StoredTables
from processors.processing.routing import TenantRouting
from processors.runtime import jobs as jobs_module
from processors.runtime.commit import WriteBehindTable
from processors.runtime.faust_adaptations import AdaptedApp, CommitProducer
from processors.runtime.health import Liveness
from processors.runtime.jobs import WorkerJobs
from processors.view.thread_view import ThreadView
from tests.engine_helpers import run_finished, run_started, t_content, t_end, t_start
from topics.declarations import STATE_TABLE, TEXT_TABLE, VIEW_TABLE, idle_ticks_topic
from topics.tenant_topics import Template

SETTINGS = Settings.from_env({"AGUI_INPUT_TOPICS": "events", "AGUI_PARTITIONS": "4"})


class Event:
    """A consumed record as the agent sees it, remembering its ack."""

    def __init__(self, topic: str, partition: int, offset: int, value: bytes,
                 key: bytes = b"run-1") -> None:
        self.message = SimpleNamespace(topic=topic, partition=partition, offset=offset,
                                       timestamp=1_700_000_000.0, key=key, value=value,
                                       headers=[("tenant", b"acme")])
        self.acked = False

    def ack(self) -> None:
        self.acked = True


class Page:
    """What a Faust view gives a page handler to answer with."""

    def json(self, body: Any, status: int = 200) -> tuple[int, Any]:
        return status, body

    def bytes(self, body: bytes, content_type: str) -> tuple[str, bytes]:
        return content_type, body


def app_stand_in(**flags: Any) -> Any:
    assignment = {TP("events", 1), TP("events", 2), TP(idle_ticks_topic(SETTINGS.app_id), 1),
                  TP("agui-run-state-changelog", 1)}
    early_commits: list[None] = []
    return SimpleNamespace(
        consumer=SimpleNamespace(assignment=lambda: assignment, highwater=lambda tp: None),
        early_commits=early_commits, commit_soon=lambda: early_commits.append(None),
        tables=SimpleNamespace(changelog_topics={"agui-run-state-changelog"}),
        in_transaction=False, should_stop=False, rebalancing=False, in_recovery=False,
        consumer_generation_id=1, **flags)


def jobs_for(app: Any, metrics: Metrics | None = None, checkpoint_seconds: float = 0.0,
             routing: TenantRouting | None = None, producer: Any = None) -> WorkerJobs:
    metrics = metrics or Metrics()
    tables: dict[str, Any] = {STATE_TABLE: {}, TEXT_TABLE: {}, VIEW_TABLE: {}}
    builder = OutputBuilder(SETTINGS.history_topic, SETTINGS.deadletter_topic,
                            SETTINGS.max_record_bytes, metrics, routing)
    processor = RecordProcessor(builder, metrics,
                                StoredTables(tables[STATE_TABLE], tables[TEXT_TABLE]),
                                tenant_header="tenant", default_tenant="default",
                                idle_timeout=SETTINGS.idle_timeout_seconds,
                                checkpoint_seconds=checkpoint_seconds)
    view = ThreadView(tables[VIEW_TABLE], partitions=SETTINGS.partitions,
                      retention_seconds=SETTINGS.view_retention_seconds)
    return WorkerJobs(cast(AdaptedApp, app), SETTINGS, metrics, processor, view,
                      cast(CommitProducer, producer),
                      cast(dict[str, WriteBehindTable], tables), Liveness(60.0, 0.0))


def feed_run(jobs: WorkerJobs, partition: int, key: bytes) -> list[Event]:
    events = [Event("events", partition, offset, orjson.dumps(value), key) for offset, value
              in enumerate([run_started(), t_start("m"), t_content("m", "hi"), t_end("m"),
                            run_finished()])]
    for event in events:
        jobs.apply(event)
    return events


def test_apply_acks_each_record_and_keeps_what_it_produced_for_its_partition() -> None:
    jobs = jobs_for(app_stand_in())
    events = feed_run(jobs, 2, b"run-1")
    assert all(event.acked for event in events)
    assert list(jobs.unsent) == [2]
    kinds = [orjson.loads(out.value)["kind"] for out in jobs.unsent[2]]
    assert kinds == ["message", "run"]
    assert jobs.metrics.per_record.records() == len(events)


def test_a_record_that_ends_a_run_starts_the_next_commit_early() -> None:
    app = app_stand_in()
    jobs = jobs_for(app)
    events = [Event("events", 2, offset, orjson.dumps(value)) for offset, value
              in enumerate([run_started(), t_start("m"), t_content("m", "hi"), t_end("m")])]
    for event in events:
        jobs.apply(event)
    assert app.early_commits == []  # streaming: nobody waits for it yet
    jobs.apply(Event("events", 2, 4, orjson.dumps(run_finished())))
    assert app.early_commits == [None]  # its history: the next turn may be waiting


def test_a_run_ending_while_a_backlog_drains_does_not_start_a_commit_early() -> None:
    app = app_stand_in()
    app.consumer.highwater = lambda tp: 5_000  # 5,000 records behind on partition 2
    jobs = jobs_for(app)
    feed_run(jobs, 2, b"run-1")
    assert app.early_commits == []  # the timed commit, stretched, takes it


def test_a_tick_sweeps_its_partition_and_is_not_counted_as_a_record() -> None:
    jobs = jobs_for(app_stand_in())
    tick = Event(jobs.ticks, 1, 0, b"1700000000.0", key=b"")
    jobs.apply(tick)
    assert tick.acked
    assert jobs.metrics.per_record.records() == 0


def test_take_commit_batches_each_partition_once_and_empties_what_it_took() -> None:
    jobs = jobs_for(app_stand_in())
    feed_run(jobs, 2, b"run-1")
    feed_run(jobs, 1, b"run-2")
    batch = jobs.take_commit()
    assert [part.partition for part in batch.parts] == [1, 2]
    for part in batch.parts:
        assert part.transaction is None  # the stand-in app is not in a transaction
        assert len(part.outgoing) == 2 and part.changes
    assert jobs.unsent == {}
    assert jobs.take_commit().parts == []


def test_a_commit_takes_no_offset_past_a_record_its_state_does_not_cover() -> None:
    jobs = jobs_for(app_stand_in(), checkpoint_seconds=3600.0)
    feed_run(jobs, 2, b"finished")  # offsets 0..4: a whole run, stored with its outputs
    streaming = [Event("events", 2, offset, orjson.dumps(value), b"streaming")
                 for offset, value in enumerate([run_started(), t_start("m"),
                                                 t_content("m", "hi")], start=5)]
    for event in streaming:
        jobs.apply(event)
    feed_run(jobs, 1, b"other")  # partition 1: offsets 0..4, all covered
    faust_acked = {TP("events", 2): 8, TP("events", 1): 5}
    batch = jobs.take_commit()
    assert batch.offsets_to_commit(faust_acked, {}) == {TP("events", 2): 5,
                                                        TP("events", 1): 5}
    # Nothing acked since, nothing to write: the offsets stay.
    assert jobs.take_commit().offsets_to_commit({}, {TP("events", 2): 5,
                                                     TP("events", 1): 5}) == {}
    # The waiting key is stored (a stop): its partition's offset moves on although
    # nothing was acked since.
    batch = jobs.take_commit(everything=True)
    assert [part.partition for part in batch.parts] == [2]
    assert batch.offsets_to_commit({}, {TP("events", 2): 5, TP("events", 1): 5}) == {
        TP("events", 2): 8}


def test_a_commit_takes_no_offset_faust_acked_for_records_never_processed() -> None:
    """Faust acks the records a stream skips without handing them to the agent (taken
    from its queue while flow is suspended, in a rebalance or a stop): a commit takes
    only what processed records reach, and a partition with none keeps its offset."""
    jobs = jobs_for(app_stand_in())
    feed_run(jobs, 1, b"run-1")  # partition 1: offsets 0..4 processed
    skipped = {TP("events", 1): 12, TP("events", 2): 7}  # as Faust acked them
    assert jobs.take_commit().offsets_to_commit(skipped, {}) == {TP("events", 1): 5}
    assert jobs.take_commit().offsets_to_commit(skipped, {TP("events", 2): 3}) == {
        TP("events", 1): 5, TP("events", 2): 3}


def test_a_commit_takes_no_history_offset_past_the_last_record_the_view_applied() -> None:
    app = app_stand_in()
    history = TP(SETTINGS.history_topic, 1)
    app.consumer.assignment().add(history)
    jobs = jobs_for(app)
    jobs.view.apply(incoming_record(Event(history.topic, 1, 3, b"{}").message))
    assert jobs.take_commit().offsets_to_commit({history: 9}, {}) == {history: 4}
    jobs.view.forget()  # partitions moved, nothing applied since: the offset stays
    assert jobs.take_commit().offsets_to_commit({history: 9}, {history: 4}) == {history: 4}


def test_a_commit_takes_no_replay_start_of_a_partition_no_longer_assigned() -> None:
    app = app_stand_in()
    jobs = jobs_for(app)
    feed_run(jobs, 1, b"run-1")
    feed_run(jobs, 3, b"run-3")  # a partition this worker does not hold (any more)
    assert jobs.take_commit().offsets_to_commit({}, {}) == {TP("events", 1): 5}


def test_consumer_lag_counts_from_the_last_record_processed_not_the_commit() -> None:
    """A commit's offset may stay a checkpoint behind what was processed: the lag
    gauge would count that as lag (and the lag alert fire under normal load)."""
    app = app_stand_in()
    ends = {TP("events", 1): 10, TP("events", 2): 9}
    app.consumer.highwater = ends.get
    app.consumer._committed_offset = {TP("events", 1): 3, TP("events", 2): 0}
    jobs = jobs_for(app, checkpoint_seconds=3600.0)
    feed_run(jobs, 2, b"run-1")  # offsets 0..4 processed, none committed
    asyncio.run(jobs.measure_lag())
    lag = jobs.metrics.consumer_lag
    assert lag.labels("events", "2")._value.get() == 4
    assert lag.labels("events", "1")._value.get() == 7  # nothing processed: committed


def test_a_revocation_drops_what_was_not_committed() -> None:
    jobs = jobs_for(app_stand_in())
    feed_run(jobs, 2, b"run-1")
    asyncio.run(jobs.on_partitions_revoked(None, set()))
    assert jobs.unsent == {}
    assert jobs.take_commit().parts == []


def test_readiness_says_why_a_worker_is_not_ready() -> None:
    for flags, reason in [({}, "joining the consumer group"),
                          ({"rebalancing": True}, "rebalancing"),
                          ({"in_recovery": True}, "recovering tables"),
                          ({"should_stop": True}, "stopping")]:
        app = app_stand_in()
        app.__dict__.update(flags)
        jobs = jobs_for(app)
        if reason != "joining the consumer group":
            asyncio.run(jobs.on_partitions_assigned(None, set()))
        status, body = asyncio.run(jobs.readiness_page(Page(), None))
        assert (status, body["reason"]) == (503, reason)
    jobs = jobs_for(app_stand_in())
    asyncio.run(jobs.on_partitions_assigned(None, set()))
    status, body = asyncio.run(jobs.readiness_page(Page(), None))
    assert (status, body) == (200, {"ready": True, "reason": "ready", "inputPartitions": 2})


def test_health_counts_only_input_partitions_and_reports_progress() -> None:
    jobs = jobs_for(app_stand_in())
    status, body = asyncio.run(jobs.health_page(Page(), None))
    assert (status, body) == (200, {"ok": True, "reason": "no lag", "processed": False,
                                    "inputPartitions": 2})
    feed_run(jobs, 1, b"run-1")
    assert asyncio.run(jobs.health_page(Page(), None))[1]["processed"] is True
    assert asyncio.run(jobs.liveness_page(Page(), None)) == (
        200, {"alive": True, "reason": "no lag"})


def test_the_metrics_page_exports_the_worker_registry() -> None:
    jobs = jobs_for(app_stand_in())
    feed_run(jobs, 1, b"run-1")
    content_type, body = asyncio.run(jobs.metrics_page(Page(), None))
    assert content_type == "text/plain"
    assert b'agui_runs_total{outcome="success"} 1.0' in body


def test_topics_that_appear_after_the_start_are_said_once_and_counted(
        caplog: Any) -> None:
    """Faust subscribes to names once, at start: a raw topic the pattern matches later
    is read after a restart, and the operator is told so (issue: AGUI_INPUT_PATTERN
    read nothing at all)."""
    metrics = Metrics()
    jobs = jobs_for(app_stand_in(), metrics)
    jobs.settings = Settings.from_env({"AGUI_INPUT_PATTERN": r"tenant\..*"})
    jobs.subscribed = frozenset({"tenant.a"})
    for _ in range(2):
        jobs.note_unread_topics(["tenant.a", "tenant.b", "unrelated", jobs.ticks])
    assert jobs.unread == {"tenant.b"}
    assert metrics.unread_topics._value.get() == 1
    assert [r.getMessage() for r in caplog.records if "appeared" in r.getMessage()] == [
        "topic tenant.b appeared after the start; the workers read it after their next"
        " restart (a rolling restart: docs/operations.md)"]


class Listing:
    """The producer's listing of the topics, counting its calls."""

    def __init__(self, *names: str) -> None:
        self.names = set(names)
        self.calls = 0

    async def topic_names(self) -> set[str]:
        self.calls += 1
        return self.names


def tenant_event(tenant: str, offset: int) -> Event:
    event = Event("events", 1, offset, b"{}")
    event.message.headers = [("tenant", tenant.encode())]
    return event


def prepared(jobs: WorkerJobs, event: Event) -> bool:
    """Prepare the record as the agent does; whether it had to wait for a look-up."""
    waiting = jobs.prepare(event)
    if waiting is None:
        return False
    asyncio.run(cast(Any, waiting))
    return True


def test_a_tenant_s_first_record_waits_for_a_look_up_begun_after_it_was_written(
        monkeypatch: Any) -> None:
    """A tenant provisioned just after another tenant's look-up: its first record came
    within a second of it, was not looked up (a look-up a second at most), and all its
    runs were dead-lettered as tenant_topic_missing (issue: the tenant-topics service
    test failed one run in three). Now it waits for the next look-up; and one look-up
    settles every record fetched before it began, however many tenants they name."""
    monkeypatch.setattr(jobs_module, "TOPIC_LOOKUP_SECONDS", 0.2)
    ends: dict[TP, int] = {}
    app = app_stand_in()
    app.consumer.highwater = ends.get
    routing = TenantRouting(Template("agui.history.{tenant}"),
                            Template("agui.deadletter.{tenant}"))
    routing.learn([], {})
    listing = Listing()
    jobs = jobs_for(app, routing=routing, producer=listing)

    ends[TP("events", 1)] = 10
    assert prepared(jobs, tenant_event("initech", 0))  # not provisioned
    assert routing.missing("initech") and listing.calls == 1
    listing.names |= {"agui.history.hooli", "agui.deadletter.hooli"}  # provisioned now
    ends[TP("events", 1)] = 12  # and its first record written
    began = time.monotonic()
    assert prepared(jobs, tenant_event("hooli", 10))
    assert time.monotonic() - began >= 0.15  # the look-ups' least interval, waited
    assert listing.calls == 2 and not routing.missing("hooli")
    assert not prepared(jobs, tenant_event("hooli", 11))
    assert not prepared(jobs, tenant_event("initech", 11))  # checked until the refresh

    ends[TP("events", 1)] = 1_000  # a flood: a new tenant in every record
    assert prepared(jobs, tenant_event("t12", 12))
    assert not any(prepared(jobs, tenant_event(f"t{offset}", offset))
                   for offset in range(13, 1_000))
    assert listing.calls == 3
    assert prepared(jobs, tenant_event("t1000", 1_000))  # written after that look-up


def test_the_backlog_is_counted_once_per_interval_over_partitions_read_once_per_assignment(
        monkeypatch: Any) -> None:
    """A run's end asks whether a backlog drains; summing every assigned partition's
    lag at each, through Faust's `assignment()` (a new set of every partition at each
    call), took a fifth of a worker holding 128 input partitions."""
    app = app_stand_in()
    assignment = app.consumer.assignment
    reads: list[None] = []

    def counted() -> Any:
        reads.append(None)
        return assignment()

    app.consumer.assignment = counted
    app.consumer.highwater = lambda tp: 5_000
    clock = [100.0]
    monkeypatch.setattr(jobs_module.time, "monotonic", lambda: clock[0])
    jobs = jobs_for(app)
    for key in range(20):  # twenty runs end within the same instant
        feed_run(jobs, 2, f"run-{key}".encode())
    assert jobs.backlogged() and len(reads) == 1
    app.consumer.highwater = lambda tp: None  # caught up: said once the interval passed
    assert jobs.backlogged()
    clock[0] += jobs_module.BACKLOG_CHECK_SECONDS
    assert not jobs.backlogged() and len(reads) == 1
    asyncio.run(jobs.on_partitions_assigned(None, set()))
    clock[0] += jobs_module.BACKLOG_CHECK_SECONDS
    jobs.backlogged()
    assert len(reads) == 2  # a new assignment is read again
    app.consumer_generation_id += 1  # and a new generation, before any callback
    clock[0] += jobs_module.BACKLOG_CHECK_SECONDS
    jobs.backlogged()
    assert len(reads) == 3
