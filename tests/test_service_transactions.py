"""The worker's transactional send and commit, on a real broker, in the states a failed
commit and a stop leave.

A rebalance can fail a commit after it ended a partition's transaction and
before Faust began the next one; every later send of that partition then
raised `IllegalOperation` and the agent crash-looped. `send_in_transaction`
must begin the transaction itself, and what it sends must commit.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import faust
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalOperation
from faust.transport.drivers import aiokafka as faust_aiokafka

from processors.faust_adaptations import AdaptedApp, send_in_transaction
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
    async with _producer_in_a_transaction(bootstrap, faust.App) as (producer, transactional_id):
        # What a commit that fails before beginning the next transaction leaves.
        await producer.commit_transaction(transactional_id)
        if repair:
            await send_in_transaction(producer, transactional_id, topic, b"key", b"{}", 0,
                                      [("h", b"1")])
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
