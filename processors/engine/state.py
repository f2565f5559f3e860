"""The engine's state for one run key: small, plain and serialisable.

It holds the shape of the active run (open sets, owners, chunk lanes, message
records) but no streamed text: deltas live in a `ContentStore`, addressed by
slot, so the state stays the same size however many deltas a message gets.
`to_json`/`from_json` round-trip it exactly (the service keeps it in a Faust
table).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import orjson


class Phase(StrEnum):
    FRESH = "fresh"  # no run has started on this key yet
    ACTIVE = "active"
    FINISHED = "finished"  # last run ended with RUN_FINISHED: a late RUN_ERROR is accepted
    ERRORED = "errored"  # last run ended with RUN_ERROR: only RUN_STARTED may follow
    FAILED = "failed"  # last run failed: records are discarded until RUN_STARTED


class ChunkKind(StrEnum):
    REASONING = "reasoning"
    TEXT = "text"
    TOOL = "tool"


# Where a message record came from, which decides how its history entry folds
# (processors.engine.decisions): built (or restated) by the run, a message of
# RUN_STARTED.input new to the thread, or what the run added to a message an
# earlier run on the key delivered.
BUILT, INPUT, CONTINUED = 0, 1, 2


class ToolCallRecord:
    __slots__ = ("args_base", "args_slot", "continued", "encrypted_type", "encrypted_value",
                 "id", "metadata", "name", "parent")

    def __init__(self, call_id: str, name: str, args_base: str = "") -> None:
        self.id = call_id
        self.name = name
        self.args_base = args_base
        self.args_slot: int | None = None
        self.encrypted_value: str | None = None
        self.encrypted_type: str | None = None  # encryptedValueType, replaced with the value
        self.metadata: dict[str, Any] | None = None
        self.parent: str | None = None  # the parentMessageId its opener gave (chunk conflicts)
        self.continued = False  # a call an earlier run delivered, reopened: args append

    def to_list(self) -> list[Any]:
        data = [self.id, self.name, self.args_base, self.args_slot, self.encrypted_value,
                self.metadata]
        if self.encrypted_type is not None or self.parent is not None or self.continued:
            data += (self.encrypted_type, self.parent, self.continued)
        return data

    @classmethod
    def from_list(cls, data: list[Any]) -> ToolCallRecord:
        record = cls(data[0], data[1], data[2])
        record.args_slot, record.encrypted_value, record.metadata = data[3], data[4], data[5]
        if len(data) > 6:  # stored before AG-UI 1.1: none of these
            record.encrypted_type, record.parent, record.continued = data[6], data[7], data[8]
        return record


class MessageRecord:
    """One history message. Text is `content_base` + the fragments of `content_slot`."""

    __slots__ = ("content_base", "content_slot", "encrypted_type", "encrypted_value", "fields",
                 "id", "metadata", "origin", "role", "tool_calls")

    def __init__(self, message_id: str, role: str, fields: dict[str, Any] | None = None) -> None:
        self.id = message_id
        self.role = role
        # Everything else the message carries verbatim (name, subagentRunId,
        # toolCallId, error, activityType, structured content). None while
        # there is nothing: most streamed messages carry nothing else, and a
        # dict each would be one more object per message to build, visit
        # (cold) at the run's end and free.
        self.fields = fields
        self.content_base: str | None = None
        self.content_slot: int | None = None
        self.tool_calls: list[ToolCallRecord] | None = None
        self.encrypted_value: str | None = None
        self.encrypted_type: str | None = None  # encryptedValueType, replaced with the value
        self.metadata: dict[str, Any] | None = None
        self.origin = BUILT

    def field(self, key: str) -> Any:
        """The value of one of `fields`, None when absent."""
        return None if self.fields is None else self.fields.get(key)

    def set_field(self, key: str, value: Any) -> None:
        if self.fields is None:
            self.fields = {key: value}
        else:
            self.fields[key] = value

    def to_list(self) -> list[Any]:
        calls = None if self.tool_calls is None else [c.to_list() for c in self.tool_calls]
        fields = {} if self.fields is None else self.fields  # stored as before: always a dict
        data = [self.id, self.role, fields, self.content_base, self.content_slot, calls,
                self.encrypted_value, self.metadata]
        if self.origin != BUILT or self.encrypted_type is not None:
            data += (self.origin, self.encrypted_type)
        return data

    @classmethod
    def from_list(cls, data: list[Any]) -> MessageRecord:
        record = cls(data[0], data[1], data[2] or None)
        record.content_base, record.content_slot = data[3], data[4]
        record.tool_calls = None if data[5] is None else [
            ToolCallRecord.from_list(c) for c in data[5]
        ]
        record.encrypted_value, record.metadata = data[6], data[7]
        if len(data) > 8:
            record.origin, record.encrypted_type = data[8], data[9]
        return record


# Owners and open sets are kept per namespace, never across them (section 9).
NAMESPACES = ("span", "reasoning", "text", "tool")
# Every kind of item a run opens, in the order of `RunState.open`: the
# namespaces with owners (the order of `RunState.owners`), then steps and subagents.
OPEN_KINDS = (*NAMESPACES, "step", "subagent")


class RunState:
    __slots__ = ("input_echoed", "lanes", "messages", "next_slot", "open", "owners", "removed",
                 "run_id", "subagents_done", "thinking", "thread_id", "tool_index",
                 "warned_fields")

    def __init__(self, thread_id: str, run_id: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        # Open ids by kind, in OPEN_KINDS order. Dicts used as ordered sets so
        # reports list ids in opening order. Tuples, not dicts by name: the
        # engine reaches a kind's ids by position, one object fewer to fetch
        # and no hashing on every open and close. (Spelt out: a comprehension
        # costs a call, and every run builds these.)
        self.open: tuple[dict[str, None], ...] = ({}, {}, {}, {}, {}, {})
        # By namespace, in NAMESPACES order: the subagentRunId (None = the
        # parent agent) that opened each id.
        self.owners: tuple[dict[str, str | None], ...] = ({}, {}, {}, {})
        # Lane (subagentRunId, None = parent) -> its pending chunk item.
        self.lanes: dict[str | None, tuple[ChunkKind, str]] = {}
        # Message id -> record, in history order (no list of ids beside it: one
        # object less per run, and the run's end reads the records in one pass).
        self.messages: dict[str, MessageRecord] = {}
        self.tool_index: dict[str, str] = {}  # tool call id -> id of the message holding it
        self.next_slot = 0
        # (event type as received, JSON pointer) already warned as unknown_field;
        # None until the first (a set is 200 bytes to write per run, and few warn).
        self.warned_fields: set[str] | None = None
        self.input_echoed = False  # RUN_STARTED carried the run's input
        # Messages earlier runs on the key delivered that a snapshot of this run dropped,
        # in order (each a removal entry when the run concludes); None until the first.
        self.removed: list[str] | None = None
        # Subagent invocations that finished or errored in this run (`subagent_reused`).
        self.subagents_done: dict[str, None] | None = None
        # The compatibility boundary's THINKING_* ids (processors.engine.retired); None
        # until the run's first retired event.
        self.thinking: list[Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {
            "thread": self.thread_id,
            "run": self.run_id,
            "open": {kind: list(ids) for kind, ids in zip(OPEN_KINDS, self.open, strict=True)},
            "owners": dict(zip(NAMESPACES, self.owners, strict=True)),
            "lanes": [[lane, kind.value, item] for lane, (kind, item) in self.lanes.items()],
            "order": list(self.messages),
            "messages": [record.to_list() for record in self.messages.values()],
            "tools": self.tool_index,
            "slot": self.next_slot,
            "warned": sorted(self.warned_fields or ()),
        }
        # Written only when set: most runs have none of them.
        if self.input_echoed:
            data["echoed"] = True
        if self.removed:
            data["removed"] = self.removed
        if self.subagents_done:
            data["subagentsDone"] = list(self.subagents_done)
        if self.thinking is not None:
            data["thinking"] = self.thinking
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunState:
        run = cls(data["thread"], data["run"])
        run.open = tuple(dict.fromkeys(data["open"][kind]) for kind in OPEN_KINDS)
        run.owners = tuple(data["owners"][ns] for ns in NAMESPACES)
        run.lanes = {lane: (ChunkKind(kind), item) for lane, kind, item in data["lanes"]}
        # Stored in history order (`order` lists the same ids, for older readers).
        run.messages = {m[0]: MessageRecord.from_list(m) for m in data["messages"]}
        run.tool_index = data["tools"]
        run.next_slot = data["slot"]
        run.warned_fields = set(data["warned"]) or None
        run.input_echoed = data.get("echoed", False)
        run.removed = data.get("removed")
        done = data.get("subagentsDone")
        run.subagents_done = None if done is None else dict.fromkeys(done)
        run.thinking = data.get("thinking")
        return run


class KeyState:
    """Everything the engine remembers about one run key between records.

    Besides the active run, what the key's earlier runs delivered (AG-UI 1.1: across
    runs within a stream, messages accumulate): each message's role by id and each
    tool call's host and name, so a later run can continue, restate or remove them
    (never their text: that is published already). And the identity of the last
    run that finished, which a late RUN_ERROR turns into an error.
    """

    __slots__ = ("held", "held_calls", "last", "phase", "run")

    def __init__(self, phase: Phase = Phase.FRESH, run: RunState | None = None) -> None:
        self.phase = phase
        self.run = run
        # None until the key's first run delivers something (most keys carry one run).
        self.held: dict[str, str] | None = None  # message id -> role
        self.held_calls: dict[str, list[str]] | None = None  # call id -> [host id, name]
        self.last: list[str] | None = None  # [threadId, runId] of the run that finished last

    def to_json(self) -> bytes:
        data: dict[str, Any] = {"phase": self.phase.value,
                                "run": None if self.run is None else self.run.to_dict()}
        if self.held:
            data["held"] = self.held
        if self.held_calls:
            data["calls"] = self.held_calls
        if self.last is not None:
            data["last"] = self.last
        return orjson.dumps(data)

    @classmethod
    def from_json(cls, data: bytes) -> KeyState:
        decoded = orjson.loads(data)
        run = decoded["run"]
        state = cls(Phase(decoded["phase"]), None if run is None else RunState.from_dict(run))
        state.held = decoded.get("held")
        state.held_calls = decoded.get("calls")
        state.last = decoded.get("last")
        return state
