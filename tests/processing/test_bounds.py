"""Bounded by construction, without a broker: a run past a limit fails and frees its
state; a tenant past its open runs has the excess runs failed; a key with no run
open leaves memory once its state is stored, and the sweep frees it from the store."""

from __future__ import annotations

from typing import Any

from processors.engine.engine import KeyEngine
from processors.engine.limits import RunLimits
from processors.metrics import Metrics
from processors.processing.outputs import OutputBuilder
from processors.processing.record_processor import RecordProcessor, StoredTables
from tests.engine_helpers import (
    enc,
    play,
    r_content,
    r_end,
    r_start,
    run_error,
    run_finished,
    run_started,
    t_content,
    t_end,
    t_start,
    tc_start,
    text,
)
from tests.memory_helpers import bytes_left_allocated
from tests.processing.test_record_processor import (
    DEADLETTER,
    HISTORY,
    IDLE,
    Committed,
    Feeder,
    dead_letters,
    feed,
    history,
)
from topics.declarations import STATE_TABLE, TEXT_TABLE

SMALL = RunLimits(events=20, content_chars=100, items=5)


def engine(limits: RunLimits = SMALL) -> KeyEngine:
    return KeyEngine(limits=limits)


# --- per-run limits (the engine) ---------------------------------------------------


def test_a_run_past_its_record_limit_fails_at_that_record_and_frees_its_text() -> None:
    events = [run_started(), r_start("m"), *(r_content("m", "x") for _ in range(30))]
    replay = play(*events, enc("m", "v"), engine=(tested := engine()))
    assert replay.failures == [(21, "run_event_limit")]
    assert replay.discarded == len(events) + 1 - 21  # the rest of the run is discarded
    assert tested.state.run is None and tested.content.texts() == {}


def test_a_run_past_its_content_limit_fails_whether_deltas_repeat_or_not() -> None:
    repeated = [run_started(), r_start("m"), *(r_content("m", "y" * 10) for _ in range(12))]
    assert play(*repeated, engine=engine()).failures == [(13, "run_content_limit")]
    mixed = [run_started(), *(event for n in range(10)
                              for event in (t_start(f"m{n % 2}"), t_content(f"m{n % 2}", "z" * 15),
                                            t_end(f"m{n % 2}")))]
    assert play(*mixed, engine=engine(RunLimits(1000, 100, 100))).failure_codes == [
        "run_content_limit"]


def test_a_run_past_its_item_limit_fails_and_loses_its_values() -> None:
    events = [run_started(), *(event for n in range(6) for event in text(f"m{n}", "a")),
              enc("m0", "v")]
    replay = play(*events, engine=engine(RunLimits(1000, 1000, 5)))
    assert replay.failure_codes == ["run_item_limit"]
    limited = play(run_started(), *text("m0", "a"), enc("m0", "v"), *text("m1", "b"),
                   *text("m2", "c"), tc_start("c1"), tc_start("c2"),
                   engine=engine(RunLimits(1000, 1000, 5)))
    assert limited.failure_codes == ["run_item_limit"] and limited.losses[-1][1] == "run_failed"


def test_limits_count_each_run_afresh() -> None:
    tested = engine(RunLimits(events=8, content_chars=1000, items=100))
    one_run = [run_started(), *text("m", "a", "b"), run_finished()]  # 6 records
    replay = play(*one_run, *one_run, *one_run, engine=tested)
    assert replay.failures == [] and len(replay.concluded) == 3


def test_the_keys_index_of_earlier_runs_is_bounded() -> None:
    tested = engine(RunLimits(events=1000, content_chars=1000, items=10))
    for run in range(5):
        play(run_started(f"r{run}"), *(event for n in range(4) for event in
                                       text(f"m{run}-{n}", "a")), run_finished(f"r{run}"),
             engine=tested)
    held = tested.state.held
    assert held is not None and len(held) <= 10
    assert "m4-3" in held and "m0-0" not in held  # the oldest are forgotten first


# --- the record processor: limits from settings, tenants, memory -------------------


def processor(committed: Committed, **options: Any) -> RecordProcessor:
    metrics = Metrics()
    return RecordProcessor(OutputBuilder(HISTORY, DEADLETTER, 1_000_000, metrics), metrics,
                           StoredTables(committed.tables[STATE_TABLE],
                                        committed.tables[TEXT_TABLE]),
                           tenant_header="tenant", default_tenant="default",
                           idle_timeout=IDLE, **options)


def tenant(name: str) -> list[tuple[str, bytes]]:
    return [("tenant", name.encode())]


def test_a_run_past_a_limit_fails_in_the_service_and_its_chunks_are_deleted() -> None:
    committed = Committed()
    tested = processor(committed, limits=RunLimits(1000, 100, 100))
    feeder = Feeder()
    feed(tested, [feeder.record(e) for e in [run_started(), r_start("m"),
                                             r_content("m", "x" * 60)]])
    committed.commit(tested)
    assert any(k for k in committed.tables[TEXT_TABLE])  # a chunk of the open run
    out = feed(tested, [feeder.record(r_content("m", "x" * 60))])
    assert [d["code"] for d in dead_letters(out)] == ["run_content_limit"]
    assert [(h["outcome"], h["failure"]) for h in history(out)] == [
        ("failed", {"code": "run_content_limit"})]
    committed.commit(tested)
    assert committed.tables[TEXT_TABLE] == {}  # the failed run's text is freed


