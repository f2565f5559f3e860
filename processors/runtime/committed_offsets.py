"""Committed offsets read as the broker answers them, the group's own error included.

From OffsetFetch v2 on, the broker answers an error of the whole group (its
coordinator still loading the group's offsets after a broker restart or a move of
an `__consumer_offsets` partition, moved to another broker, not available) with
that error and no partitions at all (Kafka's `OffsetFetchRequest.getErrorResponse`).
aiokafka reads only the partitions' errors, so it took such an answer for "no
committed offset" for every partition: the consumer started them from
`auto_offset_reset`, the raw topics' beginning, and processed everything they
retain again. Here the group's error is raised as aiokafka raises a partition's:
a coordinator loading or moved is asked again after aiokafka's backoff (a moved
one found again first), any other error fails the fetch.
"""

from __future__ import annotations

from typing import Any

import aiokafka
from aiokafka import errors
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.protocol.commit import OffsetFetchRequest

# Group-level errors after which the group's coordinator is looked up again.
_COORDINATOR_GONE = (errors.NotCoordinatorForGroupError, errors.GroupCoordinatorNotAvailableError)


def raise_group_error(coordinator: GroupCoordinator, code: int) -> None:
    """Raise the group-level error `code` of an OffsetFetch answer (0: none)."""
    if not code:
        return
    error = errors.for_code(code)
    if issubclass(error, _COORDINATOR_GONE):
        coordinator.coordinator_dead()
    if error is errors.GroupAuthorizationFailedError:
        raise error(coordinator.group_id)
    raise error()


class GroupErrorCheckingCoordinator(GroupCoordinator):  # type: ignore[misc]
    """aiokafka's group coordinator, raising an OffsetFetch answer's group error."""

    async def _send_req(self, request: Any) -> Any:
        response = await super()._send_req(request)
        if isinstance(request, OffsetFetchRequest):
            raise_group_error(self, getattr(response, "error_code", 0))
        return response


def read_group_errors(consumer: aiokafka.AIOKafkaConsumer) -> None:
    """Make a started consumer raise the group's error when it fetches committed
    offsets. Its coordinator is built in `start()` and fetches offsets only after a
    subscription and an assignment, so swapping its class then takes effect before
    the first."""
    consumer._coordinator.__class__ = GroupErrorCheckingCoordinator
