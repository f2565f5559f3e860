"""Which run each event of a response belongs to, and what is published for it.

A `ResponseTap` follows one proxied response: the SSE framer gives it events,
and it returns the records to publish to the raw topic (key = `threadId/runId`,
docs/topics.md) with what happened to each run. The decisions (docs/tap.md):

* **Run key.** A `RUN_STARTED` with string `threadId` and `runId` opens the run
  `threadId/runId`; events up to the next `RUN_STARTED` belong to it (reasoning
  events carry no run id). Events before any `RUN_STARTED` (a `RUN_ERROR` of a
  run that failed before it began) take the request's ids; without them they
  are not published (unattributed).
* **Echo.** The requested run's `RUN_STARTED` (the request's ids) without
  `input` is published with the request's input spliced in (`EchoMode`), so the
  history gets the user's messages; the original bytes are otherwise kept. An
  echo that would make the event larger than the bound is left out.
* **Whole runs or say so.** Every record takes room in a shared `Budget` until
  Kafka has it. A run that finds no room, an event larger than the bound, or a
  record Kafka refused drops the run's publication from there on; if some of
  the run was already handed out, a `RUN_ERROR` (code `tap_publication_dropped`)
  follows it, so the history never holds half a run without saying so.
* **Cut runs.** A run the stream leaves without its terminal event (the
  upstream closed or broke, the client left, another `RUN_STARTED` came) gets a
  `RUN_ERROR` saying so: the transport reports what it could not reach, and
  never synthesizes `RUN_FINISHED` (AG-UI 1.1, basic/transports, *Truncation*).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

import orjson

from processors.tap.sse import Event, Frame, SseFramer


class EchoMode(StrEnum):
    MESSAGES = "messages"  # threadId, runId and messages: what the history keeps
    INPUT = "input"  # the whole RunAgentInput (tools, context, state too)


class DropReason(StrEnum):
    BUFFER_FULL = "buffer_full"
    EVENT_TOO_LARGE = "event_too_large"
    PUBLISH_FAILED = "publish_failed"


class Fate(StrEnum):
    FINISHED = "finished"  # the upstream's own terminal event was published
    TRUNCATED = "truncated"  # the upstream's stream left the run without one
    CLIENT_GONE = "client_gone"  # the client left before the run's terminal event
    DROPPED = "dropped"  # its publication was dropped (DropReason)


class Cut(StrEnum):
    """How a response ended, for a run still open then."""

    UPSTREAM_CLOSED = "upstream_closed"
    UPSTREAM_FAILED = "upstream_failed"
    CLIENT_GONE = "client_gone"


TERMINAL_TYPES: Final = frozenset({"RUN_FINISHED", "RUN_ERROR"})
CODE_DROPPED: Final = "tap_publication_dropped"
CODE_TRUNCATED: Final = "tap_upstream_truncated"
CODE_CLIENT_GONE: Final = "tap_client_disconnected"
CODE_INTERRUPTED: Final = "tap_interrupted"
_INTERRUPTED_MESSAGE: Final = ("the tap stopped before this run's terminal event (it crashed or"
                               " was killed); what it had handed to Kafka was published")

# The tap's RUN_ERRORs name no id and quote nothing of the run.
_DROP_MESSAGES: Final = {
    DropReason.BUFFER_FULL: "the tap dropped the rest of this run: its buffer toward Kafka"
                            " was full",
    DropReason.EVENT_TOO_LARGE: "the tap dropped the rest of this run: an event was larger"
                                " than AGUI_TAP_MAX_EVENT_BYTES",
    DropReason.PUBLISH_FAILED: "the tap dropped the rest of this run: Kafka did not take one"
                               " of its events",
}
_CUT_MESSAGES: Final = {
    Cut.UPSTREAM_CLOSED: (CODE_TRUNCATED, "the agent's stream ended before this run's terminal"
                          " event"),
    Cut.UPSTREAM_FAILED: (CODE_TRUNCATED, "the tap lost the agent's stream before this run's"
                          " terminal event"),
    Cut.CLIENT_GONE: (CODE_CLIENT_GONE, "the client disconnected before this run's terminal"
                      " event; the tap closed the agent's stream"),
}
_SUPERSEDED: Final = (CODE_TRUNCATED, "the agent's stream started another run before this"
                      " run's terminal event")
_CUT_FATES: Final = {Cut.UPSTREAM_CLOSED: Fate.TRUNCATED, Cut.UPSTREAM_FAILED: Fate.TRUNCATED,
                     Cut.CLIENT_GONE: Fate.CLIENT_GONE}


def run_error(code: str, message: str) -> bytes:
    return orjson.dumps({"type": "RUN_ERROR", "message": message, "code": code})


@dataclass(frozen=True, slots=True)
class RunRequest:
    """What the tap needs of the POSTed `RunAgentInput`: the requested run's ids and
    the echo to put on its `RUN_STARTED` (serialised), when the body allows."""

    thread_id: str | None
    run_id: str | None
    echo: bytes | None

    @classmethod
    def parse(cls, body: bytes, mode: EchoMode) -> RunRequest:
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError:
            return cls(None, None, None)
        if not isinstance(value, dict):
            return cls(None, None, None)
        thread_id, run_id = value.get("threadId"), value.get("runId")
        if not (isinstance(thread_id, str) and isinstance(run_id, str)):
            return cls(None, None, None)
        echo: Any = value
        if mode is EchoMode.MESSAGES:
            messages = value.get("messages")
            echo = ({"threadId": thread_id, "runId": run_id, "messages": messages}
                    if isinstance(messages, list) else None)
        return cls(thread_id, run_id, None if echo is None else orjson.dumps(echo))

    def key(self) -> bytes | None:
        if self.thread_id is None or self.run_id is None:
            return None
        return run_key(self.thread_id, self.run_id)


def run_key(thread_id: str, run_id: str) -> bytes:
    return f"{thread_id}/{run_id}".encode("utf-8", "surrogatepass")


class Budget:
    """Bytes of records handed out and not yet taken (or refused) by Kafka, shared
    by every response of the process."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def force(self, size: int) -> None:
        """Room for a run's closing RUN_ERROR: at most one per run, always admitted."""
        self.used += size

    def give_back(self, size: int) -> None:
        self.used -= size


