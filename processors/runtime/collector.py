"""Python's cyclic garbage collector, set for a process that streams for days.

With CPython's defaults a young collection runs every 700 tracked objects
allocated and not yet freed, and a full one, which walks every tracked object,
whenever the objects promoted since the last one reach a quarter of the old
generation. A worker holds tens of objects per open run (its engine, state,
cached key, write-behind text) for seconds, so they outlive two young
collections and are promoted: with thousands of open runs, a full collection ran
every 1.4-2 s and stopped the event loop for 40-75 ms (3,400 open keys) to
250-440 ms (8,200 keys, `benchmarks/api_load.py`), 5-20 % of the worker's time.
Collecting the young generation every 10,000 allocations instead promotes
almost none of them (they are freed before), so full collections become rare;
each young collection then takes 4-12 ms. docs/performance.md, *The garbage
collector*, has the measurements.
"""

from __future__ import annotations

import gc
from typing import Final

YOUNG_THRESHOLD: Final = 10_000  # CPython's default: 700


def tune_collector() -> None:
    """Freeze what start-up built and collect the young generation less often.

    Frozen: the modules, classes and app built so far live for the whole process;
    a full collection then no longer walks them (it took 70-100 ms with them,
    7 ms without). Call once, after start-up and before serving."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
