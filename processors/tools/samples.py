"""The bundled sample of agent runs the demo replays: valid ones and broken ones.

Deterministic; each sample is one run key's record values, with a tenant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class Sample:
    key: str  # <threadId>/<runId>
    tenant: str
    description: str
    values: list[bytes]

    @property
    def thread_id(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def run_id(self) -> str:
        return self.key.split("/", 1)[1]

    @property
    def closing_records(self) -> int:
        """How many closing records the run gets: two when a late RUN_ERROR follows its
        RUN_FINISHED (the second turns it into an error), else one."""
        types = [orjson.loads(value).get("type") for value in self.values[-2:]
                 if value.startswith(b"{")]
        return 2 if types == ["RUN_FINISHED", "RUN_ERROR"] else 1

    def encrypted_values(self) -> list[str]:
        """The encrypted reasoning values the run sends, in order."""
        events = [orjson.loads(value) for value in self.values]
        return [e["encryptedValue"] for e in events
                if e.get("type") == "REASONING_ENCRYPTED_VALUE"]


def _run(thread: str, run: str, *events: dict[str, Any],
         asked: list[dict[str, Any]] | None = None,
         outcome: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A run that echoes its input (`asked`: the RunAgentInput's messages) on
    RUN_STARTED, as AG-UI 1.1 lets producers do so that the history holds the user."""
    started: dict[str, Any] = {"type": "RUN_STARTED", "threadId": thread, "runId": run,
                               "protocolVersion": "1.1"}
    if asked is not None:
        started["input"] = {"threadId": thread, "runId": run, "messages": asked}
    finished: dict[str, Any] = {"type": "RUN_FINISHED", "threadId": thread, "runId": run}
    if outcome is not None:
        finished["outcome"] = outcome
    return [started, *events, finished]


def _question(message_id: str, text: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "content": text}


def _reasoning(message_id: str, *deltas: str) -> list[dict[str, Any]]:
    return [
        {"type": "REASONING_MESSAGE_START", "messageId": message_id, "role": "reasoning"},
        *({"type": "REASONING_MESSAGE_CONTENT", "messageId": message_id, "delta": d}
          for d in deltas),
        {"type": "REASONING_MESSAGE_END", "messageId": message_id},
    ]


def _answer(message_id: str, text: str) -> list[dict[str, Any]]:
    return [
        {"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": text},
        {"type": "TEXT_MESSAGE_END", "messageId": message_id},
    ]


def _encrypted(entity: str, value: str, subtype: str = "message") -> dict[str, Any]:
    return {"type": "REASONING_ENCRYPTED_VALUE", "subtype": subtype, "entityId": entity,
            "encryptedValue": value}


def next_turn(first: Sample, asked: list[dict[str, Any]]) -> Sample:
    """The next run of `first`'s thread, as its agent server would send it: a new
    run, started from `asked` (the thread's messages and the user's next question,
    echoed), with its own reasoning (and encrypted value) and answer."""
    run = f"{first.run_id}-turn2"
    events = _run(
        first.thread_id, run,
        *_reasoning(f"r-{run}", "Building on the last answer."),
        _encrypted(f"r-{run}", f"gAAAAB-{run}"),
        *_answer(f"m-{run}", "The next step."),
        asked=asked,
    )
    return Sample(f"{first.thread_id}/{run}", first.tenant, "second turn",
                  [orjson.dumps(e) for e in events])


