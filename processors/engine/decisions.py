"""What the engine concludes from one record: plain values, no I/O.

Every decision returned by one `KeyEngine.feed` call is about the record that
was fed (the caller knows its coordinates), so decisions carry no position.
Reasons are readable and never contain reasoning text or encrypted values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from processors.engine.codes import FailureCode, LossReason, Outcome, WarningCode


@dataclass(frozen=True, slots=True)
class RunIdentity:
    thread_id: str
    run_id: str


@dataclass(frozen=True, slots=True)
class Warned:
    """Material was stripped or dropped; the run goes on."""

    code: WarningCode
    reason: str
    run: RunIdentity | None


@dataclass(frozen=True, slots=True)
class Failed:
    """The run (or, with no run active, this record on its own) failed."""

    code: FailureCode
    reason: str
    run: RunIdentity | None


@dataclass(frozen=True, slots=True)
class EncryptedLost:
    """One encrypted value that will never be returned."""

    reason: LossReason


# What a history entry does to the thread (docs/topics.md, *Folding the history topic*).
MESSAGE = "message"  # a whole message: replaces the one with its id in place, or appends
INPUT = "input"  # a message of RUN_STARTED.input new to the thread: appended if absent
CONTINUATION = "continuation"  # what this run added to a message an earlier run delivered
REMOVAL = "removal"  # a snapshot dropped a message an earlier run delivered


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    kind: str  # MESSAGE, INPUT, CONTINUATION or REMOVAL
    message: dict[str, Any]  # for REMOVAL only {"id": ...}


@dataclass(frozen=True, slots=True)
class Concluded:
    """A run ended with RUN_FINISHED or RUN_ERROR: its history is final. A `late` one
    is a RUN_ERROR after the run had finished: the run failed after all, its entries
    already published."""

    outcome: Outcome
    run: RunIdentity | None  # None for a RUN_ERROR that was the key's first event
    entries: list[HistoryEntry]
    usage: list[dict[str, Any]] | None
    error: dict[str, Any] | None
    # pendingToolCallIds (success) or interrupts (interrupt), as RUN_FINISHED said
    detail: dict[str, Any] | None = None
    input_echoed: bool | None = None  # whether RUN_STARTED carried the run's input
    late: bool = False

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The whole messages the run published (message and input entries), in order."""
        return [entry.message for entry in self.entries if entry.kind in (MESSAGE, INPUT)]


@dataclass(frozen=True, slots=True)
class Discarded:
    """The key's run had failed: the record was dropped unseen (counted only)."""


Decision = Warned | Failed | EncryptedLost | Concluded | Discarded


@dataclass(slots=True)  # not frozen: built once per record, on the hot path
class Step:
    """The decisions for one record, and the record's event type for metrics.

    `event_type` is the wire type when it is one of the 1.0 types,
    "unknown" for another string, "undecodable" when there was none.
    """

    event_type: str
    decisions: Sequence[Decision]  # read-only: quiet steps are shared
