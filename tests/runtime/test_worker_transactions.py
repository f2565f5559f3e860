"""One transaction per worker (processors.runtime.worker_transactions), on a real
broker: what fences a zombie worker's commit, and what keeps a new owner from
starting at an offset an open transaction is about to move."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import CommitFailedError, NotLeaderForPartitionError
from faust.types import TP

from processors.runtime.worker_transactions import (
    GroupMember,
    fetch_stable_offsets,
    member_fenced_producer,
    missing_group_fencing,
    stable_ends,
)
from tests.service_harness import create_topic

pytestmark = pytest.mark.kafka


def test_a_broker_without_the_member_fenced_requests_is_refused_with_the_way_out() -> None:
    kafka_4 = {28: (0, 5), 9: (1, 9)}
    assert missing_group_fencing(kafka_4) is None
    refusal = missing_group_fencing({28: (0, 2), 9: (0, 7)})
    assert refusal is not None and "TxnOffsetCommit v3" in refusal
    assert "AGUI_TRANSACTIONS=partition" in refusal
    refusal = missing_group_fencing({28: (0, 3), 9: (0, 5)})
    assert refusal is not None and "OffsetFetch v7" in refusal


@asynccontextmanager
async def _group_member(bootstrap: str, group: str, topic: str,
                        ) -> AsyncIterator[AIOKafkaConsumer]:
    """A consumer that has joined `group` and been given `topic`'s partition."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                enable_auto_commit=False, isolation_level="read_committed")
    await consumer.start()
    try:
        while not consumer.assignment():
            await consumer.getmany(timeout_ms=200)
        yield consumer
    finally:
        await consumer.stop()


async def _commit_offset(producer: AIOKafkaProducer, topic: str, group: str,
                         offset: int) -> None:
    async with producer.transaction():
        await producer.send_and_wait(topic, b"output", partition=0)
        await producer.send_offsets_to_transaction({TopicPartition(topic, 0): offset}, group)


def _fresh_topic(bootstrap: str) -> str:
    topic = f"worker-txn-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1)
    return topic


# A zombie as its consumer may see itself: still in the generation the group has
# left behind, or (having learnt it was removed) in none.
OLD_GENERATION = "old generation"
NO_MEMBER = "no member"


async def _zombie_commit(bootstrap: str, topic: str,
                         make_producer: Callable[..., AIOKafkaProducer],
                         zombie: str = OLD_GENERATION,
                         ) -> tuple[int | None, BaseException | None]:
    """A member's producer commits offset 5; then a commit made as a zombie. The
    group's offset after both, and what the second commit raised."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    async with _group_member(bootstrap, group, topic) as consumer:
        coordinator = consumer._coordinator
        member = GroupMember(coordinator.generation, coordinator.member_id, None)
        current = [member]
        producer = make_producer(lambda: current[0], bootstrap_servers=bootstrap,
                                 transactional_id=f"t-{uuid.uuid4().hex[:8]}")
        await producer.start()
        try:
            await _commit_offset(producer, topic, group, 5)
            current[0] = (member._replace(generation=member.generation - 1)
                          if zombie == OLD_GENERATION else GroupMember(-1, "", None))
            raised: BaseException | None = None
            try:
                await _commit_offset(producer, topic, group, 9)
            except Exception as error:  # what the worker's commit would see
                raised = error
        finally:
            await producer.stop()
        fetch_stable_offsets(consumer)  # the commit's offsets, once they are stable
        committed = await consumer.committed(TopicPartition(topic, 0))
    return committed, raised


@pytest.mark.parametrize("zombie", [OLD_GENERATION, NO_MEMBER])
def test_a_zombie_s_commit_is_refused(kafka_bootstrap: str, zombie: str) -> None:
    committed, raised = asyncio.run(_zombie_commit(
        kafka_bootstrap, _fresh_topic(kafka_bootstrap), member_fenced_producer, zombie))
    assert committed == 5
    assert isinstance(raised, CommitFailedError)


def test_aiokafka_s_own_commit_names_no_member_and_lets_a_zombie_commit(
        kafka_bootstrap: str) -> None:
    """Why the worker sends TxnOffsetCommit v3: v0 carries no generation."""
    def plain(_member: Callable[[], GroupMember], **settings: str) -> AIOKafkaProducer:
        return AIOKafkaProducer(**settings)
    committed, raised = asyncio.run(_zombie_commit(kafka_bootstrap, _fresh_topic(kafka_bootstrap),
                                                   plain))
    assert (committed, raised) == (9, None)


async def _fetch_while_a_transaction_holds_offsets(bootstrap: str, topic: str, stable: bool,
                                                   ) -> tuple[bool, int | None]:
    """An earlier owner's transaction holds offset 7 of a partition; a new member of
    the group fetches the partition's committed offset. Whether the fetch was still
    waiting a second later, and what it returned once the transaction committed."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    earlier = AIOKafkaProducer(bootstrap_servers=bootstrap,
                               transactional_id=f"t-{uuid.uuid4().hex[:8]}")
    await earlier.start()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        await earlier.begin_transaction()
        await earlier.send_and_wait(topic, b"output", partition=0)
        await earlier.send_offsets_to_transaction({tp: 7}, group)
        if stable:
            fetch_stable_offsets(consumer)
        fetching = asyncio.ensure_future(consumer._coordinator.fetch_committed_offsets({tp}))
        done, _ = await asyncio.wait({fetching}, timeout=1.0)
        await earlier.commit_transaction()
        offsets = await fetching
    finally:
        await consumer.stop()
        await earlier.stop()
    return not done, offsets[tp].offset if tp in offsets else None


