"""The thread view: each thread's messages and runs, read from the history topic.

`ThreadView` applies history records (docs/topics.md, *History*) one at a time
and keeps, per (tenant, threadId), the ordered list of the thread's messages
(a message id seen again replaces its earlier version in place) and a summary
of each run. It is sans-IO, like `RecordProcessor`: what must persist is kept
in memory (write-behind) and handed out per history partition by
`changes(partition)`, to be sent with that partition's next commit; reads see
those changes at once (an overlay over the stored mapping).

Storage layout, one table (`VIEW_TABLE`), `T` = the thread's key (tenant and
threadId, each length-prefixed so no two threads share a prefix):

* `H T` — the thread's header (JSON): tenant, threadId, history partition,
  message and run counts, first and last record time, and the runs whose
  closing record has not come yet (runId -> time of their first record);
* `M T <u32 position>` — one message (its AG-UI JSON, as in the record);
* `I T <messageId>` — the position of that message id (u32), so a replacement
  rewrites one message entry, never the thread;
* `R T <u32 number>` — one run's summary (JSON: runId, outcome, messageCount,
  firstTime, lastTime);
* `J T <runId>` — the number of that run's summary (u32): a run published twice
  (at-least-once) replaces its summary;
* `P <u32 partition>` — the history offset the view has read up to on that
  partition (i64): records at or below it were applied already and are skipped
  (a replay after a crash); it is also what a consistent read waits for.

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
from typing import Any, Final, Protocol

import orjson
from ag_ui.core import Message
from pydantic import TypeAdapter, ValidationError

from processors.processing.exact_bytes import exact_bytes
from processors.processing.outputs import Incoming
from processors.processing.record_processor import StateChange
from processors.safe_logging import log_exception_kind
from topics.declarations import VIEW_TABLE
from topics.partitioning import default_partition
from topics.records import HistoryMessage, HistoryRun

log = logging.getLogger("agui_stream")

_U32: Final = struct.Struct(">I")
_OFFSET: Final = struct.Struct(">q")
_MESSAGE: Final[TypeAdapter[Any]] = TypeAdapter(Message)
NOTHING_READ: Final = -1  # the read offset of a partition the view has read nothing from


class Missing(enum.Enum):
    """Why a read found nothing."""

    THREAD = "the tenant has no such thread"
    AFTER = "the thread has no message with the id given as `after`"


@dataclass(slots=True)
class ViewCounts:
    """What became of the history records the view was handed."""

    applied: int = 0  # changed the view
    replayed: int = 0  # at or below the partition's read offset: applied before
    threadless: int = 0  # a RUN_ERROR-only run's record (key `<tenant>/`)
    unusable: int = 0  # not a history record the view can use
    expired_threads: int = 0  # removed by the retention


@dataclass(slots=True)
class ThreadHeader:
    tenant: str
    thread_id: str
    partition: int
    messages: int
    runs: int
    first_time: int
    last_time: int
    open_runs: dict[str, int] = field(default_factory=dict)  # runId -> first record time

    def encode(self) -> bytes:
        return orjson.dumps({
            "tenant": self.tenant, "threadId": self.thread_id, "partition": self.partition,
            "messages": self.messages, "runs": self.runs, "firstTime": self.first_time,
            "lastTime": self.last_time, "openRuns": self.open_runs,
        })

    @classmethod
    def decode(cls, value: bytes) -> ThreadHeader:
        fields = orjson.loads(value)
        return cls(fields["tenant"], fields["threadId"], fields["partition"],
                   fields["messages"], fields["runs"], fields["firstTime"],
                   fields["lastTime"], fields["openRuns"])


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


def read_offset_key(partition: int) -> bytes:
    return b"P" + _U32.pack(partition)


def history_partition(tenant: str, thread_id: str, partitions: int) -> int:
    """The history partition of a thread's records: the producer's default
    partitioner (murmur2) on the key `<tenant>/<threadId>`."""
    return default_partition(_utf8(f"{tenant}/{thread_id}"), partitions)


def _utf8(text: str) -> bytes:
    # A query parameter may hold a lone surrogate; it then matches no stored id.
    return text.encode("utf-8", "surrogatepass")


@dataclass(slots=True)
class _Partition:
    read_offset: int
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
                 retention_seconds: float, clock: Callable[[], float] = time.time) -> None:
        self.stored = stored
        self.partitions = partitions
        self.retention_seconds = retention_seconds
        self.clock = clock
        self.counts = ViewCounts()
        self._overlay: dict[bytes, bytes | None] = {}  # newer than `stored`; None: deleted
        self._partitions: dict[int, _Partition] = {}
        self._scanned = False  # the stored headers are all in their partition's `threads`

    # --- records -------------------------------------------------------------------

    def apply(self, record: Incoming) -> None:
        """Apply one history record. Never raises."""
        try:
            part = self._part(record.partition)
            if record.offset <= part.read_offset:
                self.counts.replayed += 1
                return
            part.read_offset = record.offset
            self._put(part, read_offset_key(record.partition), _OFFSET.pack(record.offset))
            parsed = _parse(record)
            if parsed is None:
                self.counts.unusable += 1
                return
            if parsed.threadId is None:
                self.counts.threadless += 1
                return
            if parsed.runId is None:  # every run with a thread has a run id
                self.counts.unusable += 1
                return
            when = (int(self.clock() * 1000) if record.timestamp is None
                    else record.timestamp)
            self._apply(part, record.partition, parsed, parsed.threadId, parsed.runId, when)
            self.counts.applied += 1
        except Exception as error:
            self.counts.unusable += 1
            log_exception_kind(log, logging.ERROR, "could not apply a history record to the"
                               " thread view; it was skipped", error,
                               f" at {record.topic}[{record.partition}]@{record.offset}")

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
        thread = thread_key(tenant, thread_id)
        header = self._header(thread)
        if header is None:
            return Missing.THREAD
        start = 0
        if after is not None:
            position = self._position(message_index_key(thread, after))
            if position is None:
                return Missing.AFTER
            start = position + 1
        return list(self._entries(message_key(thread, p) for p in range(start, header.messages)))

    def runs(self, tenant: str, thread_id: str) -> list[dict[str, Any]] | Missing:
        """The summaries of the thread's runs, in the order their records came."""
        thread = thread_key(tenant, thread_id)
        header = self._header(thread)
        if header is None:
            return Missing.THREAD
        return list(self._entries(run_key(thread, n) for n in range(header.runs)))

    def read_offset(self, partition: int) -> int:
        """The last history offset applied on `partition` (`NOTHING_READ`: none)."""
        return self._part(partition).read_offset

    def has_run(self, tenant: str, thread_id: str, run_id: str) -> bool:
        """Whether the run's closing record is in the view."""
        return self._get(run_index_key(thread_key(tenant, thread_id), run_id)) is not None

    def threads_held(self, partitions: Iterable[int]) -> int:
        """How many threads the view holds on `partitions` (those the worker owns)."""
        self._scan_stored_headers()
        return sum(len(self._part(partition).threads) for partition in partitions)

    def partition_for(self, tenant: str, thread_id: str) -> int:
        return history_partition(tenant, thread_id, self.partitions)

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

    def _apply(self, part: _Partition, partition: int, parsed: HistoryMessage | HistoryRun,
               thread_id: str, run_id: str, when: int) -> None:
        thread = thread_key(parsed.tenant, thread_id)
        header = self._header(thread) or ThreadHeader(parsed.tenant, thread_id, partition,
                                                      0, 0, when, when)
        header.last_time = max(header.last_time, when)
        if isinstance(parsed, HistoryMessage):
            position, header.messages = self._place(
                part, message_index_key(thread, parsed.message["id"]), header.messages)
            self._put(part, message_key(thread, position), orjson.dumps(parsed.message))
            header.open_runs.setdefault(run_id, when)
        else:
            number, header.runs = self._place(part, run_index_key(thread, run_id), header.runs)
            summary = {"runId": run_id, "outcome": parsed.outcome,
                       "messageCount": parsed.messageCount,
                       "firstTime": header.open_runs.pop(run_id, when), "lastTime": when}
            self._put(part, run_key(thread, number), orjson.dumps(summary))
        self._put(part, header_key(thread), header.encode())
        part.threads[thread] = header.last_time

    def _place(self, part: _Partition, index_key: bytes, count: int) -> tuple[int, int]:
        """The position of an id (its earlier one, or a new one at the end; stored in
        the index) and the list's new length."""
        position = self._position(index_key)
        if position is not None:
            return position, count
        self._put(part, index_key, _U32.pack(count))
        return count, count + 1

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

    def _part(self, partition: int) -> _Partition:
        part = self._partitions.get(partition)
        if part is None:
            stored = self._get(read_offset_key(partition))
            offset = NOTHING_READ if stored is None else int(_OFFSET.unpack(stored)[0])
            part = self._partitions[partition] = _Partition(offset)
        return part

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


def _parse(record: Incoming) -> HistoryMessage | HistoryRun | None:
    """The history record, if it is one the view can use: a valid record whose key
    is its tenant and thread, and whose message parses as an AG-UI message."""
    try:
        fields = orjson.loads(record.value)
        if not isinstance(fields, dict):
            return None
        parsed: HistoryMessage | HistoryRun
        if fields.get("kind") == "message":
            parsed = HistoryMessage.model_validate(fields)
            _MESSAGE.validate_python(parsed.message)
        else:
            parsed = HistoryRun.model_validate(fields)
    except (orjson.JSONDecodeError, ValidationError):
        return None
    expected_key = f"{parsed.tenant}/{parsed.threadId or ''}".encode()
    return parsed if record.key == expected_key else None
