"""The run's messages as history: snapshot reconciliation and final assembly.

Shapes follow the reference reducer (`@ag-ui/client` `defaultApplyEvents`)
with the rule book's differences (reasoning.md sections 5, 7 and 9).
"""

from __future__ import annotations

from typing import Any

from processors.engine.state import (
    CONTINUED,
    OPEN_KINDS,
    MessageRecord,
    RunState,
    ToolCallRecord,
)

# Where RunState.open keeps the open messages and tool calls.
_OPEN_REASONING, _OPEN_TEXT, _OPEN_TOOL = (OPEN_KINDS.index(kind)
                                           for kind in ("reasoning", "text", "tool"))

# Keys a history message takes from its record's own slots, not from `fields`.
_RECORD_KEYS = frozenset({"id", "role", "content", "toolCalls", "encryptedValue",
                          "encryptedValueType", "metadata"})
# Roles a snapshot drops only when it carries one of that role itself (events/state).
_CLIENT_ONLY_ROLES = frozenset({"reasoning", "activity"})


def record_from_wire(message: dict[str, Any]) -> MessageRecord:
    """A message restated by MESSAGES_SNAPSHOT, taken wholesale."""
    record = MessageRecord(
        message["id"],
        message["role"],
        {k: v for k, v in message.items() if k not in _RECORD_KEYS} or None,
    )
    content = message.get("content")
    if type(content) is str:
        record.content_base = content
    elif content is not None:
        record.set_field("content", content)  # content parts or activity content
    calls = message.get("toolCalls")
    if calls is not None:
        record.tool_calls = []
        for call in calls:
            function = call["function"]
            call_record = ToolCallRecord(call["id"], function["name"], function["arguments"])
            call_record.encrypted_value = call.get("encryptedValue")
            call_record.encrypted_type = call.get("encryptedValueType")
            call_record.metadata = call.get("metadata")
            record.tool_calls.append(call_record)
    record.encrypted_value = message.get("encryptedValue")
    record.encrypted_type = message.get("encryptedValueType")
    record.metadata = message.get("metadata")
    return record


def apply_snapshot(run: RunState, snapshot: list[dict[str, Any]],
                   held: dict[str, str] | None) -> list[MessageRecord]:
    """MESSAGES_SNAPSHOT: replace known ids in place, append new ones, drop the rest;
    the restated and new records, in the snapshot's order.

    Known ids are the run's messages and those earlier runs on the key delivered
    (`held`, by role): a restated one of those is published whole (it replaces the
    delivered one in place), an unlisted one is removed (`run.removed`). Messages
    the snapshot does not list are dropped, except reasoning (activity) messages
    while the snapshot carries none of that role, and messages or tool calls
    still open (never dropped by a snapshot).
    """
    incoming = [record_from_wire(m) for m in snapshot]
    listed = {r.id for r in incoming}
    carried = {r.role for r in incoming} & _CLIENT_ONLY_ROLES
    open_messages = run.open[_OPEN_REASONING].keys() | run.open[_OPEN_TEXT].keys()
    open_calls = run.open[_OPEN_TOOL]
    open_call_hosts = {run.tool_index[c] for c in open_calls if c in run.tool_index}

    def survives(record_id: str, role: str) -> bool:
        if record_id in listed or record_id in open_messages or record_id in open_call_hosts:
            return True
        return role in _CLIENT_ONLY_ROLES and role not in carried

    by_id: dict[str, MessageRecord] = {}
    for mid, record in run.messages.items():
        if survives(mid, record.role):
            by_id[mid] = record
        elif record.origin == CONTINUED or (held and mid in held):
            _remove(run, mid)  # a message an earlier run delivered (continued or restated)
    if held:
        removed = run.removed or ()
        for mid, role in held.items():
            if mid not in run.messages and mid not in removed and not survives(mid, role):
                _remove(run, mid)
    for record in incoming:
        previous = by_id.get(record.id)
        if previous is not None:
            _keep_open_calls(previous, record, open_calls)
        by_id[record.id] = record  # a restated message keeps its place, a new one goes last
    run.messages = by_id
    run.tool_index = {
        call.id: record.id
        for record in by_id.values()
        for call in record.tool_calls or ()
    }
    return incoming


