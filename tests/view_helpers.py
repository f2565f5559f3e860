"""History records for the thread view's tests: v2 runs of every content kind,
closing records (late ones too), and v1 records as the release before wrote them."""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson

from processors.processing.outputs import Incoming
from processors.processing.record_processor import StateChange
from processors.view.thread_view import ThreadView
from topics.records import ContentKind, HistoryMessage, HistoryRemoval, HistoryRun

HISTORY = "agui.history"
T0 = 1_700_000_000_000  # ms
RETENTION = 30 * 86_400.0


def user(message_id: str, content: str = "hi") -> dict[str, Any]:
    return {"id": message_id, "role": "user", "content": content}


def assistant(message_id: str, content: str = "hello") -> dict[str, Any]:
    return {"id": message_id, "role": "assistant", "content": content}


@dataclass(frozen=True, slots=True)
class Content:
    """A run's content record other than a plain `message` one."""

    kind: str  # a ContentKind, or "removal"
    message: dict[str, Any] | None = None
    message_id: str | None = None  # a removal's


def as_input(message: dict[str, Any]) -> Content:
    return Content("input", message)


def continued(message: dict[str, Any]) -> Content:
    return Content("continuation", message)


def removed(message_id: str) -> Content:
    return Content("removal", message_id=message_id)


def content_value(tenant: str, thread: str | None, run_id: str | None, seq: int,
                  item: dict[str, Any] | Content) -> bytes:
    """The value of a v2 content record (a plain dict: a `message` record)."""
    if isinstance(item, dict):
        return HistoryMessage.encode(tenant, thread, run_id, seq, item)
    if item.kind == "removal":
        assert item.message_id is not None
        return HistoryRemoval(tenant=tenant, threadId=thread, runId=run_id, seq=seq,
                              messageId=item.message_id).to_bytes()
    assert item.message is not None and item.kind in ("message", "input", "continuation")
    return HistoryMessage.encode(tenant, thread, run_id, seq, item.message,
                                 cast(ContentKind, item.kind))


def closing_value(tenant: str, thread: str | None, run_id: str | None,
                  **fields: Any) -> bytes:
    """The value of a v2 closing record (`outcome` defaults to success)."""
    fields.setdefault("outcome", "success")
    return HistoryRun(tenant=tenant, threadId=thread, runId=run_id, **fields).to_bytes()


def v1_run_values(tenant: str, thread: str, run_id: str, messages: list[dict[str, Any]],
                  outcome: str = "finished") -> list[bytes]:
    """A run as the release before wrote it: `agui.history.v1`."""
    envelope = {"schema": "agui.history.v1", "tenant": tenant, "threadId": thread,
                "runId": run_id}
    return [*(orjson.dumps({**envelope, "kind": "message", "seq": seq, "message": m})
              for seq, m in enumerate(messages)),
            orjson.dumps({**envelope, "kind": "run", "outcome": outcome,
                          "messageCount": len(messages)})]


class History:
    """Writes one partition's history records, offsets counting up."""

    def __init__(self, partition: int = 0) -> None:
        self.partition = partition
        self.offset = 0

    def record(self, key: bytes, value: bytes, timestamp: int | None = T0) -> Incoming:
        record = Incoming(HISTORY, self.partition, self.offset, timestamp, key, value, [])
        self.offset += 1
        return record

    def run(self, thread: str, run_id: str, content: Sequence[dict[str, Any] | Content], *,
            outcome: str = "success", tenant: str = "acme", at: int = T0,
            **closing: Any) -> list[Incoming]:
        """A run's content records (in the order given: removals, then inputs, then
        messages and continuations, as the worker writes them) and its closing record
        (`messageCount` counts them unless given; `closing` adds fields)."""
        key = f"{tenant}/{thread}".encode()
        records = [self.record(key, content_value(tenant, thread, run_id, seq, item), at)
                   for seq, item in enumerate(content)]
        closing.setdefault("messageCount", len(content))
        value = closing_value(tenant, thread, run_id, outcome=outcome, **closing)
        return [*records, self.record(key, value, at + 5)]

    def late_error(self, thread: str, run_id: str, *, tenant: str = "acme", at: int = T0,
                   message: str = "failed after all") -> Incoming:
        """A RUN_ERROR after the run had finished: its second closing record."""
        return self.record(f"{tenant}/{thread}".encode(), closing_value(
            tenant, thread, run_id, outcome="error", late=True,
            error={"message": message}), at)

    def v1_run(self, thread: str, run_id: str, messages: list[dict[str, Any]], *,
               outcome: str = "finished", tenant: str = "acme",
               at: int = T0) -> list[Incoming]:
        key = f"{tenant}/{thread}".encode()
        values = v1_run_values(tenant, thread, run_id, messages, outcome)
        return [self.record(key, value, at if n < len(messages) else at + 5)
                for n, value in enumerate(values)]


def feed(view: ThreadView, records: list[Incoming]) -> None:
    for record in records:
        view.apply(record)


class Store:
    """The committed table as a dict; counts full scans (`items()`)."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.scans = 0

    def view(self, clock: float = T0 / 1000) -> ThreadView:
        return ThreadView(ScanCounting(self), partitions=4, retention_seconds=RETENTION,
                          clock=lambda: clock)

    def commit(self, view: ThreadView) -> list[StateChange]:
        changes = [change for partition in view.dirty_partitions()
                   for change in view.changes(partition)]
        self.apply(view, changes)
        return changes

    def apply(self, view: ThreadView, changes: list[StateChange]) -> None:
        for change in changes:
            if change.value is None:
                self.data.pop(change.key, None)
            else:
                self.data[change.key] = change.value
        view.changes_applied(changes)


class ScanCounting(Mapping[bytes, bytes]):
    """The store's dict, read through a mapping that counts `items()` calls."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __getitem__(self, key: bytes) -> bytes:
        return self.store.data[key]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.store.data)

    def __len__(self) -> int:
        return len(self.store.data)

    def items(self) -> ItemsView[bytes, bytes]:
        self.store.scans += 1
        return self.store.data.items()
