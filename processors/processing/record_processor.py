"""Input records in, output records and state changes out: the worker's work, without Faust.

`RecordProcessor` keeps each run key's engine in memory (`CachedKey`) and
turns every input record into the records to produce. What must persist is
kept in memory too (write-behind, like Kafka Streams' record cache) and
handed out by `changes(partition)`: per key the latest state entry and one text
chunk (see `processors.processing.stored_keys`). The caller sends the outputs and
the changes in the source partition's transaction, then commits its offsets, so
state, outputs and offsets always agree.

Checkpoints (`checkpoint_seconds` > 0): a key that produced no output since its
state was last handed out may wait, up to that long, before it
is handed out again, so that commits can be frequent (outputs readable soon)
without writing every streaming run's text at every commit. Its records since are
then covered by no stored state, so the offsets a commit may take stop before the
first of them (`replay_starts`): a crash replays them onto the stored state, and
every key's replay guard skips the records it had stored. A key that produced an
output is always handed out with it (its guard then covers the record that made
the output), and a partition whose sweep freed a key (its guard deleted) hands
out every key, so no output can be published twice.

It is total: no input can make it raise. An error while applying a record is
contained: the key's run is failed with one dead letter and the key restarts
empty (no text, count or guard of the failed run survives), and a stored
state that cannot be decoded fails that key's run once and frees it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from processors.engine.codes import FailureCode, LossReason
from processors.engine.decisions import RunIdentity, Step
from processors.engine.engine import KeyEngine
from processors.engine.history import held_encrypted_values
from processors.engine.limits import DEFAULT_LIMITS, RunLimits
from processors.engine.state import KeyState, Phase
from processors.metrics import Metrics
from processors.processing.outputs import Incoming, Outgoing, OutputBuilder
from processors.processing.stored_keys import (
    Applied,
    StoredKey,
    TextChunk,
    UndecodableState,
    WriteBehindText,
    chunk_key,
    chunk_partition,
    decode_chunk,
    decode_legacy_state,
    decode_state,
    encode_chunks,
    encode_state,
    first_chunk_owner,
    holds_body,
    join_state,
    legacy_text_keys,
    partition_of,
    split_state,
    state_part_key,
    state_parts,
)
from processors.processing.tenants import TenantTally
from processors.safe_logging import log_exception_kind
from topics.declarations import STATE_TABLE, TEXT_TABLE

log = logging.getLogger("agui_stream")

# The chunk count of a stored state entry that could not be read: above every chunk
# number, so no chunk carries a state until the entry is rewritten.
_UNKNOWN_COUNT = 1 << 32
# How much of a tenant or run key a log line quotes.
_LOGGED_NAME_CHARS = 200


class StoredTables:
    """Read access to what is persisted: the state entries and text chunks."""

    def __init__(self, states: Mapping[bytes, bytes], texts: Mapping[bytes, bytes]) -> None:
        self.states = states
        self.texts = texts


class StateChange(NamedTuple):
    """One entry to persist: `value` None deletes it."""

    table: str
    key: bytes
    value: bytes | None


@dataclass(slots=True)
class CachedKey:
    """A run key's engine and its write-behind bookkeeping."""

    engine: KeyEngine
    text: WriteBehindText
    partition: int
    last_seen: float
    applied: Applied | None = None
    chunks: int = 0  # text chunks of the active run handed out so far (numbered from 0)
    stored_chunks: int = 0  # chunk numbers that may be stored (of any run): 0 .. n-1
    persisted_state: bytes | None = None  # the state as last handed out (whole), in an
    # entry or a chunk
    entry_chunks: int | None = None  # the stored state entry's chunk count (None: no entry)
    stored_parts: int = 0  # parts of a split state entry that may be stored: 0 .. n-1
    freed: bool = False  # to delete at the next changes(), then forget
    # Checkpoints: the first record applied since the key was last handed out, when,
    # and whether a record since produced an output (then it is handed out at once).
    pending_from: Applied | None = None
    pending_since: float = 0.0
    published: bool = False
    stale_texts: list[bytes] = field(default_factory=list)  # text entries to delete

    @classmethod
    def empty(cls, partition: int, now: float, phase: Phase = Phase.FRESH,
              limits: RunLimits = DEFAULT_LIMITS) -> CachedKey:
        text = WriteBehindText()
        return cls(KeyEngine(KeyState(phase), text, limits), text, partition, now)


