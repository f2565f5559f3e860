"""The record processor on plain dicts, no broker: records, sweeps, write-behind
state, crashes between commits, containment and poison input."""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.engine.engine import KeyEngine
from processors.engine.state import KeyState, Phase
from processors.metrics import Metrics
from processors.processing.outputs import Incoming, Outgoing, OutputBuilder
from processors.processing.record_processor import (
    RecordProcessor,
    StateChange,
    StoredTables,
    state_key_for,
)
from processors.processing.stored_keys import (
    Applied,
    WriteBehindText,
    chunk_key,
    decode_chunk,
    decode_state,
    encode_chunks,
    encode_state,
    join_state,
    partition_of,
    split_state,
    state_part_key,
)
from processors.safe_logging import JsonFormatter, TextFormatter
from tests.engine_helpers import (
    enc,
    r_content,
    r_end,
    r_start,
    run_finished,
    run_started,
    t_content,
    t_end,
    t_start,
)
from tests.memory_helpers import bytes_left_allocated
from topics.declarations import STATE_TABLE, TEXT_TABLE

TOPIC = "events"
HISTORY = "history"
DEADLETTER = "deadletter"
IDLE = 60.0


class Committed:
    """What a commit has persisted: the two tables as plain dicts."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[bytes, bytes]] = {STATE_TABLE: {}, TEXT_TABLE: {}}
        self.changelog_records = 0

    def processor(self, metrics: Metrics | None = None, max_record_bytes: int = 1_000_000,
                  checkpoint_seconds: float = 0.0, idle: float = IDLE) -> RecordProcessor:
        metrics = metrics or Metrics()
        builder = OutputBuilder(HISTORY, DEADLETTER, max_record_bytes, metrics)
        return RecordProcessor(builder, metrics,
                               StoredTables(self.tables[STATE_TABLE], self.tables[TEXT_TABLE]),
                               tenant_header="tenant", default_tenant="default",
                               idle_timeout=idle, checkpoint_seconds=checkpoint_seconds)

    def commit(self, processor: RecordProcessor, now: float = 0.0,
               everything: bool = False) -> None:
        self.apply(processor, self.take(processor, now, everything))

    @staticmethod
    def take(processor: RecordProcessor, now: float = 0.0,
             everything: bool = False) -> list[StateChange]:
        """What a commit takes between two records (it is then sent, then applied)."""
        return [change for partition in processor.dirty_partitions()
                for change in processor.changes(partition, now, everything)]

    def apply(self, processor: RecordProcessor, changes: list[StateChange]) -> None:
        for change in changes:
            self.changelog_records += 1
            table = self.tables[change.table]
            if change.value is None:
                table.pop(change.key, None)
            else:
                table[change.key] = change.value
        processor.drop_deleted_keys()


class Feeder:
    """Feeds one partition's records in offset order."""

    def __init__(self, key: bytes = b"k1", partition: int = 0) -> None:
        self.key = key
        self.partition = partition
        self.offset = 0

    def record(self, value: bytes | dict[str, Any], key: bytes | None = None,
               headers: list[tuple[str, bytes]] | None = None) -> Incoming:
        data = value if isinstance(value, bytes) else orjson.dumps(value)
        record = Incoming(TOPIC, self.partition, self.offset, 1_700_000_000_000,
                          self.key if key is None else key, data, headers or [])
        self.offset += 1
        return record


def feed(processor: RecordProcessor, records: Iterable[Incoming],
         now: float = 0.0) -> list[Outgoing]:
    out: list[Outgoing] = []
    for record in records:
        out.extend(processor.process(record, now))
    return out


def history(out: list[Outgoing]) -> list[dict[str, Any]]:
    return [orjson.loads(o.value) for o in out if o.topic == HISTORY]


def dead_letters(out: list[Outgoing]) -> list[dict[str, Any]]:
    return [orjson.loads(o.value) for o in out if o.topic == DEADLETTER]


def contents(out: list[Outgoing]) -> list[str]:
    return [h["message"]["content"] for h in history(out) if h["kind"] == "message"]


def text_run(run: str, words: list[str]) -> list[dict[str, Any]]:
    return [run_started(run), t_start("m-" + run, role="assistant"),
            *(t_content("m-" + run, w) for w in words), t_end("m-" + run), run_finished(run)]


# --- the happy path and write-behind ------------------------------------------------


def test_a_run_publishes_its_history_and_leaves_no_text_behind() -> None:
    committed = Committed()
    processor = committed.processor()
    feeder = Feeder()
    out = feed(processor, (feeder.record(e) for e in text_run("r1", ["a ", "b"])))
    assert contents(out) == ["a b"]
    assert history(out)[-1]["kind"] == "run"
    committed.commit(processor)
    assert committed.tables[TEXT_TABLE] == {}
    assert len(committed.tables[STATE_TABLE]) == 1  # the key's phase and replay guard


