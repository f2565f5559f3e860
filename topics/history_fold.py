"""The history fold: what a thread's history records say its conversation is.

The reference for every consumer of the history topic (docs/topics.md, *Folding
the history topic*). Plain JSON values in, plain values out, no I/O, and nothing
raises: a record that is not usable is ignored. The thread view
(`processors/view/thread_view.py`) folds with the same functions into its table,
and tests/view/test_fold_property.py holds it to `fold_history`.

Give `fold_history` one thread's records (key `<tenant>/<threadId>`), decoded, in
topic order. Content records (`kind` `message`, `input`, `continuation`,
`removal`) change the thread's messages; closing records (`kind` `run`) the runs:

============== ==============================================================
``message``    the held message with that id is replaced in place; else appended
``input``      appended if no message with that id is held; never replaces
``continuation`` held: ``content`` appended to its content, per tool call id
               ``function.arguments`` appended (a new id: the call appended),
               ``encryptedValue`` set with ``encryptedValueType`` (absent: the
               type removed) on the message and on each tool call, ``metadata``
               merged key by key; nothing else (role, name) changes.
               Not held: the message appended as it is
``removal``    the held message with id ``messageId`` removed
``run``        the run's fate: the last closing record's fields; one without
               ``messageCount`` or ``inputEchoed`` (a late error) keeps the
               earlier record's. A late error (``late: true``) is final: a
               closing record of the run after it is a duplicate
``erasure``    the tenant erased the thread: everything folded so far is
               dropped (messages, runs, the records seen); what comes after
               starts the thread afresh
============== ==============================================================

Duplicates (an at-least-once producer, the raw topic processed again) are dropped
first, as docs/topics.md asks of every consumer that may see them: a content
record whose (runId, seq) came before changes nothing (a continuation or a
removal applied twice would change the thread twice).

Both schemas fold (*Upgrading record schemas*): an `agui.history.v1` record is
read as its v2 equivalent (`message` as `message`; a closing record's outcome
`finished` as `success`). Unknown fields are ignored. A record is not usable,
and is ignored, when it is not a JSON object of one of these shapes with the
right types, when it names no thread or run (a RUN_ERROR-only run's), or when a
continuation cannot apply to the message held (text to content that is not
text, arguments to a tool call whose arguments are not a string). Appending text
to content parts (a user message's list) appends a text part.

Positions: a replaced or continued message keeps its place; a removed one
leaves none, so the same id sent again later is appended. A Python dict has
exactly these semantics, which is all `fold_history` uses: it is linear in the
records. Nothing given to it is modified (changed messages are copies).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeGuard

ContentKind = Literal["message", "input", "continuation", "removal"]

HISTORY_V1: Final = "agui.history.v1"
HISTORY_V2: Final = "agui.history.v2"
OUTCOMES: Final = frozenset({"success", "interrupt", "cancelled", "error", "failed",
                             "abandoned"})
_V1_OUTCOMES: Final = {"finished": "success", "error": "error"}
_MESSAGE_KINDS: Final[dict[str, ContentKind]] = {
    "message": "message", "input": "input", "continuation": "continuation"}

# A further test of every message a record would leave in the thread (the thread
# view passes "parses with the ag-ui-protocol models"); a record whose resulting
# message fails it is ignored.
Accept = Callable[[dict[str, Any]], bool]


@dataclass(frozen=True, slots=True)
class Content:
    """A content record, read: it concerns the message `message_id`."""

    kind: ContentKind
    tenant: str
    thread_id: str | None
    run_id: str | None
    seq: int
    message_id: str
    message: dict[str, Any] | None  # None for a removal


@dataclass(frozen=True, slots=True)
class Closing:
    """A closing record, read: `fields` are its closing fields (outcome first), as v2."""

    tenant: str
    thread_id: str | None
    run_id: str | None
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Erasure:
    """An erasure record, read (v2 only; it always names its thread)."""

    tenant: str
    thread_id: str


class Fold(enum.Enum):
    """What folding a content record does, when it does not put a message."""

    UNCHANGED = "unchanged"  # an input already held; a removal of nothing held
    REMOVED = "removed"  # the held message is removed
    IGNORED = "ignored"  # it cannot apply (or its message fails `accept`)


@dataclass(slots=True)
class FoldedThread:
    """The thread: its messages in order, and per runId (in the order of their first
    closing record) the run's closing fields."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)