def state_key_for(tenant: str, key: bytes) -> bytes:
    return tenant.replace("\x00", "\ufffd").encode() + b"\x00" + key


def split_state_key(state_key: bytes) -> tuple[str, bytes]:
    """(tenant, record key) of a state key."""
    tenant, _, key = state_key.partition(b"\x00")
    return tenant.decode("utf-8", "replace"), key


class _Restored(NamedTuple):
    stored: StoredKey  # the newest stored state
    value: bytes  # ... as stored
    applied: Applied | None  # the key's replay guard
    chunks: int  # the active run's chunks
    stored_chunks: int  # the chunks stored (up to the first gap)


@dataclass(slots=True)
class _Partition:
    keys: dict[bytes, None] = field(default_factory=dict)  # cached keys of the partition
    dirty: dict[bytes, None] = field(default_factory=dict)  # keys with changes to hand out
    scanned: bool = False  # the stored keys of the partition are all known
    # Keys with no run open, stored and not cached: when each was last seen, for the
    # sweep that frees them (a float each, where a cached key holds an engine).
    resting: dict[bytes, float] = field(default_factory=dict)
    freed_since_handed_out: bool = False  # the next changes() hands out every key


class RecordProcessor:
    """Applies input records of the partitions a worker owns; see the module docstring."""

    def __init__(self, builder: OutputBuilder, metrics: Metrics, stored: StoredTables, *,
                 tenant_header: str, default_tenant: str, idle_timeout: float,
                 limits: RunLimits = DEFAULT_LIMITS, tenant_open_runs: int = 0,
                 checkpoint_seconds: float = 0.0) -> None:
        """`checkpoint_seconds`: how long a streaming key may wait to be handed out
        (0: it is handed out with every commit; see the module docstring)."""
        self.builder = builder
        self.metrics = metrics
        self.stored = stored
        self.tenant_header = tenant_header
        self.default_tenant = default_tenant
        self.idle_timeout = idle_timeout
        self.limits = limits
        # How many runs one tenant may have open in one input partition (0: any).
        self.tenant_open_runs = tenant_open_runs
        self.checkpoint_seconds = checkpoint_seconds
        # Per input (topic, partition): the offset after the last record processed.
        self._processed: dict[tuple[str, int], int] = {}
        self._cache: dict[bytes, CachedKey] = {}
        self._partitions: dict[int, _Partition] = {}
        self._deleted: dict[bytes, None] = {}  # keys deleted by changes() not yet applied
        self._resting: dict[bytes, None] = {}  # keys at rest in changes() not yet applied
        self._open_runs = 0
        self._tenants = TenantTally(metrics)
        # Summed when scraped (on the event loop that runs the records): only open runs
        # are cached for long, so this is a walk over the open runs.
        metrics.open_run_content.set_function(
            lambda: sum(cached.engine.content_chars for cached in self._cache.values()))

    # --- records -------------------------------------------------------------------

    def process(self, record: Incoming, now: float) -> list[Outgoing]:
        """Apply one input record; return what to produce. Never raises."""
        tenant = self.default_tenant
        state_key = b""
        try:
            self._processed[(record.topic, record.partition)] = record.offset + 1
            tenant = self.tenant(record.headers)
            state_key = state_key_for(tenant, record.key)
            out: list[Outgoing] = []
            cached = self._cached(state_key, record.partition, now, record, out)
            cached.last_seen = now
            applied = cached.applied
            if (applied is not None and applied.topic == record.topic
                    and record.offset <= applied.offset):
                # Replayed from an older committed offset: applied and published already.
                self.metrics.replayed_records.inc()
                return out
            was_open = cached.engine.state.run is not None
            step = cached.engine.feed(record.value)
            if (not was_open and cached.engine.state.run is not None and self.tenant_open_runs
                    and self._tenants.open(record.partition, tenant) >= self.tenant_open_runs):
                step = Step(step.event_type, (*step.decisions, *cached.engine.refuse(
                    FailureCode.TENANT_OPEN_RUN_LIMIT,
                    f"tenant already has {self.tenant_open_runs} runs open in input partition"
                    f" {record.partition} (AGUI_TENANT_MAX_OPEN_RUNS)")))
            cached.applied = Applied(record.topic, record.offset)
            if cached.pending_from is None:
                cached.pending_from, cached.pending_since = cached.applied, now
            self._touch(state_key, cached, was_open)
            out.extend(self.builder.build(step, record, tenant))
            cached.published = cached.published or bool(out)
            return out
        except Exception as error:
            return self._contain(error, state_key, record, tenant, now)

    def sweep(self, partition: int, now: float, tick: Incoming) -> list[Outgoing]:
        """Abandon the partition's runs idle longer than the timeout and free idle keys.

        Never raises: a key that cannot be swept is contained like a record.
        """
        out: list[Outgoing] = []
        part = self._part(partition)
        for state_key, last_seen in list(part.resting.items()):
            if now - last_seen >= self.idle_timeout:  # loaded, then freed below
                self._load_for_sweep(state_key, partition, last_seen, tick, out)
        for state_key in self._keys_of(partition, now, tick, out):
            cached = self._cache.get(state_key)
            if cached is None or cached.freed or now - cached.last_seen < self.idle_timeout:
                continue
            tenant, key = split_state_key(state_key)
            abandoned = Incoming(tick.topic, tick.partition, tick.offset, tick.timestamp,
                                 key, b"", [])
            try:
                was_open = cached.engine.state.run is not None
                if was_open:
                    out.extend(self.builder.build(cached.engine.abandon(), abandoned, tenant))
                self._free(state_key, cached, was_open)
            except Exception as error:
                out.extend(self._contain(error, state_key, abandoned, tenant, now))
        return out

    # --- write-behind ----------------------------------------------------------------

    def dirty_partitions(self) -> list[int]:
        return [number for number, part in self._partitions.items() if part.dirty]

    def changes(self, partition: int, now: float = 0.0,
                everything: bool = False) -> list[StateChange]:
        """What the partition's records changed since the last call, to persist with
        its next commit. Per key at most one state entry and one text chunk. Keys
        that may wait for a checkpoint (module docstring) stay out unless
        `everything` (partitions about to move, a stop)."""
        part = self._partitions.get(partition)
        if part is None or not part.dirty:
            return []
        everything = (everything or part.freed_since_handed_out
                      or self.checkpoint_seconds <= 0)
        part.freed_since_handed_out = False
        changes: list[StateChange] = []
        waiting: dict[bytes, None] = {}
        for state_key in part.dirty:
            cached = self._cache.get(state_key)
            if cached is None:
                continue
            if not everything and self._may_wait(cached, now):
                waiting[state_key] = None
                continue
            changes.extend(self._key_changes(state_key, cached, part))
            cached.pending_from, cached.published = None, False
            if cached.engine.state.run is None and not cached.freed:
                self._resting[state_key] = None  # leaves memory once this is applied
        part.dirty = waiting
        return changes

    def replay_starts(self) -> dict[tuple[str, int], int]:
        """Per input (topic, partition) the offset a commit may take: the first record
        of a key waiting for its checkpoint, else the offset after the last record
        processed. Call it after `changes` of every partition."""
        starts = dict(self._processed)
        for part in self._partitions.values():
            for state_key in part.dirty:
                cached = self._cache.get(state_key)
                if cached is not None and cached.pending_from is not None:
                    first = cached.pending_from
                    place = (first.topic, cached.partition)
                    starts[place] = min(starts.get(place, first.offset), first.offset)
        return starts

    def processed_offset(self, topic: str, partition: int) -> int | None:
        """The offset after the last record of the input partition processed since the
        partitions last moved (None: none)."""
        return self._processed.get((topic, partition))

    def _may_wait(self, cached: CachedKey, now: float) -> bool:
        """A key that can wait for its checkpoint: nothing published since it was handed
        out, not freed, and not waiting longer than the checkpoint interval (a key
        whose run failed and whose producer streams on waits too)."""
        return (cached.pending_from is not None and not cached.published
                and not cached.freed and now - cached.pending_since < self.checkpoint_seconds)

    def drop_deleted_keys(self) -> None:
        """The last commit's changes are applied to the stores: forget the keys it
        deleted, and let the keys with no run open leave memory (the store holds
        them: their phase, replay guard and index) — unless a record has used them
        since. Memory follows the open runs."""
        for state_key in self._deleted:
            cached = self._cache.get(state_key)
            if cached is not None and cached.freed:
                del self._cache[state_key]
                part = self._partitions.get(cached.partition)
                if part is not None:
                    part.keys.pop(state_key, None)
        self._deleted.clear()
        for state_key in self._resting:
            cached = self._cache.get(state_key)
            part = None if cached is None else self._partitions.get(cached.partition)
            if (cached is not None and part is not None and not cached.freed
                    and cached.engine.state.run is None and state_key not in part.dirty):
                self._put_to_rest(state_key, part, cached.last_seen)
        self._resting.clear()

    def forget(self) -> None:
        """Partitions moved: drop every cached key (the stored tables are the truth).

        Call it only after the changes of every partition were persisted.
        """
        self._cache.clear()
        self._partitions.clear()
        self._deleted.clear()
        self._resting.clear()
        self._open_runs = 0
        self.metrics.open_runs.set(0)
        self._tenants.clear()
        self._processed.clear()

    # --- internals -------------------------------------------------------------------

    def tenant(self, headers: Iterable[tuple[str, bytes]]) -> str:
        """The tenant a record's headers name."""
        for name, value in headers:
            if name == self.tenant_header and value:
                return value.decode("utf-8", "replace")
        return self.default_tenant

    def _part(self, partition: int) -> _Partition:
        part = self._partitions.get(partition)
        if part is None:
            part = self._partitions[partition] = _Partition()
        return part

    def _cached(self, state_key: bytes, partition: int, now: float, record: Incoming,
                out: list[Outgoing]) -> CachedKey:
        cached = self._cache.get(state_key)
        if cached is not None:
            if cached.freed:  # freed, its deletion not yet handed out: start afresh
                cached.freed = False
            return cached
        cached = self._load(state_key, partition, now, record, out)
        self._cache[state_key] = cached
        part = self._part(partition)
        part.keys[state_key] = None
        part.resting.pop(state_key, None)
        if cached.engine.state.run is not None:
            self._count_open(state_key, partition, +1)
        return cached

    def _load(self, state_key: bytes, partition: int, now: float, record: Incoming | None,
              out: list[Outgoing]) -> CachedKey:
        value = self.stored.states.get(state_key)
        if value is None and chunk_key(state_key, 0) not in self.stored.texts:
            return CachedKey.empty(partition, now, limits=self.limits)
        parts = 0
        try:
            entry = None
            if value is not None:
                parts = state_parts(value)
                value = join_state(state_key, value, self.stored.texts)
                entry = decode_state(value)
            text = WriteBehindText()
            restored = self._restore_text(state_key, entry, value, text)
        except Exception as error:
            legacy = None if value is None else decode_legacy_state(value)
            if legacy is not None and legacy.run is None:
                # Written before write-behind, no run open: rewritten, nothing lost.
                cached = CachedKey.empty(partition, now, legacy.phase, self.limits)
            else:
                # One dead letter for the key's lost run; it is freed and goes on empty.
                _log_contained(error, "stored state of a key could not be read; its run"
                               " was failed and its state freed", record, state_key)
                cached = CachedKey.empty(partition, now, Phase.FAILED, self.limits)
                if record is not None:
                    tenant = split_state_key(state_key)[0]
                    out += self.builder.outputs_for_exception(record, tenant, None)
            cached.stored_chunks = self._stored_count(chunk_key, state_key)
            cached.stored_parts = max(parts, self._stored_count(state_part_key, state_key))
            cached.stale_texts = legacy_text_keys(state_key, self.stored.texts)
            cached.persisted_state = value  # so that the new state replaces it
            cached.entry_chunks = None if value is None else _UNKNOWN_COUNT
            self._part(partition).dirty[state_key] = None
            return cached
        return CachedKey(KeyEngine(restored.stored.state, text, self.limits), text, partition,
                         now,
                         applied=restored.applied, chunks=restored.chunks,
                         stored_chunks=restored.stored_chunks,
                         persisted_state=restored.value, stored_parts=parts,
                         entry_chunks=None if entry is None else entry.chunks)

    def _restore_text(self, state_key: bytes, entry: StoredKey | None, value: bytes | None,
                      text: WriteBehindText) -> _Restored:
        """The key's newest state (its entry's, or a later one a chunk carries), and the
        active run's chunks restored into `text`. Chunks past the newest state's count
        were written by commits of deltas only, and the last one's guard is the
        newest; with no run active, stored chunks are an ended run's leftovers, to
        delete, not restore."""
        chunks: list[TextChunk] = []
        texts = self.stored.texts
        while (stored_chunk := texts.get(chunk_key(state_key, len(chunks)))) is not None:
            chunk = decode_chunk(stored_chunk)
            if chunk.state is not None and (entry is None or len(chunks) >= entry.chunks):
                entry, value = decode_state(chunk.state), chunk.state
            chunks.append(chunk)
        if entry is None or value is None:
            raise UndecodableState("text chunks without a state")
        if len(chunks) < entry.chunks:
            raise UndecodableState(f"text chunk {len(chunks)} of {entry.chunks} missing")
        applied = entry.applied
        if entry.state.run is None:
            return _Restored(entry, value, applied, 0, len(chunks))
        for number, chunk in enumerate(chunks):
            text.restore(chunk.fragments)
            if number >= entry.chunks and chunk.guard is not None:
                applied = chunk.guard
        return _Restored(entry, value, applied, len(chunks), len(chunks))

    def _touch(self, state_key: bytes, cached: CachedKey, was_open: bool) -> None:
        self._part(cached.partition).dirty[state_key] = None
        is_open = cached.engine.state.run is not None
        if is_open != was_open:
            self._count_open(state_key, cached.partition, 1 if is_open else -1)

    def _free(self, state_key: bytes, cached: CachedKey, was_open: bool) -> None:
        cached.freed = True
        part = self._part(cached.partition)
        part.dirty[state_key] = None
        # Its replay guard goes with it: no record before the commit that deletes it
        # may be replayed, so every waiting key of the partition is handed out too.
        part.freed_since_handed_out = True
        if was_open:
            self._count_open(state_key, cached.partition, -1)

    def _count_open(self, state_key: bytes, partition: int, delta: int) -> None:
        self._open_runs += delta
        self.metrics.open_runs.set(self._open_runs)
        self._tenants.count(partition, split_state_key(state_key)[0], delta)

    def _key_changes(self, state_key: bytes, cached: CachedKey,
                     part: _Partition) -> Iterator[StateChange]:
        cleared, fresh = cached.text.unpersisted()
        run_active = cached.engine.state.run is not None
        if cleared or not run_active:
            cached.chunks = 0  # the chunks stored so far are an earlier run's
        body = b"" if cached.freed else cached.engine.state.to_json()
        state_changed = cleared or not holds_body(cached.persisted_state, body)
        writes_text = bool(fresh) and run_active and not cached.freed
        carried = None  # the state entry the first chunk carries
        if writes_text:
            limit = self.builder.max_record_bytes
            # The first chunk carries a changed state when a restore will read it as
            # newer than the stored entry (stored_keys: the entry counts no more
            # chunks than its number), and the state leaves room for text.
            if state_changed and (cached.entry_chunks is None
                                  or cached.entry_chunks <= cached.chunks):
                value = encode_state(cached.partition, cached.applied, cached.chunks + 1,
                                     body)
                carried = value if len(value) <= limit // 2 else None
            # Within the largest record the changelog takes: a long message streamed
            # between two commits made a chunk the broker refused (the worker could
            # not commit, and the replay refused it again).
            for chunk in encode_chunks(fresh, limit, cached.applied, carried):
                yield StateChange(TEXT_TABLE, chunk_key(state_key, cached.chunks), chunk)
                cached.chunks += 1
            if carried is not None:
                cached.persisted_state = carried
        for stale in cached.stale_texts:
            yield StateChange(TEXT_TABLE, stale, None)
        cached.stale_texts = []
        keep = 0 if cached.freed else cached.chunks
        for number in range(keep, cached.stored_chunks):
            yield StateChange(TEXT_TABLE, chunk_key(state_key, number), None)
        cached.stored_chunks = keep
        if cached.freed:
            yield from self._state_entry(state_key, cached, None)
            # Cached until the commit that deletes it is applied (`drop_deleted_keys`):
            # until then the store still holds what it deletes, and a record for the
            # key in between must not read it.
            self._deleted[state_key] = None
            return
        if writes_text and (carried is not None or not state_changed):
            return  # the chunk carries the state, or the guard of deltas only
        value = encode_state(cached.partition, cached.applied, cached.chunks, body)
        if value != cached.persisted_state:
            yield from self._state_entry(state_key, cached, value)

    def _state_entry(self, state_key: bytes, cached: CachedKey,
                     value: bytes | None) -> Iterator[StateChange]:
        """The changes that store `value` (None: delete) as the key's state entry.

        Split within the largest record the changelog takes: a run holding hundreds
        of encrypted values made a state entry the broker refused, and every replay
        refused it again.
        """
        head, parts = (None, []) if value is None else split_state(
            value, self.builder.max_record_bytes)
        for number, part in enumerate(parts):
            yield StateChange(TEXT_TABLE, state_part_key(state_key, number), part)
        for number in range(len(parts), cached.stored_parts):
            yield StateChange(TEXT_TABLE, state_part_key(state_key, number), None)
        cached.stored_parts = len(parts)
        if head is not None or cached.entry_chunks is not None:
            yield StateChange(STATE_TABLE, state_key, head)
        cached.persisted_state = value
        cached.entry_chunks = None if head is None else cached.chunks

    def _keys_of(self, partition: int, now: float, tick: Incoming,
                 out: list[Outgoing]) -> list[bytes]:
        """The partition's keys; the first call after `forget` loads its stored ones
        (a key whose stored state cannot be read gets its dead letter here)."""
        part = self._part(partition)
        if not part.scanned:
            part.scanned = True
            for state_key in self._stored_keys_of(partition):
                if state_key in self._cache or state_key in part.resting:
                    continue  # known already, with when it was last seen
                cached = self._load_for_sweep(state_key, partition, now, tick, out)
                if (cached is not None and cached.engine.state.run is None
                        and state_key not in part.dirty):
                    self._put_to_rest(state_key, part, now)
        return list(part.keys)

    def _put_to_rest(self, state_key: bytes, part: _Partition, last_seen: float) -> None:
        """The key leaves memory (the store holds it); only when it was last seen stays,
        for the sweep."""
        del self._cache[state_key]
        part.keys.pop(state_key, None)
        part.resting[state_key] = last_seen

    def _load_for_sweep(self, state_key: bytes, partition: int, last_seen: float,
                        tick: Incoming, out: list[Outgoing]) -> CachedKey | None:
        """A stored key, loaded for the sweep (which the tick triggered): a key whose
        stored state cannot be read gets its dead letter, with the tick as source."""
        source = Incoming(tick.topic, tick.partition, tick.offset, tick.timestamp,
                          split_state_key(state_key)[1], b"", [])
        try:
            return self._cached(state_key, partition, last_seen, source, out)
        except Exception as error:
            out.extend(self._contain(error, state_key, source,
                                     split_state_key(state_key)[0], last_seen))
            return None

    def _stored_keys_of(self, partition: int) -> list[bytes]:
        """The keys stored for the partition: those with a state entry, and those whose
        state only their first chunk carries. A value without a readable partition
        is left to its key's next record."""
        states, texts = self.stored.states, self.stored.texts
        found = [state_key for state_key, value in list(states.items())
                 if partition_of(value) == partition]
        for text_key in list(texts.keys()):
            owner = first_chunk_owner(text_key)
            if owner is not None and owner not in states:
                chunk = texts.get(text_key)
                if chunk is not None and chunk_partition(chunk) == partition:
                    found.append(owner)
        return found

    def _stored_count(self, key_of: Callable[[bytes, int], bytes], state_key: bytes) -> int:
        """How many text entries (`chunk_key` or `state_part_key`) are stored for the key,
        counted up to the first gap."""
        number = 0
        while key_of(state_key, number) in self.stored.texts:
            number += 1
        return number

    def _contain(self, error: Exception, state_key: bytes, record: Incoming, tenant: str,
                 now: float) -> list[Outgoing]:
        """The key's run fails; the key restarts empty. Never raises."""
        _log_contained(error, "processing error; the run was failed", record, state_key)
        run: RunIdentity | None = None
        try:
            old = self._cache.pop(state_key, None)
            if old is not None and old.engine.state.run is not None:
                active = old.engine.state.run
                run = RunIdentity(active.thread_id, active.run_id)
            if old is not None and old.engine.state.run is not None:
                self._count_open(state_key, old.partition, -1)
                # Every encrypted value the failed run held is lost, as in any failure.
                self.builder.count_lost(LossReason.RUN_FAILED,
                                        held_encrypted_values(old.engine.state.run))
            fresh = CachedKey.empty(record.partition, now, Phase.FAILED, self.limits)
            fresh.applied = Applied(record.topic, record.offset)
            # Whatever the key had stored is deleted at the next changes().
            if old is None:
                fresh.persisted_state = self.stored.states.get(state_key)
                fresh.entry_chunks = None if fresh.persisted_state is None else _UNKNOWN_COUNT
            else:
                fresh.persisted_state, fresh.entry_chunks = (old.persisted_state,
                                                             old.entry_chunks)
            fresh.stored_chunks = max(self._stored_count(chunk_key, state_key),
                                      0 if old is None else old.stored_chunks)
            fresh.stored_parts = max(self._stored_count(state_part_key, state_key),
                                     0 if old is None else old.stored_parts)
            self._cache[state_key] = fresh
            part = self._part(record.partition)
            part.keys[state_key] = None
            part.dirty[state_key] = None
        except Exception as second:
            _log_contained(second, "could not reset the key after a processing error", record,
                           state_key)
        try:
            return self.builder.outputs_for_exception(record, tenant, run)
        except Exception as third:
            _log_contained(third, "could not build the dead letter of a processing error",
                           record, state_key)
            return []


def _log_contained(error: BaseException, what: str, record: Incoming | None,
                   state_key: bytes) -> None:
    """Where it happened: the record's coordinates, the tenant and the run key (names,
    not content; quoted, and cut to `_LOGGED_NAME_CHARS`)."""
    tenant, key = split_state_key(state_key)
    names = {"tenant": tenant[:_LOGGED_NAME_CHARS],
             "key": key[:_LOGGED_NAME_CHARS].decode("utf-8", "replace")}
    context: dict[str, object] = dict(names) if record is None else {
        "topic": record.topic, "partition": record.partition, "offset": record.offset,
        **names}
    where = ("" if record is None else f" at {record.topic}[{record.partition}]@{record.offset}"
             ) + f", tenant {names['tenant']!r}, key {names['key']!r}"
    log_exception_kind(log, logging.ERROR, what, error, where, context)

