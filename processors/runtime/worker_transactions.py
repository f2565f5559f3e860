"""One transaction per worker per commit (KIP-447), for AGUI_TRANSACTIONS=worker.

Faust's exactly-once gives each input partition its own transactional producer,
so a commit is one transaction per partition written to: with 128 partitions, up
to 128 transactions of four round trips each. Fencing then comes from the
transactional id: a partition's new owner starts a producer with the same id,
which aborts the old owner's open transaction and fences it.

Here one producer per worker writes every partition's records in one transaction.
Fencing comes from the consumer group instead, as in Kafka Streams' exactly_once_v2:

* **The offsets carry the group member** (`TxnOffsetCommit` v3: generation, member
  id, group instance id). A worker that lost its partitions in a rebalance it did
  not take part in (a zombie: stopped, cut off) has an old generation, so the group
  coordinator refuses its offsets; its transaction aborts and the worker exits
  without a commit. aiokafka sends v0, which names no member. Once the consumer
  knows it is out of the group it has no member to name, and the coordinator
  would take offsets naming none: those are not sent at all.
* **A new owner reads only stable offsets** (`OffsetFetch` v7, `require_stable`):
  while an earlier owner's transaction holding offsets of the partition is still
  open, the coordinator answers UNSTABLE_OFFSET_COMMIT and the fetch is retried, so
  the new owner never starts from an offset that the pending transaction is about
  to move. aiokafka sends v3, which cannot ask.
* **A restart aborts its predecessor's transaction at once** when the worker's
  transactional id survives the restart (`worker_transactional_id`: from
  AGUI_GROUP_INSTANCE_ID); otherwise an open transaction of a killed worker holds
  read_committed readers of the partitions it wrote until it times out
  (`TRANSACTION_TIMEOUT_MS`).

Both requests are built with aiokafka's own protocol classes, as `kafka_access`
builds Metadata v8; a broker that does not take them (before Kafka 2.5) is refused
at start (`missing_group_fencing`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import uuid
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any, NamedTuple

import aiokafka
from aiokafka import errors
from aiokafka.client import CoordinationType
from aiokafka.errors import CommitFailedError, GroupAuthorizationFailedError, KafkaError
from aiokafka.producer.sender import Sender, TxnOffsetCommitHandler
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.commit import OffsetFetchRequest
from aiokafka.protocol.offset import OffsetRequest
from aiokafka.protocol.types import (
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)
from faust.transport.consumer import TransactionManager
from faust.types import TP

from processors.runtime.committed_offsets import GroupErrorCheckingCoordinator, raise_group_error
from processors.runtime.exits import stop_without_commit
from processors.runtime.kafka_retries import until_settled

log = logging.getLogger("agui_stream")

TXN_OFFSET_COMMIT = 28
OFFSET_FETCH = 9
# The versions this module sends: the first that carry the group member, and the
# first that can ask for stable offsets.
TXN_OFFSET_COMMIT_VERSION = 3
OFFSET_FETCH_VERSION = 7

# A killed worker's open transaction holds read_committed readers of what it wrote
# until it times out (unless its restart, with the same transactional id, aborts it
# first). Kafka Streams uses 10 s under exactly_once_v2; commits here take well
# under a second.
TRANSACTION_TIMEOUT_MS = 10_000

# The group coordinator's answers that say the commit's member is not the group's
# current owner of the partitions: the worker is a zombie.
ILLEGAL_GENERATION = 22
UNKNOWN_MEMBER_ID = 25
FENCED_INSTANCE_ID = 82
STALE_MEMBER = frozenset((ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID))
# Another producer's transaction holding offsets of the partition is still open.
UNSTABLE_OFFSET_COMMIT = 88


class GroupMember(NamedTuple):
    """The consumer's place in its group at a commit."""

    generation: int
    member_id: str
    instance_id: str | None


def worker_transactional_id(app_id: str, group_instance_id: str | None) -> str:
    """The worker's transactional id: its static member id when it has one (a restart
    then aborts the transaction its predecessor left open), else one of its own."""
    return f"{app_id}-worker-{group_instance_id or uuid.uuid4().hex}"


