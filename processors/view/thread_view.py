"""The thread view: each thread's messages and runs, read from the history topic.

`ThreadView` applies history records (docs/topics.md, *History*; schema v2, and
v1 records still in the topic) one at a time and keeps, per (tenant, threadId),
the thread's messages in order and a summary of each run: exactly what
`topics.history_fold.fold_history` folds from the thread's records (it folds
each record with that module's `fold_content` and `close_run`), with the
ag-ui-protocol models as its `accept` test, so the API only ever holds messages
they parse. It is sans-IO, like `RecordProcessor`: what must persist is kept
in memory (write-behind) and handed out per history partition by
`changes(partition)`, to be sent with that partition's next commit; reads see
those changes at once (an overlay over the stored mapping).

Storage layout, one table (`VIEW_TABLE`), `T` = the thread's key (tenant and
threadId, each length-prefixed so no two threads share a prefix):

* `H T` — the thread's header (JSON): tenant, threadId, history partition,
  message positions and runs used, first and last record time, the runs not
  complete yet (runId -> [time of their first record, 1 + the highest `seq`
  of their content records applied, their closing record's `messageCount`
  or null while it has not come]), and how many runs said `inputEchoed: false`;
* `M T <u32 position>` — one message (its AG-UI JSON); a removed message
  leaves a hole (no entry), so positions never move;
* `I T <messageId>` — the position of that message id (u32), so a replacement
  or a continuation reads and rewrites one message entry, never the thread,
  and a removal deletes that entry and this one;
* `R T <u32 number>` — one run's summary (JSON: runId, the closing fields of
  `close_run` — outcome, messageCount, pendingToolCallIds, interrupts, usage,
  error, failure, inputEchoed, late, those present — firstTime, lastTime);
* `J T <runId>` — the number of that run's summary (u32): a run published twice
  (at-least-once) replaces its summary;
* `P <u32 partition>` — the history offset the view has read up to on that
  partition of the history topic (i64): records at or below it were applied
  already and are skipped (a replay after a crash); it is also what a consistent
  read waits for. With per-tenant topics (topics.tenant_topics) every tenant's
  history topic has its own: `P <u32 partition> <topic>`. A thread is one tenant's,
  so in one topic; writes are handed out per partition number, whose one
  transaction carries every topic's partition of that number.

A run is complete (`run_status`) once its closing record is in and its content
records are: `messageCount` of them (their `seq` counts 0, 1, …). Duplicates are
dropped as the fold drops them: a content record whose run already had its
`seq` (a run's records come in seq order, so "1 + the highest seq" per open run
says which, and a complete run has them all), a closing record after a late
error. So a run published twice (at-least-once, a reprocessing) changes nothing
the second time.

Entries written by the release that read only v1 are read too: a header's open
run as a bare time (complete at its closing record), a summary's `finished`
(answered as `success`).

Times are the history records' timestamps, in milliseconds. It is total:
`apply` and `expire` never raise; a record the view cannot use is counted and
skipped, and nothing about its content is logged.
"""

from __future__ import annotations

import enum
import logging
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, NamedTuple, Protocol

import orjson
from ag_ui.core import Message
from pydantic import TypeAdapter, ValidationError

from processors.processing.exact_bytes import exact_bytes
from processors.processing.outputs import Incoming
from processors.processing.record_processor import StateChange
from processors.safe_logging import log_exception_kind
from topics.declarations import VIEW_TABLE
from topics.history_fold import (
    Closing,
    Content,
    Erasure,
    Fold,
    close_run,
    fold_content,
    read_record,
)
from topics.partitioning import default_partition

log = logging.getLogger("agui_stream")

_U32: Final = struct.Struct(">I")
_OFFSET: Final = struct.Struct(">q")
_MESSAGE: Final[TypeAdapter[Any]] = TypeAdapter(Message)
_EVERY: Final = 2**32  # a limit no thread reaches (positions are u32)
NOTHING_READ: Final = -1  # the read offset of a partition the view has read nothing from


