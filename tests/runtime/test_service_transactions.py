"""The worker's transactional send and commit, on a real broker, in the states a failed
commit and a stop leave.

A rebalance can fail a commit after it ended a partition's transaction and
before Faust began the next one; every later send of that partition then
raised `IllegalOperation` and the agent crash-looped. `CommitProducer.send_batched`
must begin the transaction itself, and what it sends must commit; it sends whole
batches, and each record's place must be where the record landed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import faust
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalOperation
from aiokafka.partitioner import DefaultPartitioner
from faust.transport.drivers import aiokafka as faust_aiokafka

from processors.runtime.faust_adaptations import AdaptedApp, OutRecord
from tests.service_harness import TopicReader, create_topic


@asynccontextmanager
async def _producer_in_a_transaction(bootstrap: str, app_class: type[faust.App],
                                     ) -> AsyncIterator[tuple[Any, str]]:
    """A started exactly-once producer of a fresh app, and a transaction it began."""
    app = app_class(f"txn-{uuid.uuid4().hex[:8]}", broker=f"kafka://{bootstrap}",
                    processing_guarantee="exactly_once", autodiscover=False)
    producer = app.producer
    await producer.start()
    transactional_id = f"{app.conf.id}-0-0"
    try:
        await producer.maybe_begin_transaction(transactional_id)
        yield producer, transactional_id
    finally:
        await producer.stop_transaction(transactional_id)
        await producer.stop()


async def _send_between_transactions(bootstrap: str, topic: str,
                                     repair: bool) -> None:
    app_class = AdaptedApp if repair else faust.App
    async with _producer_in_a_transaction(bootstrap, app_class) as (producer, transactional_id):
        # What a commit that fails before beginning the next transaction leaves.
        await producer.commit_transaction(transactional_id)
        if repair:
            await producer.send_batched([OutRecord(topic, 0, b"key", b"{}", [("h", b"1")])],
                                        transactional_id)
        else:
            await producer.send(topic, b"key", b"{}", 0, None, None,
                                transactional_id=transactional_id)
        await producer.commit_transaction(transactional_id)


def test_a_send_between_transactions_begins_one_and_commits(kafka_bootstrap: str) -> None:
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 1)
    asyncio.run(_send_between_transactions(kafka_bootstrap, topic, repair=True))
    reader = TopicReader(kafka_bootstrap, topic, partitions=1)
    # The broker writes the commit markers after answering EndTxn: the record
    # becomes readable (read_committed) a moment after the commit returns.
    records = reader.wait_until(lambda recs: len(recs) > 0, 30, "the committed record")
    assert [(r.key, r.value, r.headers) for r in records] == [(b"key", {}, {"h": b"1"})]


def test_the_state_it_repairs_is_real(kafka_bootstrap: str) -> None:
    """Without the repair the same send fails: the test above exercises the failure."""
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 1)
    with pytest.raises(IllegalOperation):
        asyncio.run(_send_between_transactions(kafka_bootstrap, topic, repair=False))


async def _commit_offsets_after_the_transaction_ended(
        bootstrap: str, topic: str, group: str, producer_class: type | None) -> int | None:
    """What a stop does: Faust ends every transaction when its streams are waited
    empty, then commits the offsets of the records processed after that."""
    async with _producer_in_a_transaction(bootstrap, AdaptedApp) as (producer,
                                                                     transactional_id):
        await producer.commit_transactions({transactional_id: {TopicPartition(topic, 0): 3}},
                                           group, start_new_transaction=False)
        commit = (producer.commit_transactions if producer_class is None
                  else partial(producer_class.commit_transactions, producer))
        await commit({transactional_id: {TopicPartition(topic, 0): 5}}, group,
                     start_new_transaction=False)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                isolation_level="read_committed")
    await consumer.start()
    try:
        return await consumer.committed(TopicPartition(topic, 0))
    finally:
        await consumer.stop()


def test_offsets_committed_after_the_transactions_ended_commit(kafka_bootstrap: str) -> None:
    topic, group = f"txn-{uuid.uuid4().hex[:8]}", f"group-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 1)
    committed = asyncio.run(_commit_offsets_after_the_transaction_ended(
        kafka_bootstrap, topic, group, None))
    assert committed == 5


def test_faust_fails_to_commit_offsets_after_the_transactions_ended(
        kafka_bootstrap: str) -> None:
    """The state the adaptation repairs is real: Faust's own commit raises."""
    topic, group = f"txn-{uuid.uuid4().hex[:8]}", f"group-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 1)
    with pytest.raises(IllegalOperation, match="Not in the middle of a transaction"):
        asyncio.run(_commit_offsets_after_the_transaction_ended(
            kafka_bootstrap, topic, group, faust_aiokafka.Producer))


async def _send_batched(bootstrap: str, topic: str, records: list[OutRecord],
                        ) -> list[tuple[int, int]]:
    """Send `records` in one transaction; each record's (partition, offset) as placed."""
    async with _producer_in_a_transaction(bootstrap, AdaptedApp) as (producer, transactional_id):
        placed = await producer.send_batched(records, transactional_id)
        landed = [((batch := await delivery).partition, batch.offset + place)
                  for delivery, place in placed]
        await producer.commit_transaction(transactional_id)
    return landed


def test_batched_records_land_where_they_are_placed(kafka_bootstrap: str) -> None:
    """Records to a given partition and keyed ones, more than one batch holds (Faust's
    default batch is 16 KiB): each is read back at the partition and offset its
    place says, keyed ones on the partition Kafka's default partitioner picks."""
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 3)
    records = [OutRecord(topic, None if number % 3 else 1, f"key-{number % 7}".encode(),
                         orjson.dumps({"n": number, "pad": "x" * 1000}),
                         [("n", str(number).encode())])
               for number in range(60)]
    landed = asyncio.run(_send_batched(kafka_bootstrap, topic, records))
    reader = TopicReader(kafka_bootstrap, topic, partitions=3)
    read = reader.wait_until(lambda recs: len(recs) >= len(records), 30, "every record")
    where = {(r.partition, r.offset): r for r in read}
    partitioner = DefaultPartitioner()
    for record, (partition, offset) in zip(records, landed, strict=True):
        found = where[(partition, offset)]
        assert found.key == record.key and found.headers == dict(record.headers or [])
        assert found.value == orjson.loads(record.value or b"null")
        if record.partition is None:
            assert partition == partitioner(record.key, [0, 1, 2], [0, 1, 2])
        else:
            assert partition == record.partition
