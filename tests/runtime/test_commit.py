"""A commit's sends, without a broker."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from processors.processing.outputs import Outgoing
from processors.processing.record_processor import StateChange
from processors.runtime.commit import PartitionBatch, WorkerCommitBatch
from processors.runtime.faust_adaptations import OutRecord, Placed


class _Producer:
    """`send_batched` as the worker's producer answers it: a delivery per call, each
    record's place in the call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, list[OutRecord]]] = []

    async def send_batched(self, records: list[OutRecord],
                           transactional_id: str | None) -> list[Placed]:
        self.calls.append((transactional_id, records))
        delivery: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        delivery.set_result(SimpleNamespace(call=len(self.calls) - 1))
        return [(delivery, place) for place in range(len(records))]


def _part(partition: int, transaction: str | None) -> PartitionBatch:
    return PartitionBatch(partition, transaction,
                          [Outgoing("history", f"thread{partition}".encode(), b"{}", [])],
                          [StateChange("runs", f"run{partition}".encode(), b"state")])


def _sent(parts: list[PartitionBatch]) -> tuple[_Producer, WorkerCommitBatch]:
    producer = _Producer()
    tables = {"runs": SimpleNamespace(
        changelog_topic=SimpleNamespace(get_topic_name=lambda: "runs-changelog"))}
    batch = WorkerCommitBatch(parts, cast(Any, producer), cast(Any, tables), cast(Any, None),
                              cast(Any, None), cast(Any, None), {})
    asyncio.run(batch.send())
    return producer, batch


def test_the_parts_of_one_transaction_are_sent_in_one_call() -> None:
    """With one transaction per worker, each partition's records went in a call of
    their own: two partitions writing one history partition made the second wait
    until the first's batch was sent (aiokafka queues one batch per partition), one
    after another, and commits of 80 partitions took seconds. One call makes one
    batch per partition written; each change keeps its own record's place."""
    parts = [_part(partition, "worker-tx") for partition in range(3)]
    producer, batch = _sent(parts)
    assert [transaction for transaction, _records in producer.calls] == ["worker-tx"]
    _transaction, records = producer.calls[0]
    assert [(record.topic, record.key) for record in records] == [
        (topic, f"{name}{partition}".encode()) for partition in range(3)
        for topic, name in (("history", "thread"), ("runs-changelog", "run"))]
    for change, (_delivery, place) in batch._sent:
        assert records[place].key == change.key


def test_each_partition_s_own_transaction_is_sent_apart() -> None:
    parts = [_part(partition, f"tx-{partition}") for partition in range(3)]
    producer, batch = _sent(parts)
    assert [transaction for transaction, _records in producer.calls] == ["tx-0", "tx-1", "tx-2"]
    assert [(change.key, delivery.result().call, place)
            for change, (delivery, place) in batch._sent] == [
        (b"run0", 0, 1), (b"run1", 1, 1), (b"run2", 2, 1)]
