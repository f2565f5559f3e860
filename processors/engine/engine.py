"""The rule engine: raw record values of one run key in, decisions out.

Sans-IO and deterministic: no Kafka, no clock, no logging. The caller feeds
the record values of one key in offset order and acts on the decisions
(`processors.engine.decisions`); the same engine serves the stream processor,
the offline checker and the tests.

Every record takes one path, the steps of rule book section 2 in order, driven
by two tables: `_RULES` (per event type: its schema check, what it does inside
and outside a run, which chunk lanes it closes) and `_NAMESPACES` (per kind of
open item: its id field, failure codes, owners). The schema step costs one
compiled expression for the flat events agent servers send, whatever optional
fields they carry (`topics.events.CLEAN_CHECKS`); only other events take the
full walk of `check_model`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import Enum, auto
from typing import Any, Final

import orjson

from processors.engine import history
from processors.engine.codes import FailureCode, LossReason, Outcome, WarningCode
from processors.engine.content import ContentStore, Fragments, InMemoryContentStore
from processors.engine.decisions import (
    CONTINUATION,
    INPUT,
    MESSAGE,
    REMOVAL,
    Concluded,
    Decision,
    Discarded,
    EncryptedLost,
    Failed,
    HistoryEntry,
    RunIdentity,
    Step,
    Warned,
)
from processors.engine.jsonpatch import apply_patch
from processors.engine.limits import DEFAULT_LIMITS, RunLimits
from processors.engine.retired import RETIRED_EVENTS, translate_thinking
from processors.engine.state import (
    BUILT,
    CONTINUED,
    NAMESPACES,
    OPEN_KINDS,
    ChunkKind,
    KeyState,
    MessageRecord,
    Phase,
    RunState,
    ToolCallRecord,
)
from processors.engine.state import (
    INPUT as FROM_INPUT,
)
from topics.events import (
    CLEAN_CHECKS,
    EVENT_MODELS,
    REMOVE,
    CleanCheck,
    Findings,
    Malformed,
    Model,
    PinnedCheck,
    check_model,
    compile_pinned_check,
    protocol_version_is_foreign,
)


class RunFailure(Exception):
    """Raised inside event handling: the active run fails with `code`."""

    def __init__(self, code: FailureCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


# Keys of a checked event that no handler reads: its type (dispatched on
# already) and what servers add for their own use.
_PASSIVE_KEYS: Final = frozenset({"type", "timestamp", "rawEvent"})


class _Namespace:
    """One set of ids open at the same time (rule book section 1)."""

    __slots__ = ("already_open", "delta_keys", "id_key", "index", "name", "not_open", "noun",
                 "owned", "streams")

    def __init__(self, name: str, id_key: str, noun: str, already_open: FailureCode,
                 not_open: FailureCode, streams: bool) -> None:
        self.name = name
        self.index = OPEN_KINDS.index(name)  # its position in RunState.open (and .owners)
        self.id_key = id_key  # the field that names an item
        self.noun = noun  # how reasons name an item
        self.already_open = already_open
        self.not_open = not_open
        # Items keep the subagentRunId that first opened them (section 8).
        self.owned = name in NAMESPACES
        # Items are history (messages, tool calls): they take deltas and metadata.
        self.streams = streams
        # The keys of a delta that only appends (see the delta memo in KeyEngine).
        self.delta_keys = _PASSIVE_KEYS | {id_key, "subagentRunId", "delta"}


_SPANS: Final = _Namespace("span", "messageId", "reasoning span",
                           FailureCode.SPAN_ALREADY_OPEN, FailureCode.SPAN_NOT_OPEN, False)
_REASONING: Final = _Namespace("reasoning", "messageId", "reasoning message",
                               FailureCode.MESSAGE_ALREADY_OPEN, FailureCode.MESSAGE_NOT_OPEN, True)
_TEXT: Final = _Namespace("text", "messageId", "text message",
                          FailureCode.MESSAGE_ALREADY_OPEN, FailureCode.MESSAGE_NOT_OPEN, True)
_TOOL_CALLS: Final = _Namespace("tool", "toolCallId", "tool call",
                                FailureCode.TOOL_CALL_ALREADY_OPEN, FailureCode.TOOL_CALL_NOT_OPEN,
                                True)
_STEPS: Final = _Namespace("step", "stepName", "step",
                           FailureCode.STEP_ALREADY_OPEN, FailureCode.STEP_NOT_OPEN, False)
_SUBAGENTS: Final = _Namespace("subagent", "subagentRunId", "subagent",
                               FailureCode.SUBAGENT_ALREADY_OPEN, FailureCode.SUBAGENT_NOT_OPEN,
                               False)
# By name; a ChunkKind finds its namespace here too (its value is the name).
_NAMESPACES: Final = {ns.name: ns for ns in (_SPANS, _REASONING, _TEXT, _TOOL_CALLS, _STEPS,
                                             _SUBAGENTS)}
_TOOL: Final = ChunkKind.TOOL  # a module constant: enum attribute lookups are slow


class _Lanes(Enum):
    """Which pending chunk items an event closes before it applies (section 6)."""

    KEPT = auto()  # none: every lane's item stays pending
    OWN = auto()  # its own lane's, the lane of its subagentRunId
    ALL = auto()  # every lane's


_OWN_LANE: Final = _Lanes.OWN
_ALL_LANES: Final = _Lanes.ALL

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
_loads: Final = orjson.loads


def _describe(ns: _Namespace, item_id: str) -> str:
    if ns is _STEPS:
        owner, name = _step_of(item_id)
        return f"step {name!r}" + ("" if owner is None else f" of subagent run {owner!r}")
    return f"{ns.noun} {item_id!r}"


def _step_key(owner: str | None, name: str) -> str:
    """An open step's id: its owner and name, unambiguous whatever they contain."""
    return orjson.dumps([owner, name]).decode()


def _step_of(key: str) -> tuple[str | None, str]:
    try:
        owner, name = orjson.loads(key)
    except (orjson.JSONDecodeError, ValueError, TypeError):
        return None, key  # stored before steps had owners: the parent's
    return owner, name