def test_a_commit_of_deltas_writes_one_chunk_and_the_first_carries_the_state() -> None:
    committed = Committed()
    processor = committed.processor()
    feeder = Feeder()
    feed(processor, [feeder.record(run_started("r1")), feeder.record(r_start("rm"))])
    for commit in range(10):
        feed(processor, (feeder.record(r_content("rm", f"{commit}.{i} ")) for i in range(100)))
        committed.commit(processor)
    state_key = state_key_for("default", b"k1")
    assert sorted(committed.tables[TEXT_TABLE]) == [chunk_key(state_key, n) for n in range(10)]
    # 10 commits of 100 deltas: one chunk each; the first carries the state.
    assert committed.changelog_records == 10
    assert committed.tables[STATE_TABLE] == {}
    out = feed(processor, [feeder.record(r_end("rm")), feeder.record(run_finished("r1"))])
    committed.commit(processor)
    expected = "".join(f"{c}.{i} " for c in range(10) for i in range(100))
    assert contents(out) == [expected]
    assert committed.tables[TEXT_TABLE] == {}


def test_a_replay_after_commits_of_deltas_only_skips_what_their_chunks_guard() -> None:
    """The state entry of a run streaming deltas is older than its last chunk: the
    chunks past its count are restored, and the last one's guard is the key's."""
    feeder = Feeder()
    records = [feeder.record(e) for e in text_run("r1", [f"w{i} " for i in range(30)])]
    committed = Committed()
    processor = committed.processor()
    for start, end in ((0, 5), (5, 12), (12, 20)):  # the run starts, then deltas only
        feed(processor, records[start:end])
        committed.commit(processor)
    assert committed.changelog_records == 3  # 3 chunks, the first carrying the state
    out = crash_and_replay(committed, records, 9)  # offsets 9..19 again, then the rest
    assert contents(out) == ["".join(f"w{i} " for i in range(30))]


def fail_on_boom(monkeypatch: pytest.MonkeyPatch, message: str) -> None:
    """The engine raises an internal error (`message`) on a record containing BOOM."""
    original = KeyEngine.feed

    def failing(engine: KeyEngine, raw: bytes | str) -> Any:
        if b"BOOM" in bytes(raw):
            raise RuntimeError(message)
        return original(engine, raw)

    monkeypatch.setattr(KeyEngine, "feed", failing)


