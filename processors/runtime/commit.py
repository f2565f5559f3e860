"""One commit of the worker: what the records since the last commit produced and
changed, sent per source partition in that partition's transaction, then applied
to the local stores once committed.

The worker writes its tables only through their changelogs (write-behind): a
commit sends each partition's outputs and state changes, Faust commits the
offsets in the same transactions, and only then are the changes applied to the
local stores, the way recovery applies a changelog. If anything cannot be sent,
the worker exits without a commit (`stop_without_commit`), which is what a kill
-9 does and is safe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, NamedTuple

from aiokafka import TopicPartition
from faust.types import TP

from processors.processing.outputs import Outgoing
from processors.processing.record_processor import RecordProcessor, StateChange
from processors.runtime.exits import stop_without_commit
from processors.runtime.faust_adaptations import (
    AdaptedApp,
    CommitProducer,
    OutRecord,
    Placed,
    QuickStopTable,
)
from processors.view.thread_view import ThreadView
from topics.declarations import VIEW_TABLE


class WriteBehindTable(QuickStopTable):
    """A table the worker writes only through its changelog: what it sent, once
    delivered and committed, is applied to the local store the way Faust applies a
    changelog in recovery, `apply_changelog_batch` of `_SentEntry`s (never through
    `table[key] = value`, which would send a changelog record per write)."""


class _SentEntry:
    """A sent changelog record in the shape Faust's stores read in recovery
    (`event.key`, `event.value`, `event.message.{key,value,partition,offset,tp}`)."""

    __slots__ = ("key", "message", "offset", "partition", "tp", "value")

    def __init__(self, change: StateChange, batch: Any, place: int) -> None:
        """`batch`: the delivery metadata of the batch the change was sent in; `place`:
        the change's place in it."""
        self.key = change.key
        self.value = change.value
        self.partition = batch.partition
        self.offset = batch.offset + place
        self.tp = batch.topic_partition
        self.message = self


def _within(acked: int, reach: int | None, committed: int | None) -> int | None:
    """The offset a partition's commit takes: Faust's `acked` no further than its
    records `reach` (None: none processed, the `committed` one stays), never behind
    `committed` (None: nothing to commit)."""
    offset = committed if reach is None else min(acked, reach)
    return offset if offset is None or committed is None else max(offset, committed)


class PartitionBatch(NamedTuple):
    partition: int
    transaction: str | None  # None: no transactions (at_least_once)
    outgoing: list[Outgoing]
    changes: list[StateChange]