class Missing(enum.Enum):
    """Why a read found nothing."""

    THREAD = "the tenant has no such thread"
    AFTER = "the thread has no entry with the id given as `after`"
    BEFORE = "the thread has no entry with the id given as `before`"


class Page(NamedTuple):
    """Some of a thread's messages or runs, in the order asked for."""

    items: list[dict[str, Any]]
    has_more: bool  # more of them lie beyond the page, in the direction it was read


@dataclass(slots=True)
class ViewCounts:
    """What became of the history records the view was handed."""

    applied: int = 0  # folded into its thread
    replayed: int = 0  # at or below the partition's read offset: applied before
    threadless: int = 0  # a RUN_ERROR-only run's record (key `<tenant>/`)
    unusable: int = 0  # not a history record the view can use
    # A content record of a thread that cannot fold into it (a continuation that
    # cannot apply, a message the ag-ui-protocol models do not parse): the thread's
    # messages are unchanged, its run counts the record as taken in.
    ignored: int = 0
    # A record its run already had (its content record with that seq; a closing
    # record after a late error): an at-least-once duplicate or a reprocessing.
    duplicates: int = 0
    expired_threads: int = 0  # removed by the retention
    erased_threads: int = 0  # removed by an erasure record


@dataclass(frozen=True, slots=True)
class Cursors:
    """Which page to read: `limit` entries after the entry `after` and before the
    entry `before` (ids; None: from the start or to the end), in the list's order,
    oldest first unless `descending`."""

    limit: int
    after: str | None = None
    before: str | None = None
    descending: bool = False


class RunStatus(NamedTuple):
    """A run whose closing record is in the view."""

    summary: dict[str, Any]
    complete: bool  # its content records are all in too


@dataclass(slots=True)
class OpenRun:
    """A run not complete yet: its content records are coming, or its closing record
    has come and counts more content records than have."""

    first_time: int  # of its first record
    # 1 + the highest seq of its content records applied; None: counted by the
    # release that read only v1, which kept no count (complete at its closing record)
    seen: int | None
    expected: int | None = None  # its closing record's messageCount; None: not come

    def encode(self) -> list[int | None]:
        return [self.first_time, self.seen, self.expected]

    @classmethod
    def decode(cls, value: Any) -> OpenRun:
        if isinstance(value, int):  # written by the release that read only v1
            return cls(value, None)
        return cls(*value)


@dataclass(slots=True)
class ThreadHeader:
    tenant: str
    thread_id: str
    partition: int
    messages: int  # message positions used (removed messages leave holes)
    runs: int
    first_time: int
    last_time: int
    open_runs: dict[str, OpenRun] = field(default_factory=dict)
    unechoed_runs: int = 0  # runs whose summary says inputEchoed: false
    # The history offset of the thread's last record applied (None: a header
    # written before the view kept it).
    last_offset: int | None = None

    def encode(self) -> bytes:
        return orjson.dumps({
            "tenant": self.tenant, "threadId": self.thread_id, "partition": self.partition,
            "messages": self.messages, "runs": self.runs, "firstTime": self.first_time,
            "lastTime": self.last_time,
            "openRuns": {run_id: run.encode() for run_id, run in self.open_runs.items()},
            "unechoedRuns": self.unechoed_runs, "lastOffset": self.last_offset,
        })

    @classmethod
    def decode(cls, value: bytes) -> ThreadHeader:
        fields = orjson.loads(value)
        return cls(fields["tenant"], fields["threadId"], fields["partition"],
                   fields["messages"], fields["runs"], fields["firstTime"],
                   fields["lastTime"],
                   {run_id: OpenRun.decode(run) for run_id, run in fields["openRuns"].items()},
                   fields.get("unechoedRuns", 0), fields.get("lastOffset"))


def thread_key(tenant: str, thread_id: str) -> bytes:
    tenant_bytes, thread_bytes = _utf8(tenant), _utf8(thread_id)
    return (_U32.pack(len(tenant_bytes)) + tenant_bytes
            + _U32.pack(len(thread_bytes)) + thread_bytes)


def header_key(thread: bytes) -> bytes:
    return b"H" + thread


