"""Checkpoints of the record processor, no broker: a streaming key waits to be handed
out, the offsets a commit may take stop before its records, and a crash anywhere,
replayed from those offsets, publishes exactly what no crash would have."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from processors.processing.outputs import Incoming, Outgoing
from processors.processing.record_processor import RecordProcessor, state_key_for
from processors.processing.stored_keys import chunk_key
from tests.engine_helpers import r_content, r_start, run_started
from tests.processing.test_record_processor import (
    DEADLETTER,
    HISTORY,
    TOPIC,
    Committed,
    Feeder,
    contents,
    dead_letters,
    feed,
    mixed_run,
    text_run,
    tick,
)
from topics.declarations import STATE_TABLE, TEXT_TABLE

CHECKPOINT = 5.0


def test_a_streaming_run_waits_for_its_checkpoint_and_holds_the_commit_s_offset_back() -> None:
    committed = Committed()
    processor = committed.processor(checkpoint_seconds=CHECKPOINT)
    feeder = Feeder()
    feed(processor, [feeder.record(run_started("r1")), feeder.record(r_start("rm"))], now=0.0)
    feed(processor, (feeder.record(r_content("rm", f"{i} ")) for i in range(50)), now=1.0)
    committed.commit(processor, now=1.0)
    assert committed.changelog_records == 0  # nothing stored yet ...
    assert processor.replay_starts() == {(TOPIC, 0): 0}  # ... so no offset passes it
    feed(processor, (feeder.record(r_content("rm", f"{i} ")) for i in range(50, 60)), now=4.0)
    committed.commit(processor, now=4.0)
    assert committed.changelog_records == 0
    committed.commit(processor, now=5.0)  # the first record waited 5 s: stored
    state_key = state_key_for("default", b"k1")
    assert sorted(committed.tables[TEXT_TABLE]) == [chunk_key(state_key, 0)]
    assert committed.changelog_records == 1  # one chunk, carrying the state
    assert processor.replay_starts() == {(TOPIC, 0): feeder.offset}


def test_a_record_that_made_an_output_is_stored_with_it() -> None:
    committed = Committed()
    processor = committed.processor(checkpoint_seconds=CHECKPOINT)
    streaming, answering = Feeder(b"k1"), Feeder(b"k2", partition=0)
    answering.offset = 1000  # the same partition, later offsets
    feed(processor, [streaming.record(run_started("r1")), streaming.record(r_start("rm")),
                     streaming.record(r_content("rm", "x"))])
    out = feed(processor, [answering.record(e) for e in text_run("r2", ["hi"])])
    assert contents(out) == ["hi"]
    committed.commit(processor, now=1.0)
    # k2's run ended, published: stored, guard and all; k1 only streamed: waits.
    assert set(committed.tables[STATE_TABLE]) | {
        key.split(b"\x01")[0] for key in committed.tables[TEXT_TABLE]} == {
        state_key_for("default", b"k2")}
    assert processor.replay_starts() == {(TOPIC, 0): 0}


def test_a_freed_key_makes_its_partition_store_every_waiting_key() -> None:
    committed = Committed()
    processor = committed.processor(checkpoint_seconds=CHECKPOINT, idle=3.0)
    idle, streaming = Feeder(b"k1"), Feeder(b"k2")
    streaming.offset = 100
    feed(processor, [idle.record(run_started("r1"))], now=0.0)
    committed.commit(processor, now=0.0)  # r1 waits
    feed(processor, [streaming.record(run_started("r2")),
                     streaming.record(r_start("rm")),
                     streaming.record(r_content("rm", "x"))], now=2.0)
    out = processor.sweep(0, 3.5, tick())  # r1 abandoned and its key freed; r2 recent
    assert [d["code"] for d in dead_letters(out)] == ["run_abandoned"]
    committed.commit(processor, now=3.5)
    assert state_key_for("default", b"k2") in committed.tables[STATE_TABLE] or any(
        key.startswith(state_key_for("default", b"k2")) for key in committed.tables[TEXT_TABLE])
    assert processor.replay_starts() == {(TOPIC, 0): 103}


def test_everything_stores_every_waiting_key() -> None:
    committed = Committed()
    processor = committed.processor(checkpoint_seconds=CHECKPOINT)
    feeder = Feeder()
    feed(processor, [feeder.record(run_started("r1")), feeder.record(r_start("rm"))])
    committed.commit(processor, now=0.0, everything=True)
    assert committed.changelog_records == 1
    assert processor.replay_starts() == {(TOPIC, 0): 2}


def test_without_checkpoints_every_key_is_stored_with_every_commit() -> None:
    committed = Committed()
    processor = committed.processor()
    feeder = Feeder()
    feed(processor, [feeder.record(run_started("r1")), feeder.record(r_start("rm"))])
    committed.commit(processor)
    assert committed.changelog_records == 1
    assert processor.replay_starts() == {(TOPIC, 0): 2}


def _outputs(out: list[Outgoing]) -> list[tuple[str, bytes]]:
    return [(o.topic, o.value) for o in out if o.topic in (HISTORY, DEADLETTER)]


def _step(processor: RecordProcessor, record: Incoming, now: float) -> list[Outgoing]:
    if record.topic == "ticks":
        return processor.sweep(0, now, record)
    return processor.process(record, now)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_crash_anywhere_with_checkpoints_replays_to_exactly_the_outputs_of_no_crash(
        data: st.DataObject) -> None:
    """Keys streaming runs interleaved with idle ticks, the clock moving on, commits at
    arbitrary records, a crash at an arbitrary record: the restarted processor reads
    the input from the offset the last commit took and the ticks after the last
    committed one, at the same times; what was committed plus what it publishes is
    exactly what a processor that never crashed published."""
    queues = [[event for _ in range(data.draw(st.integers(1, 3)))
               for event in mixed_run(key, data.draw(st.integers(0, 1)),
                                      data.draw(st.integers(0, 8)))]
              for key in range(3)]
    keys = [key for key, queue in enumerate(queues) for _ in queue]
    order = data.draw(st.permutations([*keys, *[-1] * data.draw(st.integers(0, 6))]))
    feeder = Feeder()
    positions = [0, 0, 0]
    ticks = 0
    records: list[tuple[Incoming, float]] = []
    now = 0.0
    for key in order:
        now += data.draw(st.sampled_from([0.0, 0.5, 2.0, 4.5]))
        if key < 0:
            records.append((tick(0, ticks), now))
            ticks += 1
            continue
        records.append((feeder.record(queues[key][positions[key]], key=f"k{key}".encode()),
                        now))
        positions[key] += 1
    commits = set(data.draw(st.lists(st.integers(1, len(records)), max_size=20)))
    crash = data.draw(st.integers(0, len(records)))

    def processor(committed: Committed) -> RecordProcessor:
        # No run goes idle: a restart gives stored keys a fresh idle clock, so an
        # abandonment could differ (test_a_freed_key_... covers the sweep's frees).
        return committed.processor(checkpoint_seconds=CHECKPOINT, idle=1e9)

    expected: list[tuple[str, bytes]] = []
    never_crashed = processor(Committed())
    for record, when in records:
        expected += _outputs(_step(never_crashed, record, when))
    committed = Committed()
    running = processor(committed)
    published: list[tuple[str, bytes]] = []
    pending: list[tuple[str, bytes]] = []
    input_from, ticks_from = 0, 0
    for index, (record, when) in enumerate(records[:crash]):
        pending += _outputs(_step(running, record, when))
        if index + 1 in commits:
            committed.commit(running, when)
            published, pending = published + pending, []
            input_from = running.replay_starts().get((TOPIC, 0), input_from)
            ticks_from = sum(1 for done, _ in records[:index + 1] if done.topic == "ticks")
    restarted = processor(committed)
    for record, when in records:
        if record.offset >= (ticks_from if record.topic == "ticks" else input_from):
            published += _outputs(_step(restarted, record, when))
    assert published == expected
