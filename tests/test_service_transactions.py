"""The worker's transactional send, on a real broker, in the state a failed commit leaves.

A rebalance can fail a commit after it ended a partition's transaction and
before Faust began the next one; every later send of that partition then
raised `IllegalOperation` and the agent crash-looped. `send_in_transaction`
must begin the transaction itself, and what it sends must commit.
"""

from __future__ import annotations

import asyncio
import uuid

import faust
import pytest
from aiokafka.errors import IllegalOperation

from processors.faust_adaptations import send_in_transaction
from tests.service_harness import TopicReader, create_topic


async def _send_between_transactions(bootstrap: str, topic: str,
                                     repair: bool) -> None:
    app = faust.App(f"txn-{uuid.uuid4().hex[:8]}", broker=f"kafka://{bootstrap}",
                    processing_guarantee="exactly_once", autodiscover=False)
    producer = app.producer
    await producer.start()
    transactional_id = f"{app.conf.id}-0-0"
    try:
        await producer.maybe_begin_transaction(transactional_id)
        # What a commit that fails before beginning the next transaction leaves.
        await producer.commit_transaction(transactional_id)
        if repair:
            await send_in_transaction(producer, transactional_id, topic, b"key", b"{}", 0,
                                      [("h", b"1")])
        else:
            await producer.send(topic, b"key", b"{}", 0, None, None,
                                transactional_id=transactional_id)
        await producer.commit_transaction(transactional_id)
    finally:
        await producer.stop_transaction(transactional_id)
        await producer.stop()


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