def message_key(thread: bytes, position: int) -> bytes:
    return b"M" + thread + _U32.pack(position)


def message_index_key(thread: bytes, message_id: str) -> bytes:
    return b"I" + thread + _utf8(message_id)


def run_key(thread: bytes, number: int) -> bytes:
    return b"R" + thread + _U32.pack(number)


def run_index_key(thread: bytes, run_id: str) -> bytes:
    return b"J" + thread + _utf8(run_id)


def read_offset_key(partition: int, topic: str = "") -> bytes:
    """The shared history topic's keys have no topic (as before per-tenant topics)."""
    return b"P" + _U32.pack(partition) + _utf8(topic)


# A partition of a history topic: (topic, partition).
HistoryPartition = tuple[str, int]


def history_partition(tenant: str, thread_id: str, partitions: int) -> int:
    """The history partition of a thread's records: the producer's default
    partitioner (murmur2) on the key `<tenant>/<threadId>`."""
    return default_partition(_utf8(f"{tenant}/{thread_id}"), partitions)


def _utf8(text: str) -> bytes:
    # A query parameter may hold a lone surrogate; it then matches no stored id.
    return text.encode("utf-8", "surrogatepass")


@dataclass(slots=True)
class _Partition:
    read_offsets: dict[str, int]  # per history topic, loaded as it is first read
    # thread key -> its last record time (ms): expiry compares times, decodes nothing
    threads: dict[bytes, int] = field(default_factory=dict)
    dirty: dict[bytes, None] = field(default_factory=dict)  # entries to hand out


class Persisted(Protocol):
    """An entry as persisted: a `StateChange`, or the worker's record of one sent."""

    @property
    def key(self) -> bytes: ...

    @property
    def value(self) -> bytes | None: ...


