"""Kafka requests asked again while their error is retriable (no broker needed)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import errors

from processors.runtime.kafka_retries import until_settled


def test_a_retriable_error_is_asked_again_after_what_runs_between() -> None:
    calls: list[str] = []

    async def attempt() -> int:
        calls.append("attempt")
        if calls.count("attempt") < 3:
            raise errors.NotLeaderForPartitionError()
        return 7

    async def between() -> None:
        calls.append("between")

    assert asyncio.run(until_settled(attempt, 30.0, between)) == 7
    assert calls == ["attempt", "between", "attempt", "between", "attempt"]


def test_an_error_that_does_not_pass_is_raised_at_once() -> None:
    calls: list[None] = []

    async def attempt() -> int:
        calls.append(None)
        raise errors.TopicAuthorizationFailedError()

    with pytest.raises(errors.TopicAuthorizationFailedError):
        asyncio.run(until_settled(attempt, 30.0))
    assert len(calls) == 1


def test_a_retriable_error_is_raised_once_the_time_is_up() -> None:
    async def attempt() -> int:
        raise errors.CoordinatorLoadInProgressError()

    with pytest.raises(errors.CoordinatorLoadInProgressError):
        asyncio.run(until_settled(attempt, 0.0))
