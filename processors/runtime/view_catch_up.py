"""When a newly assigned history partition's view may answer: once it holds every
history record the partition held when the assignment came.

A new owner's view of a partition starts as the table last committed, and its agent
then reads the history from the committed offset on. When the previous owner had
applied (and served) records past that offset, the new owner's first answers were
older than ones already served: a thread served with four messages, then with two,
then four again (issue 28). A worker therefore answers for a history partition
only once its view has applied every record below the partition's end (as a
read_committed consumer sees it) at the assignment; until then the API says 503
`not_ready`, as it does while the table recovers.

The end is usually a transaction's commit marker, which is never delivered, so
"applied the record below the end" cannot be the test. Instead: the consumer's
position has reached the end (every record below it was fetched); a later fetch
has begun (every record fetched before it was handed to the agent: Faust fetches
and hands out one batch at a time); the view has applied the last record handed
out for the partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any, Final, Protocol

from processors.safe_logging import log_exception_kind
from processors.view.thread_view import HistoryPartition

log = logging.getLogger("agui_stream")

# How often a partition still catching up is looked at again.
_POLL_SECONDS: Final = 0.01
_RETRY_SECONDS: Final = 1.0  # after the ends could not be read


class DeliveringConsumer(Protocol):
    """What the catch-up needs of the worker's consumer (`WholeRecordConsumer`)."""

    fetches_begun: int  # Faust's fetches so far (one batch handed out each)

    def last_handed_out(self, tp: Any) -> int | None: ...

    def fetch_position(self, tp: Any) -> int | None: ...

    async def highwaters(self, *partitions: Any) -> Any: ...


class ViewCatchUp:
    """The history partitions of the current assignment whose view has caught up.
    `applied(partition)`: the last history offset the view applied there;
    `recovered()`: the tables are recovered (the view reads them); `consumer()`: the
    worker's consumer (made when the worker starts)."""

    def __init__(self, consumer: Callable[[], DeliveringConsumer],
                 applied: Callable[[HistoryPartition], int],
                 recovered: Callable[[], bool]) -> None:
        self.consumer = consumer
        self.applied = applied
        self.recovered = recovered
        self._caught_up: set[HistoryPartition] = set()
        self._waiting: dict[Any, _Progress] = {}  # the partitions not caught up yet
        self._task: asyncio.Task[None] | None = None

    def caught_up(self, partition: HistoryPartition) -> bool:
        return partition in self._caught_up

    def assigned(self, tps: Iterable[Any]) -> None:
        """A new assignment: its history partitions `tps` catch up from now on."""
        self.revoked()
        self._task = asyncio.get_running_loop().create_task(self._catch_up(list(tps)))

    def revoked(self) -> None:
        """Partitions move: none answers until the next assignment has caught up."""
        self._caught_up = set()
        self._waiting = {}
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def begin(self, tps: list[Any]) -> None:
        """Read the ends of the assignment's history partitions `tps`."""
        while True:
            try:
                ends: dict[Any, int] = dict(await self.consumer().highwaters(*tps))
                break
            except Exception as error:  # the broker is moving: ask again
                log_exception_kind(log, logging.WARNING, "could not read the history"
                                   " partitions' ends", error)
                await asyncio.sleep(_RETRY_SECONDS)
        self._waiting = {tp: _Progress(end) for tp, end in ends.items()}

    async def look(self) -> bool:
        """Move each partition's catch-up on as far as it goes now; True once every
        partition has caught up."""
        if self.recovered():
            caught_up, waiting = self._caught_up, self._waiting  # (this assignment's)
            for tp, progress in list(waiting.items()):
                partition = (tp.topic, tp.partition)
                with contextlib.suppress(Exception):  # (a table read failing: next look)
                    if self._step(tp, partition, progress):
                        caught_up.add(partition)
                        del waiting[tp]
        return not self._waiting

    async def _catch_up(self, tps: list[Any]) -> None:
        await self.begin(tps)
        while not await self.look():
            await asyncio.sleep(_POLL_SECONDS)

    def _step(self, tp: Any, partition: HistoryPartition, progress: _Progress) -> bool:
        """Move the partition's catch-up on as far as it can go now; True once done."""
        applied = self.applied(partition)
        if applied >= progress.end - 1:
            return True
        if progress.fetched_through is None:
            position = self.consumer().fetch_position(tp)
            if position is None or position < progress.end:
                return False
            progress.fetched_through = self.consumer().fetches_begun
        if progress.handed_out is None:
            if self.consumer().fetches_begun <= progress.fetched_through:
                return False  # the fetch that read up to the end is still handing out
            progress.handed_out = self.consumer().last_handed_out(tp)
        return progress.handed_out is None or applied >= progress.handed_out


class _Progress:
    """One partition's catch-up: its end at the assignment, then the fetch count once
    the position reached it, then the last offset handed out by then."""

    __slots__ = ("end", "fetched_through", "handed_out")

    def __init__(self, end: int) -> None:
        self.end = end
        self.fetched_through: int | None = None
        self.handed_out: int | None = None