class KeyEngine:
    """Checks and reassembles the runs of one run key.

    `state` and `content` may be supplied (restored) by the caller; by default
    they start empty and in memory.
    """

    # Slots keep the attributes inside the object: one cache line less to
    # fetch per record when a service interleaves thousands of keys.
    __slots__ = ("_chars", "_events", "_findings", "_limits", "_memo", "_memo_fragments",
                 "_memo_id", "_memo_tag", "_out", "content", "state")

    def __init__(self, state: KeyState | None = None, content: ContentStore | None = None,
                 limits: RunLimits = DEFAULT_LIMITS) -> None:
        self.state = state if state is not None else KeyState()
        self.content: ContentStore = content if content is not None else InMemoryContentStore()
        self._out: list[Decision] = []  # the current record's decisions; `_step` empties it
        self._findings = Findings()
        self._limits = limits
        # The active run's records and streamed characters (processors.engine.limits);
        # restored, the run's text is counted from what was restored.
        self._events = 0
        self._chars = (0 if self.state.run is None
                       else sum(map(len, self.content.texts().values())))
        # The delta memo: where the key's next delta goes, if it is the same as
        # the last one. Set by a CONTENT/ARGS, or a chunk continuing an item,
        # that did nothing but append (its keys within its namespace's
        # `delta_keys`: no metadata, role, name, tool name or parent), by an
        # explicit START, for the item's CONTENT/ARGS, and by an opening chunk
        # with a delta, for the id-less chunks of its lane that continue it;
        # dropped as soon as anything else is applied to the run.
        # Until then, a clean event of that type, id and tag that only appends
        # meets the same run state: its handler would pass the same checks and
        # append to the same fragments, so the memo only skips the lookups
        # (which, with thousands of keys interleaved, are mostly cache misses).
        # tests/engine/test_decorated_events.py checks that it decides as the handlers.
        self._memo: _Repeat | None = None  # the delta's type and check; None: no memo
        self._memo_id: str | None  # its id, None for an id-less chunk
        self._memo_tag: str | None  # its subagentRunId
        self._memo_fragments: Fragments

    # --- entry points ---------------------------------------------------------

    def feed(self, raw: bytes | str) -> Step:
        """Apply the next record value of the key; return what it decided.

        The steps of rule book section 2, in order.
        """
        try:
            event = _loads(raw)
            event_type = event["type"]
        except (orjson.JSONDecodeError, TypeError, KeyError):  # no JSON object with a type
            return self._undecodable()
        # A repeat of the last delta (see the delta memo) passes every step as
        # that one did, and appends to the same fragments.
        memo = self._memo  # set only while a run is active
        if memo is not None and event_type == memo.event_type:
            # Callables kept in slots are fetched apart from their call: a call
            # spelt `memo.delta_of(...)` takes the interpreter's slow method lookup.
            delta_of = memo.delta_of
            delta = delta_of(event, self._memo_id, self._memo_tag)
            if delta is not None:
                if delta:
                    self._memo_fragments.append(delta)
                    self._chars += len(delta)
                self._events += 1
                if self._chars > self._limits.content_chars or (
                        self._events > self._limits.events):
                    return self._over_limit(event_type)
                return memo.quiet
        if type(event_type) is not str:
            return self._undecodable()
        rule = _RULES.get(event_type)
        run = self.state.run
        if run is None and self.state.phase is _FAILED and event_type != "RUN_STARTED":
            self._out.append(Discarded())
            return _step("unknown" if rule is None else event_type, self._out)
        if rule is None:
            if event_type not in RETIRED_EVENTS:
                self._warn(WarningCode.UNKNOWN_EVENT_TYPE,
                           f"event type {_shown_type(event_type)} is not an AG-UI 1.1 type;"
                           " the event was dropped")
                return _step("unknown", self._out)
            # The compatibility boundary (rule book section 2): translated before the
            # schema sees it.
            event = translate_thinking(event, run)
            self._warn_retired(event_type, "", f"translated to {event['type']}")
            event_type = event["type"]
            rule = _RULES[event_type]
        is_clean = rule.is_clean
        if not is_clean(event):
            checked = self._checked(event_type, rule.model, event)
            if checked is None:
                return _step(event_type, self._out)
            event = checked
        if run is None:
            outside_run = rule.outside_run
            outside_run(self, event_type, event)
        else:
            self._memo = None  # the run changes: where a delta goes may change with it
            self._events += 1
            try:
                lanes = run.lanes
                if lanes:
                    if rule.lanes is _OWN_LANE:
                        lane = event.get("subagentRunId")
                        if lane in lanes:
                            self._close_lane(run, lane)
                    elif rule.lanes is _ALL_LANES:
                        for lane in list(lanes):
                            self._close_lane(run, lane)
                in_run = rule.in_run
                in_run(self, run, event)
                self._check_limits(run)
            except RunFailure as failure:
                self._fail(failure.code, failure.reason)
        out = self._out
        return _step(event_type, out) if out else rule.quiet

    @property
    def content_chars(self) -> int:
        """Characters of streamed text and arguments the active run holds."""
        return self._chars

    def _check_limits(self, run: RunState) -> None:
        """Past one of the run's limits, the run fails (processors.engine.limits)."""
        limits = self._limits
        if self._events > limits.events:
            raise RunFailure(FailureCode.RUN_EVENT_LIMIT,
                             f"the run applied more than {limits.events} records")
        if self._chars > limits.content_chars:
            raise RunFailure(FailureCode.RUN_CONTENT_LIMIT,
                             f"the run streamed more than {limits.content_chars} characters"
                             " of text and tool-call arguments")
        items = (len(run.messages) + len(run.tool_index) + len(run.open[_SPANS.index])
                 + len(run.open[_STEPS.index]) + len(run.open[_SUBAGENTS.index]))
        if items > limits.items:
            raise RunFailure(FailureCode.RUN_ITEM_LIMIT,
                             f"the run holds more than {limits.items} messages, tool calls and"
                             " open spans, steps and subagents")

    def _over_limit(self, event_type: str) -> Step:
        """A repeated delta took the run past a limit: it fails at this record."""
        self._memo = None
        run = self.state.run
        assert run is not None  # the memo is set only while a run is active
        try:
            self._check_limits(run)
        except RunFailure as failure:
            self._fail(failure.code, failure.reason)
        return _step(event_type, self._out)

    def refuse(self, code: FailureCode, reason: str) -> tuple[Decision, ...]:
        """The caller ends the active run with a failure of its own (a tenant's limit);
        the decisions, which belong to the record just fed."""
        if self.state.run is not None:
            self._fail(code, reason)
        decisions = tuple(self._out)
        self._out.clear()
        return decisions

    def abandon(self) -> Step:
        """The caller's idle timeout expired: the active run fails `run_abandoned`."""
        out = self._out
        if self.state.run is not None:
            self._fail(FailureCode.RUN_ABANDONED,
                       "no terminal event arrived before the idle timeout",
                       loss=LossReason.RUN_ABANDONED)
        return _step("abandoned", out)

    # --- decoding and schema ----------------------------------------------------

    def _undecodable(self) -> Step:
        if self.state.phase is _FAILED:
            self._out.append(Discarded())
        else:
            self._fail(FailureCode.UNDECODABLE_RECORD,
                       "record value is not a JSON object with a string type")
        return _step("undecodable", self._out)

    def _checked(self, event_type: str, model: Model, event: dict[str, Any]
                 ) -> dict[str, Any] | None:
        """The full schema check of an event that is not clean (section 2, steps 4-5).

        Returns the event as stripped, or None when the record is decided here:
        malformed, or removed as a whole.
        """
        findings = self._findings
        try:
            checked = check_model(model, event, "", findings)
        except Malformed as error:
            findings.clear()
            self._fail(FailureCode.MALFORMED_EVENT, f"{event_type}: {error}")
            return None
        if (findings.unknown_fields or findings.unknown_members or findings.unknown_subtype
                or findings.retired_shapes):
            unknown_subtype = findings.unknown_subtype
            self._warn_stripped(event_type, findings, checked is REMOVE)
            findings.clear()
            if unknown_subtype and checked is not REMOVE:
                self._warn(WarningCode.UNKNOWN_SUBTYPE,
                           "REASONING_ENCRYPTED_VALUE.subtype is not an AG-UI 1.1 member;"
                           " the event was dropped")
                self._out.append(EncryptedLost(LossReason.UNKNOWN_SUBTYPE))
                return None
        # REMOVE: an unknown union member in a required position takes the event with it.
        return None if checked is REMOVE else checked

    # --- lifecycle ------------------------------------------------------------

    def _stray(self, event_type: str, event: dict[str, Any]) -> None:
        """A record that cannot open a run while none is active fails on its own."""
        phase = self.state.phase
        if phase is Phase.FRESH:
            self._fail(FailureCode.RUN_NOT_STARTED,
                       f"{event_type} before any RUN_STARTED on this key")
        else:
            may_follow = ("RUN_STARTED or a late RUN_ERROR" if phase is Phase.FINISHED
                          else "RUN_STARTED")
            self._fail(FailureCode.RUN_ALREADY_ENDED,
                       f"{event_type} after the run ended ({phase.value}); only {may_follow}"
                       " may follow")

    def _start_run(self, event_type: str, event: dict[str, Any]) -> None:
        run = RunState(event["threadId"], event["runId"])
        version = event.get("protocolVersion")
        self.state.run = run
        self._events, self._chars = 1, 0
        self.state.phase = Phase.ACTIVE
        if version is not None and protocol_version_is_foreign(version):
            self._warn(WarningCode.PROTOCOL_VERSION,
                       "RUN_STARTED.protocolVersion is newer than 1.1 or not MAJOR.MINOR;"
                       " proceeding as 1.1")
        run_input = event.get("input")
        if run_input is not None:
            run.input_echoed = True
            self._take_input(run, run_input["messages"])

    def _take_input(self, run: RunState, messages: list[dict[str, Any]]) -> None:
        """RUN_STARTED.input (rule book section 3): its messages are entities of the
        run; those new to the thread are history, before the run's own messages.
        New: the input's tail after its last message an agent produced (the user's
        new message, the client's tool results), or all of it when there is none,
        minus what the key already holds. The rest the thread holds already: the
        key's index takes them, as if an earlier run had delivered them."""
        agent_made = [i for i, m in enumerate(messages) if m["role"] in _AGENT_ROLES]
        tail_starts = agent_made[-1] + 1 if agent_made else 0
        state = self.state
        for position, message in enumerate(messages):
            message_id = message["id"]
            if state.held is not None and message_id in state.held:
                continue
            if position < tail_starts:
                _hold(state, message_id, message["role"], message.get("toolCalls"))
            elif message_id not in run.messages:
                record = history.record_from_wire(message)
                record.origin = FROM_INPUT
                run.messages[message_id] = record
                for call in record.tool_calls or ():
                    run.tool_index[call.id] = message_id
        _bound_index(state, self._limits.items)

    def _run_already_active(self, run: RunState, event: dict[str, Any]) -> None:
        raise RunFailure(FailureCode.RUN_ALREADY_ACTIVE,
                         f"RUN_STARTED while run {run.run_id!r} is active")

    def _run_error_outside_run(self, event_type: str, event: dict[str, Any]) -> None:
        state = self.state
        phase = state.phase
        if phase is Phase.FRESH:
            # A RUN_ERROR as the key's first event is a run of its own.
            self._out.append(Concluded(Outcome.ERROR, None, [], event.get("usage"),
                                       _error_of(event)))
            state.phase = Phase.ERRORED
        elif phase is Phase.FINISHED:
            # A late RUN_ERROR (events/lifecycle, "After a run closes"): the run that
            # reported it finished failed after all. What it delivered stays.
            last = state.last
            identity = None if last is None else RunIdentity(last[0], last[1])
            self._out.append(Warned(WarningCode.LATE_RUN_ERROR,
                                    "RUN_ERROR after RUN_FINISHED: the run failed after it"
                                    " reported its end; it is an error run now", identity))
            self._out.append(Concluded(Outcome.ERROR, identity, [], event.get("usage"),
                                       _error_of(event), late=True))
            state.phase = Phase.ERRORED
        else:
            self._stray(event_type, event)

    def _run_finished(self, run: RunState, event: dict[str, Any]) -> None:
        if event["threadId"] != run.thread_id or event["runId"] != run.run_id:
            # The known cause of a runId alone differing, for the operator who reads it.
            hint = ("; LangGraph's AG-UI adapter before 0.0.38 echoes a wrong runId on"
                    " every run: upgrade it" if event["threadId"] == run.thread_id else "")
            raise RunFailure(
                FailureCode.RUN_ID_MISMATCH,
                f"RUN_FINISHED names thread {event['threadId']!r} run {event['runId']!r};"
                f" RUN_STARTED named thread {run.thread_id!r} run {run.run_id!r}{hint}",
            )
        if any(run.open):
            still_open = [
                _describe(_NAMESPACES[kind], item_id)
                for kind, ids in zip(OPEN_KINDS, run.open, strict=True)
                for item_id in ids
            ]
            raise RunFailure(FailureCode.OPEN_AT_FINISH,
                             "open at RUN_FINISHED: " + ", ".join(still_open))
        outcome, detail = _finished_outcome(event.get("outcome"))
        self._conclude(outcome, run, event, None, detail)
        self.state.phase = Phase.FINISHED
        self.state.last = [run.thread_id, run.run_id]

    def _run_error(self, run: RunState, event: dict[str, Any]) -> None:
        discarded_values = 0
        for ns in (_REASONING, _TEXT):
            for message_id in run.open[ns.index]:
                record = run.messages.pop(message_id, None)
                if record is None:
                    continue
                discarded_values += _values_on(record)
                self._warn(WarningCode.INCOMPLETE_AT_ERROR,
                           f"{_describe(ns, message_id)} was open at RUN_ERROR;"
                           " it was discarded")
        for call_id in run.open[_TOOL_CALLS.index]:
            host = run.messages.get(run.tool_index.get(call_id, ""))
            if host is None or host.tool_calls is None:
                continue  # went with a discarded message
            call = next(c for c in host.tool_calls if c.id == call_id)
            host.tool_calls.remove(call)
            discarded_values += call.encrypted_value is not None
            self._warn(WarningCode.INCOMPLETE_AT_ERROR,
                       f"{_describe(_TOOL_CALLS, call_id)} was open at RUN_ERROR;"
                       " it was discarded")
            if not host.tool_calls and not (host.content_base or host.content_slot is not None):
                run.messages.pop(host.id)
                discarded_values += _values_on(host)
        self._out.extend(EncryptedLost(LossReason.INCOMPLETE_AT_ERROR)
                         for _ in range(discarded_values))
        self._conclude(Outcome.ERROR, run, event, _error_of(event), None)
        self.state.phase = Phase.ERRORED

    def _assemble(self, run: RunState) -> list[HistoryEntry]:
        """The run's history entries (rule book section 15): removals, then its
        messages in history order, each as its origin says; and the key's index of
        delivered messages learns them."""
        texts = self.content.texts()
        state = self.state
        entries = []
        for removed in run.removed or ():
            entries.append(HistoryEntry(REMOVAL, {"id": removed}))
            _forget(state, removed)
        for record in run.messages.values():
            origin = record.origin
            message = history.to_message(record, texts)
            entries.append(HistoryEntry(_ENTRY_KINDS[origin], message))
            _hold(state, record.id, record.role, message.get("toolCalls"))
        _bound_index(state, self._limits.items)
        return entries

    def _conclude(self, outcome: Outcome, run: RunState, event: dict[str, Any],
                  error: dict[str, Any] | None, detail: dict[str, Any] | None) -> None:
        """The run ends with its history (RUN_FINISHED, RUN_ERROR)."""
        self._out.append(Concluded(outcome, RunIdentity(run.thread_id, run.run_id),
                                   self._assemble(run), event.get("usage"), error, detail,
                                   run.input_echoed))
        self._end_run()

    def _end_run(self) -> None:
        run = self.state.run
        if run is not None:
            self.content.clear()
        self.state.run = None
        self._memo = None
        self._events = self._chars = 0

    def _fail(self, code: FailureCode, reason: str,
              loss: LossReason = LossReason.RUN_FAILED) -> None:
        run = self.state.run
        identity = None if run is None else RunIdentity(run.thread_id, run.run_id)
        if run is not None:
            self._out.extend(EncryptedLost(loss) for _ in range(history.held_encrypted_values(run)))
        self._out.append(Failed(code, reason, identity))  # the concluding decision comes last
        self._end_run()
        self.state.phase = Phase.FAILED

    # --- warnings ---------------------------------------------------------------

    def _run_identity(self) -> RunIdentity | None:
        run = self.state.run
        return None if run is None else RunIdentity(run.thread_id, run.run_id)

    def _warn(self, code: WarningCode, reason: str) -> None:
        self._out.append(Warned(code, reason, self._run_identity()))

    def _first_in_run(self, key: str) -> bool:
        """Whether the active run has not warned `key` yet (it has now); outside a run
        every occurrence warns. A producer that sends the same unknown property, or
        the same retired shape, on every delta gets one warning per run."""
        run = self.state.run
        if run is None:
            return True
        if run.warned_fields is None:
            run.warned_fields = {key}
        elif key in run.warned_fields:
            return False
        else:
            run.warned_fields.add(key)
        return True

    def _warn_retired(self, event_type: str, pointer: str, what: str) -> None:
        """A retired shape the engine translated itself (a THINKING_* event)."""
        if self._first_in_run(f"retired {event_type} {pointer}"):
            self._warn(WarningCode.RETIRED_SHAPE,
                       f"{event_type}{pointer}: a retired AG-UI shape; {what}")

    def _warn_stripped(self, event_type: str, findings: Findings, dropped: bool = False) -> None:
        """The warnings of what the check translated or stripped; `dropped`: the
        event itself was removed (an unknown member in a required position)."""
        # Retired shapes first: the compatibility boundary translates them
        # before the schema is enforced. Retired shapes and unknown properties
        # are de-duplicated per run on (event type as received, pointer), in
        # the run's one set of warned keys: an unknown_field key starts with
        # the event type, a retired_shape key with "retired " (no event type
        # does), so the two never collide.
        for code, prefix, pointers, what in (
            (WarningCode.RETIRED_SHAPE, "retired ", findings.retired_shapes,
             "retired shape at {} was translated to its AG-UI 1.1 replacement"),
            (WarningCode.UNKNOWN_FIELD, "", findings.unknown_fields,
             "unknown property {} was stripped"),
        ):
            for pointer in pointers:
                if self._first_in_run(f"{prefix}{event_type} {pointer}"):
                    self._warn(code, f"{event_type}: {what.format(pointer)}")
        removed = "was removed with the event" if dropped else "was removed"
        for pointer in findings.unknown_members:
            self._warn(WarningCode.UNKNOWN_MEMBER,
                       f"{event_type}: unknown union member at {pointer} {removed}")

    # --- chunks -------------------------------------------------------------------

    def _chunk(self, run: RunState, kind: ChunkKind, event: dict[str, Any]) -> None:
        id_key = _NAMESPACES[kind].id_key
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
            fragments = self._chunk_open(run, kind, item_id, event)
            lanes[tag] = (kind, item_id)
            if fragments is not None:
                # Its lane's id-less chunks continue it: the usual next records.
                self._remember(event["type"], None, tag, fragments)
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
    ) -> Fragments | None:
        """Expand an opening chunk; return the fragments its delta went to, if any."""
        start: dict[str, Any] = {}
        if "subagentRunId" in event:
            start["subagentRunId"] = event["subagentRunId"]
        if "metadata" in event:
            start["metadata"] = event["metadata"]
        delta = event.get("delta")
        if kind is ChunkKind.REASONING:
            start["messageId"] = item_id
            self._reasoning_start(run, start)
            return None if delta is None else self._append_text(run, item_id, delta, None)
        if kind is ChunkKind.TEXT:
            start["messageId"] = item_id
            for key in ("role", "name"):
                if key in event:
                    start[key] = event[key]
            self._text_start(run, start)
            return None if delta is None else self._append_text(run, item_id, delta, None)
        if "toolCallName" not in event:
            raise RunFailure(FailureCode.CHUNK_WITHOUT_ID,
                             "first tool call chunk carries no toolCallName")
        start["toolCallId"] = item_id
        start["toolCallName"] = event["toolCallName"]
        if "parentMessageId" in event:
            start["parentMessageId"] = event["parentMessageId"]
        self._tool_start(run, start)
        return None if delta is None else self._append_args(run, item_id, delta, None)

    def _chunk_continue(
        self, run: RunState, kind: ChunkKind, item_id: str, event: dict[str, Any]
    ) -> None:
        # What the expansion makes of it: a CONTENT/ARGS, which needs the item
        # open (an explicit END elsewhere may have closed a lane's pending item).
        ns = _NAMESPACES[kind]
        self._require_open(run, ns, item_id, event.get("subagentRunId"))
        if kind is _TOOL:
            call = self._tool_call(run, item_id)
            name = event.get("toolCallName")
            if name is not None and call is not None and name != call.name:
                raise RunFailure(FailureCode.CHUNK_CONFLICT,
                                 f"tool call chunk for {item_id!r} names another tool")
            # A repeated parentMessageId must be the opener's, whose absence (or "")
            # established none (patterns/streaming); "" repeats nothing.
            claimed = event.get("parentMessageId") or None
            if (claimed is not None and call is not None and not call.continued
                    and claimed != call.parent):
                raise RunFailure(FailureCode.CHUNK_CONFLICT,
                                 f"tool call chunk for {item_id!r} names another parent message")
        elif kind is ChunkKind.TEXT:
            record = run.messages.get(item_id)
            # Of a message an earlier run delivered only the role is known here; across
            # runs a consumer need not detect a disagreement (events/text-messages).
            if record is not None and record.origin != CONTINUED:
                for key, current in (("role", record.role), ("name", record.field("name"))):
                    if key in event and event[key] != current:
                        raise RunFailure(FailureCode.CHUNK_CONFLICT,
                                         f"text chunk for {item_id!r} repeats {key} with"
                                         " another value")
        delta = event.get("delta")
        metadata = event.get("metadata")
        if delta is not None or metadata is not None:
            self._append(run, ns, item_id, delta or "", metadata, event)

    def _close_lane(self, run: RunState, lane: str | None) -> None:
        """Synthesize the END of the lane's pending chunk item."""
        kind, item_id = run.lanes.pop(lane)
        self._close(run, _NAMESPACES[kind], item_id, None, None)

    # --- open / close discipline --------------------------------------------------

    def _check_owner(self, run: RunState, ns: _Namespace, item_id: str, tag: str | None) -> None:
        if tag is None:
            return  # an absent tag never disagrees
        owner = run.owners[ns.index].get(item_id, _ABSENT)
        if owner is not _ABSENT and owner != tag:
            opener = "the parent agent" if owner is None else f"subagent run {owner!r}"
            raise RunFailure(FailureCode.OWNER_MISMATCH,
                             f"{_describe(ns, item_id)} belongs to {opener};"
                             f" subagent run {tag!r} may not continue it")

    def _open(self, run: RunState, ns: _Namespace, item_id: str, tag: str | None) -> None:
        opened = run.open[ns.index]
        if item_id in opened:
            raise RunFailure(ns.already_open, f"{_describe(ns, item_id)} is already open")
        if ns.owned:
            owners = run.owners[ns.index]
            if item_id in owners:
                self._check_owner(run, ns, item_id, tag)
            else:
                owners[item_id] = tag
        opened[item_id] = None

    def _require_open(self, run: RunState, ns: _Namespace, item_id: str, tag: str | None) -> None:
        if item_id not in run.open[ns.index]:
            raise RunFailure(ns.not_open, f"{_describe(ns, item_id)} is not open")
        if tag is not None and ns.owned:
            self._check_owner(run, ns, item_id, tag)

    def _close(self, run: RunState, ns: _Namespace, item_id: str, tag: str | None,
               metadata: dict[str, Any] | None) -> None:
        self._require_open(run, ns, item_id, tag)
        del run.open[ns.index][item_id]
        if metadata is not None and ns.streams:
            if ns is _TOOL_CALLS:
                call = self._tool_call(run, item_id)
                if call is not None:
                    call.metadata = _merged(call.metadata, metadata)
            else:
                record = run.messages.get(item_id)
                if record is not None:
                    record.metadata = _merged(record.metadata, metadata)

    def _continue(self, run: RunState, ns: _Namespace, event: dict[str, Any]) -> None:
        """An explicit CONTENT or ARGS: a delta to an open message or tool call."""
        item_id = event[ns.id_key]
        self._require_open(run, ns, item_id, event.get("subagentRunId"))
        self._append(run, ns, item_id, event["delta"], event.get("metadata"), event)

    def _append(self, run: RunState, ns: _Namespace, item_id: str, delta: str,
                metadata: dict[str, Any] | None, event: dict[str, Any]) -> None:
        """A continuation's delta and metadata; the delta memo learns where it went."""
        if ns is _TOOL_CALLS:
            fragments = self._append_args(run, item_id, delta, metadata)
        else:
            fragments = self._append_text(run, item_id, delta, metadata)
        if fragments is not None and ns.delta_keys.issuperset(event):
            self._remember(event["type"], event.get(ns.id_key), event.get("subagentRunId"),
                           fragments)

    def _remember(self, event_type: str, item_id: str | None, tag: str | None,
                  fragments: Fragments) -> None:
        """Set the delta memo: deltas of this type, id and tag go to these fragments."""
        self._memo = _RULES[event_type].repeats[(item_id is None) * 2 + (tag is None)]
        self._memo_id = item_id
        self._memo_tag = tag
        self._memo_fragments = fragments

    # --- reasoning and text messages -----------------------------------------------

    def _reasoning_start(self, run: RunState, event: dict[str, Any]) -> MessageRecord:
        return self._start_message(run, _REASONING, "reasoning", event)

    def _text_start(self, run: RunState, event: dict[str, Any]) -> MessageRecord:
        return self._start_message(run, _TEXT, event.get("role", "assistant"), event)

    def _start_message(
        self, run: RunState, ns: _Namespace, role: str, event: dict[str, Any]
    ) -> MessageRecord:
        """Open the message; the record it streams into."""
        message_id = event["messageId"]
        tag = event.get("subagentRunId")
        self._open(run, ns, message_id, tag)
        record = run.messages.get(message_id)
        if record is None and (self.state.held or {}).get(message_id) != "activity":
            record = self._delivered(run, message_id)
            if record is not None:
                record.content_base = ""  # what this run appends to the delivered text
        if record is None:
            record = MessageRecord(message_id, role)
            if tag is not None:
                record.set_field("subagentRunId", tag)
            if "name" in event:
                record.set_field("name", event["name"])
            record.content_base = ""
            run.messages[message_id] = record
        else:
            if record.origin == FROM_INPUT:
                record.origin = BUILT  # changed by the run: published whole
            if record.content_base is None and record.content_slot is None:
                record.content_base = ""  # a tool-call host now streams text too
        if "metadata" in event:
            record.metadata = _merged(record.metadata, event["metadata"])
        return record

    def _delivered(self, run: RunState, message_id: str) -> MessageRecord | None:
        """A message an earlier run on the key delivered (and no snapshot of this run
        removed), as a record of what this run adds to it; None if there is none."""
        held = self.state.held
        if held is None or message_id not in held or (run.removed and message_id in run.removed):
            return None
        record = MessageRecord(message_id, held[message_id])
        record.origin = CONTINUED
        run.messages[message_id] = record
        return record

    def _append_text(
        self, run: RunState, message_id: str, delta: str, metadata: dict[str, Any] | None,
    ) -> Fragments | None:
        """Returns the fragments the delta went to (None for an empty delta)."""
        record = run.messages[message_id]
        fragments = None
        if delta:
            fragments = self.content.fragments(_text_slot(run, record))
            fragments.append(delta)
            self._chars += len(delta)
        if metadata is not None:
            record.metadata = _merged(record.metadata, metadata)
        return fragments

    # --- tool calls -------------------------------------------------------------------

    def _tool_call(self, run: RunState, call_id: str) -> ToolCallRecord | None:
        host = run.messages.get(run.tool_index.get(call_id, ""))
        if host is not None:
            for call in host.tool_calls or ():
                if call.id == call_id:
                    return call
        return None

    def _delivered_call(self, run: RunState, call_id: str) -> ToolCallRecord | None:
        """A tool call an earlier run on the key delivered, as a record of what this
        run adds to it, on its host's continuation; None if there is none."""
        calls = self.state.held_calls
        if calls is None or call_id not in calls:
            return None
        host_id, name = calls[call_id]
        host = run.messages.get(host_id) or self._delivered(run, host_id)
        if host is None:  # its host was removed by a snapshot of this run
            return None
        call = ToolCallRecord(call_id, name)
        call.continued = True
        if host.tool_calls is None:
            host.tool_calls = []
        host.tool_calls.append(call)
        run.tool_index[call_id] = host_id
        return call

    def _tool_start(self, run: RunState, event: dict[str, Any]) -> ToolCallRecord:
        """Open the tool call; the record its arguments stream into."""
        call_id = event["toolCallId"]
        tag = event.get("subagentRunId")
        self._open(run, _TOOL_CALLS, call_id, tag)
        call = self._tool_call(run, call_id) or self._delivered_call(run, call_id)
        if call is None:
            # An empty parentMessageId names no message: the .NET SDK sends "" for none.
            parent = event.get("parentMessageId") or None
            host = self._tool_host(run, parent, call_id, tag)
            call = ToolCallRecord(call_id, event["toolCallName"])
            call.parent = parent
            if host.tool_calls is None:
                host.tool_calls = []
            host.tool_calls.append(call)
            run.tool_index[call_id] = host.id
        if "metadata" in event:
            call.metadata = _merged(call.metadata, event["metadata"])
        return call

    def _tool_host(
        self, run: RunState, parent_id: str | None, call_id: str, tag: str | None
    ) -> MessageRecord:
        """The assistant message parentMessageId names, or a new one."""
        host_id = parent_id if parent_id is not None else call_id
        host = run.messages.get(host_id)
        if host is None:
            held = self.state.held
            if held is not None and held.get(host_id) == "assistant":
                host = self._delivered(run, host_id)  # a delivered message takes the call
            elif held is not None and host_id in held:
                host = MessageRecord(host_id, held[host_id])  # its role names no host
        if host is not None and host.role == "assistant":
            if host.origin == FROM_INPUT:
                host.origin = BUILT
            return host
        if host is not None:
            host_id = call_id  # the name is taken by a message of another role
            existing = run.messages.get(host_id)
            if existing is not None:
                return existing
        host = MessageRecord(host_id, "assistant")
        if tag is not None:
            host.set_field("subagentRunId", tag)
        run.messages[host_id] = host
        return host

    def _append_args(
        self, run: RunState, call_id: str, delta: str, metadata: dict[str, Any] | None
    ) -> Fragments | None:
        """Returns the fragments the delta went to (None for an empty delta or no call)."""
        call = self._tool_call(run, call_id)
        if call is None:
            return None
        fragments = None
        if delta:
            fragments = self.content.fragments(_args_slot(run, call))
            fragments.append(delta)
            self._chars += len(delta)
        if metadata is not None:
            call.metadata = _merged(call.metadata, metadata)
        return fragments

    def _tool_result(self, run: RunState, event: dict[str, Any]) -> None:
        message_id = event["messageId"]
        record = MessageRecord(message_id, "tool", {"toolCallId": event["toolCallId"]})
        content = event["content"]
        if type(content) is str:
            record.content_base = content
        else:
            record.set_field("content", content)
        if "subagentRunId" in event:
            record.set_field("subagentRunId", event["subagentRunId"])
        if "metadata" in event:
            record.metadata = event["metadata"]
        existing = run.messages.get(message_id)
        held = self.state.held
        if existing is None and held is not None and message_id in held and (
                not run.removed or message_id not in run.removed):
            if held[message_id] == "tool":  # a delivered result, restated: replaced whole
                run.messages[message_id] = record
            else:
                self._id_conflict(message_id, held[message_id])
            return
        if existing is None:
            history.add_tool_result(run, record, event["toolCallId"])
        elif existing.role == "tool" and existing.field("toolCallId") == event["toolCallId"]:
            run.messages[message_id] = record  # restated: it keeps its place
        elif _named_after_its_call(run, existing):
            # The host this engine made for a call without parentMessageId was named
            # after the call; the result's own id wins it (rule book section 7).
            history.rename(run, existing, _free_id(run, self.state, f"{message_id}/assistant"))
            history.add_tool_result(run, record, event["toolCallId"])
        else:
            self._id_conflict(message_id, existing.role)

    def _id_conflict(self, message_id: str, role: str) -> None:
        self._warn(WarningCode.MESSAGE_ID_CONFLICT,
                   f"TOOL_CALL_RESULT names message {message_id!r}, which is already a {role}"
                   " message; the result was dropped")

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
            if record is None:
                held = self.state.held
                if held is None or held.get(entity_id, "activity") == "activity":
                    return False
                record = self._delivered(run, entity_id)
            if record is None or record.role == "activity":
                return False
            if record.origin == FROM_INPUT:
                record.origin = BUILT  # changed by the run: published whole
            record.encrypted_value = event["encryptedValue"]
            record.encrypted_type = event.get("encryptedValueType")  # none: removed
            return True
        call = self._tool_call(run, entity_id) or self._delivered_call(run, entity_id)
        if call is None:
            return False
        host = run.messages[run.tool_index[entity_id]]
        if host.origin == FROM_INPUT:
            host.origin = BUILT
        call.encrypted_value = event["encryptedValue"]
        call.encrypted_type = event.get("encryptedValueType")
        return True

    # --- steps and subagents -------------------------------------------------------------

    def _step_started(self, run: RunState, event: dict[str, Any]) -> None:
        """Steps are per owner (events/subagents): a parent and a subagent may each
        have a step of one name open."""
        self._open(run, _STEPS, _step_key(event.get("subagentRunId"), event["stepName"]), None)

    def _step_finished(self, run: RunState, event: dict[str, Any]) -> None:
        name = event["stepName"]
        key = _step_key(event.get("subagentRunId"), name)
        opened = run.open[_STEPS.index]
        if key not in opened:
            others = [other for other in opened if _step_of(other)[1] == name]
            if others:
                raise RunFailure(FailureCode.OWNER_MISMATCH,
                                 f"{_describe(_STEPS, key)} is not open; a STEP_FINISHED"
                                 " closes only its own owner's step (open: "
                                 + ", ".join(_describe(_STEPS, other) for other in others)
                                 + ")")
        self._close(run, _STEPS, key, None, None)

    def _subagent_started(self, run: RunState, event: dict[str, Any]) -> None:
        invocation = event["subagentRunId"]
        done = run.subagents_done
        if done is not None and invocation in done:
            # An id names one invocation; the spec asks producers not to reuse one but
            # never asks a consumer to reject the run (rule book section 9).
            del done[invocation]
            self._warn(WarningCode.SUBAGENT_REUSED,
                       f"SUBAGENT_STARTED reuses subagent run {invocation!r}, which already"
                       " ended in this run; it starts a new invocation")
        self._open(run, _SUBAGENTS, invocation, None)

    def _subagent_ended(self, run: RunState, event: dict[str, Any]) -> None:
        invocation = event["subagentRunId"]
        self._close(run, _SUBAGENTS, invocation, None, None)
        if run.subagents_done is None:
            run.subagents_done = {}
        run.subagents_done[invocation] = None

    # --- snapshots and activity ---------------------------------------------------------

    def _messages_snapshot(self, run: RunState, event: dict[str, Any]) -> None:
        restated = history.apply_snapshot(run, event["messages"], self.state.held)
        # It establishes the owner of each message it carries (events/state), except
        # of one still streaming: the lane that opened it streams the rest.
        open_messages = run.open[_REASONING.index].keys() | run.open[_TEXT.index].keys()
        open_calls = run.open[_TOOL_CALLS.index]
        for record in restated:
            owner = record.field("subagentRunId")
            if record.id not in open_messages and record.role != "activity":
                ns = _REASONING if record.role == "reasoning" else _TEXT
                run.owners[ns.index][record.id] = owner
            for call in record.tool_calls or ():
                if call.id not in open_calls:
                    run.owners[_TOOL_CALLS.index][call.id] = owner

    def _activity_snapshot(self, run: RunState, event: dict[str, Any]) -> None:
        """Creates or replaces an activity message (events/activity): a replacing
        snapshot re-mints its owner and takes its content and type, while the
        metadata gathered so far keeps merging; `replace: false` leaves an existing
        one as it stands but for metadata."""
        message_id = event["messageId"]
        previous = run.messages.get(message_id)
        metadata = event.get("metadata")
        held = self.state.held
        if (previous is None and event.get("replace") is False and held is not None
                and held.get(message_id) == "activity"):
            return  # an earlier run's activity, left as it stands
        if previous is not None and previous.role == "activity":
            if metadata is not None:
                previous.metadata = _merged(previous.metadata, metadata)
            if event.get("replace") is False:
                return
            metadata = previous.metadata
        record = MessageRecord(
            message_id, "activity",
            {"activityType": event["activityType"], "content": event["content"]},
        )
        if "subagentRunId" in event:
            record.set_field("subagentRunId", event["subagentRunId"])
        if metadata is not None:
            record.metadata = dict(metadata)
        run.messages[message_id] = record

    def _activity_delta(self, run: RunState, event: dict[str, Any]) -> None:
        message_id = event["messageId"]
        record = run.messages.get(message_id)
        if record is None or record.role != "activity":
            self._warn(WarningCode.ACTIVITY_UNKNOWN_MESSAGE,
                       f"ACTIVITY_DELTA names {message_id!r}, which is no activity message of"
                       " the run; the delta was skipped")
            return
        tag = event.get("subagentRunId")
        owner = record.field("subagentRunId")
        if tag is not None and tag != owner:
            opener = "the parent agent" if owner is None else f"subagent run {owner!r}"
            raise RunFailure(FailureCode.OWNER_MISMATCH,
                             f"activity message {message_id!r} belongs to {opener};"
                             f" subagent run {tag!r} may not amend it")
        patched = apply_patch(record.field("content"), event["patch"])
        if type(patched) is not dict:  # atomic: a delta that does not apply changes nothing
            self._warn(WarningCode.ACTIVITY_PATCH_FAILED,
                       f"ACTIVITY_DELTA for {message_id!r}: the patch does not apply to the"
                       " activity's content (or leaves no object); the activity is unchanged")
            return
        record.set_field("content", patched)
        record.set_field("activityType", event["activityType"])  # a delta may retype it
        if "metadata" in event:
            record.metadata = _merged(record.metadata, event["metadata"])


