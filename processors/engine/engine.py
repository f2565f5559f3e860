"""The rule engine: raw record values of one run key in, decisions out.

Sans-IO and deterministic: no Kafka, no clock, no logging. The caller feeds
the record values of one key in offset order and acts on the decisions
(`processors.engine.decisions`); the same engine serves the stream processor,
the offline checker and the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import orjson

from processors.engine import history
from processors.engine.codes import FailureCode, LossReason, Outcome, WarningCode
from processors.engine.content import ContentStore, Fragments, InMemoryContentStore
from processors.engine.decisions import (
    Concluded,
    Decision,
    Discarded,
    EncryptedLost,
    Failed,
    RunIdentity,
    Step,
    Warned,
)
from processors.engine.jsonpatch import apply_patch
from processors.engine.state import (
    ChunkKind,
    KeyState,
    MessageRecord,
    Phase,
    RunState,
    ToolCallRecord,
)
from topics.events import (
    ENCRYPTED_VALUE_SUBTYPES,
    EVENT_MODELS,
    REMOVE,
    TEXT_MESSAGE_ROLES,
    Findings,
    Malformed,
    check_model,
    protocol_version_is_foreign,
)


class RunFailure(Exception):
    """Raised inside event handling: the active run fails with `code`."""

    def __init__(self, code: FailureCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


# Events that leave a pending chunk item open (reasoning.md section 4, chunks).
_KEEPS_CHUNK_OPEN: Final = frozenset(
    {"REASONING_ENCRYPTED_VALUE", "RAW", "ACTIVITY_SNAPSHOT", "ACTIVITY_DELTA", "SUBAGENT_STARTED"}
)
# Events that close every lane before they apply.
_CLOSES_ALL_LANES: Final = frozenset(
    {"RUN_STARTED", "RUN_FINISHED", "RUN_ERROR", "MESSAGES_SNAPSHOT"}
)
_CHUNK_KINDS: Final = {
    "REASONING_MESSAGE_CHUNK": ChunkKind.REASONING,
    "TEXT_MESSAGE_CHUNK": ChunkKind.TEXT,
    "TOOL_CALL_CHUNK": ChunkKind.TOOL,
}
_NOT_OPEN_CODE: Final = {
    "span": FailureCode.SPAN_NOT_OPEN,
    "reasoning": FailureCode.MESSAGE_NOT_OPEN,
    "text": FailureCode.MESSAGE_NOT_OPEN,
    "tool": FailureCode.TOOL_CALL_NOT_OPEN,
    "step": FailureCode.STEP_NOT_OPEN,
    "subagent": FailureCode.SUBAGENT_NOT_OPEN,
}
_ALREADY_OPEN_CODE: Final = {
    "span": FailureCode.SPAN_ALREADY_OPEN,
    "reasoning": FailureCode.MESSAGE_ALREADY_OPEN,
    "text": FailureCode.MESSAGE_ALREADY_OPEN,
    "tool": FailureCode.TOOL_CALL_ALREADY_OPEN,
    "step": FailureCode.STEP_ALREADY_OPEN,
    "subagent": FailureCode.SUBAGENT_ALREADY_OPEN,
}
_KIND_NAMES: Final = {
    "span": "reasoning span",
    "reasoning": "reasoning message",
    "text": "text message",
    "tool": "tool call",
    "step": "step",
    "subagent": "subagent",
}
# Bare deltas taken by `KeyEngine._took_bare_delta` (one lookup per record):
# (id key, namespace) of an explicit continuation, or the kind of a chunk
# continuing its lane.
_FAST_DELTAS: Final[dict[str, tuple[str, str] | ChunkKind]] = {
    "REASONING_MESSAGE_CONTENT": ("messageId", "reasoning"),
    "TEXT_MESSAGE_CONTENT": ("messageId", "text"),
    "TOOL_CALL_ARGS": ("toolCallId", "tool"),
    "REASONING_MESSAGE_CHUNK": ChunkKind.REASONING,
    "TEXT_MESSAGE_CHUNK": ChunkKind.TEXT,
    "TOOL_CALL_CHUNK": ChunkKind.TOOL,
}
# Bare boundaries taken by `KeyEngine._took_bare_boundary`: the id key and
# namespace of `{type, id}`, and whether it opens (a span, a step) or closes.
_FAST_BOUNDARIES: Final = {
    "REASONING_START": ("messageId", "span", True),
    "STEP_STARTED": ("stepName", "step", True),
    "REASONING_END": ("messageId", "span", False),
    "REASONING_MESSAGE_END": ("messageId", "reasoning", False),
    "TEXT_MESSAGE_END": ("messageId", "text", False),
    "TOOL_CALL_END": ("toolCallId", "tool", False),
    "STEP_FINISHED": ("stepName", "step", False),
}
# Bare message starts taken by `KeyEngine._took_bare_start`: the message's
# namespace, the record's one key besides type and messageId, and the values
# that key may take (None: any string).
_FAST_STARTS: Final[dict[str, tuple[str, str, frozenset[str] | None]]] = {
    "REASONING_MESSAGE_START": ("reasoning", "role", frozenset({"reasoning"})),
    "TEXT_MESSAGE_START": ("text", "role", TEXT_MESSAGE_ROLES),
    "REASONING_MESSAGE_CHUNK": ("reasoning", "delta", None),
    "TEXT_MESSAGE_CHUNK": ("text", "delta", None),
}
_TOOL: Final = ChunkKind.TOOL  # a module constant: enum attribute lookups are slow
# A record that decided nothing gets a shared, immutable Step.
_QUIET_STEPS: Final = {
    event_type: Step(event_type, ())
    for event_type in (*EVENT_MODELS, "unknown", "undecodable", "abandoned")
}


def _step(event_type: str, out: list[Decision]) -> Step:
    """The Step of the decisions collected in `out`, which it empties.

    The engine keeps no reference to a record's decisions once it returns
    them: a concluded run's history goes when the caller drops it, not
    (long after, from cold memory) at the key's next record.
    """
    if not out:
        return _QUIET_STEPS[event_type]
    step = Step(event_type, tuple(out))
    out.clear()
    return step


_ABSENT: Final = object()
_FAILED: Final = Phase.FAILED


def _describe(namespace: str, item_id: str) -> str:
    return f"{_KIND_NAMES[namespace]} {item_id!r}"


class KeyEngine:
    """Checks and reassembles the runs of one run key.

    `state` and `content` may be supplied (restored) by the caller; by default
    they start empty and in memory.
    """

    # Slots keep the attributes inside the object: one cache line less to
    # fetch per record when a service interleaves thousands of keys.
    __slots__ = ("_findings", "_hot_field", "_hot_fragments", "_hot_id", "_hot_kind", "_hot_size",
                 "_out", "content", "state")

    def __init__(self, state: KeyState | None = None, content: ContentStore | None = None) -> None:
        self.state = state if state is not None else KeyState()
        self.content: ContentStore = content if content is not None else InMemoryContentStore()
        self._out: list[Decision] = []  # the current record's decisions; `_step` empties it
        self._findings = Findings()
        # The hot slot: after a bare delta, where the same bare delta goes next
        # (its _FAST_DELTAS entry, record size, id field and value, fragments),
        # so that a key streaming into one message touches only this object
        # and the fragments. Any other record drops it (`_hot_kind = None`);
        # the other `_hot_*` are set whenever `_hot_kind` is.
        self._hot_kind: tuple[str, str] | ChunkKind | None = None
        self._hot_size: int
        self._hot_field: str | None
        self._hot_id: str | None
        self._hot_fragments: Fragments

    # --- entry points ---------------------------------------------------------

    def feed(self, raw: bytes | str) -> Step:
        """Apply the next record value of the key; return what it decided."""
        try:
            event = orjson.loads(raw)
        except orjson.JSONDecodeError:
            event = None
        event_type = event.get("type") if type(event) is dict else None
        if type(event_type) is not str:
            self._undecodable()
            return _step("undecodable", self._out)
        fast = _FAST_DELTAS.get(event_type)
        hot = self._hot_kind
        if hot is not None:
            # The same bare delta as the key's last record, to the same item:
            # nothing else was applied since, so it cannot fail or close anything.
            if fast is hot and len(event) == self._hot_size:
                field = self._hot_field
                delta = event.get("delta")
                if type(delta) is str and (field is None or event.get(field) == self._hot_id):
                    if delta:
                        self._hot_fragments.append(delta)
                    return _QUIET_STEPS[event_type]
            self._hot_kind = None
        run = self.state.run
        if run is not None:
            if fast is not None and self._took_bare_delta(run, fast, event):
                return _QUIET_STEPS[event_type]
            path = _FAST_PATHS.get(event_type)
            if path is not None and path(self, run, event_type, event):
                return _QUIET_STEPS[event_type]
        out = self._out
        model = EVENT_MODELS.get(event_type)
        if self.state.phase is _FAILED and event_type != "RUN_STARTED":
            out.append(Discarded())
            return _step("unknown" if model is None else event_type, out)
        if model is None:
            self._warn(WarningCode.UNKNOWN_EVENT_TYPE,
                       "event type is not an AG-UI 1.0 type; the event was dropped")
            return _step("unknown", out)
        findings = self._findings
        try:
            checked = check_model(model, event, "", findings)
        except Malformed as error:
            findings.clear()
            self._fail(FailureCode.MALFORMED_EVENT, f"{event_type}: {error}")
            return _step(event_type, out)
        if checked is REMOVE:
            checked = None  # an unknown union member in a required position
        if findings.unknown_fields or findings.unknown_members or findings.unknown_subtype:
            unknown_subtype = findings.unknown_subtype
            self._warn_stripped(event_type, findings)
            findings.clear()
            if unknown_subtype and checked is not None:
                self._warn(WarningCode.UNKNOWN_SUBTYPE,
                           "REASONING_ENCRYPTED_VALUE.subtype is not an AG-UI 1.0 member;"
                           " the event was dropped")
                out.append(EncryptedLost(LossReason.UNKNOWN_SUBTYPE))
                return _step(event_type, out)
        if checked is not None:
            self._apply(run, event_type, checked)
        return _step(event_type, out)

    def _took_bare_delta(
        self, run: RunState, fast: tuple[str, str] | ChunkKind, event: dict[str, Any]
    ) -> bool:
        """The fast path for the commonest record, a bare delta to an open item.

        Takes only shapes the schema check would pass untouched (no unknown,
        null or other optional key) and that can neither close a chunk lane
        nor fail: `{type, messageId|toolCallId, delta}` CONTENT/ARGS for an
        open item while the parent lane has no pending chunk item, and
        `{type, delta[, subagentRunId]}` CHUNK continuing its lane's pending
        item of that kind. Anything else takes the general path, which
        decides the same way (tests/test_properties.py proves it).
        """
        if isinstance(fast, tuple):
            if len(event) != 3:
                return False
            id_key, namespace = fast
            item_id = event.get(id_key)
            delta = event.get("delta")
            if (type(delta) is not str or type(item_id) is not str
                    or item_id not in run.open[namespace] or None in run.lanes):
                return False
            kind = _TOOL if namespace == "tool" else None
            id_field: str | None = id_key
            hot_id: str | None = item_id
        else:
            kind = fast
            delta = event.get("delta")
            if type(delta) is not str:
                return False
            size = len(event)
            if size == 2:
                id_field = hot_id = None
                pending = run.lanes.get(None)
            elif size == 3:
                tag = event.get("subagentRunId")
                pending = run.lanes.get(tag) if type(tag) is str else None
                id_field, hot_id = "subagentRunId", tag
            else:
                return False
            if pending is None or pending[0] is not kind or pending[1] not in run.open[kind]:
                return False
            item_id = pending[1]
        if kind is _TOOL:
            call = self._tool_call(run, item_id)
            if call is None or (not delta and call.args_slot is None):
                return True  # nothing to keep (as `_append_args`)
            fragments = self.content.fragments(_args_slot(run, call))
        else:
            record = run.messages[item_id]
            if not delta and record.content_slot is None:
                return True
            fragments = self.content.fragments(_text_slot(run, record))
        if delta:
            fragments.append(delta)
        self._hot_kind = fast
        self._hot_size = len(event)
        self._hot_field = id_field
        self._hot_id = hot_id
        self._hot_fragments = fragments
        return True

    def _took_bare_boundary(self, run: RunState, event_type: str, event: dict[str, Any]) -> bool:
        """The fast path for a bare `{type, id}` start of a span or step, or end of an item.

        Takes it only when it cannot fail: a start of an id not open, an end
        of an open one, after closing the parent lane's pending chunk item as
        the general path does first (only when that item is open and is not
        the id itself). Anything else takes the general path, which decides
        the same way (tests/test_properties.py proves it).
        """
        id_key, namespace, opens = _FAST_BOUNDARIES[event_type]
        item_id = event.get(id_key)
        if len(event) != 2 or type(item_id) is not str:
            return False
        opened = run.open[namespace]
        pending = run.lanes.get(None)
        if pending is not None:
            kind, pending_id = pending
            pending_open = run.open["tool" if kind is _TOOL else kind.value]
            if pending_id not in pending_open or (pending_open is opened and pending_id == item_id):
                return False
        if (item_id in opened) is opens:
            return False
        if pending is not None:
            del run.lanes[None]
            del pending_open[pending_id]  # the synthesized END of the pending item
        if opens:
            self._open(run, namespace, item_id, None)
        else:
            del opened[item_id]
        return True

    def _took_bare_start(self, run: RunState, event_type: str, event: dict[str, Any]) -> bool:
        """The fast path for a bare start of a message: a START with a role, or the
        first CHUNK of the parent lane with a delta (`{type, messageId, role|delta}`).

        Taken only when the message is not open, the parent lane has no
        pending chunk item and no lane has it pending, so the start can
        neither fail nor close anything; the general handler then applies it.
        """
        namespace, key, accepted = _FAST_STARTS[event_type]
        message_id = event.get("messageId")
        value = event.get(key)
        if (len(event) != 3 or type(message_id) is not str or type(value) is not str
                or (accepted is not None and value not in accepted)
                or message_id in run.open[namespace] or None in run.lanes):
            return False
        kind = _CHUNK_KINDS.get(event_type)
        if kind is None:
            _HANDLERS[event_type](self, run, event)
        elif (kind, message_id) in run.lanes.values():
            return False
        else:
            self._chunk(run, kind, event)
        return True

    def _took_bare_encrypted(self, run: RunState, event_type: str, event: dict[str, Any]) -> bool:
        """The fast path for `{type, subtype, entityId, encryptedValue}` naming a held entity.

        REASONING_ENCRYPTED_VALUE leaves chunk lanes open, so holding the
        value is all it does; an unknown subtype or entity takes the general
        path, which warns.
        """
        subtype = event.get("subtype")
        return (len(event) == 4 and type(subtype) is str and subtype in ENCRYPTED_VALUE_SUBTYPES
                and type(event.get("entityId")) is str
                and type(event.get("encryptedValue")) is str
                and self._held_encrypted(run, event))

    def abandon(self) -> Step:
        """The caller's idle timeout expired: the active run fails `run_abandoned`."""
        out = self._out
        if self.state.run is not None:
            self._fail(FailureCode.RUN_ABANDONED,
                       "no terminal event arrived before the idle timeout",
                       loss=LossReason.RUN_ABANDONED)
        return _step("abandoned", out)

    # --- lifecycle ------------------------------------------------------------

    def _apply(self, run: RunState | None, event_type: str, event: dict[str, Any]) -> None:
        if run is None:
            self._outside_run(event_type, event)
            return
        try:
            chunk_kind = _CHUNK_KINDS.get(event_type)
            if chunk_kind is not None:
                self._chunk(run, chunk_kind, event)
                return
            if event_type in _CLOSES_ALL_LANES:
                if event_type == "RUN_STARTED":
                    raise RunFailure(FailureCode.RUN_ALREADY_ACTIVE,
                                     f"RUN_STARTED while run {run.run_id!r} is active")
                for lane in list(run.lanes):
                    self._close_lane(run, lane)
                if event_type == "RUN_FINISHED":
                    self._run_finished(run, event)
                    return
                if event_type == "RUN_ERROR":
                    self._run_error(run, event)
                    return
            elif event_type not in _KEEPS_CHUNK_OPEN and run.lanes:
                lane = event.get("subagentRunId")
                if lane in run.lanes:
                    self._close_lane(run, lane)
            _HANDLERS[event_type](self, run, event)
        except RunFailure as failure:
            self._fail(failure.code, failure.reason)

    def _outside_run(self, event_type: str, event: dict[str, Any]) -> None:
        phase = self.state.phase
        if event_type == "RUN_STARTED":
            self._start_run(event)
        elif event_type == "RUN_ERROR" and phase is Phase.FRESH:
            # A RUN_ERROR as the key's first event is a run of its own.
            self._conclude(Outcome.ERROR, None, [], event.get("usage"), _error_of(event))
            self.state.phase = Phase.ERRORED
        elif event_type == "RUN_ERROR" and phase is Phase.FINISHED:
            self.state.phase = Phase.ERRORED  # a late RUN_ERROR is accepted silently
        elif phase is Phase.FRESH:
            self._fail(FailureCode.RUN_NOT_STARTED,
                       f"{event_type} before any RUN_STARTED on this key")
        else:
            self._fail(FailureCode.RUN_ALREADY_ENDED,
                       f"{event_type} after the run ended ({phase.value}); only RUN_STARTED"
                       + (" or a late RUN_ERROR" if phase is Phase.FINISHED else "")
                       + " may follow")

    def _start_run(self, event: dict[str, Any]) -> None:
        run = RunState(event["threadId"], event["runId"])
        version = event.get("protocolVersion")
        self.state.run = run
        self.state.phase = Phase.ACTIVE
        if version is not None and protocol_version_is_foreign(version):
            self._warn(WarningCode.PROTOCOL_VERSION,
                       "RUN_STARTED.protocolVersion is newer than 1.0 or not MAJOR.MINOR;"
                       " proceeding as 1.0")

    def _run_finished(self, run: RunState, event: dict[str, Any]) -> None:
        if event["threadId"] != run.thread_id or event["runId"] != run.run_id:
            raise RunFailure(
                FailureCode.RUN_ID_MISMATCH,
                f"RUN_FINISHED names thread {event['threadId']!r} run {event['runId']!r};"
                f" RUN_STARTED named thread {run.thread_id!r} run {run.run_id!r}",
            )
        if any(run.open.values()):
            still_open = [
                _describe(namespace, item_id)
                for namespace, ids in run.open.items()
                for item_id in ids
            ]
            raise RunFailure(FailureCode.OPEN_AT_FINISH,
                             "open at RUN_FINISHED: " + ", ".join(still_open))
        self._conclude(Outcome.FINISHED, run, self._assemble(run), event.get("usage"), None)
        self.state.phase = Phase.FINISHED

    def _run_error(self, run: RunState, event: dict[str, Any]) -> None:
        discarded_values = 0
        for namespace in ("reasoning", "text"):
            for message_id in run.open[namespace]:
                record = run.messages.pop(message_id, None)
                if record is None:
                    continue
                run.order.remove(message_id)
                discarded_values += _values_on(record)
                self._warn(WarningCode.INCOMPLETE_AT_ERROR,
                           f"{_describe(namespace, message_id)} was open at RUN_ERROR;"
                           " it was discarded")
        for call_id in run.open["tool"]:
            host = run.messages.get(run.tool_index.get(call_id, ""))
            if host is None or host.tool_calls is None:
                continue  # went with a discarded message
            call = next(c for c in host.tool_calls if c.id == call_id)
            host.tool_calls.remove(call)
            discarded_values += call.encrypted_value is not None
            self._warn(WarningCode.INCOMPLETE_AT_ERROR,
                       f"{_describe('tool', call_id)} was open at RUN_ERROR; it was discarded")
            if not host.tool_calls and not (host.content_base or host.content_slot is not None):
                run.messages.pop(host.id)
                run.order.remove(host.id)
                discarded_values += _values_on(host)
        self._out.extend(EncryptedLost(LossReason.INCOMPLETE_AT_ERROR)
                         for _ in range(discarded_values))
        self._conclude(Outcome.ERROR, run, self._assemble(run), event.get("usage"),
                       _error_of(event))
        self.state.phase = Phase.ERRORED

    def _assemble(self, run: RunState) -> list[dict[str, Any]]:
        texts = self.content.texts()
        return [history.to_message(run.messages[mid], texts) for mid in run.order]

    def _conclude(
        self,
        outcome: Outcome,
        run: RunState | None,
        messages: list[dict[str, Any]],
        usage: list[dict[str, Any]] | None,
        error: dict[str, Any] | None,
    ) -> None:
        identity = None if run is None else RunIdentity(run.thread_id, run.run_id)
        self._out.append(Concluded(outcome, identity, messages, usage, error))
        self._end_run()

    def _end_run(self) -> None:
        run = self.state.run
        if run is not None:
            self.content.clear()
        self.state.run = None
        self._hot_kind = None

    def _fail(self, code: FailureCode, reason: str,
              loss: LossReason = LossReason.RUN_FAILED) -> None:
        run = self.state.run
        identity = None if run is None else RunIdentity(run.thread_id, run.run_id)
        if run is not None:
            self._out.extend(EncryptedLost(loss) for _ in range(history.held_encrypted_values(run)))
        self._out.append(Failed(code, reason, identity))  # the concluding decision comes last
        self._end_run()
        self.state.phase = Phase.FAILED

    def _undecodable(self) -> None:
        if self.state.phase is Phase.FAILED:
            self._out.append(Discarded())
            return
        self._fail(FailureCode.UNDECODABLE_RECORD,
                   "record value is not a JSON object with a string type")

    # --- warnings ---------------------------------------------------------------

    def _run_identity(self) -> RunIdentity | None:
        run = self.state.run
        return None if run is None else RunIdentity(run.thread_id, run.run_id)

    def _warn(self, code: WarningCode, reason: str) -> None:
        self._out.append(Warned(code, reason, self._run_identity()))

    def _warn_stripped(self, event_type: str, findings: Findings) -> None:
        run = self.state.run
        for pointer in findings.unknown_fields:
            if run is not None:
                # De-duplicated per run on (event type as received, pointer).
                key = f"{event_type} {pointer}"
                if key in run.warned_fields:
                    continue
                run.warned_fields.add(key)
            self._warn(WarningCode.UNKNOWN_FIELD,
                       f"{event_type}: unknown property {pointer} was stripped")
        for pointer in findings.unknown_members:
            self._warn(WarningCode.UNKNOWN_MEMBER,
                       f"{event_type}: unknown union member at {pointer} was removed")

    # --- chunks -------------------------------------------------------------------

    def _chunk(self, run: RunState, kind: ChunkKind, event: dict[str, Any]) -> None:
        id_key = "toolCallId" if kind is ChunkKind.TOOL else "messageId"
        item_id = event.get(id_key)
        tag = event.get("subagentRunId")
        lanes = run.lanes
        if item_id is not None:
            pending = lanes.get(tag)
            if pending is not None and pending[0] is kind and pending[1] == item_id:
                self._chunk_continue(run, kind, item_id, event)
                return
            if (kind, item_id) in lanes.values():
                # An id names one item, whatever lane the chunk is tagged with
                # (rule book section 9): it continues the item where it is
                # pending and closes nothing; a tag that disagrees with the
                # item's owner fails in the continuation's owner check.
                self._chunk_continue(run, kind, item_id, event)
                return
            if pending is not None:
                self._close_lane(run, tag)
            self._chunk_open(run, kind, item_id, event)
            lanes[tag] = (kind, item_id)
            return
        if tag is not None:
            pending = lanes.get(tag)
            if pending is None or pending[0] is not kind:
                raise RunFailure(FailureCode.CHUNK_WITHOUT_ID,
                                 f"first {kind.value} chunk of lane {tag!r} carries no {id_key}")
            self._chunk_continue(run, kind, pending[1], event)
            return
        pending = lanes.get(None)
        if pending is None or pending[0] is not kind:
            candidates = [item for k, item in lanes.values() if k is kind]
            if len(candidates) > 1:
                raise RunFailure(FailureCode.CHUNK_AMBIGUOUS,
                                 f"untagged {kind.value} chunk without {id_key} while"
                                 f" {len(candidates)} lanes have a pending item")
            if not candidates:
                raise RunFailure(FailureCode.CHUNK_WITHOUT_ID,
                                 f"first {kind.value} chunk carries no {id_key}")
            self._chunk_continue(run, kind, candidates[0], event)
            return
        self._chunk_continue(run, kind, pending[1], event)

    def _chunk_open(
        self, run: RunState, kind: ChunkKind, item_id: str, event: dict[str, Any]
    ) -> None:
        start: dict[str, Any] = {}
        if "subagentRunId" in event:
            start["subagentRunId"] = event["subagentRunId"]
        if "metadata" in event:
            start["metadata"] = event["metadata"]
        delta = event.get("delta")
        if kind is ChunkKind.REASONING:
            start["messageId"] = item_id
            self._reasoning_start(run, start)
            if delta is not None:
                self._append_message(run, item_id, delta, None)
        elif kind is ChunkKind.TEXT:
            start["messageId"] = item_id
            for key in ("role", "name"):
                if key in event:
                    start[key] = event[key]
            self._text_start(run, start)
            if delta is not None:
                self._append_message(run, item_id, delta, None)
        else:
            if "toolCallName" not in event:
                raise RunFailure(FailureCode.CHUNK_WITHOUT_ID,
                                 "first tool call chunk carries no toolCallName")
            start["toolCallId"] = item_id
            start["toolCallName"] = event["toolCallName"]
            if "parentMessageId" in event:
                start["parentMessageId"] = event["parentMessageId"]
            self._tool_start(run, start)
            if delta is not None:
                self._append_args(run, item_id, delta, None)

    def _chunk_continue(
        self, run: RunState, kind: ChunkKind, item_id: str, event: dict[str, Any]
    ) -> None:
        # What the expansion makes of it: a CONTENT/ARGS, which needs the item
        # open (an explicit END elsewhere may have closed a lane's pending item).
        self._require_open(run, kind, item_id, event.get("subagentRunId"))
        delta = event.get("delta")
        metadata = event.get("metadata")
        if kind is ChunkKind.TOOL:
            call = self._tool_call(run, item_id)
            name = event.get("toolCallName")
            if name is not None and call is not None and name != call.name:
                raise RunFailure(FailureCode.CHUNK_CONFLICT,
                                 f"tool call chunk for {item_id!r} names another tool")
            if delta is not None or metadata is not None:
                self._append_args(run, item_id, delta or "", metadata)
            return
        if kind is ChunkKind.TEXT:
            record = run.messages.get(item_id)
            if record is not None:
                for key, current in (("role", record.role), ("name", record.fields.get("name"))):
                    if key in event and event[key] != current:
                        raise RunFailure(FailureCode.CHUNK_CONFLICT,
                                         f"text chunk for {item_id!r} repeats {key} with"
                                         " another value")
        if delta is not None or metadata is not None:
            self._append_message(run, item_id, delta or "", metadata)

    def _close_lane(self, run: RunState, lane: str | None) -> None:
        """Synthesize the END of the lane's pending chunk item."""
        kind, item_id = run.lanes.pop(lane)
        if kind is ChunkKind.TOOL:
            self._close(run, "tool", item_id, None)
        else:
            self._close(run, kind.value, item_id, None)

    # --- open / close discipline --------------------------------------------------

    def _check_owner(self, run: RunState, namespace: str, item_id: str, tag: str | None) -> None:
        if tag is None:
            return  # an absent tag never disagrees
        owner = run.owners[namespace].get(item_id, _ABSENT)
        if owner is not _ABSENT and owner != tag:
            opener = "the parent agent" if owner is None else f"subagent run {owner!r}"
            raise RunFailure(FailureCode.OWNER_MISMATCH,
                             f"{_describe(namespace, item_id)} belongs to {opener};"
                             f" subagent run {tag!r} may not continue it")

    def _open(self, run: RunState, namespace: str, item_id: str, tag: str | None) -> None:
        opened = run.open[namespace]
        if item_id in opened:
            raise RunFailure(_ALREADY_OPEN_CODE[namespace],
                             f"{_describe(namespace, item_id)} is already open")
        if namespace in run.owners:
            owners = run.owners[namespace]
            if item_id in owners:
                self._check_owner(run, namespace, item_id, tag)
            else:
                owners[item_id] = tag
        opened[item_id] = None

    def _require_open(self, run: RunState, namespace: str, item_id: str, tag: str | None) -> None:
        if item_id not in run.open[namespace]:
            raise RunFailure(_NOT_OPEN_CODE[namespace],
                             f"{_describe(namespace, item_id)} is not open")
        if tag is not None and namespace in run.owners:
            self._check_owner(run, namespace, item_id, tag)

    def _close(self, run: RunState, namespace: str, item_id: str, event: dict[str, Any] | None,
               ) -> None:
        self._require_open(run, namespace, item_id,
                           None if event is None else event.get("subagentRunId"))
        del run.open[namespace][item_id]
        if event is not None and "metadata" in event:
            if namespace == "tool":
                call = self._tool_call(run, item_id)
                if call is not None:
                    call.metadata = _merged(call.metadata, event["metadata"])
            elif namespace in ("reasoning", "text"):
                record = run.messages.get(item_id)
                if record is not None:
                    record.metadata = _merged(record.metadata, event["metadata"])

    # --- spans ----------------------------------------------------------------------

    def _span_start(self, run: RunState, event: dict[str, Any]) -> None:
        self._open(run, "span", event["messageId"], event.get("subagentRunId"))

    def _span_end(self, run: RunState, event: dict[str, Any]) -> None:
        self._close(run, "span", event["messageId"], event)

    # --- reasoning and text messages -----------------------------------------------

    def _reasoning_start(self, run: RunState, event: dict[str, Any]) -> None:
        self._start_message(run, "reasoning", "reasoning", event)

    def _reasoning_content(self, run: RunState, event: dict[str, Any]) -> None:
        self._content(run, "reasoning", event)

    def _content(self, run: RunState, namespace: str, event: dict[str, Any]) -> None:
        """REASONING_MESSAGE_CONTENT / TEXT_MESSAGE_CONTENT (bare ones take the fast path)."""
        message_id = event["messageId"]
        self._require_open(run, namespace, message_id, event.get("subagentRunId"))
        self._append_message(run, message_id, event["delta"], event.get("metadata"))

    def _reasoning_end(self, run: RunState, event: dict[str, Any]) -> None:
        self._close(run, "reasoning", event["messageId"], event)

    def _text_start(self, run: RunState, event: dict[str, Any]) -> None:
        self._start_message(run, "text", event.get("role", "assistant"), event)

    def _text_content(self, run: RunState, event: dict[str, Any]) -> None:
        self._content(run, "text", event)

    def _text_end(self, run: RunState, event: dict[str, Any]) -> None:
        self._close(run, "text", event["messageId"], event)

    def _start_message(
        self, run: RunState, namespace: str, role: str, event: dict[str, Any]
    ) -> None:
        message_id = event["messageId"]
        tag = event.get("subagentRunId")
        self._open(run, namespace, message_id, tag)
        record = run.messages.get(message_id)
        if record is None:
            record = MessageRecord(message_id, role)
            if tag is not None:
                record.fields["subagentRunId"] = tag
            if "name" in event:
                record.fields["name"] = event["name"]
            record.content_base = ""
            run.messages[message_id] = record
            run.order.append(message_id)
        elif record.content_base is None and record.content_slot is None:
            record.content_base = ""  # a tool-call host now streams text too
        if "metadata" in event:
            record.metadata = _merged(record.metadata, event["metadata"])

    def _append_message(
        self, run: RunState, message_id: str, delta: str, metadata: dict[str, Any] | None,
    ) -> None:
        record = run.messages[message_id]
        if delta:
            self.content.fragments(_text_slot(run, record)).append(delta)
        if metadata is not None:
            record.metadata = _merged(record.metadata, metadata)

    # --- tool calls -------------------------------------------------------------------

    def _tool_call(self, run: RunState, call_id: str) -> ToolCallRecord | None:
        host = run.messages.get(run.tool_index.get(call_id, ""))
        if host is not None:
            for call in host.tool_calls or ():
                if call.id == call_id:
                    return call
        return None

    def _tool_start(self, run: RunState, event: dict[str, Any]) -> None:
        call_id = event["toolCallId"]
        tag = event.get("subagentRunId")
        self._open(run, "tool", call_id, tag)
        call = self._tool_call(run, call_id)
        if call is None:
            host = self._tool_host(run, event.get("parentMessageId"), call_id, tag)
            call = ToolCallRecord(call_id, event["toolCallName"])
            if host.tool_calls is None:
                host.tool_calls = []
            host.tool_calls.append(call)
            run.tool_index[call_id] = host.id
        if "metadata" in event:
            call.metadata = _merged(call.metadata, event["metadata"])

    def _tool_host(
        self, run: RunState, parent_id: str | None, call_id: str, tag: str | None
    ) -> MessageRecord:
        """The assistant message parentMessageId names, or a new one."""
        host_id = parent_id if parent_id is not None else call_id
        host = run.messages.get(host_id)
        if host is not None and host.role == "assistant":
            return host
        if host is not None:
            host_id = call_id  # the name is taken by a message of another role
            existing = run.messages.get(host_id)
            if existing is not None:
                return existing
        host = MessageRecord(host_id, "assistant")
        if tag is not None:
            host.fields["subagentRunId"] = tag
        run.messages[host_id] = host
        run.order.append(host_id)
        return host

    def _tool_args(self, run: RunState, event: dict[str, Any]) -> None:
        call_id = event["toolCallId"]
        self._require_open(run, "tool", call_id, event.get("subagentRunId"))
        self._append_args(run, call_id, event["delta"], event.get("metadata"))

    def _append_args(
        self, run: RunState, call_id: str, delta: str, metadata: dict[str, Any] | None
    ) -> None:
        call = self._tool_call(run, call_id)
        if call is None:
            return
        if delta:
            self.content.fragments(_args_slot(run, call)).append(delta)
        if metadata is not None:
            call.metadata = _merged(call.metadata, metadata)

    def _tool_end(self, run: RunState, event: dict[str, Any]) -> None:
        self._close(run, "tool", event["toolCallId"], event)

    def _tool_result(self, run: RunState, event: dict[str, Any]) -> None:
        message_id = event["messageId"]
        record = MessageRecord(message_id, "tool", {"toolCallId": event["toolCallId"]})
        content = event["content"]
        if type(content) is str:
            record.content_base = content
        else:
            record.fields["content"] = content
        if "subagentRunId" in event:
            record.fields["subagentRunId"] = event["subagentRunId"]
        previous = run.messages.get(message_id)
        if "metadata" in event:
            record.metadata = event["metadata"]
        run.messages[message_id] = record
        if previous is None:
            run.order.insert(history.tool_result_position(run, event["toolCallId"]), message_id)

    # --- encrypted values -------------------------------------------------------------

    def _encrypted_value(self, run: RunState, event: dict[str, Any]) -> None:
        if self._held_encrypted(run, event):
            return
        self._warn(WarningCode.ENCRYPTED_VALUE_UNKNOWN_ENTITY,
                   f"REASONING_ENCRYPTED_VALUE names {event['subtype']} {event['entityId']!r},"
                   " which this run does not hold; the value was dropped")
        self._out.append(EncryptedLost(LossReason.UNKNOWN_ENTITY))

    def _held_encrypted(self, run: RunState, event: dict[str, Any]) -> bool:
        """Give the value to the message or tool call it names, if the run holds it."""
        entity_id = event["entityId"]
        if event["subtype"] == "message":
            record = run.messages.get(entity_id)
            if record is None or record.role == "activity":
                return False
            record.encrypted_value = event["encryptedValue"]
            return True
        call = self._tool_call(run, entity_id)
        if call is None:
            return False
        call.encrypted_value = event["encryptedValue"]
        return True

    # --- snapshots and activity ---------------------------------------------------------

    def _messages_snapshot(self, run: RunState, event: dict[str, Any]) -> None:
        history.apply_snapshot(run, event["messages"])

    def _activity_snapshot(self, run: RunState, event: dict[str, Any]) -> None:
        message_id = event["messageId"]
        previous = run.messages.get(message_id)
        if previous is not None and previous.role == "activity" and event.get("replace") is False:
            return
        record = MessageRecord(
            message_id, "activity",
            {"activityType": event["activityType"], "content": event["content"]},
        )
        if "subagentRunId" in event:
            record.fields["subagentRunId"] = event["subagentRunId"]
        if "metadata" in event:
            record.metadata = event["metadata"]
        run.messages[message_id] = record
        if previous is None:
            run.order.append(message_id)

    def _activity_delta(self, run: RunState, event: dict[str, Any]) -> None:
        record = run.messages.get(event["messageId"])
        if record is None or record.role != "activity":
            return
        patched = apply_patch(record.fields["content"], event["patch"])
        if type(patched) is dict:
            record.fields["content"] = patched
        if "metadata" in event:
            record.metadata = _merged(record.metadata, event["metadata"])

    # --- steps and subagents ------------------------------------------------------------

    def _step_started(self, run: RunState, event: dict[str, Any]) -> None:
        self._open(run, "step", event["stepName"], None)

    def _step_finished(self, run: RunState, event: dict[str, Any]) -> None:
        self._close(run, "step", event["stepName"], None)

    def _subagent_started(self, run: RunState, event: dict[str, Any]) -> None:
        self._open(run, "subagent", event["subagentRunId"], None)

    def _subagent_finished(self, run: RunState, event: dict[str, Any]) -> None:
        self._close(run, "subagent", event["subagentRunId"], None)