def test_a_new_owner_waits_for_the_offsets_of_an_open_transaction(kafka_bootstrap: str,
                                                                  ) -> None:
    waited, offset = asyncio.run(_fetch_while_a_transaction_holds_offsets(
        kafka_bootstrap, _fresh_topic(kafka_bootstrap), stable=True))
    assert (waited, offset) == (True, 7)


def test_aiokafka_s_own_fetch_does_not_wait_and_misses_them(kafka_bootstrap: str) -> None:
    """Why the worker fetches with require_stable: the new owner would start at the
    offset before the earlier owner's commit, and process its records again."""
    waited, offset = asyncio.run(_fetch_while_a_transaction_holds_offsets(
        kafka_bootstrap, _fresh_topic(kafka_bootstrap), stable=False))
    assert (waited, offset) == (False, None)


async def _recovery_end_behind_an_open_transaction(bootstrap: str, topic: str,
                                                   ) -> tuple[int, bool, int]:
    """A changelog partition where an earlier owner's transaction is open and the
    next owner committed records after it. What a read_committed consumer takes for
    the end meanwhile; whether `stable_ends` was still waiting a second later; and
    the end it returned once the open transaction aborted."""
    tp = TopicPartition(topic, 0)
    earlier, later = (AIOKafkaProducer(bootstrap_servers=bootstrap,
                                       transactional_id=f"t-{uuid.uuid4().hex[:8]}")
                      for _ in range(2))
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    for client in (earlier, later, consumer):
        await client.start()
    try:
        await earlier.begin_transaction()
        await earlier.send_and_wait(topic, b"left open", partition=0)
        async with later.transaction():
            await later.send_and_wait(topic, b"committed after it", partition=0)
        stalled = (await consumer.end_offsets([tp]))[tp]
        ending = asyncio.ensure_future(stable_ends(consumer, [tp]))
        done, _ = await asyncio.wait({ending}, timeout=1.0)
        await earlier.abort_transaction()
        end = (await ending)[tp]
    finally:
        for client in (earlier, later, consumer):
            await client.stop()
    return stalled, not done, end


def test_recovery_ends_only_once_an_earlier_owner_s_open_transaction_has_ended(
        kafka_bootstrap: str) -> None:
    stalled, waited, end = asyncio.run(_recovery_end_behind_an_open_transaction(
        kafka_bootstrap, _fresh_topic(kafka_bootstrap)))
    # Offsets: the open record, the later record, the later commit marker, then the
    # abort marker; the stable end stood before the open record.
    assert stalled == 0
    assert waited
    assert end == 4


def test_recovery_asks_the_written_ends_again_while_a_partition_has_no_leader() -> None:
    """A worker that had just created its changelogs crashed in recovery: the
    partitions' leaders were not elected yet (NotLeaderForPartition). The written
    ends are asked again, with the leaders looked up again, as aiokafka's own offset
    requests are."""
    tp = TP("changelog", 0)
    leaders = [None, 1, 1]  # no leader known yet, then one that has not taken over
    answers = [NotLeaderForPartitionError.errno, 0]
    updates: list[None] = []

    class Client:
        cluster = SimpleNamespace(leader_for_partition=lambda _tp: leaders.pop(0))

        async def force_metadata_update(self) -> None:
            updates.append(None)

        async def send(self, node: int, request: Any) -> Any:
            code = answers.pop(0)
            return SimpleNamespace(topics=[("changelog", [(0, code, -1, 42)])])

        async def end_offsets(self, partitions: list[TP]) -> dict[TP, int]:
            return {tp: 42}

    consumer: Any = SimpleNamespace(_client=Client())
    consumer.end_offsets = consumer._client.end_offsets
    assert asyncio.run(stable_ends(consumer, [tp])) == {tp: 42}
    assert len(updates) == 2 and not leaders and not answers
