"""The worker's garbage collector settings (processors.runtime.collector)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from processors.runtime.collector import YOUNG_THRESHOLD, tune_collector


@pytest.fixture
def collector_restored() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("collector_restored")
def test_start_up_objects_are_frozen_and_young_collections_are_rarer() -> None:
    _, middle, old = gc.get_threshold()
    tune_collector()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (YOUNG_THRESHOLD, middle, old)


@pytest.mark.usefixtures("collector_restored")
def test_objects_freed_within_the_young_threshold_cause_no_collection() -> None:
    """What the threshold is for: a run's objects, held while a few thousand more
    are allocated and then freed, cause no collection at all."""
    tune_collector()
    gc.collect(0)
    before = [generation["collections"] for generation in gc.get_stats()]
    held = [[n] for n in range(YOUNG_THRESHOLD // 3)]  # an open run's state
    churn = [[n] for n in range(YOUNG_THRESHOLD // 3)]  # records passing through
    del churn, held
    assert [generation["collections"] for generation in gc.get_stats()] == before