def missing_group_fencing(versions: dict[int, tuple[int, int]]) -> str | None:
    """Why the broker cannot fence a worker's transactions by group member (None: it
    can); `versions`: its ApiVersions, api key -> (min, max)."""
    for api_key, version, name in ((TXN_OFFSET_COMMIT, TXN_OFFSET_COMMIT_VERSION,
                                    "TxnOffsetCommit"),
                                   (OFFSET_FETCH, OFFSET_FETCH_VERSION, "OffsetFetch")):
        low, high = versions.get(api_key, (0, -1))
        if not low <= version <= high:
            return (f"the broker does not take {name} v{version} (Kafka 2.5 or later does),"
                    " which one transaction per worker needs: set AGUI_TRANSACTIONS=partition")
    return None


# --- TxnOffsetCommit v3 --------------------------------------------------------------

def _per_topic(partitions: Any) -> CompactArray:
    """A flexible version's array of topics, each a name and its `partitions`."""
    return CompactArray(("name", CompactString("utf-8")), ("partitions", partitions),
                        ("tags", TaggedFields))


def _per_partition(*fields: tuple[str, Any]) -> CompactArray:
    return CompactArray(*fields, ("tags", TaggedFields))


class _TxnOffsetCommitResponseV3(Response):  # type: ignore[misc]
    API_KEY = TXN_OFFSET_COMMIT
    API_VERSION = TXN_OFFSET_COMMIT_VERSION
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("topics", _per_topic(_per_partition(("partition", Int32), ("error_code", Int16)))),
        ("tags", TaggedFields),
    )


class _TxnOffsetCommitRequestV3(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = TXN_OFFSET_COMMIT
    API_VERSION = TXN_OFFSET_COMMIT_VERSION
    RESPONSE_TYPE = _TxnOffsetCommitResponseV3
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("group_id", CompactString("utf-8")),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("generation_id", Int32),
        ("member_id", CompactString("utf-8")),
        ("group_instance_id", CompactString("utf-8")),
        ("topics", _per_topic(_per_partition(
            ("partition", Int32), ("offset", Int64), ("leader_epoch", Int32),
            ("metadata", CompactString("utf-8"))))),
        ("tags", TaggedFields),
    )


class _MemberTxnOffsetCommit(Request[_TxnOffsetCommitRequestV3]):  # type: ignore[misc]
    API_KEY = TXN_OFFSET_COMMIT

    def __init__(self, *fields: Any) -> None:
        self._fields = fields

    def build(self, request_struct_class: type[_TxnOffsetCommitRequestV3],
              ) -> _TxnOffsetCommitRequestV3:
        return request_struct_class(*self._fields)


class _MemberTxnOffsetCommitHandler(TxnOffsetCommitHandler):  # type: ignore[misc]
    """aiokafka's handler, sending v3 with the group member at the time of sending."""

    def __init__(self, sender: Any, offsets: Any, group_id: str, member: GroupMember) -> None:
        super().__init__(sender, offsets, group_id)
        self._member = member

    def create_request(self) -> _MemberTxnOffsetCommit:
        transactions = self._sender._txn_manager
        member = self._member
        topics: dict[str, list[tuple[Any, ...]]] = collections.defaultdict(list)
        for tp, offset in sorted(self._offsets.items()):
            topics[tp.topic].append((tp.partition, offset.offset, -1, offset.metadata, {}))
        return _MemberTxnOffsetCommit(
            transactions.transactional_id, self._group_id, transactions.producer_id,
            transactions.producer_epoch, member.generation, member.member_id,
            member.instance_id, [(topic, parts, {}) for topic, parts in topics.items()], {})

    def handle_response(self, resp: Any) -> Any:
        """A stale member aborts the transaction (its offsets' future fails); any other
        answer is aiokafka's to handle, in the shape it reads."""
        errors = [(topic, [(partition, code) for partition, code, _tags in partitions])
                  for topic, partitions, _tags in resp.topics]
        if any(code in STALE_MEMBER for _topic, codes in errors for _partition, code in codes):
            self._sender._txn_manager.error_transaction(CommitFailedError(
                "the group has a newer generation: this worker no longer owns the"
                " partitions of the commit"))
            return None
        return super().handle_response(SimpleNamespace(errors=errors))