def test_a_state_a_chunk_carries_is_newer_than_the_entry_only_past_the_entry_s_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a contained error the key's stored entry still counts the failed run's
    chunks: a new run streaming in that commit rewrites the entry rather than
    putting its state into its chunk 0 (a restore would read the older entry as
    the newer, with the new run's text)."""
    feeder = Feeder()
    committed = Committed()
    processor = committed.processor()
    first = [run_started("r1"), t_start("m-r1", role="assistant"), t_content("m-r1", "OLD ")]
    feed(processor, (feeder.record(e) for e in first))
    committed.commit(processor)  # chunk 0 carries r1's state: no entry
    feed(processor, [feeder.record(t_content("m-r1", "OLD ")),
                     feeder.record(r_start("rm")), feeder.record(r_end("rm"))])
    feed(processor, [feeder.record(t_content("m-r1", "OLD "))])
    committed.commit(processor)
    feed(processor, [feeder.record(t_end("m-r1"))])
    committed.commit(processor)  # no text: the state goes to an entry counting 2 chunks
    state_key = state_key_for("default", b"k1")
    assert decode_state(committed.tables[STATE_TABLE][state_key]).chunks == 2
    fail_on_boom(monkeypatch, "internal")
    second = text_run("r2", ["new ", "text"])
    records = [feeder.record(e) for e in [t_content("m-r1", "BOOM"), *second]]
    feed(processor, records[:4])  # contained; r2 starts and streams in the same commit
    committed.commit(processor)
    out = crash_and_replay(committed, records, 4)
    assert contents(out) == ["new text"] and dead_letters(out) == []


def test_after_partitions_move_the_sweep_finds_keys_whose_state_a_chunk_carries() -> None:
    committed = Committed()
    processor = committed.processor()
    for partition in (0, 1):
        feeder = Feeder(key=f"k{partition}".encode(), partition=partition)
        feed(processor, (feeder.record(e) for e in text_run(f"r{partition}", ["x"])[:3]))
    committed.commit(processor)
    assert committed.tables[STATE_TABLE] == {}  # both states are in chunks
    processor = committed.processor()
    assert processor.sweep(1, 0.0, tick(1)) == []  # found, with a fresh clock
    out = processor.sweep(1, IDLE + 1, tick(1))
    assert [(d["code"], d["runId"]) for d in dead_letters(out)] == [("run_abandoned", "r1")]
    committed.commit(processor)
    assert sorted(committed.tables[TEXT_TABLE]) == [
        chunk_key(state_key_for("default", b"k0"), 0)]


def test_a_first_chunk_that_cannot_be_decoded_fails_once_and_is_freed() -> None:
    committed = Committed()
    state_key = state_key_for("default", b"k1")
    committed.tables[TEXT_TABLE][chunk_key(state_key, 0)] = b"\x02\x00"
    processor = committed.processor()
    feeder = Feeder()
    out = feed(processor, (feeder.record(e) for e in text_run("r1", ["new"])))
    assert [d["code"] for d in dead_letters(out)] == ["processing_error"]
    assert contents(out) == ["new"]
    committed.commit(processor)
    assert committed.tables[TEXT_TABLE] == {}


def test_text_streamed_between_two_commits_is_stored_in_records_the_changelog_takes(
) -> None:
    """Two messages, each small enough to publish, streamed between two commits made
    one chunk larger than the broker takes: the commit failed, and so did every
    replay of it."""
    committed = Committed()
    limit = 8_000
    processor = committed.processor(max_record_bytes=limit)
    feeder = Feeder()
    words = [f"{i}:평가단계ünï😀 " for i in range(200)]  # about 4.5 KB, multi-byte characters
    events = [run_started("r1"), r_start("rm"), *(r_content("rm", w) for w in words),
              r_end("rm"), t_start("tm", role="assistant"),
              *(t_content("tm", w) for w in reversed(words)), t_end("tm"), run_finished("r1")]
    records = [feeder.record(e) for e in events]
    feed(processor, records[:-2])  # all deltas, the text message still open
    committed.commit(processor)
    chunks = list(committed.tables[TEXT_TABLE].values())
    assert len(chunks) > 1 and all(len(chunk) <= limit for chunk in chunks)
    out = crash_and_replay_with(committed, records, len(records) - 2, limit)
    assert [h["message"].get("content") for h in history(out) if h["kind"] == "message"] == [
        "".join(words), "".join(reversed(words))]


def reasoning_with_encrypted_values(run: str, count: int) -> list[dict[str, Any]]:
    """A run holding `count` encrypted values of 1 KB, in its state until it ends."""
    events: list[dict[str, Any]] = [run_started(run)]
    for number in range(count):
        mid = f"rm-{number}"
        events += [r_start(mid), r_content(mid, "think"), r_end(mid),
                   enc(mid, f"{number:04d}" + "e" * 1020)]
    return [*events, run_finished(run)]


def test_a_run_state_larger_than_a_record_is_stored_split_and_restored_whole() -> None:
    """A run holding many encrypted values made a state entry larger than the
    changelog takes: the commit failed, and so did every replay of it."""
    committed = Committed()
    limit = 10_000
    processor = committed.processor(max_record_bytes=limit)
    feeder = Feeder()
    records = [feeder.record(e) for e in reasoning_with_encrypted_values("r1", 30)]
    feed(processor, records[:-1])
    committed.commit(processor)
    stored = [*committed.tables[STATE_TABLE].values(), *committed.tables[TEXT_TABLE].values()]
    assert sum(map(len, stored)) > 30_000 and all(len(value) <= limit for value in stored)
    out = crash_and_replay_with(committed, records, len(records) - 1, limit)
    values = [h["message"].get("encryptedValue") for h in history(out)
              if h["kind"] == "message"]
    assert values == [f"{number:04d}" + "e" * 1020 for number in range(30)]


def committed_split_state() -> tuple[Committed, RecordProcessor, Feeder]:
    """A run open across a commit, its state stored split (the limit 10,000 B)."""
    committed = Committed()
    processor = committed.processor(max_record_bytes=10_000)
    feeder = Feeder()
    feed(processor, (feeder.record(e) for e in reasoning_with_encrypted_values("r1", 30)[:-1]))
    committed.commit(processor)
    return committed, processor, feeder


def test_a_split_state_that_shrinks_or_ends_leaves_no_part_behind() -> None:
    committed, processor, feeder = committed_split_state()
    assert len(committed.tables[TEXT_TABLE]) > 1
    feed(processor, [feeder.record(run_finished("r1"))])
    committed.commit(processor)
    assert committed.tables[TEXT_TABLE] == {}  # the state entry is whole again
    processor.sweep(0, IDLE + 1, feeder.record(b"tick"))
    committed.commit(processor)
    assert committed.tables == {STATE_TABLE: {}, TEXT_TABLE: {}}


def test_a_split_state_missing_a_part_fails_its_run_once_and_is_freed() -> None:
    committed, _, feeder = committed_split_state()
    state_key = state_key_for("default", b"k1")
    del committed.tables[TEXT_TABLE][state_part_key(state_key, 1)]
    restarted = committed.processor(max_record_bytes=10_000)
    out = feed(restarted, [feeder.record(run_finished("r1"))])
    assert [d["code"] for d in dead_letters(out)] == ["processing_error"]
    committed.commit(restarted)
    assert committed.tables[TEXT_TABLE] == {}
    again = feed(restarted, (feeder.record(e) for e in text_run("r2", ["x"])))
    assert dead_letters(again) == [] and contents(again) == ["x"]


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=400), topic=st.text(max_size=20),
       limit=st.integers(1, 400))