class ThreadView:
    """Applies the history records of the partitions a worker owns; see the module
    docstring. `stored` is the table as committed; `clock` (seconds) dates records
    that carry no timestamp."""

    def __init__(self, stored: Mapping[bytes, bytes], *, partitions: int,
                 retention_seconds: float, clock: Callable[[], float] = time.time,
                 history_topic: str = "agui.history",
                 tenant_topic: Callable[[str], str | None] | None = None) -> None:
        """`history_topic`: the shared one; `tenant_topic`: each tenant's own, with
        per-tenant topics (None: a tenant's name too long for one)."""
        self.stored = stored
        self.partitions = partitions
        self.history_topic = history_topic
        self.tenant_topic = tenant_topic
        self.retention_seconds = retention_seconds
        self.clock = clock
        self.counts = ViewCounts()
        self._overlay: dict[bytes, bytes | None] = {}  # newer than `stored`; None: deleted
        self._partitions: dict[int, _Partition] = {}
        self._scanned = False  # the stored headers are all in their partition's `threads`

    # --- records -------------------------------------------------------------------

    def apply(self, record: Incoming) -> bytes | None:
        """Apply one history record; the key (`thread_key`) of the thread it concerned,
        if any. Never raises."""
        try:
            part = self._part(record.partition)
            if record.offset <= self._read_offset(part, record.topic, record.partition):
                self.counts.replayed += 1
                return None
            part.read_offsets[record.topic] = record.offset
            self._put(part, self._read_offset_key(record.topic, record.partition),
                      _OFFSET.pack(record.offset))
            parsed = _parse(record)
            if parsed is None:
                self.counts.unusable += 1
                return None
            if isinstance(parsed, Erasure):
                thread = thread_key(parsed.tenant, parsed.thread_id)
                self._erase(part, thread)
                return thread
            if parsed.thread_id is None:
                self.counts.threadless += 1
                return None
            if parsed.run_id is None:  # every run with a thread has a run id
                self.counts.unusable += 1
                return None
            when = (int(self.clock() * 1000) if record.timestamp is None
                    else record.timestamp)
            thread = thread_key(parsed.tenant, parsed.thread_id)
            outcome = self._apply(part, record, parsed, thread, parsed.thread_id,
                                  parsed.run_id, when)
            if outcome is Fold.IGNORED:
                self.counts.ignored += 1
            elif outcome is _DUPLICATE:
                self.counts.duplicates += 1
            else:
                self.counts.applied += 1
            return thread
        except Exception as error:
            self.counts.unusable += 1
            log_exception_kind(log, logging.ERROR, "could not apply a history record to the"
                               " thread view; it was skipped", error,
                               f" at {record.topic}[{record.partition}]@{record.offset}")
            return None

    def expire(self, partition: int, now: float) -> None:
        """Remove the partition's threads whose last record is older than the
        retention (`now` in seconds), every entry of them. Never raises."""
        cutoff = int((now - self.retention_seconds) * 1000)
        try:
            part = self._part(partition)
            self._scan_stored_headers()
            for thread, last_time in list(part.threads.items()):
                if last_time >= cutoff:
                    continue
                header = self._header(thread)
                if header is not None:
                    self._delete_thread(part, thread, header)
                    self.counts.expired_threads += 1
                del part.threads[thread]
        except Exception as error:
            log_exception_kind(log, logging.ERROR, "could not expire the threads of a"
                               " partition of the thread view", error, f" on [{partition}]")

    # --- reads ---------------------------------------------------------------------

    def messages(self, tenant: str, thread_id: str,
                 after: str | None = None) -> list[dict[str, Any]] | Missing:
        """The thread's messages in order, or only those after the message `after`."""
        page = self.message_page(tenant, thread_id, Cursors(_EVERY, after))
        return page if isinstance(page, Missing) else page.items

    def runs(self, tenant: str, thread_id: str) -> list[dict[str, Any]] | Missing:
        """The summaries of the thread's runs, in the order of their first closing
        record."""
        page = self.run_page(tenant, thread_id, Cursors(_EVERY))
        return page if isinstance(page, Missing) else page.items

    def message_page(self, tenant: str, thread_id: str, cursors: Cursors) -> Page | Missing:
        """A page of the thread's messages; `cursors` name message ids."""
        thread = thread_key(tenant, thread_id)
        header = self._header(thread)
        if header is None:
            return Missing.THREAD
        return self._page(header.messages, partial(message_key, thread),
                          partial(message_index_key, thread), cursors, _as_stored)

    def run_page(self, tenant: str, thread_id: str, cursors: Cursors) -> Page | Missing:
        """A page of the thread's run summaries (in the order of their first closing
        record); `cursors` name run ids."""
        thread = thread_key(tenant, thread_id)
        header = self._header(thread)
        if header is None:
            return Missing.THREAD
        return self._page(header.runs, partial(run_key, thread), partial(run_index_key, thread),
                          cursors, _current)

    def thread_offset(self, tenant: str, thread_id: str) -> int | None:
        """The history offset of the thread's last record the view applied; None for no
        thread. (A header written before the view kept it answers its partition's.)"""
        header = self._header(thread_key(tenant, thread_id))
        if header is None:
            return None
        if header.last_offset is None:
            return self.read_offset(self.partition_for(tenant, thread_id))
        return header.last_offset

    def unechoed_runs(self, tenant: str, thread_id: str) -> int:
        """How many of the thread's runs said `inputEchoed: false` (their RUN_STARTED
        carried no input: the thread may lack user messages); 0 for no thread."""
        header = self._header(thread_key(tenant, thread_id))
        return 0 if header is None else header.unechoed_runs

    def read_offset(self, partition: HistoryPartition) -> int:
        """The last history offset applied on `partition` (`NOTHING_READ`: none)."""
        topic, number = partition
        return self._read_offset(self._part(number), topic, number)

    def reach(self, topic: str, partition: int) -> int | None:
        """The offset after the last history record of (`topic`, `partition`) the view
        has applied or read since the partitions last moved: how far a commit may take
        the partition's offset (the records before it are in the changes handed out).
        None: nothing of it applied since (its committed offset stays)."""
        part = self._partitions.get(partition)
        offset = None if part is None else part.read_offsets.get(topic)
        return None if offset is None else offset + 1

    def run_status(self, tenant: str, thread_id: str, run_id: str) -> RunStatus | None:
        """The run's summary and whether it is complete; None while its closing record
        is not in the view."""
        thread = thread_key(tenant, thread_id)
        number = self._position(run_index_key(thread, run_id))
        if number is None:
            return None
        summary = self._get(run_key(thread, number))
        header = self._header(thread)
        if summary is None or header is None:
            return None
        return RunStatus(_current(orjson.loads(summary)), run_id not in header.open_runs)

    def threads_held(self, partitions: Iterable[int]) -> int:
        """How many threads the view holds on `partitions` (those the worker owns)."""
        self._scan_stored_headers()
        return sum(len(self._part(partition).threads) for partition in partitions)

    def partition_for(self, tenant: str, thread_id: str) -> HistoryPartition:
        """Where the thread's records are ("" as the topic: the tenant has none)."""
        topic = (self.history_topic if self.tenant_topic is None
                 else self.tenant_topic(tenant) or "")
        return topic, history_partition(tenant, thread_id, self.partitions)

    # --- write-behind ----------------------------------------------------------------

    def dirty_partitions(self) -> list[int]:
        return [number for number, part in self._partitions.items() if part.dirty]

    def changes(self, partition: int) -> list[StateChange]:
        """What the partition's records changed since the last call, to persist with
        its next commit: each changed entry once, with its latest value."""
        part = self._partitions.get(partition)
        if part is None or not part.dirty:
            return []
        changes = [StateChange(VIEW_TABLE, key, self._get(key)) for key in part.dirty]
        part.dirty.clear()
        return changes

    def changes_applied(self, changes: Iterable[Persisted]) -> None:
        """`changes` are in the stored mapping now: reads go to it for the entries not
        changed again since (an entry changed back to the same value may go too)."""
        for change in changes:
            if change.key in self._overlay and self._overlay[change.key] == change.value:
                del self._overlay[change.key]

    def forget(self) -> None:
        """Partitions moved: drop everything in memory (the stored table is the truth).

        Changes not yet applied are dropped too: the records that made them are
        delivered again from the committed offset."""
        self._overlay.clear()
        self._partitions.clear()
        self._scanned = False

    # --- internals -------------------------------------------------------------------

    def _apply(self, part: _Partition, record: Incoming, parsed: Content | Closing,
               thread: bytes, thread_id: str, run_id: str, when: int) -> object:
        """Fold the record into its thread (`thread` is its `thread_key`): `Fold.IGNORED`
        if it could not fold, `_DUPLICATE` if its run had it already (only the thread's
        offset changes), else None."""
        header = self._header(thread) or ThreadHeader(parsed.tenant, thread_id,
                                                      record.partition, 0, 0, when, when)
        header.last_offset = record.offset  # what `min_offset` waits for, duplicate or not
        outcome: object = None
        if isinstance(parsed, Content):
            if not self._taken_in(thread, header, run_id, parsed.seq, when):
                outcome = _DUPLICATE
            elif not self._fold(part, thread, header, parsed):
                outcome = Fold.IGNORED
        elif not self._close(part, thread, header, run_id, parsed.fields, when):
            outcome = _DUPLICATE
        if outcome is not _DUPLICATE:
            header.last_time = max(header.last_time, when)
        self._put(part, header_key(thread), header.encode())
        part.threads[thread] = header.last_time
        return outcome

    def _fold(self, part: _Partition, thread: bytes, header: ThreadHeader,
              record: Content) -> bool:
        """`fold_content` on the stored thread: reads the held message only for a
        continuation, and writes the one message entry (and index) it changes."""
        index = message_index_key(thread, record.message_id)
        position = self._position(index)
        held: dict[str, Any] | None = None
        if position is not None:
            if record.kind == "continuation":
                stored = self._get(message_key(thread, position))
                held = None if stored is None else orjson.loads(stored)
            else:
                held = _HELD_UNREAD
        folded = fold_content(record, held, parses_as_message)
        if isinstance(folded, dict):
            if position is None:
                position = header.messages
                header.messages += 1
                self._put(part, index, _U32.pack(position))
            self._put(part, message_key(thread, position), orjson.dumps(folded))
        elif folded is Fold.REMOVED and position is not None:
            self._put(part, message_key(thread, position), None)
            self._put(part, index, None)
        return folded is not Fold.IGNORED

    def _taken_in(self, thread: bytes, header: ThreadHeader, run_id: str, seq: int,
                  when: int) -> bool:
        """A content record of the run is in: count it towards the run's completion.
        False if the run had it already: the fold's (runId, seq) identity, kept as
        "1 + the highest seq", since a run's records come in seq order (they are
        written in one transaction), and as nothing once the run is complete."""
        run = header.open_runs.get(run_id)
        if run is None:
            if self._get(run_index_key(thread, run_id)) is not None:
                return False  # complete already: a duplicate, or the run published again
            run = header.open_runs[run_id] = OpenRun(when, 0)
        elif run.seen is not None and seq < run.seen:
            return False
        if run.seen is not None:
            run.seen = seq + 1
        if run.expected is not None and (run.seen is None or run.seen >= run.expected):
            del header.open_runs[run_id]
        return True

    def _close(self, part: _Partition, thread: bytes, header: ThreadHeader, run_id: str,
               fields: dict[str, Any], when: int) -> bool:
        """A closing record: the run's summary becomes its fate (`close_run`). False
        if the run's fate is a late error already (final: a duplicate)."""
        index = run_index_key(thread, run_id)
        number = self._position(index)
        previous: dict[str, Any] | None = None
        if number is not None:
            stored = self._get(run_key(thread, number))
            previous = None if stored is None else orjson.loads(stored)
            if previous is not None and previous.get("late") is True:
                return False
        else:
            number = header.runs
            header.runs += 1
            self._put(part, index, _U32.pack(number))
        fate = close_run(previous, fields)
        run = header.open_runs.get(run_id)
        count = fate.get("messageCount")
        if run is not None:
            first_time = run.first_time
            if count is None or run.seen is None or run.seen >= count:
                del header.open_runs[run_id]
            else:
                run.expected = count
        else:
            first_time = when if previous is None else previous["firstTime"]
            if previous is None and count:  # its content records have not come (yet)
                header.open_runs[run_id] = OpenRun(when, 0, count)
        if previous is not None and previous.get("inputEchoed") is False:
            header.unechoed_runs -= 1
        if fate.get("inputEchoed") is False:
            header.unechoed_runs += 1
        summary = {"runId": run_id, **fate, "firstTime": first_time, "lastTime": when}
        self._put(part, run_key(thread, number), orjson.dumps(summary))
        return True

    def _delete_thread(self, part: _Partition, thread: bytes, header: ThreadHeader) -> None:
        for position in range(header.messages):
            message = self._get(message_key(thread, position))
            if message is not None:
                self._put(part, message_index_key(thread, orjson.loads(message)["id"]), None)
            self._put(part, message_key(thread, position), None)
        for number in range(header.runs):
            summary = self._get(run_key(thread, number))
            if summary is not None:
                self._put(part, run_index_key(thread, orjson.loads(summary)["runId"]), None)
            self._put(part, run_key(thread, number), None)
        self._put(part, header_key(thread), None)

    def _page(self, count: int, entry_key: Callable[[int], bytes],
              index_key: Callable[[str], bytes], cursors: Cursors,
              current: Callable[[dict[str, Any]], dict[str, Any]]) -> Page | Missing:
        """Up to `cursors.limit` entries of positions [0, count) in the order asked for,
        between the cursors (exclusive); read from the `after` side, or from the
        `before` side when only `before` is given (the entries nearest to it)."""
        low, high = 0, count
        for cursor, missing, is_low in ((cursors.after, Missing.AFTER, not cursors.descending),
                                        (cursors.before, Missing.BEFORE, cursors.descending)):
            if cursor is None:
                continue
            position = self._position(index_key(cursor))
            if position is None:
                return missing
            if is_low:
                low = max(low, position + 1)
            else:
                high = min(high, position)
        from_after_side = cursors.after is not None or cursors.before is None
        upward = from_after_side != cursors.descending
        positions = range(low, high) if upward else range(high - 1, low - 1, -1)
        items: list[dict[str, Any]] = []
        for position in positions:
            value = self._get(entry_key(position))
            if value is None:  # a removed message's hole
                continue
            if len(items) == cursors.limit:
                return Page(items if from_after_side else items[::-1], True)
            items.append(current(orjson.loads(value)))
        return Page(items if from_after_side else items[::-1], False)

    def _erase(self, part: _Partition, thread: bytes) -> None:
        """An erasure record: the thread's every entry goes (there may be none: erased
        twice, expired, never seen)."""
        header = self._header(thread)
        if header is not None:
            self._delete_thread(part, thread, header)
        part.threads.pop(thread, None)
        self.counts.erased_threads += 1

    def _part(self, partition: int) -> _Partition:
        part = self._partitions.get(partition)
        if part is None:
            part = self._partitions[partition] = _Partition({})
        return part

    def _read_offset_key(self, topic: str, partition: int) -> bytes:
        return read_offset_key(partition, "" if topic == self.history_topic else topic)

    def _read_offset(self, part: _Partition, topic: str, partition: int) -> int:
        offset = part.read_offsets.get(topic)
        if offset is None:
            stored = self._get(self._read_offset_key(topic, partition))
            offset = NOTHING_READ if stored is None else int(_OFFSET.unpack(stored)[0])
            part.read_offsets[topic] = offset
        return offset

    def _scan_stored_headers(self) -> None:
        """Once after `forget`: put every stored thread in its partition's index, with
        its last record time, so that expiring a partition never reads every key (nor
        decodes every header) again."""
        if self._scanned:
            return
        for key, value in self.stored.items():  # no writes meanwhile: synchronous
            if key[:1] != b"H" or key in self._overlay:
                continue
            try:
                header = ThreadHeader.decode(value)
            except Exception:  # not a header this code wrote: left as it is
                continue
            self._part(header.partition).threads[key[1:]] = header.last_time
        self._scanned = True

    def _get(self, key: bytes) -> bytes | None:
        if key in self._overlay:
            return self._overlay[key]
        return self.stored.get(key)

    def _put(self, part: _Partition, key: bytes, value: bytes | None) -> None:
        self._overlay[key] = None if value is None else exact_bytes(value)
        part.dirty[key] = None

    def _header(self, thread: bytes) -> ThreadHeader | None:
        value = self._get(header_key(thread))
        return None if value is None else ThreadHeader.decode(value)

    def _position(self, index_key: bytes) -> int | None:
        value = self._get(index_key)
        return None if value is None else int(_U32.unpack(value)[0])

    def _entries(self, keys: Iterator[bytes]) -> Iterator[dict[str, Any]]:
        for key in keys:
            value = self._get(key)
            if value is not None:
                yield orjson.loads(value)