class _MemberSender(Sender):  # type: ignore[misc]
    """aiokafka's sender, committing offsets in a transaction with the group member."""

    member: Callable[[], GroupMember]

    async def _do_txn_offset_commit(self, offsets: Any, group_id: str) -> None:
        if not offsets:
            return
        member = self.member()
        if member.generation < 0 or not member.member_id:
            # The consumer learnt it is out of the group (aiokafka then forgets its
            # generation and member id) and has not joined again. The coordinator
            # takes offsets that name no member from anyone, as from a client that
            # is not in the group: they would commit.
            self._txn_manager.error_transaction(CommitFailedError(
                "this worker is not a member of the group now"))
            return
        try:  # sent to the group's coordinator, as aiokafka does
            node_id = await self._find_coordinator(CoordinationType.GROUP, group_id)
        except GroupAuthorizationFailedError as error:
            self._txn_manager.error_transaction(error)
            return
        await _MemberTxnOffsetCommitHandler(self, offsets, group_id, member).do(node_id)


def member_fenced_producer(member: Callable[[], GroupMember], **settings: Any,
                           ) -> aiokafka.AIOKafkaProducer:
    """A transactional producer whose offsets carry `member()` (see the module)."""
    producer = aiokafka.AIOKafkaProducer(transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
                                         **settings)
    # The sender is built in the producer's constructor, before any request: its
    # class is swapped for the one that sends v3 (no other state differs).
    producer._sender.__class__ = _MemberSender
    producer._sender.member = member
    return producer


# --- OffsetFetch v7 ------------------------------------------------------------------

class _OffsetFetchResponseV7(Response):  # type: ignore[misc]
    API_KEY = OFFSET_FETCH
    API_VERSION = OFFSET_FETCH_VERSION
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("topics", _per_topic(_per_partition(
            ("partition", Int32), ("offset", Int64), ("leader_epoch", Int32),
            ("metadata", CompactString("utf-8")), ("error_code", Int16)))),
        ("error_code", Int16),
        ("tags", TaggedFields),
    )


