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


class ToolCallRecord:
    __slots__ = ("args_base", "args_slot", "encrypted_value", "id", "metadata", "name")

    def __init__(self, call_id: str, name: str, args_base: str = "") -> None:
        self.id = call_id
        self.name = name
        self.args_base = args_base
        self.args_slot: int | None = None
        self.encrypted_value: str | None = None
        self.metadata: dict[str, Any] | None = None

    def to_list(self) -> list[Any]:
        return [self.id, self.name, self.args_base, self.args_slot, self.encrypted_value,
                self.metadata]

    @classmethod
    def from_list(cls, data: list[Any]) -> ToolCallRecord:
        record = cls(data[0], data[1], data[2])
        record.args_slot, record.encrypted_value, record.metadata = data[3], data[4], data[5]
        return record


class MessageRecord:
    """One history message. Text is `content_base` + the fragments of `content_slot`."""

    __slots__ = ("content_base", "content_slot", "encrypted_value", "fields", "id",
                 "metadata", "role", "tool_calls")

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
        self.metadata: dict[str, Any] | None = None

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
        return [self.id, self.role, fields, self.content_base, self.content_slot, calls,
                self.encrypted_value, self.metadata]

    @classmethod
    def from_list(cls, data: list[Any]) -> MessageRecord:
        record = cls(data[0], data[1], data[2] or None)
        record.content_base, record.content_slot = data[3], data[4]
        record.tool_calls = None if data[5] is None else [
            ToolCallRecord.from_list(c) for c in data[5]
        ]
        record.encrypted_value, record.metadata = data[6], data[7]
        return record


# Owners and open sets are kept per namespace, never across them (section 9).
NAMESPACES = ("span", "reasoning", "text", "tool")
# Every kind of item a run opens, in the order of `RunState.open`: the
# namespaces with owners (the order of `RunState.owners`), then steps and subagents.
OPEN_KINDS = (*NAMESPACES, "step", "subagent")


class RunState:
    __slots__ = ("lanes", "messages", "next_slot", "open", "owners", "run_id", "thread_id",
                 "tool_index", "warned_fields")

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

    def to_dict(self) -> dict[str, Any]:
        return {
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
        return run


class KeyState:
    """Everything the engine remembers about one run key between records."""

    __slots__ = ("phase", "run")

    def __init__(self, phase: Phase = Phase.FRESH, run: RunState | None = None) -> None:
        self.phase = phase
        self.run = run

    def to_json(self) -> bytes:
        return orjson.dumps(
            {"phase": self.phase.value, "run": None if self.run is None else self.run.to_dict()}
        )

    @classmethod
    def from_json(cls, data: bytes) -> KeyState:
        decoded = orjson.loads(data)
        run = decoded["run"]
        return cls(Phase(decoded["phase"]), None if run is None else RunState.from_dict(run))
