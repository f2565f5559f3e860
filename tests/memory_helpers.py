"""Memory a piece of code leaves allocated, counted by tracemalloc (allocations,
not RSS: the same on every run of the same code)."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable


def bytes_left_allocated(work: Callable[[], object]) -> int:
    """Bytes still allocated after `work()` returns, with its result kept alive."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        kept = work()
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    del kept
    return sum(stat.size_diff for stat in after.compare_to(before, "filename"))
