"""What a stuck worker logs about itself on SIGUSR1: where each task and thread waits,
and where Faust's consumer and table recovery stand. Code locations, partitions,
offsets and flags only: never a record's content."""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import sys
import threading
import traceback
from collections.abc import Iterable
from typing import Any

import faust

from processors.runtime.faust_adaptations import resumed_coroutine
from processors.safe_logging import log_exception_kind

log = logging.getLogger("agui_stream")


def log_partition_state(app: faust.App) -> None:
    """Log where Faust's consumer and table recovery stand: partitions, offsets and
    flags only (what a stuck worker needs explained; never a record's content)."""
    def tps(partitions: Any) -> str:
        return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(partitions or ()))

    def offsets(mapping: Any) -> str:
        return ", ".join(f"{tp.topic}[{tp.partition}]={offset}"
                         for tp, offset in sorted(dict(mapping or {}).items()))

    try:
        consumer: Any = app.consumer
        recovery: Any = getattr(app.tables, "recovery", None)
        lines = [
            f"assigned: {tps(consumer.assignment())}",
            f"fetched (active): {tps(getattr(consumer, '_active_partitions', None))}",
            f"paused: {tps(getattr(consumer, '_paused_partitions', None))}",
            f"flow: consumer {consumer.flow_active}, app {app.flow_control.is_active()};"
            f" rebalancing {app.rebalancing}; in recovery {app.in_recovery}",
            f"recovery offsets: {offsets(getattr(recovery, 'active_offsets', None))}",
            f"recovery highwaters: {offsets(getattr(recovery, 'active_highwaters', None))}",
            f"read offsets: {offsets(getattr(consumer, '_read_offset', None))}",
            f"committed offsets: {offsets(getattr(consumer, '_committed_offset', None))}",
            *_kafka_client_state(consumer),
        ]
        log.warning("consumer state:\n%s", "\n".join(lines))
    except Exception as error:  # a diagnostic must never stop the worker
        log_exception_kind(log, logging.WARNING, "could not log the consumer state", error)


def _kafka_client_state(consumer: Any) -> list[str]:
    """What aiokafka's own consumer holds per partition, where Faust's view ends: its
    fetch position, pause flag and buffered fetch (read without the consumer thread's
    loop, so a snapshot that may be a moment old)."""
    client = getattr(getattr(consumer, "_thread", None), "_consumer", None)
    if client is None:
        return []
    subscription = client._subscription.subscription
    fetcher = client._fetcher
    states = []
    for tp in sorted(subscription.assignment.tps if subscription else ()):
        state = subscription.assignment.state_value(tp)
        position = state.position if state.has_valid_position else "none"
        states.append(f"{tp.topic}[{tp.partition}]={position}"
                      f"{' paused' if state.paused else ''}"
                      f"{' buffered' if tp in fetcher._records else ''}")
    return [f"kafka client positions: {', '.join(states)}",
            f"kafka client: reassignment in progress"
            f" {client._subscription.reassignment_in_progress},"
            f" fetches in flight to nodes {sorted(fetcher._in_flight)}"]


def log_task_stacks(app: faust.App | None = None) -> None:
    """Log where each asyncio task waits, on this loop and on the consumer thread's
    (which fetches and commits for it), and where each thread is: code locations
    only, never values."""
    lines = _task_lines(asyncio.all_tasks())
    log.warning("%d tasks:\n%s", len(lines), "\n".join(lines))
    thread_loop = getattr(getattr(getattr(app, "consumer", None), "_thread", None),
                          "thread_loop", None)
    if isinstance(thread_loop, asyncio.AbstractEventLoop):
        try:  # another thread's loop: its task set may change while it is read
            tasks = list(asyncio.all_tasks(thread_loop))
        except RuntimeError:
            tasks = []
        lines = _task_lines(tasks)
        log.warning("%d consumer thread tasks:\n%s", len(lines), "\n".join(lines))
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    lines = [f"{names.get(ident, ident)}: " + " -> ".join(
                 f"{frame.name} ({frame.filename}:{frame.lineno})"
                 for frame in traceback.extract_stack(top, limit=12))
             for ident, top in sys._current_frames().items()]
    log.warning("%d threads:\n%s", len(lines), "\n".join(sorted(lines)))


def _task_lines(tasks: Iterable[asyncio.Task[Any]]) -> list[str]:
    return sorted(f"{task.get_name()}: {await_path(task)}" for task in tasks)


def await_path(task: asyncio.Task[Any]) -> str:
    """The task's coroutine and, link by link, what it awaits (outermost first).

    `Task.get_stack()` shows only the outermost coroutine; the place a stuck
    task waits is at the end of its await chain.
    """
    places: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None:
        frame = (getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
                 or getattr(awaited, "gi_frame", None))
        if frame is None:
            inner = _driven_by(awaited)
            if inner is None:
                places.append(type(awaited).__name__)  # a future, or a finished coroutine
                break
            awaited = inner
            continue
        places.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno})")
        awaited = (getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
                   or getattr(awaited, "gi_yieldfrom", None) or resumed_coroutine(frame))
    return " -> ".join(places)


def _driven_by(awaitable: Any) -> Any:
    """The coroutine or generator an await wrapper drives (`__await__()` of a
    coroutine, an async generator's `asend`), which no public attribute names."""
    if isinstance(awaitable, asyncio.Future) or type(awaitable).__name__ == "FutureIter":
        return None
    for referent in gc.get_referents(awaitable):
        if (inspect.iscoroutine(referent) or inspect.isasyncgen(referent)
                or inspect.isgenerator(referent)):
            return referent
    return None