def fold_history(records: Iterable[Any], accept: Accept | None = None) -> FoldedThread:
    """Fold one thread's decoded history records, in topic order."""
    held: dict[str, dict[str, Any]] = {}  # id -> message, in thread order
    runs: dict[str, dict[str, Any]] = {}
    seen: set[tuple[str, int]] = set()  # (runId, seq) of the content records folded
    for value in records:
        record = read_record(value)
        if isinstance(record, Erasure):
            held, runs, seen = {}, {}, set()
            continue
        if record is None or record.thread_id is None or record.run_id is None:
            continue
        if isinstance(record, Closing):
            previous = runs.get(record.run_id)
            if previous is None or previous.get("late") is not True:
                runs[record.run_id] = close_run(previous, record.fields)
            continue
        if (record.run_id, record.seq) in seen:
            continue
        seen.add((record.run_id, record.seq))
        folded = fold_content(record, held.get(record.message_id), accept)
        if isinstance(folded, dict):
            held[record.message_id] = folded  # in place when held, else last
        elif folded is Fold.REMOVED:
            del held[record.message_id]
    return FoldedThread(list(held.values()), runs)


def fold_content(record: Content, held: dict[str, Any] | None,
                 accept: Accept | None = None) -> dict[str, Any] | Fold:
    """The message the thread holds under `record.message_id` once `record` is folded
    (to put in place of the held one, or to append), or what else happens.

    `held` is the message held under that id, None when there is none. Only a
    continuation reads it: for the other kinds, only whether it is None matters."""
    if record.kind == "removal":
        return Fold.UNCHANGED if held is None else Fold.REMOVED
    assert record.message is not None  # read_record: every other kind carries one
    if record.kind == "input" and held is not None:
        return Fold.UNCHANGED
    message: dict[str, Any] | None = record.message
    if record.kind == "continuation" and held is not None:
        message = continue_message(held, record.message)
    if message is None or (accept is not None and not accept(message)):
        return Fold.IGNORED
    return message


def continue_message(held: dict[str, Any], addition: dict[str, Any]) -> dict[str, Any] | None:
    """`held` continued by a continuation record's message (its shape checked by
    `read_record`), as a new dict; None when it cannot apply."""
    merged = dict(held)
    if "content" in addition:
        text, content = addition["content"], held.get("content")
        if content is None:
            merged["content"] = text
        elif isinstance(content, str):
            merged["content"] = content + text
        elif isinstance(content, list):  # content parts: the text is one more part
            merged["content"] = [*content, {"type": "text", "text": text}]
        else:  # an activity's object
            return None
    if "toolCalls" in addition:
        calls = held.get("toolCalls")
        if calls is None:
            calls = []
        elif not isinstance(calls, list):
            return None
        calls = list(calls)
        where: dict[str, int] = {}
        for position, call in enumerate(calls):
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                where.setdefault(call["id"], position)
        for call in addition["toolCalls"]:
            at = where.get(call["id"])
            if at is None:
                where[call["id"]] = len(calls)
                calls.append(call)
                continue
            continued = _continue_call(calls[at], call)
            if continued is None:
                return None
            calls[at] = continued
        merged["toolCalls"] = calls
    if "encryptedValue" in addition:
        _set_encrypted_value(merged, addition)
    if "metadata" in addition:
        metadata = held.get("metadata")
        if metadata is None:
            merged["metadata"] = addition["metadata"]
        elif isinstance(metadata, dict):
            merged["metadata"] = {**metadata, **addition["metadata"]}
        else:
            return None
    return merged


def _continue_call(held: Any, addition: dict[str, Any]) -> dict[str, Any] | None:
    if not isinstance(held, dict):
        return None
    merged = dict(held)
    arguments = addition.get("function", {}).get("arguments")
    if arguments is not None:
        function = held.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
            return None
        merged["function"] = {**function, "arguments": function["arguments"] + arguments}
    if "encryptedValue" in addition:
        _set_encrypted_value(merged, addition)
    return merged


def _set_encrypted_value(target: dict[str, Any], source: dict[str, Any]) -> None:
    """An encrypted value and its type go together: the source's replace the target's,
    and a type the source does not give is removed."""
    target["encryptedValue"] = source["encryptedValue"]
    if "encryptedValueType" in source:
        target["encryptedValueType"] = source["encryptedValueType"]
    else:
        target.pop("encryptedValueType", None)


def close_run(previous: dict[str, Any] | None, fields: dict[str, Any]) -> dict[str, Any]:
    """A run's fate after its closing record `fields`: those fields, keeping the
    previous fate's `messageCount` and `inputEchoed` when they lack them (a late
    error says neither)."""
    run = dict(fields)
    if previous is not None:
        for carried in ("messageCount", "inputEchoed"):
            if carried not in run and carried in previous:
                run[carried] = previous[carried]
    return run