class _OffsetFetchRequestV7(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = OFFSET_FETCH
    API_VERSION = OFFSET_FETCH_VERSION
    RESPONSE_TYPE = _OffsetFetchResponseV7
    SCHEMA = Schema(
        ("group_id", CompactString("utf-8")),
        ("topics", _per_topic(CompactArray(Int32))),
        ("require_stable", Boolean),
        ("tags", TaggedFields),
    )


class _StableOffsetFetch(Request[_OffsetFetchRequestV7]):  # type: ignore[misc]
    API_KEY = OFFSET_FETCH

    def __init__(self, group_id: str, topics: list[tuple[str, list[int]]]) -> None:
        self._group_id = group_id
        self._topics = topics

    def build(self, request_struct_class: type[_OffsetFetchRequestV7]) -> _OffsetFetchRequestV7:
        return request_struct_class(self._group_id, [(topic, partitions, {}) for
                                                     topic, partitions in self._topics],
                                    True, {})


class UnstableOffsetCommit(KafkaError):  # type: ignore[misc]
    """A partition's offsets are in a transaction still open: fetched again after the
    coordinator's backoff (aiokafka retries a retriable error)."""

    retriable = True


class _StableOffsetsCoordinator(GroupErrorCheckingCoordinator):
    """aiokafka's group coordinator, fetching committed offsets with require_stable
    (and raising the group's error: `committed_offsets`)."""

    async def _send_req(self, request: Any) -> Any:
        if not isinstance(request, OffsetFetchRequest):
            return await super()._send_req(request)
        response = await super()._send_req(
            _StableOffsetFetch(request._consumer_group, request._partitions or []))
        if response.error_code == UNSTABLE_OFFSET_COMMIT or any(
                partition[4] == UNSTABLE_OFFSET_COMMIT
                for _name, partitions, _tags in response.topics for partition in partitions):
            raise UnstableOffsetCommit("an earlier owner's transaction is still open")
        raise_group_error(self, response.error_code)
        # The shape aiokafka reads (v1-v5): (partition, offset, metadata, error code).
        return SimpleNamespace(topics=[
            (name, [(partition, offset, metadata or "", code)
                    for partition, offset, _epoch, metadata, code, _tags in partitions])
            for name, partitions, _tags in response.topics])


def fetch_stable_offsets(consumer: aiokafka.AIOKafkaConsumer) -> None:
    """Make a started consumer fetch its committed offsets with require_stable. Its
    coordinator is built in `start()` and fetches offsets only after a subscription
    and an assignment, so swapping its class then takes effect before the first."""
    consumer._coordinator.__class__ = _StableOffsetsCoordinator


# --- Faust ---------------------------------------------------------------------------

class WorkerTransactionManager(TransactionManager):
    """Faust's transaction manager with one transaction for the whole worker: no
    producer per partition to start or stop in a rebalance, every offset of a commit
    in the worker's transaction. A commit the group refuses (a stale member) exits
    without a commit: its transaction aborts, and the partitions' owner processes
    the records again."""

    transactional_id: str

    async def on_rebalance(self, assigned: set[TP], revoked: set[TP],
                           newly_assigned: set[TP]) -> None:
        producer: Any = self.producer
        if self.transactional_id not in producer._transaction_producers:
            await producer.maybe_begin_transaction(self.transactional_id)

    async def commit(self, offsets: Mapping[TP, int],
                     start_new_transaction: bool = True) -> bool:
        if not offsets:
            return False
        try:
            await self.producer.commit_transactions(
                {self.transactional_id: offsets}, self.app.conf.id,
                start_new_transaction=start_new_transaction)
        except Exception as error:
            stop_without_commit("the offsets of a commit", error)
        return True


# --- Recovery behind an open transaction ---------------------------------------------

LATEST = -1  # ListOffsets: the partition's end
READ_UNCOMMITTED = 0
OPEN_TRANSACTION_POLL_SECONDS = 0.1
# How long the written ends are asked again while a partition has no leader yet (a
# changelog the worker just created) or its leader moved, as aiokafka's own offset
# requests are; then the recovery fails (and the worker exits without a commit).
WRITTEN_ENDS_SECONDS = 30.0


async def stable_ends(consumer: aiokafka.AIOKafkaConsumer, partitions: list[TP],
                      ) -> dict[TP, int]:
    """The last stable offset of each of `partitions` once every transaction open on
    them now has ended.

    A read_committed consumer's end of a partition is its last stable offset, which
    stops at the first transaction still open. With a transaction per partition a
    new owner's producer aborts the earlier owner's open transaction before anything
    is read; with one per worker nothing does until it times out, and the previous
    owner's later commits stay behind it. Table recovery ending there would build
    state older than the committed input offsets. So it waits until the stable end
    reaches the end written now (at most the transaction timeout, and the broker's
    check for timed-out transactions)."""
    written = await _written_ends(consumer, partitions)
    said = False
    while True:
        stable: dict[TP, int] = await consumer.end_offsets(partitions)
        behind = [tp for tp in partitions if stable[tp] < written[tp]]
        if not behind:
            return stable
        if not said:
            log.info("%d changelog partition(s) wait for a transaction an earlier owner left"
                     " open (up to its %d s timeout) before their recovery ends", len(behind),
                     TRANSACTION_TIMEOUT_MS // 1000)
            said = True
        await asyncio.sleep(OPEN_TRANSACTION_POLL_SECONDS)


async def _written_ends(consumer: aiokafka.AIOKafkaConsumer, partitions: list[TP],
                        ) -> dict[TP, int]:
    """Each partition's end as written (its high watermark: read_uncommitted), asked
    of its leader with aiokafka's ListOffsets request; asked again, with the leaders
    looked up again, after an error that passes (no leader yet, a leader moved): a
    worker that had just created its changelogs crashed in recovery on
    NotLeaderForPartition."""
    client = consumer._client
    return await until_settled(lambda: _ask_written_ends(client, partitions),
                               WRITTEN_ENDS_SECONDS, between=client.force_metadata_update)


async def _ask_written_ends(client: Any, partitions: list[TP]) -> dict[TP, int]:
    by_leader: dict[int, dict[str, list[tuple[int, int]]]] = collections.defaultdict(
        lambda: collections.defaultdict(list))
    for tp in partitions:
        leader = client.cluster.leader_for_partition(tp)
        if leader is None or leader < 0:
            raise errors.LeaderNotAvailableError(
                f"no leader known for {tp.topic}[{tp.partition}]")
        by_leader[leader][tp.topic].append((tp.partition, LATEST))
    ends: dict[TP, int] = {}
    for leader, topics in by_leader.items():
        response = await client.send(leader, OffsetRequest(-1, READ_UNCOMMITTED,
                                                           list(topics.items())))
        for topic, answers in response.topics:
            for partition, error_code, *position in answers:
                if error_code:
                    raise errors.for_code(error_code)()
                ends[TP(topic, partition)] = position[-1]
    return ends
