"""`kill -USR1` on a worker logs where each task waits, down to the innermost await."""

from __future__ import annotations

import asyncio

from processors.service import await_path


async def _innermost(gate: asyncio.Event) -> None:
    await gate.wait()


async def _outer(gate: asyncio.Event) -> None:
    await _innermost(gate)


def test_the_path_reaches_the_innermost_await() -> None:
    async def run() -> str:
        gate = asyncio.Event()
        task = asyncio.create_task(_outer(gate))
        await asyncio.sleep(0)  # let the task reach its wait
        path = await_path(task)
        gate.set()
        await task
        return path

    path = asyncio.run(run())
    names = [place.split(" ")[0] for place in path.split(" -> ")]
    assert names[:3] == ["_outer", "_innermost", "wait"], path
    assert names[-1].startswith("Future"), path  # the future it waits on