# --- reading a record ------------------------------------------------------------------


def read_record(value: Any) -> Content | Closing | Erasure | None:
    """The record, if it is a usable history record (either schema); else None."""
    if not isinstance(value, dict):
        return None
    schema, tenant = value.get("schema"), value.get("tenant")
    thread_id, run_id = value.get("threadId"), value.get("runId")
    if (schema not in (HISTORY_V1, HISTORY_V2) or not isinstance(tenant, str)
            or not _optional(thread_id, str) or not _optional(run_id, str)):
        return None
    kind = value.get("kind")
    if not isinstance(kind, str):
        return None
    if kind == "run":
        fields = (_v1_closing(value) if schema == HISTORY_V1 else _v2_closing(value))
        return None if fields is None else Closing(tenant, thread_id, run_id, fields)
    if kind == "erasure":
        if schema != HISTORY_V2 or thread_id is None or type(value.get("erasedAt")) is not int:
            return None
        return Erasure(tenant, thread_id)
    seq = value.get("seq")
    if type(seq) is not int or seq < 0 or (schema == HISTORY_V1 and kind != "message"):
        return None
    if kind == "removal":
        message_id = value.get("messageId")
        if not isinstance(message_id, str):
            return None
        return Content("removal", tenant, thread_id, run_id, seq, message_id, None)
    message_kind, message = _MESSAGE_KINDS.get(kind), value.get("message")
    if message_kind is None or not _is_message(message):
        return None
    if message_kind == "continuation" and not _is_addition(message):
        return None
    return Content(message_kind, tenant, thread_id, run_id, seq, message["id"], message)


def _v1_closing(value: dict[str, Any]) -> dict[str, Any] | None:
    outcome, count = value.get("outcome"), value.get("messageCount")
    if not isinstance(outcome, str) or outcome not in _V1_OUTCOMES or not _count(count):
        return None
    fields: dict[str, Any] = {"outcome": _V1_OUTCOMES[outcome], "messageCount": count}
    return fields if _take(fields, value, ("usage", _dict_list), ("error", _is_dict)) else None


def _v2_closing(value: dict[str, Any]) -> dict[str, Any] | None:
    outcome = value.get("outcome")
    if not isinstance(outcome, str) or outcome not in OUTCOMES:
        return None
    fields: dict[str, Any] = {"outcome": value["outcome"]}
    if _take(fields, value, ("messageCount", _count), ("pendingToolCallIds", _str_list),
             ("interrupts", _dict_list), ("usage", _dict_list), ("error", _is_dict),
             ("failure", _is_failure), ("inputEchoed", _is_bool), ("late", _is_bool)):
        return fields
    return None


def _take(fields: dict[str, Any], value: dict[str, Any],
          *optional: tuple[str, Callable[[Any], bool]]) -> bool:
    """Copy the optional fields present in `value` into `fields`; False if one has
    the wrong type."""
    for name, valid in optional:
        if name in value:
            if not valid(value[name]):
                return False
            fields[name] = value[name]
    return True


def _is_message(message: Any) -> TypeGuard[dict[str, Any]]:
    return (isinstance(message, dict) and isinstance(message.get("id"), str)
            and isinstance(message.get("role"), str))


def _is_addition(message: dict[str, Any]) -> bool:
    """A continuation's message has what the fold reads in the types it reads."""
    calls = message.get("toolCalls", [])
    return (_optional_key(message, "content", str) and _encrypted_value_ok(message)
            and _optional_key(message, "metadata", dict) and isinstance(calls, list)
            and all(_is_call_addition(call) for call in calls))


def _is_call_addition(call: Any) -> bool:
    if not isinstance(call, dict) or not isinstance(call.get("id"), str):
        return False
    function = call.get("function", {})
    return (isinstance(function, dict) and _optional_key(function, "arguments", str)
            and _encrypted_value_ok(call))


def _encrypted_value_ok(value: dict[str, Any]) -> bool:
    return (_optional_key(value, "encryptedValue", str)
            and _optional_key(value, "encryptedValueType", str))


def _optional_key(value: dict[str, Any], name: str, kind: type) -> bool:
    return name not in value or isinstance(value[name], kind)


def _optional(value: Any, kind: type) -> bool:
    return value is None or isinstance(value, kind)


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_dict(value: Any) -> bool:
    return isinstance(value, dict)


def _dict_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _is_failure(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("code"), str)