# --- the rule table ---------------------------------------------------------------------

_Handler = Callable[[KeyEngine, RunState, dict[str, Any]], None]
_OutsideRun = Callable[[KeyEngine, str, dict[str, Any]], None]


def _opens(ns: _Namespace) -> _Handler:
    """The handler of a START that opens an item of `ns` and builds nothing else."""
    def open_item(engine: KeyEngine, run: RunState, event: dict[str, Any]) -> None:
        engine._open(run, ns, event[ns.id_key], event.get("subagentRunId"))
    return open_item


def _closes(ns: _Namespace) -> _Handler:
    """The handler of an END of an item of `ns`."""
    def close_item(engine: KeyEngine, run: RunState, event: dict[str, Any]) -> None:
        engine._close(run, ns, event[ns.id_key], event.get("subagentRunId"),
                      event.get("metadata"))
    return close_item


def _starts(start: Callable[[KeyEngine, RunState, dict[str, Any]],
                            MessageRecord | ToolCallRecord], deltas: str) -> _Handler:
    """The handler of an explicit START of an item: `start`, then the delta memo
    takes the item's `deltas` (CONTENT or ARGS), which usually come next, from the
    first one on.

    The START closed its own lane first, so no pending chunk item stands between
    it and such a delta (a chunk's expansion, which leaves its item pending in
    its lane, sets no memo here).
    """
    def start_item(engine: KeyEngine, run: RunState, event: dict[str, Any]) -> None:
        item = start(engine, run, event)
        slot = (_args_slot(run, item) if isinstance(item, ToolCallRecord)
                else _text_slot(run, item))
        engine._remember(deltas, item.id, event.get("subagentRunId"),
                         engine.content.fragments(slot))
    return start_item


