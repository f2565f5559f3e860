"""Small builders and a replay helper shared by the engine tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from ag_ui.core import Message
from pydantic import TypeAdapter

from processors.engine.decisions import (
    Concluded,
    Decision,
    Discarded,
    EncryptedLost,
    Failed,
    Step,
    Warned,
)
from processors.engine.engine import KeyEngine

MESSAGE = TypeAdapter(Message)


# --- event builders ---------------------------------------------------------------


def _ev(type_: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": type_, **fields}


def run_started(run: str = "r1", thread: str = "t1", **kw: Any) -> dict[str, Any]:
    return _ev("RUN_STARTED", {"threadId": thread, "runId": run, **kw})


def run_finished(run: str = "r1", thread: str = "t1", **kw: Any) -> dict[str, Any]:
    return _ev("RUN_FINISHED", {"threadId": thread, "runId": run, **kw})


def run_error(message: str = "boom", **kw: Any) -> dict[str, Any]:
    return _ev("RUN_ERROR", {"message": message, **kw})


def span_start(mid: str, **kw: Any) -> dict[str, Any]:
    return _ev("REASONING_START", {"messageId": mid, **kw})


def span_end(mid: str, **kw: Any) -> dict[str, Any]:
    return _ev("REASONING_END", {"messageId": mid, **kw})


def r_start(mid: str, **kw: Any) -> dict[str, Any]:
    return _ev("REASONING_MESSAGE_START", {"messageId": mid, "role": "reasoning", **kw})


def r_content(mid: str, delta: str, **kw: Any) -> dict[str, Any]:
    return _ev("REASONING_MESSAGE_CONTENT", {"messageId": mid, "delta": delta, **kw})


def r_end(mid: str, **kw: Any) -> dict[str, Any]:
    return _ev("REASONING_MESSAGE_END", {"messageId": mid, **kw})


def r_chunk(**kw: Any) -> dict[str, Any]:
    return _ev("REASONING_MESSAGE_CHUNK", kw)


def t_start(mid: str, **kw: Any) -> dict[str, Any]:
    return _ev("TEXT_MESSAGE_START", {"messageId": mid, **kw})


def t_content(mid: str, delta: str, **kw: Any) -> dict[str, Any]:
    return _ev("TEXT_MESSAGE_CONTENT", {"messageId": mid, "delta": delta, **kw})


def t_end(mid: str, **kw: Any) -> dict[str, Any]:
    return _ev("TEXT_MESSAGE_END", {"messageId": mid, **kw})


def t_chunk(**kw: Any) -> dict[str, Any]:
    return _ev("TEXT_MESSAGE_CHUNK", kw)


def tc_start(cid: str, name: str = "lookup", **kw: Any) -> dict[str, Any]:
    return _ev("TOOL_CALL_START", {"toolCallId": cid, "toolCallName": name, **kw})


def tc_args(cid: str, delta: str, **kw: Any) -> dict[str, Any]:
    return _ev("TOOL_CALL_ARGS", {"toolCallId": cid, "delta": delta, **kw})


def tc_end(cid: str, **kw: Any) -> dict[str, Any]:
    return _ev("TOOL_CALL_END", {"toolCallId": cid, **kw})


def tc_chunk(**kw: Any) -> dict[str, Any]:
    return _ev("TOOL_CALL_CHUNK", kw)


def tc_result(mid: str, cid: str, content: Any = "ok", **kw: Any) -> dict[str, Any]:
    return _ev("TOOL_CALL_RESULT", {"messageId": mid, "toolCallId": cid, "content": content,
                                    **kw})


def enc(entity: str, value: str, subtype: Any = "message", **kw: Any) -> dict[str, Any]:
    return _ev("REASONING_ENCRYPTED_VALUE",
               {"subtype": subtype, "entityId": entity, "encryptedValue": value, **kw})


def snapshot(*messages: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return _ev("MESSAGES_SNAPSHOT", {"messages": list(messages), **kw})


def custom(**kw: Any) -> dict[str, Any]:
    return _ev("CUSTOM", {"name": "c", "value": 1, **kw})


def raw_event(**kw: Any) -> dict[str, Any]:
    return _ev("RAW", {"event": {"x": 1}, **kw})


def act_snap(mid: str, content: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return _ev("ACTIVITY_SNAPSHOT",
               {"messageId": mid, "activityType": "plan", "content": content, **kw})


def act_delta(mid: str, patch: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return _ev("ACTIVITY_DELTA", {"messageId": mid, "activityType": "plan", "patch": patch, **kw})


def step_started(name: str, **kw: Any) -> dict[str, Any]:
    return _ev("STEP_STARTED", {"stepName": name, **kw})


def step_finished(name: str, **kw: Any) -> dict[str, Any]:
    return _ev("STEP_FINISHED", {"stepName": name, **kw})


def sub_started(sid: str, **kw: Any) -> dict[str, Any]:
    return _ev("SUBAGENT_STARTED", {"subagentRunId": sid, "name": "helper", **kw})


def sub_finished(sid: str, **kw: Any) -> dict[str, Any]:
    return _ev("SUBAGENT_FINISHED", {"subagentRunId": sid, **kw})


def sub_error(sid: str, **kw: Any) -> dict[str, Any]:
    return _ev("SUBAGENT_ERROR", {"subagentRunId": sid, "message": "x", **kw})


def reasoning(mid: str, *deltas: str, **kw: Any) -> list[dict[str, Any]]:
    """A whole reasoning message: START, a CONTENT per delta, END."""
    return [r_start(mid, **kw), *(r_content(mid, d) for d in deltas), r_end(mid)]


def text(mid: str, *deltas: str, **kw: Any) -> list[dict[str, Any]]:
    """A whole text message: START, a CONTENT per delta, END."""
    return [t_start(mid, **kw), *(t_content(mid, d) for d in deltas), t_end(mid)]


def in_run(*events: dict[str, Any] | bytes, run: str = "r1") -> list[dict[str, Any] | bytes]:
    return [run_started(run), *events, run_finished(run)]


# --- replay -------------------------------------------------------------------------


def encode(event: dict[str, Any] | bytes) -> bytes:
    return event if isinstance(event, bytes) else orjson.dumps(event)


@dataclass
class Replay:
    """The decisions of a replay, each with its 1-based line."""

    engine: KeyEngine
    steps: list[Step] = field(default_factory=list)

    def entries(self) -> list[tuple[int, Decision]]:
        return [(line, d) for line, step in enumerate(self.steps, 1) for d in step.decisions]

    @property
    def failures(self) -> list[tuple[int, str]]:
        return [(line, d.code.value) for line, d in self.entries() if isinstance(d, Failed)]

    @property
    def failure_codes(self) -> list[str]:
        return [code for _, code in self.failures]

    @property
    def warnings(self) -> list[tuple[int, str]]:
        return [(line, d.code.value) for line, d in self.entries() if isinstance(d, Warned)]

    @property
    def warning_codes(self) -> list[str]:
        return [code for _, code in self.warnings]

    @property
    def losses(self) -> list[tuple[int, str]]:
        return [(line, d.reason.value) for line, d in self.entries()
                if isinstance(d, EncryptedLost)]

    @property
    def loss_reasons(self) -> list[str]:
        return [reason for _, reason in self.losses]

    @property
    def concluded(self) -> list[Concluded]:
        return [d for _, d in self.entries() if isinstance(d, Concluded)]

    @property
    def discarded(self) -> int:
        return sum(1 for _, d in self.entries() if isinstance(d, Discarded))

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The messages of the last concluded run."""
        assert self.concluded, f"no run concluded: {self.entries()}"
        return self.concluded[-1].messages

    @property
    def reasons(self) -> list[str]:
        return [d.reason for _, d in self.entries() if isinstance(d, Warned | Failed)]

    def by_id(self) -> dict[str, dict[str, Any]]:
        return {m["id"]: m for m in self.messages}

    def feed(self, *events: dict[str, Any] | bytes) -> Replay:
        for event in events:
            self.steps.append(self.engine.feed(encode(event)))
        return self


def play(*events: dict[str, Any] | bytes, engine: KeyEngine | None = None) -> Replay:
    return Replay(engine if engine is not None else KeyEngine()).feed(*events)


def play_run(*events: dict[str, Any] | bytes) -> Replay:
    return play(*in_run(*events))


def finished_clean(replay: Replay) -> list[dict[str, Any]]:
    """Assert the (last) run finished with no failure and no warning; its messages."""
    assert replay.failures == [], replay.entries()
    assert replay.warnings == [], replay.entries()
    assert replay.losses == [], replay.entries()
    assert replay.concluded and replay.concluded[-1].outcome.value == "success"
    for message in replay.messages:
        MESSAGE.validate_python(message)
    return replay.messages
