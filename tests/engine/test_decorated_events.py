"""Events as agent servers send them decide exactly as bare ones (issue 11).

Servers add optional fields the rules never act on: a `timestamp` on every
event, the provider's raw chunk as `rawEvent` on some. The engine takes one
path for every record, so these properties check that:

* decorating a key's events changes no decision: the same failures with the
  same codes and reasons at the same lines, the same warnings and losses, the
  same history messages (the rule book copies neither field into a message);
* the compiled clean check admits only events the full schema walk returns
  untouched, and admits every flat event however it is decorated;
* the delta memo decides exactly as the handlers it stands in for.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.engine.content import InMemoryContentStore
from processors.engine.decisions import Step
from processors.engine.engine import KeyEngine
from processors.engine.state import KeyState
from tests.engine.test_properties import JSON, SETTINGS, Key, feed_all, typed_junk, valid_keys
from tests.engine_helpers import encode
from topics.events import (
    CLEAN_CHECKS,
    EVENT_MODELS,
    MAX_SAFE_INTEGER,
    Findings,
    Malformed,
    check_model,
)

# Integral floats are valid timestamps too; they take the full walk.
TIMESTAMPS = st.one_of(
    st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER),
    st.integers(-(2**40), 2**40).map(float),
)


@st.composite
def decorations(draw: Any, count: int) -> list[dict[str, Any]]:
    """For each of `count` events: a timestamp, and on some a rawEvent (any JSON
    but a whole null, a retired shape that warns)."""
    out = []
    for _ in range(count):
        decoration: dict[str, Any] = {"timestamp": draw(TIMESTAMPS)}
        if draw(st.integers(0, 3)) == 0:
            decoration["rawEvent"] = draw(JSON.filter(lambda value: value is not None))
        out.append(decoration)
    return out


def decorate(events: list[Any], extra: list[dict[str, Any]]) -> list[Any]:
    """Each event object with its decoration added after its own keys."""
    return [{**event, **more} if type(event) is dict else event
            for event, more in zip(events, extra, strict=True)]


# Junk keys start inside a run, with items of every kind open and pending in lanes.
PRIMED = [
    {"type": "RUN_STARTED", "threadId": "t1", "runId": "r1"},
    {"type": "REASONING_MESSAGE_START", "messageId": "a", "role": "reasoning"},
    {"type": "TEXT_MESSAGE_CHUNK", "messageId": "b", "delta": "x", "subagentRunId": "A"},
    {"type": "TOOL_CALL_CHUNK", "toolCallId": "c1", "toolCallName": "f"},
    {"type": "TOOL_CALL_START", "toolCallId": "m1", "toolCallName": "f", "subagentRunId": "B"},
]


# =====================================================================================
# Decorated streams decide as bare ones
# =====================================================================================


@SETTINGS
@given(valid_keys(max_runs=2), st.data())
def test_decorated_valid_keys_decide_as_bare(key: Key, data: st.DataObject) -> None:
    decorated = decorate(key.events, data.draw(decorations(len(key.events))))
    assert feed_all(decorated) == feed_all(key.events)


@settings(SETTINGS, max_examples=200)
@given(st.lists(typed_junk(), max_size=12), st.data())
def test_decorated_junk_decides_as_bare(events: list[dict[str, Any]], data: st.DataObject
                                        ) -> None:
    """Failures, warnings and their reasons too: junk replaces nothing it decorates."""
    events = [*PRIMED, *(e for e in events if "timestamp" not in e and "rawEvent" not in e)]
    decorated = decorate(events, data.draw(decorations(len(events))))
    assert feed_all(decorated) == feed_all(events)


@SETTINGS
@given(valid_keys(max_runs=2), st.data())
def test_decorated_mutated_keys_decide_as_bare(key: Key, data: st.DataObject) -> None:
    """A run broken somewhere (a record repeated, dropped or junk inserted) fails the
    same way decorated or not."""
    events = list(key.events)
    index = data.draw(st.integers(0, len(events) - 1))
    mutation = data.draw(st.sampled_from(["repeat", "drop", "insert"]))
    if mutation == "repeat":
        events.insert(index, events[index])
    elif mutation == "drop":
        del events[index]
    else:
        junk = data.draw(typed_junk())
        junk.pop("timestamp", None)
        junk.pop("rawEvent", None)
        events.insert(index, junk)
    decorated = decorate(events, data.draw(decorations(len(events))))
    assert feed_all(decorated) == feed_all(events)


# =====================================================================================
# The clean check
# =====================================================================================


def _walk_leaves_untouched(event: dict[str, Any]) -> bool:
    findings = Findings()
    before = copy.deepcopy(event)
    try:
        checked = check_model(EVENT_MODELS[event["type"]], event, "", findings)
    except Malformed:
        return False
    return (checked is event and event == before and not findings.unknown_fields
            and not findings.unknown_members and not findings.unknown_subtype
            and not findings.retired_shapes)


@settings(SETTINGS, max_examples=500)
@given(typed_junk(), st.data())
def test_clean_check_admits_only_what_the_walk_leaves_untouched(
    event: dict[str, Any], data: st.DataObject
) -> None:
    if type(event["type"]) is not str or event["type"] not in EVENT_MODELS:
        return  # junk may overwrite its own type
    if data.draw(st.booleans()):
        event = decorate([event], data.draw(decorations(1)))[0]
    if CLEAN_CHECKS[event["type"]](event):
        assert _walk_leaves_untouched(event)


# Events whose generated shape always holds a structure only the walk can judge.
NESTED = frozenset({"MESSAGES_SNAPSHOT", "ACTIVITY_DELTA"})


@SETTINGS
@given(valid_keys(max_runs=2), st.data())
def test_flat_events_are_clean_however_decorated(key: Key, data: st.DataObject) -> None:
    """A timestamp (an integer) or rawEvent never sends an event down the walk."""
    extra = data.draw(decorations(len(key.events)))
    for decoration in extra:
        decoration["timestamp"] = int(decoration["timestamp"])
    for event in decorate(key.events, extra):
        assert CLEAN_CHECKS[event["type"]](event) is (event["type"] not in NESTED), event["type"]


# Values a flat field may take: clean ones for some field or other, and unclean ones
# (a float that is no integer, an integer past 2^53, a boolean, null, ...).
FLAT_VALUES = ["x", "reasoning", "assistant", "tool", "message", "function", 0, -7,
               1_700_000_000_000, -(2**53), 2**53, 1.5, True, None, {}, {"k": 1}, [],
               [{"model": "m", "inputTokens": 1}], [{"inputTokens": -1}], ["x"]]


def clean_as_specified(event: dict[str, Any]) -> bool:
    """What the compiled clean check computes, spelt out field by field: no key
    outside the model, every required field present, every value (but the type's)
    one its field's `clean` predicate accepts."""
    fields = EVENT_MODELS[event["type"]].fields
    return (all(key in fields for key in event)
            and all(name in event for name, spec in fields.items() if spec.required)
            and all(key == "type" or (fields[key].clean is not None and fields[key].clean(value))
                    for key, value in event.items()))


@st.composite
def flat_events(draw: Any) -> dict[str, Any]:
    """An event of any type with each of its fields absent, clean or any flat value,
    and sometimes a key of no field."""
    event_type = draw(st.sampled_from(sorted(EVENT_MODELS)))
    event: dict[str, Any] = {"type": event_type}
    for name, spec in EVENT_MODELS[event_type].fields.items():
        if name == "type":
            continue
        choice = draw(st.sampled_from(["absent", "clean", "clean", "any"]))
        clean = [v for v in FLAT_VALUES if spec.clean is not None and spec.clean(v)]
        if choice == "clean" and clean:
            event[name] = draw(st.sampled_from(clean))
        elif choice != "absent":
            event[name] = draw(st.sampled_from(FLAT_VALUES))
    if draw(st.integers(0, 4)) == 0:
        event[draw(st.sampled_from(["extra", "Timestamp", "delta2"]))] = draw(
            st.sampled_from(FLAT_VALUES))
    return dict(draw(st.permutations(list(event.items()))))


@settings(SETTINGS, max_examples=2000)
@given(flat_events())
def test_clean_check_counts_keys_as_specified(event: dict[str, Any]) -> None:
    """The compiled count (its early exit when the usual fields account for every
    key, its count of the rarely sent ones otherwise) decides as the spelt-out rule."""
    assert CLEAN_CHECKS[event["type"]](event) == clean_as_specified(event), event


# =====================================================================================
# The delta memo decides as the handlers
# =====================================================================================


def feed_without_memo(events: list[Any]) -> tuple[list[Step], bytes]:
    """Each record through an engine freshly restored from the state: no memo, ever."""
    content = InMemoryContentStore()
    state = KeyState()
    steps = []
    for event in events:
        engine = KeyEngine(KeyState.from_json(state.to_json()), content)
        steps.append(engine.feed(encode(event)))
        state = engine.state
    return steps, state.to_json()


def feed_with_memo(events: list[Any]) -> tuple[list[Step], bytes]:
    engine = KeyEngine()
    return feed_all(events, engine), engine.state.to_json()


def _id_key(event: dict[str, Any]) -> str:
    """The id field of a delta's item (junk may carry a type that is no string)."""
    event_type = event["type"]
    return ("toolCallId" if type(event_type) is str and event_type.startswith("TOOL")
            else "messageId")


@st.composite
def repeated_deltas(draw: Any, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Some deltas repeated, as they are or changed in one key the memo looks at."""
    out = []
    for event in events:
        out.append(event)
        if "delta" not in event or not draw(st.booleans()):
            continue
        for _ in range(draw(st.integers(1, 3))):
            change = draw(st.sampled_from(
                ["same", "delta", "metadata", "tag", "untag", "id", "null id", "role", "name",
                 "toolCallName", "no delta", "bad timestamp", "float timestamp", "unknown key"]))
            repeat = dict(event, delta=draw(st.text(max_size=3)))
            if change == "same":
                repeat = dict(event)
            elif change == "metadata":
                repeat["metadata"] = {"k": 1}
            elif change == "tag":
                repeat["subagentRunId"] = draw(st.sampled_from(["A", "B"]))
            elif change == "untag":
                repeat.pop("subagentRunId", None)
            elif change == "id":
                repeat[_id_key(event)] = draw(st.sampled_from(["a", "b", "c1", "m1", "orphan"]))
            elif change == "null id":
                repeat[_id_key(event)] = None
            elif change in ("role", "name", "toolCallName"):
                repeat[change] = draw(st.sampled_from(["user", "assistant", "f", "g"]))
            elif change == "no delta":
                del repeat["delta"]
            elif change == "bad timestamp":
                repeat["timestamp"] = draw(st.sampled_from([2**53, 1.5, "1", None, True]))
            elif change == "float timestamp":
                repeat["timestamp"] = 1700000000000.0
            elif change == "unknown key":
                repeat["extra"] = 1
            out.append(repeat)
    return out


@SETTINGS
@given(valid_keys(max_runs=2), st.data())
def test_memo_decides_as_handlers_valid(key: Key, data: st.DataObject) -> None:
    events = decorate(key.events, data.draw(decorations(len(key.events))))
    events = data.draw(repeated_deltas(events))
    assert feed_with_memo(events) == feed_without_memo(events)


@settings(SETTINGS, max_examples=200)
@given(st.lists(typed_junk(), max_size=12), st.data())
def test_memo_decides_as_handlers_junk(events: list[dict[str, Any]], data: st.DataObject
                                       ) -> None:
    events = data.draw(repeated_deltas([*PRIMED, *events]))
    assert feed_with_memo(events) == feed_without_memo(events)


# Starts, deltas, ends and chunks of a few items of one kind, in any order: the
# delta memo meets STARTs (which set it for the item's first delta), chunks that
# leave their item pending in a lane (which an explicit delta closes first),
# reopened ids and owners that disagree.
ITEM_EVENTS = {
    "REASONING_MESSAGE": ("messageId", "CONTENT", {"role": "reasoning"}),
    "TEXT_MESSAGE": ("messageId", "CONTENT", {}),
    "TOOL_CALL": ("toolCallId", "ARGS", {"toolCallName": "f"}),
}


@st.composite
def item_events(draw: Any) -> list[dict[str, Any]]:
    family = draw(st.sampled_from(sorted(ITEM_EVENTS)))
    id_key, delta_suffix, start_fields = ITEM_EVENTS[family]
    events: list[dict[str, Any]] = [{"type": "RUN_STARTED", "threadId": "t", "runId": "r"}]
    for _ in range(draw(st.integers(1, 10))):
        step = draw(st.sampled_from(["START", "DELTA", "DELTA", "END", "CHUNK", "CHUNK"]))
        bare_chunk = step == "CHUNK" and draw(st.booleans())  # an id, no delta
        event: dict[str, Any] = {"type": f"{family}_{delta_suffix if step == 'DELTA' else step}"}
        if step == "START" or (step == "CHUNK" and family == "TOOL_CALL" and draw(st.booleans())):
            event.update(start_fields)
        if step != "CHUNK" or bare_chunk or draw(st.booleans()):
            event[id_key] = draw(st.sampled_from(["a", "a", "b"]))
        if step == "DELTA" or (step == "CHUNK" and not bare_chunk and draw(st.booleans())):
            event["delta"] = draw(st.sampled_from(["x", "", "{}"]))
        tag = draw(st.sampled_from([None, None, None, "A"]))
        if tag is not None:
            event["subagentRunId"] = tag
        events.append(event)
    return events


@settings(SETTINGS, max_examples=400)
@given(item_events(), st.data())
def test_memo_decides_as_handlers_around_starts_and_chunks(
    events: list[dict[str, Any]], data: st.DataObject
) -> None:
    events = data.draw(repeated_deltas(events))
    assert feed_with_memo(events) == feed_without_memo(events)


def _item(family: str, step: str, item_id: str | None = "a", tag: str | None = None,
          delta: str | None = None) -> dict[str, Any]:
    id_key, delta_suffix, start_fields = ITEM_EVENTS[family]
    event: dict[str, Any] = {"type": f"{family}_{delta_suffix if step == 'DELTA' else step}"}
    if step == "START":
        event.update(start_fields)
    if item_id is not None:
        event[id_key] = item_id
    if delta is not None:
        event["delta"] = delta
    if tag is not None:
        event["subagentRunId"] = tag
    return event


@pytest.mark.parametrize("family", sorted(ITEM_EVENTS))
@pytest.mark.parametrize("steps", [
    # A START sets the memo for its item's deltas: the first one on takes it.
    [("START", None, None), ("DELTA", None, "x"), ("DELTA", None, "y")],
    [("START", "A", None), ("DELTA", "A", "x"), ("DELTA", None, "y"), ("DELTA", "A", "z")],
    [("START", "A", None), ("DELTA", "B", "x")],  # owner mismatch
    [("START", None, None), ("END", None, None), ("START", "A", None), ("DELTA", "A", "x")],
    # An opening chunk expands to a START, but leaves its item pending in its lane:
    # an explicit delta closes the lane first (and then finds the item closed).
    [("CHUNK", None, None), ("DELTA", None, "x")],
    [("CHUNK", "A", None), ("DELTA", "A", "x")],
    [("CHUNK", "A", None), ("DELTA", None, "x")],
])
def test_memo_after_starts_decides_as_handlers(
    family: str, steps: list[tuple[str, str | None, str | None]]
) -> None:
    events = [{"type": "RUN_STARTED", "threadId": "t", "runId": "r"},
              *(_item(family, step, "a", tag, delta) for step, tag, delta in steps)]
    if family == "TOOL_CALL":
        for event in events:
            if event["type"] == "TOOL_CALL_CHUNK":
                event["toolCallName"] = "f"
    assert feed_with_memo(events) == feed_without_memo(events)