def test_a_split_state_entry_joins_to_the_entry_it_was_split_from(
        body: bytes, topic: str, limit: int) -> None:
    state_key = b"tenant\x00key"
    value = encode_state(3, Applied(topic, 7), 2, KeyState().to_json() + body)
    head, parts = split_state(value, limit)
    assert all(len(part) <= limit for part in parts)
    texts = {state_part_key(state_key, n): part for n, part in enumerate(parts)}
    assert join_state(state_key, head, texts) == value
    assert partition_of(head) == 3


@settings(max_examples=300, deadline=None)
@given(fragments=st.lists(st.tuples(st.integers(0, 5), st.text(max_size=300)), max_size=8),
       limit=st.integers(1, 400),
       guard=st.none() | st.builds(Applied, st.text(max_size=20), st.integers(0, 2**63 - 1)),
       state=st.none() | st.binary(max_size=100))
def test_chunks_stay_within_their_limit_and_restore_every_slot_s_text_guard_and_state(
        fragments: list[tuple[int, str]], limit: int, guard: Applied | None,
        state: bytes | None) -> None:
    chunks = encode_chunks(fragments, limit, guard, state)
    header = 11 + (0 if guard is None else len(guard.topic.encode()))
    carried = 0 if state is None else 4 + len(state)
    assert all(len(chunk) <= max(limit, header + carried + 12) for chunk in chunks)
    restored, expected = WriteBehindText(), WriteBehindText()
    for number, chunk in enumerate(chunks):
        decoded = decode_chunk(chunk)
        assert decoded.guard == guard
        assert decoded.state == (state if number == 0 else None)
        restored.restore(decoded.fragments)
    for slot, text in fragments:
        expected.restore([(slot, text)])
    assert restored.texts() == expected.texts()


def test_a_commit_leaves_a_slot_one_string_per_chunk_in_the_list_the_engine_holds() -> None:
    text = WriteBehindText()
    fragments = text.fragments(0)
    for delta in ("a", "b", "c"):
        fragments.append(delta)
    assert text.unpersisted() == (False, [(0, "abc")])
    assert text.fragments(0) is fragments and fragments == ["abc"]
    fragments.append("d")
    assert text.unpersisted() == (False, [(0, "d")])
    assert text.unpersisted() == (False, [])
    assert fragments == ["abc", "d"] and text.texts() == {0: "abcd"}


def test_a_commit_with_nothing_new_changes_nothing() -> None:
    committed = Committed()
    processor = committed.processor()
    feeder = Feeder()
    feed(processor, (feeder.record(e) for e in text_run("r1", ["x"])))
    committed.commit(processor)
    before = committed.changelog_records
    committed.commit(processor)
    assert committed.changelog_records == before


def test_an_idle_open_run_keeps_about_five_kilobytes_in_the_worker() -> None:
    """Each cached key kept a second copy of its last stored engine state, as
    `orjson.dumps` returned it with the 4 KB buffer it was written in: 8.9 KB per
    open run; 4.8 KB since the state is compared in its stored entry (allocations
    counted by tracemalloc; service_bench.py part 3 measures RSS)."""
    runs = 2_000
    committed = Committed()
    processor = committed.processor()

    def open_runs() -> Committed:
        offset = 0
        for number in range(runs):
            key, mid = f"open{number:06d}".encode(), f"m{number}"
            for event in [run_started(f"r{number}"), r_start(mid),
                          *(r_content(mid, "thinking about it ") for _ in range(3))]:
                processor.process(Incoming(TOPIC, 0, offset, 1, key, orjson.dumps(event), []),
                                  0.0)
                offset += 1
        committed.commit(processor)
        return committed

    assert bytes_left_allocated(open_runs) / runs < 7_000


# --- crashes between commits ----------------------------------------------------------


def crash_and_replay(committed: Committed, records: list[Incoming],
                     from_offset: int) -> list[Outgoing]:
    """A new worker on what was committed, replaying from `from_offset`."""
    return crash_and_replay_with(committed, records, from_offset, 1_000_000)


def crash_and_replay_with(committed: Committed, records: list[Incoming], from_offset: int,
                          max_record_bytes: int) -> list[Outgoing]:
    return feed(committed.processor(max_record_bytes=max_record_bytes),
                records[from_offset:])


