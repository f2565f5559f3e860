"""The broker behind ``kafka_bootstrap`` really works: topics, produce/consume, transactions."""

import asyncio
import uuid
from collections.abc import Awaitable
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

T = TypeVar("T")
DEADLINE_S = 90.0


def run(coro: Awaitable[T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, DEADLINE_S)

    return asyncio.run(bounded())


async def create_topic(bootstrap: str, partitions: int) -> str:
    name = f"test-broker-{uuid.uuid4().hex[:12]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(name=name, num_partitions=partitions, replication_factor=1)]
        )
        # Topic metadata reaches the broker's cache shortly after creation
        # (KRaft): wait for it to be listed, bounded by run()'s deadline.
        delay = 0.05
        while name not in await admin.list_topics():
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
    finally:
        await admin.close()
    return name


async def read_to_end(
    bootstrap: str, topic: str, partitions: int, isolation_level: str = "read_uncommitted"
) -> list[Any]:
    """All records of ``topic`` up to its current end (the LSO for read_committed)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=isolation_level,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        records: list[Any] = []

        async def behind() -> bool:
            return any([await consumer.position(tp) < ends[tp] for tp in tps])

        while await behind():
            batches = await consumer.getmany(*tps, timeout_ms=500)
            for batch in batches.values():
                records.extend(batch)
        return records
    finally:
        await consumer.stop()


def test_produce_and_consume_100_records(kafka_bootstrap: str) -> None:
    async def scenario() -> None:
        topic = await create_topic(kafka_bootstrap, partitions=3)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            futures = [
                await producer.send(topic, key=f"k{i % 7}".encode(), value=f"v{i}".encode())
                for i in range(100)
            ]
            acked = {((m := await fut).partition, m.offset) for fut in futures}
        finally:
            await producer.stop()

        records = await read_to_end(kafka_bootstrap, topic, 3)
        assert len(records) == 100
        assert sorted(r.value for r in records) == sorted(f"v{i}".encode() for i in range(100))
        # Same key -> same partition, in send order.
        by_key: dict[bytes, list[int]] = {}
        for r in records:
            by_key.setdefault(r.key, []).append(int(r.value[1:]))
        for key, values in by_key.items():
            k = int(key[1:])
            assert values == [i for i in range(100) if i % 7 == k]
            assert len({r.partition for r in records if r.key == key}) == 1
        assert {(r.partition, r.offset) for r in records} == acked

    run(scenario())


def test_transactional_producer_read_committed(kafka_bootstrap: str) -> None:
    async def scenario() -> None:
        topic = await create_topic(kafka_bootstrap, partitions=2)
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap,
            transactional_id=f"test-txn-{uuid.uuid4().hex[:8]}",
            enable_idempotence=True,
        )
        await producer.start()
        try:
            await producer.begin_transaction()
            for i in range(5):
                await producer.send(topic, key=b"k", value=f"aborted-{i}".encode())
            await producer.abort_transaction()

            async with producer.transaction():
                for i in range(10):
                    await producer.send(topic, key=b"k", value=f"committed-{i}".encode())
        finally:
            await producer.stop()

        committed = await read_to_end(kafka_bootstrap, topic, 2, "read_committed")
        assert [r.value for r in committed] == [f"committed-{i}".encode() for i in range(10)]

        everything = await read_to_end(kafka_bootstrap, topic, 2, "read_uncommitted")
        assert sorted(r.value for r in everything) == sorted(
            [f"aborted-{i}".encode() for i in range(5)]
            + [f"committed-{i}".encode() for i in range(10)]
        )

    run(scenario())
