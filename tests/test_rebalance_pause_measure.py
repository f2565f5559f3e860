"""The rebalance benchmark's pause measure (benchmarks/rebalance_pause.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from rebalance_pause import Pause, longest_pause


def test_a_partition_processed_elsewhere_before_the_window_pauses_from_its_start() -> None:
    # The counted worker last processed the partition at t=1 (then it moved away);
    # the window opens at t=30 and the partition is processed again from t=34.
    progress = [(0.0, 0.0), (1.0, 10.0), (30.0, 10.0), (32.0, 10.0), (34.0, 12.0),
                (35.0, 14.0), (36.0, 16.0), (37.0, 18.0)]
    assert longest_pause(progress, start=30.0, end=37.0, produced=100.0) == Pause(4.0, 30.0, 34.0)


def test_the_longest_gap_inside_the_window_counts() -> None:
    progress = [(10.0, 1.0), (11.0, 2.0), (12.0, 2.0), (17.0, 3.0), (18.0, 4.0), (21.0, 5.0)]
    assert longest_pause(progress, start=10.0, end=21.0, produced=100.0) == Pause(6.0, 11.0, 17.0)


def test_a_partition_never_processed_in_the_window_pauses_for_all_of_it() -> None:
    progress = [(0.0, 5.0), (10.0, 5.0), (20.0, 5.0), (31.0, 5.0)]
    assert longest_pause(progress, start=10.0, end=30.0, produced=100.0) == Pause(20.0, 10.0, 30.0)


def test_a_partition_with_nothing_left_is_not_paused() -> None:
    progress = [(10.0, 8.0), (11.0, 10.0), (25.0, 10.0)]
    assert longest_pause(progress, start=10.0, end=25.0, produced=10.0) == Pause(1.0, 10.0, 11.0)