@dataclass(frozen=True, slots=True)
class Record:
    run: RunPublication
    value: bytes

    @property
    def size(self) -> int:
        return len(self.run.key) + len(self.value)


@dataclass(slots=True)
class Step:
    """What one call decided: records to publish, in order, and what to count."""

    records: list[Record] = field(default_factory=list)
    fates: list[Fate] = field(default_factory=list)
    drops: list[DropReason] = field(default_factory=list)
    dropped_events: int = 0
    unattributed_events: int = 0


class RunPublication:
    """One run's publication: open until its terminal event, a cut or a drop."""

    def __init__(self, key: bytes, budget: Budget) -> None:
        self.key = key
        self.budget = budget
        self.handed_out = 0
        self.started = False  # a RUN_STARTED was published for it
        self.ended = False  # its fate is decided (terminal event, cut or drop)
        self.dropped = False
        self.said_error = False  # the tap's own RUN_ERROR went out for it

    def publish(self, value: bytes, step: Step) -> None:
        if self.dropped:
            step.dropped_events += 1
            return
        if not self.budget.take(len(self.key) + len(value)):
            step.dropped_events += 1
            self.drop(DropReason.BUFFER_FULL, step)
            return
        step.records.append(Record(self, value))
        self.handed_out += 1

    def finish(self, step: Step) -> None:
        """The upstream's terminal event was published."""
        if not self.ended:
            self.ended = True
            step.fates.append(Fate.FINISHED)

    def cut(self, code: str, message: str, fate: Fate, step: Step) -> None:
        if self.ended:
            return
        self.ended = True
        step.fates.append(fate)
        self._say_error(code, message, step)

    def drop(self, reason: DropReason, step: Step) -> None:
        """Publish nothing more of this run; say so if some of it went out."""
        if self.dropped:
            return
        self.dropped = True
        step.drops.append(reason)
        if not self.ended:
            self.ended = True
            step.fates.append(Fate.DROPPED)
        if self.handed_out:
            self._say_error(CODE_DROPPED, _DROP_MESSAGES[reason], step)

    def _say_error(self, code: str, message: str, step: Step) -> None:
        if self.said_error or not self.handed_out:
            return
        self.said_error = True
        value = run_error(code, message)
        self.budget.force(len(self.key) + len(value))
        step.records.append(Record(self, value))
        self.handed_out += 1