def _continues(ns: _Namespace) -> _Handler:
    """The handler of a CONTENT or ARGS of an item of `ns`."""
    def continue_item(engine: KeyEngine, run: RunState, event: dict[str, Any]) -> None:
        engine._continue(run, ns, event)
    return continue_item


def _chunks(kind: ChunkKind) -> _Handler:
    """The handler of a chunk of `kind`: expanded, then checked (section 6)."""
    def expand(engine: KeyEngine, run: RunState, event: dict[str, Any]) -> None:
        engine._chunk(run, kind, event)
    return expand


def _ignore(engine: KeyEngine, run: RunState, event: dict[str, Any]) -> None:
    """Validated, but builds no history (state, raw and custom events)."""


class _Rule:
    """What one event type does once its schema check has passed."""

    __slots__ = ("event_type", "in_run", "is_clean", "lanes", "model", "outside_run", "quiet",
                 "repeats")

    def __init__(self, event_type: str, in_run: _Handler, lanes: _Lanes,
                 outside_run: _OutsideRun = KeyEngine._stray,
                 deltas: _Namespace | None = None) -> None:
        self.event_type = event_type
        self.model = EVENT_MODELS[event_type]
        self.is_clean: CleanCheck = CLEAN_CHECKS[event_type]
        self.in_run = in_run  # applies it to the active run
        self.lanes = lanes  # the pending chunk items it closes first
        self.outside_run = outside_run  # what it does when no run is active (section 3)
        self.quiet = _QUIET_STEPS[event_type]  # its Step when it decides nothing
        # For a delta to items of `deltas`, the delta memo's checks: by whether
        # the memo has an id and a tag (see `_Repeat`).
        self.repeats = () if deltas is None else tuple(
            _Repeat(self, deltas, has_id, has_tag)
            for has_id in (True, False) for has_tag in (True, False))