class WorkerCommitBatch:
    """One commit's outputs and state changes (a `CommitBatch`). Sent and applied
    while the agent goes on with later records: those only buffer, and no record
    reads a key's stored state while the key has changes in flight (it stays cached
    until `apply`, see RecordProcessor.drop_deleted_keys)."""

    def __init__(self, parts: list[PartitionBatch], producer: CommitProducer,
                 tables: dict[str, WriteBehindTable], app: AdaptedApp,
                 processor: RecordProcessor, view: ThreadView,
                 reach: dict[tuple[str, int], int | None]) -> None:
        """`reach`: per assigned input and history (topic, partition), the offset its
        committed offset may reach: an input's replay start
        (`RecordProcessor.replay_starts`), a history partition's offset after the last
        record the view applied; None: no record processed since the partitions last
        moved."""
        self.parts = parts
        self.reach = reach
        self.producer = producer
        self.tables = tables
        self.app = app
        self.processor = processor
        self.view = view
        self._sent: list[tuple[StateChange, Placed]] = []
        self._delivered: dict[asyncio.Future[Any], Any] = {}  # a batch's delivery -> metadata

    async def send(self) -> None:
        """Each partition's records in its own transaction, or every partition's in
        the worker's one (AGUI_TRANSACTIONS=worker) (Faust's
        TransactionManager would pick it by the *output* record's partition; history
        is keyed by thread, so it would commit apart from the input offsets), waited
        for until the broker has them: offsets added to a transaction while its
        records are still being produced made the broker refuse them for a moment
        (NOT_ENOUGH_REPLICAS while it verifies the transaction), and the producer
        retried only after its backoff. If anything cannot be sent, exit without a
        commit (see stop_without_commit)."""
        changelogs = {name: table.changelog_topic.get_topic_name()
                      for name, table in self.tables.items()}

        def records_of(part: PartitionBatch) -> list[OutRecord]:
            records = [OutRecord(item.topic, None, item.key, item.value, item.headers)
                       for item in part.outgoing]
            records += [OutRecord(changelogs[change.table], part.partition, change.key,
                                  change.value, None) for change in part.changes]
            return records

        async def send_transaction(parts: list[PartitionBatch]) -> None:
            # The parts of one transaction (every part, with one per worker) in one
            # call: one batch per partition written. Sent part by part, two parts
            # writing one history partition made the second wait until the first's
            # batch was sent (aiokafka queues one batch per partition), in turn:
            # commits of 80 partitions took 1.5-2.6 s at 128 partitions under load.
            per_part = [records_of(part) for part in parts]
            placed = await self.producer.send_batched(
                [record for records in per_part for record in records], parts[0].transaction)
            start = 0
            for part, records in zip(parts, per_part, strict=True):
                own = placed[start:start + len(records)]
                start += len(records)
                self._delivered.update(dict.fromkeys(delivery for delivery, _place in own))
                self._sent += zip(part.changes, own[len(part.outgoing):], strict=True)

        by_transaction: dict[str | None, list[PartitionBatch]] = {}
        for part in self.parts:
            by_transaction.setdefault(part.transaction, []).append(part)
        try:
            # All transactions at once: one after another, each transaction's first
            # round trip waited for the sends of the partitions before it.
            await asyncio.gather(*map(send_transaction, by_transaction.values()))
            for delivery in self._delivered:
                self._delivered[delivery] = await delivery
        except Exception as error:
            stop_without_commit("the records produced since the last commit", error)

    def offsets_to_commit(self, acked: dict[TP, int],
                          committed: Mapping[TP, int | None]) -> dict[TP, int]:
        """Faust's offsets of the records acked, each input and history partition's
        capped at what its processed records reach (`reach`), and a reach that moved
        although nothing was acked (an input's waiting keys were handed out). A
        partition this batch writes to always has an offset: a transaction commits
        only with offsets.

        The cap: an input record past its partition's replay start is covered by no
        stored state yet; and Faust's pure-Python stream iterator (where
        faust-streaming's compiled one is missing, or NO_CYTHON is set) acks the
        records it skips without handing them to the agent (taken from a queue while
        flow is suspended, in a rebalance or a stop, or of an older generation). A
        partition whose records reach nothing known keeps its committed offset."""
        offsets: dict[TP, int] = {}
        for tp, offset in acked.items():
            place = (tp.topic, tp.partition)
            capped = (_within(offset, self.reach[place], committed.get(tp))
                      if place in self.reach else offset)  # (idle ticks: nothing to cap)
            if capped is not None:
                offsets[tp] = capped
        writes = {part.partition for part in self.parts}
        for place, reach in self.reach.items():
            if reach is None:
                continue
            # aiokafka's own type, the only one its transactions take (equal to Faust's
            # TP of the same partition, so `offsets` holds one entry per partition).
            tp = TopicPartition(*place)
            before = committed.get(tp)
            if tp not in offsets and (tp.partition in writes or before is None
                                      or reach > before):
                offsets[tp] = reach if before is None else max(reach, before)
        return offsets

    async def apply(self) -> None:
        """Apply the committed state changes to the local stores, as recovery would."""
        # Faust's stores read only what _SentEntry has of an event.
        entries: dict[str, list[Any]] = {name: [] for name in self.tables}
        # (Faust's assignment() builds a set of every partition assigned: only when
        # there is something to apply.)
        assigned = {tp.partition for tp in self.app.consumer.assignment()} if self._sent else set()
        for change, (delivery, place) in self._sent:
            batch = self._delivered[delivery]
            if batch.partition in assigned:
                entries[change.table].append(_SentEntry(change, batch, place))
        for name, table in self.tables.items():
            table.apply_changelog_batch(entries[name])
        self.processor.drop_deleted_keys()
        self.view.changes_applied(entries[VIEW_TABLE])
