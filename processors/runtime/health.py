"""Whether a worker is ready and alive, decided from what the worker observes.

Pure (no Faust, no clock of its own): the service's health timer feeds it
observations and the health pages ask it. Liveness means progress: a worker
whose assigned input partitions have records it has not processed, and that
has processed nothing for `stall_after` seconds, is stuck (a restart is the
remedy); a worker with no lag is alive however long it has been idle.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Verdict:
    healthy: bool
    reason: str


class Liveness:
    """Progress against lag; the clock is the caller's (monotonic seconds)."""

    def __init__(self, stall_after: float, now: float) -> None:
        self.stall_after = stall_after
        self._progress_at = now  # the last time a record was processed, or partitions moved
        self._processed = 0
        self._lagging: list[str] = []  # input partitions with unprocessed records

    def partitions_moved(self, now: float) -> None:
        """A rebalance: the new assignment gets a full `stall_after` to show progress."""
        self._progress_at = now
        self._lagging = []

    def observe(self, processed: int, lagging: list[str], now: float) -> None:
        """`processed`: records processed so far (a counter); `lagging`: the assigned
        input partitions whose end offset is beyond the next record to process."""
        if processed != self._processed:
            self._processed = processed
            self._progress_at = now
        self._lagging = lagging

    def verdict(self, now: float) -> Verdict:
        idle = now - self._progress_at
        if self._lagging and idle > self.stall_after:
            return Verdict(False, f"no record processed for {idle:.0f} s while input"
                                  f" partitions {', '.join(self._lagging)} have records"
                                  " to process")
        if self._lagging:
            return Verdict(True, f"processing; last progress {idle:.0f} s ago")
        return Verdict(True, "no lag")