def _remove(run: RunState, message_id: str) -> None:
    if run.removed is None:
        run.removed = [message_id]
    elif message_id not in run.removed:
        run.removed.append(message_id)


def _keep_open_calls(
    previous: MessageRecord, replacement: MessageRecord, open_calls: dict[str, None]
) -> None:
    """A restated message keeps the tool calls that are still streaming."""
    restated = {c.id for c in replacement.tool_calls or ()}
    for call in previous.tool_calls or ():
        if call.id in open_calls and call.id not in restated:
            if replacement.tool_calls is None:
                replacement.tool_calls = []
            replacement.tool_calls.append(call)


def held_encrypted_values(run: RunState) -> int:
    """How many encrypted values the run holds now (one per message / tool call)."""
    held = 0
    for record in run.messages.values():
        if record.encrypted_value is not None:
            held += 1
        for call in record.tool_calls or ():
            if call.encrypted_value is not None:
                held += 1
    return held


def to_message(record: MessageRecord, texts: dict[int, str]) -> dict[str, Any]:
    """The AG-UI `Message` (camelCase, optional keys absent) a record stands for."""
    message: dict[str, Any] = {"id": record.id, "role": record.role}
    if record.fields:
        message.update(record.fields)
    slot = record.content_slot
    if slot is not None:
        message["content"] = (record.content_base or "") + texts.get(slot, "")
    elif record.content_base is not None:
        message["content"] = record.content_base
    if record.tool_calls:
        message["toolCalls"] = [_to_tool_call(call, texts) for call in record.tool_calls]
    if record.encrypted_value is not None:
        message["encryptedValue"] = record.encrypted_value
        if record.encrypted_type is not None:
            message["encryptedValueType"] = record.encrypted_type
    if record.metadata is not None:
        message["metadata"] = record.metadata
    return message


def _to_tool_call(call: ToolCallRecord, texts: dict[int, str]) -> dict[str, Any]:
    arguments = call.args_base
    if call.args_slot is not None:
        arguments += texts.get(call.args_slot, "")
    tool_call: dict[str, Any]
    if call.continued:  # what this run added to a call an earlier run delivered
        tool_call = {"id": call.id}
        if arguments:
            tool_call["function"] = {"arguments": arguments}
    else:
        tool_call = {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": arguments},
        }
    if call.encrypted_value is not None:
        tool_call["encryptedValue"] = call.encrypted_value
        if call.encrypted_type is not None:
            tool_call["encryptedValueType"] = call.encrypted_type
    if call.metadata is not None:
        tool_call["metadata"] = call.metadata
    return tool_call


def add_tool_result(run: RunState, record: MessageRecord, tool_call_id: str) -> None:
    """Place a new TOOL_CALL_RESULT's message: right after the assistant message
    holding the call, after the results already placed there; at the end when
    the call is unknown."""
    messages = run.messages
    host = run.tool_index.get(tool_call_id)
    if host is None or host not in messages:
        messages[record.id] = record
        return
    host_calls = {c.id for c in messages[host].tool_calls or ()}
    placed = list(messages)
    position = placed.index(host) + 1
    while position < len(placed):
        following = messages[placed[position]]
        if following.role != "tool" or following.field("toolCallId") not in host_calls:
            break
        position += 1
    if position == len(placed):
        messages[record.id] = record
    else:  # a dict only appends: rebuild it with the record in its place
        items = list(messages.items())
        items.insert(position, (record.id, record))
        run.messages = dict(items)


def rename(run: RunState, record: MessageRecord, new_id: str) -> None:
    """Give a message of the run another id, keeping its place and its tool calls."""
    old_id = record.id
    record.id = new_id
    run.messages = {(new_id if mid == old_id else mid): message
                    for mid, message in run.messages.items()}
    for call_id, host in run.tool_index.items():
        if host == old_id:
            run.tool_index[call_id] = new_id
