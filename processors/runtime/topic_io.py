"""Plain reads and writes of whole topics, for the tools (the demo): produce keyed
records, and read back every committed record of a topic."""

from __future__ import annotations

import time
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from processors.config import Settings
from processors.runtime.kafka_client import aiokafka_options

Headers = list[tuple[str, bytes]]


async def produce(settings: Settings, topic: str,
                  records: Iterable[tuple[bytes, bytes, Headers]]) -> None:
    """Send (key, value, headers) records in order, idempotently, and wait until the
    broker has every one."""
    producer = AIOKafkaProducer(**aiokafka_options(settings), linger_ms=5,
                                enable_idempotence=True)
    await producer.start()
    try:
        for key, value, headers in records:
            await producer.send(topic, value=value, key=key, headers=headers)
        await producer.flush()
    finally:
        await producer.stop()


async def read_committed(settings: Settings, topic: str,
                         timeout: float = 30) -> list[tuple[bytes | None, int]]:
    """Every committed record of `topic` up to its end when called (its value and
    partition), partition by partition; what `timeout` seconds did not read is left."""
    consumer = AIOKafkaConsumer(**aiokafka_options(settings), isolation_level="read_committed",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        found: list[tuple[bytes | None, int]] = []
        deadline = time.monotonic() + timeout
        for tp in tps:
            while await consumer.position(tp) < ends[tp] and time.monotonic() < deadline:
                batch = await consumer.getmany(tp, timeout_ms=1000)
                found += [(message.value, tp.partition) for message in batch.get(tp, [])]
        return found
    finally:
        await consumer.stop()