_DUPLICATE: Final = object()  # what `_apply` says of a record its run had already
# What `_fold` passes as the held message when the record's kind does not read it.
_HELD_UNREAD: Final[dict[str, Any]] = {}


def parses_as_message(message: dict[str, Any]) -> bool:
    """The view's `accept`: the message parses with the ag-ui-protocol models (what the
    API promises of every message it answers)."""
    try:
        _MESSAGE.validate_python(message)
    except ValidationError:
        return False
    return True


def _as_stored(message: dict[str, Any]) -> dict[str, Any]:
    return message


def _current(summary: dict[str, Any]) -> dict[str, Any]:
    """A stored run summary as this release answers it (the release that read only v1
    stored `finished` for `success`)."""
    if summary.get("outcome") == "finished":
        return {**summary, "outcome": "success"}
    return summary


def _parse(record: Incoming) -> Content | Closing | Erasure | None:
    """The history record, if it is one the view can use (`read_record`), under the
    key of its tenant and thread."""
    try:
        fields = orjson.loads(record.value)
    except orjson.JSONDecodeError:
        return None
    parsed = read_record(fields)
    if parsed is None:
        return None
    expected_key = f"{parsed.tenant}/{parsed.thread_id or ''}".encode()
    return parsed if record.key == expected_key else None
