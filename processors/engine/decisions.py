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


@dataclass(frozen=True, slots=True)
class Concluded:
    """A run ended with RUN_FINISHED or RUN_ERROR: its history is final."""

    outcome: Outcome
    run: RunIdentity | None  # None for a RUN_ERROR that was the key's first event
    messages: list[dict[str, Any]]
    usage: list[dict[str, Any]] | None
    error: dict[str, Any] | None


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