def _ignore(engine: KeyEngine, run: RunState, event: dict[str, Any]) -> None:
    """Validated, but builds no history (state, raw and custom events)."""


# The fast paths for other bare records, by event type (tried after
# `_took_bare_delta`, which takes most records).
_FAST_PATHS: Final[dict[str, Callable[[KeyEngine, RunState, str, dict[str, Any]], bool]]] = {
    **dict.fromkeys(_FAST_BOUNDARIES, KeyEngine._took_bare_boundary),
    **dict.fromkeys(_FAST_STARTS, KeyEngine._took_bare_start),
    "REASONING_ENCRYPTED_VALUE": KeyEngine._took_bare_encrypted,
}

# One table for all engines (a service holds an engine per key): shared, it
# stays in the CPU cache, where per-engine bound methods would not.
_HANDLERS: Final[dict[str, Callable[[KeyEngine, RunState, dict[str, Any]], None]]] = {
    "REASONING_START": KeyEngine._span_start,
    "REASONING_END": KeyEngine._span_end,
    "REASONING_MESSAGE_START": KeyEngine._reasoning_start,
    "REASONING_MESSAGE_CONTENT": KeyEngine._reasoning_content,
    "REASONING_MESSAGE_END": KeyEngine._reasoning_end,
    "REASONING_ENCRYPTED_VALUE": KeyEngine._encrypted_value,
    "TEXT_MESSAGE_START": KeyEngine._text_start,
    "TEXT_MESSAGE_CONTENT": KeyEngine._text_content,
    "TEXT_MESSAGE_END": KeyEngine._text_end,
    "TOOL_CALL_START": KeyEngine._tool_start,
    "TOOL_CALL_ARGS": KeyEngine._tool_args,
    "TOOL_CALL_END": KeyEngine._tool_end,
    "TOOL_CALL_RESULT": KeyEngine._tool_result,
    "MESSAGES_SNAPSHOT": KeyEngine._messages_snapshot,
    "ACTIVITY_SNAPSHOT": KeyEngine._activity_snapshot,
    "ACTIVITY_DELTA": KeyEngine._activity_delta,
    "STEP_STARTED": KeyEngine._step_started,
    "STEP_FINISHED": KeyEngine._step_finished,
    "SUBAGENT_STARTED": KeyEngine._subagent_started,
    "SUBAGENT_FINISHED": KeyEngine._subagent_finished,
    "SUBAGENT_ERROR": KeyEngine._subagent_finished,
    "STATE_SNAPSHOT": _ignore,
    "STATE_DELTA": _ignore,
    "RAW": _ignore,
    "CUSTOM": _ignore,
}


def _text_slot(run: RunState, record: MessageRecord) -> int:
    """The content slot of the message's streamed text, allocated at its first delta."""
    if record.content_slot is None:
        record.content_slot = run.next_slot
        run.next_slot += 1
    return record.content_slot


def _args_slot(run: RunState, call: ToolCallRecord) -> int:
    """The content slot of the tool call's streamed arguments, allocated at their first delta."""
    if call.args_slot is None:
        call.args_slot = run.next_slot
        run.next_slot += 1
    return call.args_slot


def _merged(current: dict[str, Any] | None, update: dict[str, Any]) -> dict[str, Any]:
    """Metadata merges key by key, last write wins, no recursion (AG-UI 1.0)."""
    if current is None:
        return dict(update)
    current.update(update)
    return current


def _values_on(record: MessageRecord) -> int:
    count = 1 if record.encrypted_value is not None else 0
    return count + sum(1 for c in record.tool_calls or () if c.encrypted_value is not None)


def _error_of(event: dict[str, Any]) -> dict[str, Any]:
    error = {"message": event["message"]}
    if "code" in event:
        error["code"] = event["code"]
    return error
