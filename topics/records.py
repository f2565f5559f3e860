"""Output record shapes (contract: docs/topics.md), as pydantic v2 models.

Downstream teams build on these; a change is a new `schema` value, never a
silent one. Optional keys are absent, never null. A dead letter's `event` is
built by `topics.redaction.redact_event`: identifying fields only, everything
else a marker of its type and size.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

HISTORY_SCHEMA: Final = "agui.history.v2"
DEADLETTER_SCHEMA: Final = "agui.deadletter.v1"

# What a history content record does to the thread a consumer folds (docs/topics.md,
# *Folding the history topic*): `message` replaces the held message with its id in
# place, or appends; `input` (a message of RUN_STARTED.input new to the thread)
# appends only when the id is not held; `continuation` adds what a later run on the
# same stream added to a message an earlier one delivered; `removal` removes one.
ContentKind = Literal["message", "input", "continuation"]
CONTENT_KINDS: Final = ("message", "input", "continuation")
# How a run ended, as AG-UI 1.1 names it (events/lifecycle), plus the two endings the
# service gives a run itself: `failed` (a rule was broken) and `abandoned` (idle timeout).
RunOutcome = Literal["success", "interrupt", "cancelled", "error", "failed", "abandoned"]


class _Record(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, populate_by_name=True)

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.model_dump(by_alias=True, exclude_none=True))


class _HistoryRecord(_Record):
    schema_: Literal["agui.history.v2"] = Field(HISTORY_SCHEMA, alias="schema")
    tenant: str
    threadId: str | None = None
    runId: str | None = None


class HistoryMessage(_HistoryRecord):
    """A content record that carries a message (`kind` says how it folds)."""

    kind: ContentKind = "message"
    seq: int
    message: dict[str, Any]

    @staticmethod
    def encode(tenant: str, thread_id: str | None, run_id: str | None, seq: int,
               message: dict[str, Any], kind: ContentKind = "message") -> bytes:
        """The bytes of `HistoryMessage(...).to_bytes()`, for the engine's own messages,
        without the model's validating copy of the whole message (one per published
        message, on the worker's hot path). tests/processing/test_records.py proves they
        agree."""
        record: dict[str, Any] = {"schema": HISTORY_SCHEMA, "tenant": tenant}
        if thread_id is not None:
            record["threadId"] = thread_id
        if run_id is not None:
            record["runId"] = run_id
        record["kind"] = kind
        record["seq"] = seq
        record["message"] = message
        return orjson.dumps(record)


class HistoryRemoval(_HistoryRecord):
    """A later run's MESSAGES_SNAPSHOT dropped a message an earlier run delivered."""

    kind: Literal["removal"] = "removal"
    seq: int
    messageId: str


class HistoryErasure(_HistoryRecord):
    """The tenant erased the thread (`DELETE /v1/threads/{threadId}`): every consumer
    drops what the thread's records before this one gave it. Later records start the
    thread afresh."""

    kind: Literal["erasure"] = "erasure"
    erasedAt: int  # milliseconds since the epoch


class RunFailure(_Record):
    code: str


class HistoryRun(_HistoryRecord):
    """The closing record of a run: how it ended, and how many content records it
    published. Every run that ends gets one; a `late` one (a RUN_ERROR after the run
    had finished) turns the run into an error. The last closing record of a run is
    its fate."""

    kind: Literal["run"] = "run"
    outcome: RunOutcome
    messageCount: int | None = None  # absent only on a late error
    pendingToolCallIds: list[str] | None = None
    interrupts: list[dict[str, Any]] | None = None
    usage: list[dict[str, Any]] | None = None
    error: dict[str, Any] | None = None
    failure: RunFailure | None = None
    inputEchoed: bool | None = None
    late: bool | None = None
    # Optional fields left out because the record would not fit its topic, by name.
    truncated: list[str] | None = None


class SourceCoordinates(_Record):
    topic: str
    partition: int
    offset: int
    timestamp: int | None = None


class DeadLetter(_Record):
    """A failure or warning about one input record. Sized to fit its topic: what does not
    fit is left out, in this order, and said so: the event copy (`truncated`), the input
    record's headers copied onto it (`headersDropped`: how many), what is past the first
    1,024 characters of the reason, tenant and ids (`cut`)."""

    schema_: Literal["agui.deadletter.v1"] = Field(DEADLETTER_SCHEMA, alias="schema")
    kind: Literal["failure", "warning"]
    code: str
    reason: str
    tenant: str
    threadId: str | None = None
    runId: str | None = None
    source: SourceCoordinates
    event: Any = None  # the offending event, redacted (topics.redaction)
    raw: str | None = None  # base64 of an undecodable record's value
    truncated: bool | None = None  # `event`/`raw` left out: the record would be too large
    headersDropped: int | None = None  # input headers not copied: too large
    cut: bool | None = None  # reason, tenant and ids cut to 1,024 characters: too large
