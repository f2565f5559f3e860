"""Liveness from progress and lag (processors/runtime/health.py), on a plain clock."""

from __future__ import annotations

from processors.runtime.health import Liveness

STALL = 300.0


def test_an_idle_worker_without_lag_stays_alive_however_long() -> None:
    liveness = Liveness(STALL, now=0.0)
    liveness.observe(processed=10, lagging=[], now=5.0)
    assert liveness.verdict(now=10 * STALL).healthy


def test_lag_with_no_progress_for_longer_than_the_stall_time_is_not_alive() -> None:
    liveness = Liveness(STALL, now=0.0)
    liveness.observe(processed=0, lagging=["events[3]"], now=10.0)
    assert liveness.verdict(now=STALL).healthy  # not yet
    verdict = liveness.verdict(now=STALL + 1)
    assert not verdict.healthy and "events[3]" in verdict.reason


def test_progress_restarts_the_clock() -> None:
    liveness = Liveness(STALL, now=0.0)
    liveness.observe(processed=5, lagging=["events[0]"], now=STALL - 1)
    assert liveness.verdict(now=2 * STALL - 2).healthy
    liveness.observe(processed=5, lagging=["events[0]"], now=2 * STALL)  # nothing new
    assert not liveness.verdict(now=2 * STALL).healthy


def test_a_rebalance_gives_the_new_assignment_a_full_stall_time() -> None:
    liveness = Liveness(STALL, now=0.0)
    liveness.observe(processed=0, lagging=["events[1]"], now=STALL + 1)
    assert not liveness.verdict(now=STALL + 1).healthy
    liveness.partitions_moved(now=STALL + 2)
    liveness.observe(processed=0, lagging=["events[1]"], now=STALL + 3)
    assert liveness.verdict(now=2 * STALL).healthy
    assert not liveness.verdict(now=2 * STALL + 3).healthy