class _Repeat:
    """What the delta memo checks a record against, for one rule and one shape of
    memo (with or without an id, with or without a subagentRunId).

    The rule's clean check narrowed to a delta that only appends, with the
    memo's id and tag pinned: an event equal in both, or lacking the one the
    memo lacks, and otherwise clean. It returns the event's delta, None when
    the event is no such repeat (or carries no delta: rare, it takes the rule).
    """

    __slots__ = ("delta_of", "event_type", "quiet")

    def __init__(self, rule: _Rule, deltas: _Namespace, has_id: bool, has_tag: bool) -> None:
        self.event_type = rule.event_type
        self.quiet = rule.quiet
        keys = deltas.delta_keys - {k for k, kept in ((deltas.id_key, has_id),
                                                       ("subagentRunId", has_tag)) if not kept}
        self.delta_of: PinnedCheck = compile_pinned_check(
            rule.model, keys, "type", (deltas.id_key, "subagentRunId"), "delta")


_RULES: Final = {rule.event_type: rule for rule in (
    # Run lifecycle (rule book section 3). A RUN_STARTED inside a run fails
    # before it could close anything.
    _Rule("RUN_STARTED", KeyEngine._run_already_active, _Lanes.KEPT, KeyEngine._start_run),
    _Rule("RUN_FINISHED", KeyEngine._run_finished, _Lanes.ALL),
    _Rule("RUN_ERROR", KeyEngine._run_error, _Lanes.ALL, KeyEngine._run_error_outside_run),
    # Spans, reasoning and text messages, tool calls (sections 4-7). A chunk
    # switches lanes itself as it is expanded.
    _Rule("REASONING_START", _opens(_SPANS), _Lanes.OWN),
    _Rule("REASONING_END", _closes(_SPANS), _Lanes.OWN),
    _Rule("REASONING_MESSAGE_START",
          _starts(KeyEngine._reasoning_start, "REASONING_MESSAGE_CONTENT"),
          _Lanes.OWN),
    _Rule("REASONING_MESSAGE_CONTENT", _continues(_REASONING), _Lanes.OWN, deltas=_REASONING),
    _Rule("REASONING_MESSAGE_END", _closes(_REASONING), _Lanes.OWN),
    _Rule("REASONING_MESSAGE_CHUNK", _chunks(ChunkKind.REASONING), _Lanes.KEPT, deltas=_REASONING),
    _Rule("TEXT_MESSAGE_START", _starts(KeyEngine._text_start, "TEXT_MESSAGE_CONTENT"),
          _Lanes.OWN),
    _Rule("TEXT_MESSAGE_CONTENT", _continues(_TEXT), _Lanes.OWN, deltas=_TEXT),
    _Rule("TEXT_MESSAGE_END", _closes(_TEXT), _Lanes.OWN),
    _Rule("TEXT_MESSAGE_CHUNK", _chunks(ChunkKind.TEXT), _Lanes.KEPT, deltas=_TEXT),
    _Rule("TOOL_CALL_START", _starts(KeyEngine._tool_start, "TOOL_CALL_ARGS"),
          _Lanes.OWN),
    _Rule("TOOL_CALL_ARGS", _continues(_TOOL_CALLS), _Lanes.OWN, deltas=_TOOL_CALLS),
    _Rule("TOOL_CALL_END", _closes(_TOOL_CALLS), _Lanes.OWN),
    _Rule("TOOL_CALL_CHUNK", _chunks(ChunkKind.TOOL), _Lanes.KEPT, deltas=_TOOL_CALLS),
    _Rule("TOOL_CALL_RESULT", KeyEngine._tool_result, _Lanes.OWN),
    # Encrypted values, snapshots, activity (sections 9, 10, 12).
    _Rule("REASONING_ENCRYPTED_VALUE", KeyEngine._encrypted_value, _Lanes.KEPT),
    _Rule("MESSAGES_SNAPSHOT", KeyEngine._messages_snapshot, _Lanes.ALL),
    _Rule("ACTIVITY_SNAPSHOT", KeyEngine._activity_snapshot, _Lanes.KEPT),
    _Rule("ACTIVITY_DELTA", KeyEngine._activity_delta, _Lanes.KEPT),
    # Steps, subagents and the events that build nothing (section 9). A
    # subagent's end is in the lane of the subagent it ends.
    _Rule("STEP_STARTED", KeyEngine._step_started, _Lanes.OWN),
    _Rule("STEP_FINISHED", KeyEngine._step_finished, _Lanes.OWN),
    _Rule("SUBAGENT_STARTED", KeyEngine._subagent_started, _Lanes.KEPT),
    _Rule("SUBAGENT_FINISHED", KeyEngine._subagent_ended, _Lanes.OWN),
    _Rule("SUBAGENT_ERROR", KeyEngine._subagent_ended, _Lanes.OWN),
    _Rule("STATE_SNAPSHOT", _ignore, _Lanes.OWN),
    _Rule("STATE_DELTA", _ignore, _Lanes.OWN),
    _Rule("RAW", _ignore, _Lanes.KEPT),
    _Rule("CUSTOM", _ignore, _Lanes.OWN),
)}
assert _RULES.keys() == EVENT_MODELS.keys()


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
    """Metadata merges key by key, last write wins, no recursion (AG-UI 1.1, basic/metadata)."""
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