def test_a_tenant_past_its_open_runs_has_the_excess_run_failed_and_others_go_on() -> None:
    committed = Committed()
    tested = processor(committed, tenant_open_runs=2)
    feeder = Feeder()
    out = feed(tested, [feeder.record(run_started(f"a{n}"), key=f"a{n}".encode(),
                                      headers=tenant("acme")) for n in range(3)])
    assert [(d["code"], d["runId"]) for d in dead_letters(out)] == [
        ("tenant_open_run_limit", "a2")]
    other = feed(tested, [feeder.record(run_started("g0"), key=b"g0", headers=tenant("globex"))])
    assert dead_letters(other) == []
    assert open_runs_by_tenant(tested) == {"acme": 2, "globex": 1}
    # A run that ends makes room.
    feed(tested, [feeder.record(run_finished("a0"), key=b"a0", headers=tenant("acme"))])
    assert open_runs_by_tenant(tested) == {"acme": 1, "globex": 1}
    again = feed(tested, [feeder.record(run_started("a3"), key=b"a3", headers=tenant("acme"))])
    assert dead_letters(again) == []
    assert open_runs_by_tenant(tested) == {"acme": 2, "globex": 1}


def open_runs_by_tenant(tested: RecordProcessor) -> dict[str, float]:
    return {sample.labels["tenant"]: sample.value
            for family in tested.metrics.tenant_open_runs.collect()
            for sample in family.samples}


def test_a_flood_of_tenant_names_is_labelled_at_most_fifty_times_and_left_behind() -> None:
    committed = Committed()
    tested = processor(committed)
    names = [f"t{n}" for n in range(60)] + ["x" * 101, "bad\nname"]
    for name in names:
        feeder = Feeder(key=name.encode())
        feed(tested, [feeder.record(e, headers=tenant(name))
                      for e in (run_started(name), run_finished(name))])
    labels = open_runs_by_tenant(tested)
    assert len(labels) == 51 and labels["other"] == 0 and set(labels) - {"other"} == {
        f"t{n}" for n in range(50)}
    assert tested._tenants._open[0] == {}  # nothing kept for the runs that ended


def test_a_key_with_no_run_open_leaves_memory_and_comes_back_from_the_store() -> None:
    committed = Committed()
    tested = processor(committed)
    for n in range(50):
        feeder = Feeder(key=f"run-{n}".encode())
        feed(tested, [feeder.record(e) for e in
                      [run_started(f"r{n}"), t_start("m"), t_content("m", "hi"), t_end("m"),
                       run_finished(f"r{n}")]])
    open_feeder = Feeder(key=b"open")
    feed(tested, [open_feeder.record(run_started("open"))])
    committed.commit(tested)
    assert list(tested._cache) == [b"default\x00open"]  # only the open run stays in memory
    # A late RUN_ERROR for a finished run: the key comes back from the store, and knows.
    late = Feeder(key=b"run-7")
    late.offset = 5
    out = feed(tested, [late.record(run_error("flush failed"))])
    assert [(h["runId"], h["outcome"], h.get("late")) for h in history(out)] == [
        ("r7", "error", True)]


def test_the_sweep_frees_keys_at_rest_once_idle() -> None:
    committed = Committed()
    tested = processor(committed)
    feeder = Feeder(key=b"done")
    feed(tested, [feeder.record(e) for e in [run_started(), run_finished()]], now=0.0)
    committed.commit(tested)
    assert committed.tables[STATE_TABLE] and not tested._cache
    tick = Feeder(key=b"").record(b"")
    tested.sweep(0, IDLE / 2, tick)
    committed.commit(tested)
    assert committed.tables[STATE_TABLE]  # not idle long enough yet
    tested.sweep(0, IDLE + 1, tick)
    committed.commit(tested)
    assert committed.tables[STATE_TABLE] == {} and not tested._cache


def test_memory_follows_open_runs_through_a_restart() -> None:
    committed = Committed()
    first = processor(committed)
    for n in range(20):
        feeder = Feeder(key=f"k{n}".encode())
        events = [run_started(f"r{n}"), run_finished(f"r{n}")] if n % 2 else [run_started(
            f"r{n}")]
        feed(first, [feeder.record(e) for e in events])
    committed.commit(first)
    restarted = processor(committed)  # partitions moved here
    tick = Feeder(key=b"").record(b"")
    restarted.sweep(0, 0.0, tick)  # the first sweep learns the partition's stored keys
    assert len(restarted._cache) == 10  # the open runs; the rest at rest
    assert len(restarted._partitions[0].resting) == 10


def test_a_concluded_key_keeps_a_few_hundred_bytes_where_it_kept_its_engine() -> None:
    """Before keys rested, a concluded key stayed cached with its engine until the idle
    timeout: 1.8 KB per key here. At rest, what is left is its stored entry (in the
    plain dict that stands for the store) and its last-seen time (allocations
    counted by tracemalloc; service_bench.py part 3 measures RSS)."""
    keys = 2_000
    committed = Committed()
    tested = processor(committed)

    def concluded_runs() -> Committed:
        for number in range(keys):
            feeder = Feeder(key=f"done{number:06d}".encode())
            feed(tested, [feeder.record(e) for e in [
                run_started(f"r{number}"), r_start("m"), r_content("m", "thinking it over"),
                r_end("m"), run_finished(f"r{number}")]])
            if number % 500 == 499:
                committed.commit(tested)  # the worker commits every 2.8 s
        committed.commit(tested)
        return committed

    assert bytes_left_allocated(concluded_runs) / keys < 700
