"""`kill -USR1` on a worker logs where each task waits, down to the innermost await,
and where Faust's consumer and table recovery stand."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from types import SimpleNamespace

import pytest
from faust.types import TP

from processors.runtime.diagnostics import await_path, log_partition_state, log_task_stacks
from processors.runtime.faust_adaptations import _Resumed


async def _innermost(gate: asyncio.Event) -> None:
    await gate.wait()


async def _outer(gate: asyncio.Event) -> None:
    await _innermost(gate)


def _path_of_waiting_task(start: Callable[[asyncio.Event], Awaitable[None]]) -> list[str]:
    """The names on `await_path` of a task `start` makes, while it waits on a gate."""
    async def run() -> str:
        gate = asyncio.Event()
        task = asyncio.ensure_future(start(gate))
        await asyncio.sleep(0)  # let the task reach its wait
        path = await_path(task)
        gate.set()
        await task
        return path

    return [place.split(" ")[0] for place in asyncio.run(run()).split(" -> ")]


def test_the_path_reaches_the_innermost_await() -> None:
    names = _path_of_waiting_task(_outer)
    assert names[:3] == ["_outer", "_innermost", "wait"], names
    assert names[-1].startswith("Future"), names  # the future it waits on


def test_the_path_goes_on_into_a_delivery_the_consumer_started_itself() -> None:
    """The consumer runs a record's delivery up to its first wait and hands the rest
    to a task as a `_Resumed`: the path follows it into the delivery's own awaits."""
    def resumed(gate: asyncio.Event) -> Awaitable[None]:
        delivery = _outer(gate)
        return _Resumed(delivery, delivery.send(None))

    names = _path_of_waiting_task(resumed)
    assert names[-4:-1] == ["_outer", "_innermost", "wait"], names


def test_the_consumer_state_names_partitions_offsets_and_flags(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events, log = TP("events", 1), TP("app-run-state-changelog", 1)
    consumer = SimpleNamespace(
        assignment=lambda: {events, log}, _active_partitions={events}, _paused_partitions={log},
        flow_active=True, _read_offset={events: 41}, _committed_offset={events: 40})
    app = SimpleNamespace(
        consumer=consumer, flow_control=SimpleNamespace(is_active=lambda: False),
        rebalancing=False, in_recovery=True,
        tables=SimpleNamespace(recovery=SimpleNamespace(active_offsets={log: 7},
                                                         active_highwaters={log: 9})))
    with caplog.at_level(logging.WARNING):
        log_partition_state(app)  # type: ignore[arg-type]
    assert "fetched (active): events[1]" in caplog.text
    assert "paused: app-run-state-changelog[1]" in caplog.text
    assert "flow: consumer True, app False; rebalancing False; in recovery True" in caplog.text
    assert "recovery highwaters: app-run-state-changelog[1]=9" in caplog.text
    assert "read offsets: events[1]=41" in caplog.text


def test_the_dump_names_every_thread_and_the_consumer_thread_s_tasks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The consumer thread fetches and commits in its own loop: a stall there shows
    in its tasks and its thread's stack, not in the main loop's tasks."""
    thread_loop = asyncio.new_event_loop()
    gate = asyncio.Event()
    waiting = thread_loop.create_task(_outer(gate), name="fetch")
    thread_loop.run_until_complete(asyncio.sleep(0))  # the task reaches its wait
    app = SimpleNamespace(consumer=SimpleNamespace(_thread=SimpleNamespace(
        thread_loop=thread_loop)))

    async def dump() -> None:
        log_task_stacks(app)  # type: ignore[arg-type]

    try:
        with caplog.at_level(logging.WARNING):
            asyncio.run(dump())
    finally:
        waiting.cancel()
        thread_loop.run_until_complete(asyncio.gather(waiting, return_exceptions=True))
        thread_loop.close()
    assert "1 consumer thread tasks:\nfetch: _outer" in caplog.text
    assert "threads:\nMainThread: " in caplog.text
    assert "test_the_dump_names_every_thread" in caplog.text  # this thread's own frame