# Roles only an agent produces: an input's messages after the last of these are new.
_AGENT_ROLES: Final = frozenset({"assistant", "reasoning", "activity"})
# A message record's origin -> the kind of its history entry.
_ENTRY_KINDS: Final = {BUILT: MESSAGE, FROM_INPUT: INPUT, CONTINUED: CONTINUATION}


def _hold(state: KeyState, message_id: str, role: str,
          tool_calls: list[dict[str, Any]] | None) -> None:
    """The key's index learns a message (and its tool calls) the thread holds."""
    if state.held is None:
        state.held = {}
    state.held[message_id] = role
    if tool_calls:
        if state.held_calls is None:
            state.held_calls = {}
        for call in tool_calls:
            name = call.get("function", {}).get("name")
            if name is not None:  # a continued call's entry names none: it is held already
                state.held_calls[call["id"]] = [message_id, name]


def _bound_index(state: KeyState, cap: int) -> None:
    """The key's index remembers at most `cap` messages: past it, the oldest tenth is
    forgotten at once (with their tool calls), so its size follows the limit and the
    work stays linear. A later run naming a forgotten message names an unknown one."""
    held = state.held
    if held is None or len(held) <= cap:
        return
    keep = list(held)[len(held) - cap + cap // 10:]
    state.held = {message_id: held[message_id] for message_id in keep}
    if state.held_calls:
        state.held_calls = {call: entry for call, entry in state.held_calls.items()
                            if entry[0] in state.held}


def _forget(state: KeyState, message_id: str) -> None:
    """A snapshot removed a message the key's index held, with its tool calls."""
    if state.held is not None:
        state.held.pop(message_id, None)
    if state.held_calls:
        for call_id in [c for c, (host, _name) in state.held_calls.items() if host == message_id]:
            del state.held_calls[call_id]


def _finished_outcome(outcome: dict[str, Any] | None) -> tuple[Outcome, dict[str, Any] | None]:
    """RUN_FINISHED.outcome as the closing record carries it: absent means success."""
    if outcome is None:
        return Outcome.SUCCESS, None
    kind = outcome["type"]
    if kind == "interrupt":
        return Outcome.INTERRUPT, {"interrupts": outcome["interrupts"]}
    if kind == "cancelled":
        return Outcome.CANCELLED, None
    pending = outcome.get("pendingToolCallIds")
    return Outcome.SUCCESS, None if pending is None else {"pendingToolCallIds": pending}


def _named_after_its_call(run: RunState, record: MessageRecord) -> bool:
    """Whether `record` is an assistant message this engine made to hold a tool call
    that came without parentMessageId (named after the call, no text of its own)."""
    return (record.role == "assistant" and record.origin == BUILT
            and run.tool_index.get(record.id) == record.id
            and record.content_base is None and record.content_slot is None)


def _free_id(run: RunState, state: KeyState, wanted: str) -> str:
    """`wanted`, or `wanted/2`, `wanted/3`… : the first no message of the key has."""
    candidate, suffix = wanted, 1
    while candidate in run.messages or (state.held is not None and candidate in state.held):
        suffix += 1
        candidate = f"{wanted}/{suffix}"
    return candidate


_TYPE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def _shown_type(event_type: str) -> str:
    """An unknown event type as a reason names it: quoted when it looks like a type
    name, else not shown (a `type` can be any string; reasons never quote content)."""
    return repr(event_type) if _TYPE_NAME.fullmatch(event_type) else "(not shown)"
