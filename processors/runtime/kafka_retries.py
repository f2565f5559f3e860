"""Kafka requests asked again while they fail with an error Kafka calls retriable (a
coordinator still loading, a partition without a leader yet), for a bounded time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiokafka import errors

T = TypeVar("T")


async def until_settled(attempt: Callable[[], Awaitable[T]], seconds: float,
                        between: Callable[[], Awaitable[object]] | None = None) -> T:
    """`attempt()`, again while it fails with a retriable error, for up to `seconds`
    (pausing 0.1 s, doubling up to 1 s); `between()`, if given, runs before each
    attempt again (to look the partitions' leaders up again, say)."""
    deadline = asyncio.get_running_loop().time() + seconds
    pause = 0.1
    while True:
        try:
            return await attempt()
        except errors.KafkaError as error:
            if not error.retriable or asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, 1.0)
        if between is not None:
            await between()