def test_a_crash_between_commits_replays_onto_the_committed_state() -> None:
    events = text_run("r1", [f"w{i} " for i in range(30)])
    feeder = Feeder()
    records = [feeder.record(e) for e in events]
    committed = Committed()
    processor = committed.processor()
    feed(processor, records[:12])
    committed.commit(processor)  # offsets 0..11 committed with their state
    lost = feed(processor, records[12:20])  # processed, never committed: the crash
    assert lost == []
    out = crash_and_replay(committed, records, 12)
    assert contents(out) == ["".join(f"w{i} " for i in range(30))]


def mixed_run(key: int, run: int, words: int) -> list[dict[str, Any]]:
    """A run with a reasoning message (and its encrypted value) and a text message;
    a key's runs of the same number and words are identical (a client's retry)."""
    name = f"r{key}-{run}"
    return [run_started(name), r_start("rm" + name),
            *(r_content("rm" + name, f"{name}.{i} ") for i in range(words)), r_end("rm" + name),
            enc("rm" + name, "v" + name), t_start("tm" + name, role="assistant"),
            *(t_content("tm" + name, f"{i}/{name} ") for i in range(words)), t_end("tm" + name),
            run_finished(name)]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_crash_anywhere_replays_to_exactly_the_outputs_of_no_crash(data: st.DataObject) -> None:
    """Keys streaming runs interleaved, commits at arbitrary records, a crash at an
    arbitrary record, and a restart from the last commit or any offset before it
    (the offset fetch can race a commit): what was committed plus what the
    restarted processor publishes is exactly what a processor that never crashed
    published."""
    queues = [[event for _ in range(data.draw(st.integers(1, 3)))
               for event in mixed_run(key, data.draw(st.integers(0, 1)),
                                      data.draw(st.integers(0, 10)))]
              for key in range(3)]
    order = data.draw(st.permutations([key for key, queue in enumerate(queues) for _ in queue]))
    feeder = Feeder()
    positions = [0, 0, 0]
    records = []
    for key in order:
        records.append(feeder.record(queues[key][positions[key]], key=f"k{key}".encode()))
        positions[key] += 1
    commits = set(data.draw(st.lists(st.integers(1, len(records)), max_size=20)))
    crash = data.draw(st.integers(0, len(records)))

    def outputs(out: list[Outgoing]) -> list[bytes]:
        return [o.value for o in out if o.topic == HISTORY]

    expected = outputs(feed(Committed().processor(), records))
    committed = Committed()
    processor = committed.processor()
    published: list[bytes] = []
    pending: list[bytes] = []
    resume = 0
    for index, record in enumerate(records[:crash]):
        pending += outputs(processor.process(record, 0.0))
        if index + 1 in commits:
            committed.commit(processor)
            published, pending, resume = published + pending, [], index + 1
    restarted = committed.processor()
    replay = data.draw(st.integers(0, resume))
    for index, record in enumerate(records[replay:], start=replay):
        published += outputs(restarted.process(record, 0.0))
        if index + 1 in commits and index >= resume:
            committed.commit(restarted)
    assert published == expected


def test_records_replayed_from_an_older_offset_are_skipped_not_published_again() -> None:
    feeder = Feeder()
    records = [feeder.record(e) for e in [*text_run("r1", ["a"]), *text_run("r2", ["b"])]]
    committed = Committed()
    metrics = Metrics()
    processor = committed.processor(metrics)
    first = feed(processor, records[:5])  # r1 whole: published and committed
    committed.commit(processor)
    assert contents(first) == ["a"]
    # The restarted worker is handed an offset older than its last commit.
    replayed_metrics = Metrics()
    out = feed(committed.processor(replayed_metrics), records)
    assert contents(out) == ["b"]
    assert replayed_metrics.replayed_records._value.get() == 5


def test_a_run_ending_and_the_next_starting_between_commits_never_mix_text() -> None:
    feeder = Feeder()
    committed = Committed()
    processor = committed.processor()
    first = text_run("r1", ["OLD ", "OLD ", "OLD "])
    second = text_run("r2", ["new"])
    feed(processor, (feeder.record(e) for e in first[:3]))
    committed.commit(processor)  # r1's first chunk is stored
    feed(processor, (feeder.record(e) for e in first[3:]))
    feed(processor, (feeder.record(e) for e in second[:3]))  # r2 streams, same commit
    committed.commit(processor)
    # Crash: r2 goes on from the committed state only.
    out = feed(committed.processor(), (feeder.record(e) for e in second[3:]))
    assert contents(out) == ["new"]


# --- containment ----------------------------------------------------------------------


