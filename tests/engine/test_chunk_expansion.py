"""Chunks decide exactly as their explicit START/CONTENT/END expansion (hypothesis).

The rule book expands every `*_CHUNK` before any check. `expand` below is
that expansion written out on its own, lane by lane, with no engine code:
a generated multi-lane chunk stream and its expansion must give the same
first failure (code and source line) or, when there is none, the same
messages and warnings.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine_helpers import play

LANES = [None, "A", "B"]
KINDS = ["reasoning", "text", "tool"]
IDS = ["a", "b", "c"]
ID_KEY = {"reasoning": "messageId", "text": "messageId", "tool": "toolCallId"}
TYPES = {
    "reasoning": ("REASONING_MESSAGE_START", "REASONING_MESSAGE_CONTENT",
                  "REASONING_MESSAGE_END", "REASONING_MESSAGE_CHUNK"),
    "text": ("TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
             "TEXT_MESSAGE_CHUNK"),
    "tool": ("TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_CHUNK"),
}
CHUNK_KIND = {types[3]: kind for kind, types in TYPES.items()}
KEEPS_CHUNK_OPEN = {"RAW"}
CLOSES_ALL_LANES = {"RUN_STARTED", "RUN_FINISHED", "RUN_ERROR"}


def _tagged(event: dict[str, Any], tag: str | None) -> dict[str, Any]:
    return event if tag is None else {**event, "subagentRunId": tag}


def start(kind: str, item: str, tag: str | None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": TYPES[kind][0], ID_KEY[kind]: item}
    if kind == "reasoning":
        event["role"] = "reasoning"
    elif kind == "tool":
        event["toolCallName"] = "lookup"
    return _tagged(event, tag)


def content(kind: str, item: str, delta: str, tag: str | None) -> dict[str, Any]:
    return _tagged({"type": TYPES[kind][1], ID_KEY[kind]: item, "delta": delta}, tag)


def end(kind: str, item: str, tag: str | None) -> dict[str, Any]:
    return _tagged({"type": TYPES[kind][2], ID_KEY[kind]: item}, tag)


def chunk(kind: str, item: str | None, delta: str | None, tag: str | None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": TYPES[kind][3]}
    if item is not None:
        event[ID_KEY[kind]] = item
        if kind == "tool":
            event["toolCallName"] = "lookup"
    if delta is not None:
        event["delta"] = delta
    return _tagged(event, tag)


class ExpansionFailed(Exception):
    def __init__(self, line: int, code: str) -> None:
        super().__init__(line, code)
        self.line, self.code = line, code


def expand(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[int],
                                                   tuple[int, str] | None]:
    """The explicit events, the source line of each, and where expansion itself
    failed (it stops there)."""
    lanes: dict[str | None, tuple[str, str]] = {}
    out: list[dict[str, Any]] = []
    lines: list[int] = []
    for line, event in enumerate(events, start=1):
        emitted: list[dict[str, Any]] = []
        kind = CHUNK_KIND.get(event["type"])
        tag = event.get("subagentRunId")
        if kind is not None:
            item = event.get(ID_KEY[kind])
            delta = event.get("delta")
            if item is not None and (kind, item) in lanes.values():
                # an id names one item, whatever the lane (rule book section 9)
                emitted.append(content(kind, item, delta or "", tag))
            elif item is not None:
                if tag in lanes:
                    emitted.append(end(*lanes.pop(tag), tag))
                emitted.append(start(kind, item, tag))
                if delta is not None:
                    emitted.append(content(kind, item, delta, tag))
                lanes[tag] = (kind, item)
            else:
                try:
                    target = _continued_item(lanes, kind, tag, line)
                except ExpansionFailed as failed:
                    return out, lines, (failed.line, failed.code)
                emitted.append(content(kind, target, delta or "", tag))
        elif event["type"] in CLOSES_ALL_LANES:
            emitted += [end(k, i, lane) for lane, (k, i) in lanes.items()]
            lanes.clear()
            emitted.append(event)
        elif event["type"] in KEEPS_CHUNK_OPEN:
            emitted.append(event)
        else:
            if tag in lanes:
                emitted.append(end(*lanes.pop(tag), tag))
            emitted.append(event)
        out += emitted
        lines += [line] * len(emitted)
    return out, lines, None


def _continued_item(lanes: dict[str | None, tuple[str, str]], kind: str, tag: str | None,
                    line: int) -> str:
    if tag is not None:
        pending = lanes.get(tag)
        if pending is None or pending[0] != kind:
            raise ExpansionFailed(line, "chunk_without_id")
        return pending[1]
    pending = lanes.get(None)
    if pending is not None and pending[0] == kind:
        return pending[1]
    candidates = [item for k, item in lanes.values() if k == kind]
    if len(candidates) > 1:
        raise ExpansionFailed(line, "chunk_ambiguous")
    if not candidates:
        raise ExpansionFailed(line, "chunk_without_id")
    return candidates[0]


@st.composite
def chunk_streams(draw: st.DrawFn) -> list[dict[str, Any]]:
    body: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(KINDS))
        tag = draw(st.sampled_from(LANES))
        item = draw(st.sampled_from(IDS))
        choice = draw(st.sampled_from(["chunk", "chunk", "chunk", "idless", "start", "end",
                                       "custom", "raw"]))
        if choice == "chunk":
            body.append(chunk(kind, item, draw(st.none() | st.sampled_from(["", "x", "yz"])),
                              tag))
        elif choice == "idless":
            body.append(chunk(kind, None, draw(st.none() | st.sampled_from(["", "p", "q"])),
                              tag))
        elif choice == "start":
            body.append(start(kind, item, tag))
        elif choice == "end":
            body.append(end(kind, item, tag))
        elif choice == "custom":
            body.append(_tagged({"type": "CUSTOM", "name": "n", "value": 1}, tag))
        else:
            body.append(_tagged({"type": "RAW", "event": {}}, tag))
    return [{"type": "RUN_STARTED", "threadId": "t", "runId": "r"}, *body,
            {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}]


@settings(deadline=None, max_examples=400)
@given(chunk_streams())
def test_chunk_streams_decide_as_their_explicit_expansion(events: list[dict[str, Any]]) -> None:
    chunked = play(*events)
    explicit_events, source_lines, expansion_failure = expand(events)
    explicit = play(*explicit_events)
    explicit_failures = [(source_lines[line - 1], code) for line, code in explicit.failures]
    expected_failure = (explicit_failures[:1] or
                        ([expansion_failure] if expansion_failure else []))
    assert chunked.failures[:1] == expected_failure
    if not expected_failure:
        assert chunked.concluded[0].messages == explicit.concluded[0].messages
        assert chunked.warning_codes == explicit.warning_codes