def _valid_runs(count: int) -> list[Sample]:
    samples = []
    for n in range(count):
        thread, run = f"thread-{n:03d}", f"run-{n:03d}"
        events = _run(
            thread, run,
            {"type": "REASONING_START", "messageId": f"span-{n}"},
            *_reasoning(f"r-{n}", "Let me think ", f"about question {n}."),
            _encrypted(f"r-{n}", f"gAAAAB-sample-{n:03d}"),
            {"type": "REASONING_END", "messageId": f"span-{n}"},
            {"type": "TOOL_CALL_START", "toolCallId": f"tc-{n}", "toolCallName": "search",
             "parentMessageId": f"a-{n}"},
            {"type": "TOOL_CALL_ARGS", "toolCallId": f"tc-{n}", "delta": '{"q":"demo"}'},
            {"type": "TOOL_CALL_END", "toolCallId": f"tc-{n}"},
            {"type": "TOOL_CALL_RESULT", "messageId": f"t-{n}", "toolCallId": f"tc-{n}",
             "content": "3 results"},
            {"type": "REASONING_MESSAGE_CHUNK", "messageId": f"r2-{n}", "delta": "Chunked "},
            {"type": "REASONING_MESSAGE_CHUNK", "delta": "reasoning."},
            *_answer(f"m-{n}", f"Answer {n}."),
            asked=[_question(f"u-{n}", f"What about question {n}?")],
        )
        samples.append(Sample(f"{thread}/{run}", ("acme", "globex")[n % 2],
                              "valid run", [orjson.dumps(e) for e in events]))
    return samples


def _broken_runs() -> list[Sample]:
    thread = "thread-broken"
    broken: list[tuple[str, list[Any]]] = [
        ("orphan reasoning content (message_not_open)", _run(
            thread, "orphan",
            {"type": "REASONING_MESSAGE_CONTENT", "messageId": "ghost", "delta": "?"})),
        ("encrypted value for an unknown message (lost: unknown_entity)", _run(
            thread, "lost-value", *_reasoning("r1", "x"), _encrypted("nobody", "enc-lost"))),
        ("unknown encrypted subtype (lost: unknown_subtype)", _run(
            thread, "subtype", *_reasoning("r1", "x"), _encrypted("r1", "enc-x", "tool-result"))),
        ("reasoning message left open (open_at_finish)", _run(
            thread, "left-open",
            {"type": "REASONING_MESSAGE_START", "messageId": "r1", "role": "reasoning"})),
        ("null metadata (malformed_event)", _run(
            thread, "null", {"type": "REASONING_START", "messageId": "s1", "metadata": None})),
        ("a newer producer's material (warnings, run finishes)", _run(
            thread, "newer", {"type": "FUTURE_EVENT", "x": 1},
            {"type": "REASONING_START", "messageId": "s1", "futureField": True},
            {"type": "REASONING_END", "messageId": "s1"})),
        ("a run failed while holding a value (lost: run_failed)", [
            *_run(thread, "held", *_reasoning("r1", "x"), _encrypted("r1", "enc-held"))[:-1],
            {"type": "REASONING_END", "messageId": "never-opened"}]),
        ("an undecodable record (undecodable_record)", [
            {"type": "RUN_STARTED", "threadId": thread, "runId": "bytes"}, b"\xff not json"]),
        ("a run the user stopped (outcome cancelled)", _run(
            thread, "stopped", *_answer("m1", "Half an ans"), outcome={"type": "cancelled"})),
        ("a run that failed after it finished (late RUN_ERROR)", [
            *_run(thread, "late", *_answer("m1", "Done.")),
            {"type": "RUN_ERROR", "message": "the transport failed while flushing"}]),
        ("a 0.x producer's THINKING_* events (retired shapes, translated)", _run(
            thread, "thinking", {"type": "THINKING_TEXT_MESSAGE_START"},
            {"type": "THINKING_TEXT_MESSAGE_CONTENT", "delta": "Old-style thinking."},
            {"type": "THINKING_TEXT_MESSAGE_END"})),
    ]
    return [
        Sample(f"{thread}/{n}", "acme", description,
               [e if isinstance(e, bytes) else orjson.dumps(e) for e in events])
        for n, (description, events) in enumerate(broken)
    ]


def sample_runs(valid: int = 40) -> list[Sample]:
    return [*_valid_runs(valid), *_broken_runs()]
