"""A newly assigned history partition answers only once its view holds what the
partition held at the assignment (`processors.runtime.view_catch_up`), without a
broker: a stand-in consumer whose position, fetches and ends the tests move."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from faust.types import TP

from processors.runtime.view_catch_up import ViewCatchUp
from processors.view.thread_view import HistoryPartition

HISTORY = TP("agui.history", 0)
PARTITION: HistoryPartition = ("agui.history", 0)


class Consumer:
    """Ends, positions and fetches as the tests set them; counts position reads."""

    def __init__(self, end: int) -> None:
        self.ends = {HISTORY: end}
        self.positions: dict[Any, int | None] = {HISTORY: None}
        self.fetches_begun = 0
        self.handed_out: dict[Any, int] = {}
        self.position_reads = 0

    def last_handed_out(self, tp: Any) -> int | None:
        return self.handed_out.get(tp)

    async def highwaters(self, *partitions: Any) -> dict[Any, int]:
        return {tp: self.ends[tp] for tp in partitions}

    def fetch_position(self, tp: Any) -> int | None:
        self.position_reads += 1
        return self.positions[tp]


class World:
    def __init__(self, end: int, applied: int = -1, recovered: bool = True) -> None:
        self.consumer = Consumer(end)
        self.applied = {PARTITION: applied}
        self.recovered = recovered
        self.catch_up = ViewCatchUp(lambda: self.consumer, self.applied.__getitem__,
                                    lambda: self.recovered)

    def caught_up(self) -> bool:
        return self.catch_up.caught_up(PARTITION)


def look(world: World, *moves: Callable[[], object]) -> list[bool]:
    """Begin an assignment of the history partition, then look once after each move:
    whether it had caught up each time."""
    async def scenario() -> list[bool]:
        await world.catch_up.begin([HISTORY])
        seen = []
        for move in moves:
            move()
            await world.catch_up.look()
            seen.append(world.caught_up())
        return seen

    return asyncio.run(scenario())


def nothing() -> None:
    pass


def test_a_partition_whose_view_has_applied_the_record_below_its_end_is_caught_up() -> None:
    assert look(World(end=5, applied=4), nothing) == [True]


def test_an_empty_partition_is_caught_up() -> None:
    assert look(World(end=0), nothing) == [True]


def test_behind_a_commit_marker_it_waits_for_the_fetch_then_the_handing_out_then_the_view(
        ) -> None:
    """Records 0..8, the commit marker at 9, end 10; the view applied up to 4 (the
    table as committed). No step alone is enough, and the order of the checks
    matters: what is handed out is read only once the fetch that reached the end
    has handed its batch out."""
    world = World(end=10, applied=4)
    consumer = world.consumer

    def fetched_to(position: int, last: int) -> Callable[[], None]:
        def move() -> None:
            consumer.positions[HISTORY] = position
            consumer.handed_out[HISTORY] = last
        return move

    def next_fetch() -> None:
        consumer.fetches_begun += 1

    def applied(offset: int) -> Callable[[], None]:
        return lambda: world.applied.__setitem__(PARTITION, offset)

    assert look(world, fetched_to(7, 6), applied(6),  # not fetched to the end
                fetched_to(10, 7), applied(7),  # fetched, the batch still handing out
                fetched_to(10, 8), next_fetch,  # handed out: 8 is the last
                applied(7),  # not applied yet
                applied(8)) == [False, False, False, False, False, False, False, True]


def test_nothing_moves_while_the_tables_recover() -> None:
    world = World(end=10, applied=4, recovered=False)
    world.consumer.positions[HISTORY] = 10
    world.consumer.handed_out[HISTORY] = 8
    world.applied[PARTITION] = 9
    assert look(world, nothing) == [False]
    assert world.consumer.position_reads == 0


def test_a_partition_whose_fetches_handed_out_nothing_is_caught_up_once_fetched() -> None:
    """The view's committed offset is past every record below the end (only markers
    were read): nothing to apply."""
    world = World(end=10, applied=4)
    world.consumer.positions[HISTORY] = 10

    def next_fetch() -> None:
        world.consumer.fetches_begun += 1

    assert look(world, nothing, next_fetch) == [False, True]


def test_a_revocation_forgets_every_partition_caught_up() -> None:
    async def scenario() -> tuple[bool, bool]:
        world = World(end=5, applied=4)
        world.catch_up.assigned([HISTORY])
        async with asyncio.timeout(5):  # the catch-up task polls
            while not world.caught_up():
                await asyncio.sleep(0.001)
        answered_before = world.caught_up()
        world.catch_up.revoked()
        return answered_before, world.caught_up()

    assert asyncio.run(scenario()) == (True, False)
