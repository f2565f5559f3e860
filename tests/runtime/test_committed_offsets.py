"""Committed offsets fetched with the group's own error read (broker-free: the
coordinator's answers are the broker's, built with aiokafka's response classes)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import errors
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.protocol.commit import OffsetFetchResponse_v3
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from processors.runtime.committed_offsets import GroupErrorCheckingCoordinator
from processors.runtime.worker_transactions import (
    _OffsetFetchResponseV7,
    _StableOffsetsCoordinator,
)

TP0 = TopicPartition("events", 0)
COORDINATOR_LOAD_IN_PROGRESS = 14
NOT_COORDINATOR = 16


def _answering(monkeypatch: pytest.MonkeyPatch, coordinator_class: type[GroupCoordinator],
               answer: Any) -> tuple[GroupCoordinator, list[bool]]:
    """A coordinator of `coordinator_class` whose requests the broker answers with
    `answer`; and the record of its coordinator being marked dead."""
    async def send(self: Any, request: Any) -> Any:
        return answer

    monkeypatch.setattr(GroupCoordinator, "_send_req", send)
    coordinator = object.__new__(coordinator_class)
    coordinator.group_id = "app"
    dead: list[bool] = []
    coordinator.coordinator_dead = lambda: dead.append(True)  # type: ignore[method-assign]
    return coordinator, dead


def _fetch(coordinator: GroupCoordinator) -> Any:
    return asyncio.run(coordinator._do_fetch_commit_offsets([TP0]))


def _group_error(code: int) -> OffsetFetchResponse_v3:
    # What Kafka answers from v2 on for an error of the whole group: no partitions.
    return OffsetFetchResponse_v3(throttle_time_ms=0, topics=[], error_code=code)


def test_aiokafka_takes_a_group_error_for_no_committed_offsets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    coordinator, _ = _answering(monkeypatch, GroupCoordinator,
                                _group_error(COORDINATOR_LOAD_IN_PROGRESS))
    assert _fetch(coordinator) == {}  # every partition would start from auto_offset_reset


def test_a_coordinator_still_loading_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    coordinator, dead = _answering(monkeypatch, GroupErrorCheckingCoordinator,
                                   _group_error(COORDINATOR_LOAD_IN_PROGRESS))
    with pytest.raises(errors.GroupLoadInProgressError) as raised:
        _fetch(coordinator)
    assert raised.value.retriable and not dead  # aiokafka's fetch retries it


def test_a_moved_coordinator_is_looked_up_again(monkeypatch: pytest.MonkeyPatch) -> None:
    coordinator, dead = _answering(monkeypatch, GroupErrorCheckingCoordinator,
                                   _group_error(NOT_COORDINATOR))
    with pytest.raises(errors.NotCoordinatorForGroupError):
        _fetch(coordinator)
    assert dead == [True]


def test_an_answer_without_a_group_error_is_read_as_aiokafka_reads_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    answer = OffsetFetchResponse_v3(throttle_time_ms=0, error_code=0,
                                    topics=[("events", [(0, 42, "", 0)])])
    coordinator, _ = _answering(monkeypatch, GroupErrorCheckingCoordinator, answer)
    assert _fetch(coordinator) == {TP0: OffsetAndMetadata(42, "")}


def test_with_worker_transactions_the_stable_fetch_raises_the_group_error_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    answer = _OffsetFetchResponseV7(throttle_time_ms=0, topics=[],
                                    error_code=COORDINATOR_LOAD_IN_PROGRESS, tags={})
    coordinator, _ = _answering(monkeypatch, _StableOffsetsCoordinator, answer)
    with pytest.raises(errors.GroupLoadInProgressError):
        _fetch(coordinator)
