"""History records for the thread view's tests."""

from __future__ import annotations

from typing import Any

from processors.processing.outputs import Incoming
from processors.view.thread_view import ThreadView
from topics.records import HistoryMessage, HistoryRun

HISTORY = "agui.history"
T0 = 1_700_000_000_000  # ms


def user(message_id: str, content: str = "hi") -> dict[str, Any]:
    return {"id": message_id, "role": "user", "content": content}


def assistant(message_id: str, content: str = "hello") -> dict[str, Any]:
    return {"id": message_id, "role": "assistant", "content": content}


class History:
    """Writes one partition's history records, offsets counting up."""

    def __init__(self, partition: int = 0) -> None:
        self.partition = partition
        self.offset = 0

    def record(self, key: bytes, value: bytes, timestamp: int | None = T0) -> Incoming:
        record = Incoming(HISTORY, self.partition, self.offset, timestamp, key, value, [])
        self.offset += 1
        return record

    def run(self, thread: str, run_id: str, messages: list[dict[str, Any]], *,
            outcome: str = "success", tenant: str = "acme", at: int = T0) -> list[Incoming]:
        key = f"{tenant}/{thread}".encode()
        records = [self.record(key, HistoryMessage.encode(tenant, thread, run_id, seq, m), at)
                   for seq, m in enumerate(messages)]
        closing = HistoryRun(tenant=tenant, threadId=thread, runId=run_id, outcome=outcome,
                             messageCount=len(messages)).to_bytes()
        return [*records, self.record(key, closing, at + 5)]


def feed(view: ThreadView, records: list[Incoming]) -> None:
    for record in records:
        view.apply(record)