def test_an_internal_error_counts_the_failed_run_s_encrypted_values_as_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    feeder = Feeder()
    metrics = Metrics()
    processor = Committed().processor(metrics)
    feed(processor, [feeder.record(e) for e in [
        run_started("r1"), r_start("rm"), r_content("rm", "x"), r_end("rm"),
        {"type": "REASONING_ENCRYPTED_VALUE", "subtype": "message", "entityId": "rm",
         "encryptedValue": "enc"}]])

    def failing(engine: KeyEngine, raw: bytes | str) -> Any:
        raise RuntimeError("internal")

    monkeypatch.setattr(KeyEngine, "feed", failing)
    out = feed(processor, [feeder.record(t_content("m", "BOOM"))])
    assert [d["code"] for d in dead_letters(out)] == ["processing_error"]
    lost = metrics.encrypted_content_lost.labels("run_failed")._value.get()
    assert lost == 1
    # The run ended: its closing record says it failed, and why.
    (closing,) = [orjson.loads(o.value) for o in out if o.topic == HISTORY]
    assert (closing["runId"], closing["outcome"], closing["failure"]) == (
        "r1", "failed", {"code": "processing_error"})


def test_an_internal_error_fails_the_run_once_and_the_next_run_starts_clean(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    feeder = Feeder()
    committed = Committed()
    processor = committed.processor()
    feed(processor, (feeder.record(e) for e in text_run("r1", ["OLD ", "OLD "])[:3]))
    committed.commit(processor)
    fail_on_boom(monkeypatch, "secret reasoning that must not be logged")
    out = feed(processor, [feeder.record(t_content("m-r1", "BOOM"))])
    assert [d["code"] for d in dead_letters(out)] == ["processing_error"]
    rest = feed(processor, [feeder.record(e) for e in text_run("r1", [])[3:]])
    assert history(rest) == []  # the failed run's remaining records are discarded
    committed.commit(processor)
    assert committed.tables[TEXT_TABLE] == {}  # the failed run's text is deleted
    out = feed(processor, (feeder.record(e) for e in text_run("r2", ["new"])))
    assert contents(out) == ["new"]
    # ... and after a crash too (from the committed state only).
    committed.commit(processor)
    again = feed(committed.processor(),
                 (feeder.record(e) for e in text_run("r3", ["fresh"])))
    assert contents(again) == ["fresh"]


def test_a_stored_state_that_cannot_be_decoded_fails_once_and_is_freed() -> None:
    committed = Committed()
    state_key = state_key_for("default", b"k1")
    committed.tables[STATE_TABLE][state_key] = b"\x00\x00\x00\x01not a state"
    committed.tables[TEXT_TABLE][chunk_key(state_key, 0)] = b"OLD"
    committed.tables[TEXT_TABLE][chunk_key(state_key, 1)] = b"OLD"
    processor = committed.processor()
    feeder = Feeder()
    out = feed(processor, (feeder.record(e) for e in text_run("r1", ["new"])))
    assert [d["code"] for d in dead_letters(out)] == ["processing_error"]
    assert contents(out) == ["new"]  # the record that found it still started its run
    committed.commit(processor)
    assert committed.tables[TEXT_TABLE] == {}
    again = feed(committed.processor(), (feeder.record(e) for e in text_run("r2", ["x"])))
    assert dead_letters(again) == [] and contents(again) == ["x"]


def legacy_entries(committed: Committed, state: KeyState, fragments: list[str]) -> None:
    """Entries as the release before write-behind stored them, for key k1 on partition 0."""
    state_key = state_key_for("default", b"k1")
    committed.tables[STATE_TABLE][state_key] = struct.pack(">I", 0) + state.to_json()
    texts = committed.tables[TEXT_TABLE]
    texts[state_key + b"\x02"] = struct.pack(">QqI", len(fragments), 41, 0) + TOPIC.encode()
    for number, fragment in enumerate(fragments):
        texts[state_key + b"\x01" + struct.pack(">Q", number)] = (
            struct.pack(">I", 0) + fragment.encode())


def test_a_key_stored_before_write_behind_with_no_open_run_is_rewritten_quietly() -> None:
    committed = Committed()
    legacy_entries(committed, KeyState(Phase.FINISHED), [])
    processor = committed.processor()
    feeder = Feeder()
    out = feed(processor, (feeder.record(e) for e in text_run("r2", ["new"])))
    assert dead_letters(out) == [] and contents(out) == ["new"]
    committed.commit(processor)
    assert committed.tables[TEXT_TABLE] == {}  # its progress entry is gone
    [value] = committed.tables[STATE_TABLE].values()
    assert value[0] == 2  # the current encoding


def test_a_run_stored_open_before_write_behind_fails_once_and_leaves_nothing() -> None:
    committed = Committed()
    engine = KeyEngine()
    for event in text_run("r1", ["OLD"])[:3]:
        engine.feed(orjson.dumps(event))
    legacy_entries(committed, engine.state, ["OLD"])
    processor = committed.processor()
    out = processor.sweep(0, 0.0, tick())  # found by the sweep after an assignment
    assert [d["code"] for d in dead_letters(out)] == ["processing_error"]
    committed.commit(processor)
    assert committed.tables[TEXT_TABLE] == {}


def test_a_dead_letter_whose_event_copy_fails_is_still_sent_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(value: bytes) -> Any:
        raise TypeError("cannot copy")

    monkeypatch.setattr("processors.processing.outputs._offending", broken)
    processor = Committed().processor()
    out = feed(processor, [Feeder().record({"type": "REASONING_MESSAGE_CONTENT"})])
    [letter] = dead_letters(out)
    assert letter["kind"] == "failure" and "event" not in letter and "raw" not in letter
    assert letter["source"] == {"topic": TOPIC, "partition": 0, "offset": 0,
                                "timestamp": 1_700_000_000_000}


JSON_VALUES = [None, True, 1, 1.5, "s", ["CUSTOM"], {"a": 1}, [], {}]


@pytest.mark.parametrize("poison", [
    *({"type": bad, "name": "x", "value": 1} for bad in JSON_VALUES if bad != "s"),
    *({**r_start("rm"), "role": bad} for bad in JSON_VALUES),
    *({**r_content("rm", "x"), "delta": bad} for bad in JSON_VALUES),
    *({"type": "REASONING_ENCRYPTED_VALUE", "subtype": "message", "entityId": "rm",
       "encryptedValue": bad} for bad in JSON_VALUES),
])
def test_poison_inside_a_run_gets_one_dead_letter_and_the_next_run_is_whole(
    poison: dict[str, Any],
) -> None:
    feeder = Feeder()
    processor = Committed().processor()
    out = feed(processor, [feeder.record(run_started("r1")), feeder.record(r_start("rm")),
                           feeder.record(poison)])
    assert len(dead_letters(out)) <= 1  # a valid shape (a string delta) sends none
    # r1 ends (failed already, or now for its open message): nothing internal.
    out += feed(processor, [feeder.record(run_finished("r1"))])
    assert [d["code"] for d in dead_letters(out)] != [] and all(
        d["code"] != "processing_error" for d in dead_letters(out))
    out = feed(processor, (feeder.record(e) for e in text_run("r2", ["whole"])))
    assert contents(out) == ["whole"]


# --- the sweep ------------------------------------------------------------------------


def tick(partition: int = 0, offset: int = 0) -> Incoming:
    return Incoming("ticks", partition, offset, None, b"", b"", [])


def test_the_sweep_abandons_idle_runs_and_frees_idle_keys() -> None:
    committed = Committed()
    processor = committed.processor()
    feeder = Feeder()
    feed(processor, [feeder.record(run_started("r1")), feeder.record(r_start("rm")),
                     feeder.record(r_content("rm", "x"))], now=0.0)
    assert processor.sweep(0, IDLE - 1, tick()) == []
    out = processor.sweep(0, IDLE + 1, tick())
    assert [d["code"] for d in dead_letters(out)] == ["run_abandoned"]
    committed.commit(processor)
    assert committed.tables == {STATE_TABLE: {}, TEXT_TABLE: {}}


def test_after_partitions_move_the_sweep_finds_the_stored_keys_of_its_partition_only() -> None:
    committed = Committed()
    processor = committed.processor()
    for partition in (0, 1):
        feeder = Feeder(key=f"k{partition}".encode(), partition=partition)
        feed(processor, [feeder.record(run_started(f"r{partition}"))])
    committed.commit(processor)
    processor.forget()
    processor = committed.processor()
    out = processor.sweep(1, 0.0, tick(1))
    assert out == []  # found, with a fresh clock
    out = processor.sweep(1, IDLE + 1, tick(1))
    assert [(d["code"], d["runId"]) for d in dead_letters(out)] == [("run_abandoned", "r1")]


def test_a_sweep_that_finds_an_undecodable_state_contains_it() -> None:
    committed = Committed()
    state_key = state_key_for("default", b"k1")
    # Our format and partition 0, but a body that is not a state.
    committed.tables[STATE_TABLE][state_key] = (b"\x02\x00\x00\x00\x00" + b"\xff" * 8
                                                + b"\x00\x00\x00\x00\x00\x00{")
    processor = committed.processor()
    out = processor.sweep(0, 0.0, tick())
    assert [d["code"] for d in dead_letters(out)] == ["processing_error"]
    assert processor.sweep(0, IDLE + 1, tick()) == []
    committed.commit(processor)
    assert committed.tables[STATE_TABLE] == {}


def test_a_freed_key_whose_deletion_is_not_yet_committed_starts_afresh() -> None:
    committed = Committed()
    processor = committed.processor()
    feeder = Feeder()
    feed(processor, (feeder.record(e) for e in text_run("r1", ["a"])))
    committed.commit(processor)
    processor.sweep(0, IDLE + 1, tick())  # frees the key (deletion pending)
    out = feed(processor, (feeder.record(e) for e in text_run("r2", ["b"])), now=IDLE + 2)
    assert contents(out) == ["b"]
    committed.commit(processor)
    assert len(committed.tables[STATE_TABLE]) == 1


class ReadLog(dict[bytes, bytes]):
    """A stored table that records which keys were read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[bytes] = []

    def get(self, key: bytes, default: Any = None) -> Any:
        self.reads.append(key)
        return super().get(key, default)

    def __getitem__(self, key: bytes) -> bytes:
        self.reads.append(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.reads.append(key)  # type: ignore[arg-type]
        return super().__contains__(key)


def test_no_record_reads_a_key_whose_deletion_is_in_flight() -> None:
    # A commit takes its changes between two records, then sends and applies them
    # while later records are processed: the store still holds what it deletes.
    committed = Committed()
    committed.tables = {STATE_TABLE: ReadLog(), TEXT_TABLE: ReadLog()}
    processor = committed.processor()
    feeder = Feeder()
    feed(processor, (feeder.record(e) for e in text_run("r1", ["a"])))
    committed.commit(processor)
    processor.sweep(0, IDLE + 1, tick())  # frees the key
    in_flight = committed.take(processor)
    assert [c.value for c in in_flight if c.table == STATE_TABLE] == [None]
    for table in committed.tables.values():
        table.reads.clear()  # type: ignore[attr-defined]
    out = feed(processor, (feeder.record(e) for e in text_run("r2", ["b"])), now=IDLE + 2)
    assert contents(out) == ["b"]
    assert [t.reads for t in committed.tables.values()] == [[], []]  # type: ignore[attr-defined]
    committed.apply(processor, in_flight)  # the deletion lands; the key is still in use
    committed.commit(processor)
    after_crash = feed(committed.processor(),
                       (feeder.record(e) for e in text_run("r3", ["c"])), now=IDLE + 3)
    assert contents(after_crash) == ["c"] and dead_letters(after_crash) == []
    assert len(committed.tables[STATE_TABLE]) == 1


def test_a_deleted_key_is_forgotten_once_its_deletion_is_applied() -> None:
    committed = Committed()
    processor = committed.processor()
    feeder = Feeder()
    feed(processor, [feeder.record(run_started("r1"))])
    committed.commit(processor)
    processor.sweep(0, IDLE + 1, tick())
    in_flight = committed.take(processor)
    assert processor.sweep(0, 2 * IDLE, tick()) == []  # still cached, already freed
    committed.apply(processor, in_flight)
    assert committed.tables[STATE_TABLE] == {}
    # Forgotten: the next record of the key reads the (now empty) store.
    committed.tables[STATE_TABLE] = ReadLog()
    processor.stored.states = committed.tables[STATE_TABLE]
    feed(processor, [feeder.record(run_started("r2"))], now=2 * IDLE)
    assert state_key_for("default", b"k1") in committed.tables[STATE_TABLE].reads


# --- totality ---------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
event_like = st.fixed_dictionaries(
    {"type": st.sampled_from(["RUN_STARTED", "TEXT_MESSAGE_CONTENT", "REASONING_MESSAGE_CHUNK",
                              "REASONING_ENCRYPTED_VALUE", "RUN_FINISHED"]) | json_values},
    optional={"messageId": json_values, "delta": json_values, "role": json_values,
              "encryptedValue": json_values, "threadId": json_values, "runId": json_values},
)
values = (st.binary(max_size=64) | json_values.map(orjson.dumps)
          | event_like.map(orjson.dumps))
headers = st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=3)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=4), values, headers), max_size=12))
def test_no_bytes_json_or_headers_make_it_raise(
    records: list[tuple[bytes, bytes, list[tuple[str, bytes]]]],
) -> None:
    committed = Committed()
    processor = committed.processor()
    for offset, (key, value, header_list) in enumerate(records):
        record = Incoming(TOPIC, offset % 2, offset, None, key, value, header_list)
        for out in processor.process(record, float(offset)):
            assert out.topic in (HISTORY, DEADLETTER)
        if offset % 3 == 0:
            committed.commit(processor)
    processor.sweep(0, 1e9, tick())
    committed.commit(processor)


def test_a_contained_error_is_logged_with_where_it_happened_as_json_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    committed = Committed()
    state_key = state_key_for("acme", b"k1\nforged line")
    committed.tables[STATE_TABLE][state_key] = (b"\x02\x00\x00\x00\x00" + b"\xff" * 8
                                                + b"\x00\x00\x00\x00\x00\x00{")
    with caplog.at_level(logging.ERROR):
        committed.processor().sweep(0, 0.0, tick())
    [record] = caplog.records
    line = orjson.loads(JsonFormatter().format(record))
    assert {key: line[key] for key in ("topic", "partition", "tenant", "key")} == {
        "topic": "ticks", "partition": 0, "tenant": "acme", "key": "k1\nforged line"}
    # A text line quotes the key: a newline in it cannot forge a log line.
    assert "key 'k1\\nforged line'" in TextFormatter().format(record).splitlines()[0]