class ResponseTap:
    """One proxied SSE response: chunks in, a `Step` per call out."""

    def __init__(self, request: RunRequest, budget: Budget, max_event_bytes: int) -> None:
        self.request = request
        self.budget = budget
        self.max_event_bytes = max_event_bytes
        self.framer = SseFramer(max_event_bytes)
        self.run: RunPublication | None = None

    def feed(self, chunk: bytes) -> Step:
        step = Step()
        for frame in self.framer.feed(chunk):
            self._frame(frame, step)
        return step

    def end(self, cut: Cut) -> Step:
        """The response is over; a run left open is cut (its `RUN_ERROR` says how)."""
        step = Step()
        if self.run is not None:
            code, message = _CUT_MESSAGES[cut]
            self.run.cut(code, message, _CUT_FATES[cut], step)
        return step

    def _frame(self, frame: Frame, step: Step) -> None:
        if not isinstance(frame, Event):
            run = self._current()
            if run is None:
                step.unattributed_events += 1
            else:
                step.dropped_events += 1
                run.drop(DropReason.EVENT_TOO_LARGE, step)
            return
        value = frame.data
        event = _decoded(value)
        kind = event.get("type")
        if kind == "RUN_STARTED":
            thread_id, run_id = event.get("threadId"), event.get("runId")
            if isinstance(thread_id, str) and isinstance(run_id, str):
                self._start(run_key(thread_id, run_id), step)
                if "input" not in event:
                    value = self._echoed(value, thread_id, run_id)
        run = self._current()
        if run is None:
            step.unattributed_events += 1
            return
        run.publish(value, step)
        if kind in TERMINAL_TYPES:
            run.finish(step)

    def _current(self) -> RunPublication | None:
        if self.run is None:
            key = self.request.key()
            if key is not None:
                self.run = RunPublication(key, self.budget)
        return self.run

    def _start(self, key: bytes, step: Step) -> None:
        run = self.run
        if run is not None and run.key == key and not run.started:
            run.started = True  # events before it were this run's already
            return
        if run is not None:
            run.cut(*_SUPERSEDED, Fate.TRUNCATED, step)
        self.run = RunPublication(key, self.budget)
        self.run.started = True

    def _echoed(self, value: bytes, thread_id: str, run_id: str) -> bytes:
        """`value` with the request's input as `input`, for the requested run only."""
        echo = self.request.echo
        if echo is None or (thread_id, run_id) != (self.request.thread_id, self.request.run_id):
            return value
        body = value.rstrip()
        if not body.endswith(b"}"):
            return value
        echoed = body[:-1] + b',"input":' + echo + b"}"
        return echoed if len(echoed) <= self.max_event_bytes else value


def _decoded(value: bytes) -> dict[str, Any]:
    """The event as a JSON object, or an empty one (the worker judges what it is)."""
    try:
        event = orjson.loads(value)
    except orjson.JSONDecodeError:
        return {}
    return event if isinstance(event, dict) else {}


class OpenRuns:
    """The runs whose records went to Kafka without their terminal event yet, as the
    publisher process sees them: if the tap stops abruptly, each gets a RUN_ERROR
    (`tap_interrupted`), so that no half run waits for the workers' idle timeout."""

    def __init__(self) -> None:
        self._open: dict[bytes, bytes] = {}  # run key -> tenant

    def handed(self, key: bytes, tenant: bytes, value: bytes) -> None:
        try:
            kind = orjson.loads(value).get("type")
        except (orjson.JSONDecodeError, AttributeError):
            kind = None
        if kind in TERMINAL_TYPES:
            self._open.pop(key, None)
        else:
            self._open[key] = tenant

    def interrupted(self) -> list[tuple[bytes, bytes, bytes]]:
        """(key, tenant, RUN_ERROR) for each run still open; none is open after."""
        errors = [(key, tenant, run_error(CODE_INTERRUPTED, _INTERRUPTED_MESSAGE))
                  for key, tenant in self._open.items()]
        self._open.clear()
        return errors
