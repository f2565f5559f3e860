"""Property-based tests of the rule engine (hypothesis).

* Generated VALID keys (several runs; random interleavings of spans, explicit
  and chunked reasoning/text messages in several lanes, tool calls with
  arguments, tool results, encrypted values, activity messages, steps,
  subagents and simple MESSAGES_SNAPSHOTs) are accepted without a warning and
  reassemble to exactly the model's messages (content = concatenated deltas,
  encrypted values byte-identical, last wins).
* Mutations of valid keys fail with the expected code at the expected line.
* Arbitrary bytes / JSON / typed junk never raise out of `feed`.
* The state round-trips at any cut point.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.engine.content import InMemoryContentStore
from processors.engine.decisions import Concluded, Failed, Step
from processors.engine.engine import KeyEngine
from processors.engine.state import KeyState
from tests.engine_helpers import MESSAGE, encode
from topics.events import EVENT_MODELS

SETTINGS = settings(deadline=None, max_examples=60,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

LANES = [None, "A", "B"]
DELTA = st.text(max_size=12)
VALUE = st.text(min_size=0, max_size=40)

# =====================================================================================
# A model of a valid key
# =====================================================================================


@dataclass
class Msg:
    id: str
    role: str
    tag: str | None
    content: list[str] | None = None  # None: no content key
    encrypted: str | None = None
    calls: list[dict[str, Any]] | None = None
    name: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # toolCallId, activityType, ...
    content_obj: Any = None  # activity content

    def as_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"id": self.id, "role": self.role}
        if self.tag is not None:
            message["subagentRunId"] = self.tag
        if self.name is not None:
            message["name"] = self.name
        message.update(self.extra)
        if self.role == "activity":
            message["content"] = copy.deepcopy(self.content_obj)
        elif self.content is not None:
            message["content"] = "".join(self.content)
        if self.calls:
            message["toolCalls"] = [_call_message(c) for c in self.calls]
        if self.encrypted is not None:
            message["encryptedValue"] = self.encrypted
        return message


def _call_message(call: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"id": call["id"], "type": "function",
                           "function": {"name": call["name"], "arguments": "".join(call["args"])}}
    if call["enc"] is not None:
        out["encryptedValue"] = call["enc"]
    return out


@dataclass
class Emitted:
    event: dict[str, Any]
    kind: str  # e.g. "start:reasoning", "end:tool", "content:text", "other"
    run: int


class RunModel:
    """Draws one valid run, event by event, and knows its expected history."""

    def __init__(self, draw: Any, run_index: int, out: list[Emitted]) -> None:
        self.draw = draw
        self.run = run_index
        self.out = out
        self.counter = 0
        self.messages: dict[str, Msg] = {}
        self.order: list[str] = []
        self.calls: dict[str, tuple[str, dict[str, Any]]] = {}  # call id -> (host id, call)
        self.open: dict[str, dict[str, str | None]] = {
            "span": {}, "reasoning": {}, "text": {}, "tool": {}, "step": {}, "subagent": {}}
        self.closed_reasoning: list[str] = []
        self.lanes: dict[str | None, tuple[str, str]] = {}  # lane -> (kind, id)
        self.owner: dict[tuple[str, str], str | None] = {}
        self.subagents_done: set[str] = set()  # an invocation id is not reused in a run

    # --- helpers ---------------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        # Ids never repeat across the runs of a key: messages accumulate across runs
        # (AG-UI 1.1), so a repeated id would continue the earlier run's message.
        self.counter += 1
        suffix = "" if self.run == 0 else f"r{self.run}"
        return f"{prefix}{self.counter}{suffix}"

    def emit(self, event: dict[str, Any], kind: str = "other") -> None:
        self.out.append(Emitted(event, kind, self.run))

    def touch(self, lane: str | None, event_type: str) -> None:
        """The engine closes the lane's pending chunk before most events."""
        if event_type in ("REASONING_ENCRYPTED_VALUE", "RAW", "ACTIVITY_SNAPSHOT",
                          "ACTIVITY_DELTA", "SUBAGENT_STARTED"):
            return
        self.lanes.pop(lane, None)

    def cont_tag(self, owner: str | None) -> str | None:
        """A continuation carries its owner's tag or none (an absent tag never disagrees)."""
        if owner is None:
            return None
        return owner if self.draw(st.booleans()) else None

    def tagged(self, event: dict[str, Any], tag: str | None) -> dict[str, Any]:
        if tag is not None:
            event["subagentRunId"] = tag
        return event

    def new_message(self, msg: Msg) -> None:
        self.messages[msg.id] = msg
        self.order.append(msg.id)

    # --- actions -----------------------------------------------------------------------

    def actions(self) -> list[str]:
        acts = ["span_start", "r_start", "t_start", "tc_start", "r_chunk_new", "t_chunk_new",
                "tc_chunk_new", "custom", "raw", "step_start", "sub_start", "activity"]
        if self.open["span"]:
            acts.append("span_end")
        for ns in ("reasoning", "text"):
            if self.open[ns]:
                acts += [f"{ns}_content"] * 3 + [f"{ns}_end"]
        if self.open["tool"]:
            acts += ["tc_args", "tc_args", "tc_end"]
        if self.open["step"]:
            acts.append("step_end")
        if self.open["subagent"]:
            acts.append("sub_end")
        if self.lanes:
            acts += ["chunk_continue"] * 4
        if self.closed_reasoning:
            acts.append("r_reopen")
        if self.messages:
            acts += ["enc_message", "enc_message"]
        if self.calls:
            acts += ["enc_call", "tc_result"]
        if any(m.role == "activity" for m in self.messages.values()):
            acts.append("activity_delta")
        if not any(self.open[ns] for ns in ("reasoning", "text", "tool")):
            acts.append("snapshot")
        return acts

    def step(self) -> None:
        getattr(self, "do_" + self.draw(st.sampled_from(self.actions())))()

    def do_span_start(self) -> None:
        tag = self.draw(st.sampled_from(LANES))
        sid = self.fresh("s")
        self.touch(tag, "REASONING_START")
        self.open["span"][sid] = tag
        self.emit(self.tagged({"type": "REASONING_START", "messageId": sid}, tag), "start:span")

    def do_span_end(self) -> None:
        sid = self.draw(st.sampled_from(sorted(self.open["span"])))
        tag = self.cont_tag(self.open["span"].pop(sid))
        self.touch(tag, "REASONING_END")
        self.emit(self.tagged({"type": "REASONING_END", "messageId": sid}, tag), "end:span")

    def _start(self, ns: str, mid: str, tag: str | None, reopen: bool = False) -> None:
        event_type = "REASONING_MESSAGE_START" if ns == "reasoning" else "TEXT_MESSAGE_START"
        self.touch(tag, event_type)
        event: dict[str, Any] = {"type": event_type, "messageId": mid}
        if ns == "reasoning":
            event["role"] = "reasoning"
        if not reopen:
            if ns == "reasoning":
                self.new_message(Msg(mid, "reasoning", tag, []))
            else:
                role = self.draw(st.sampled_from([None, "assistant", "user"]))
                name = self.draw(st.sampled_from([None, "bob"]))
                if role is not None:
                    event["role"] = role
                if name is not None:
                    event["name"] = name
                self.new_message(Msg(mid, role or "assistant", tag, [], name=name))
        self.open[ns][mid] = tag
        self.emit(self.tagged(event, tag), f"start:{ns}")

    def do_r_start(self) -> None:
        self._start("reasoning", self.fresh("rm"), self.draw(st.sampled_from(LANES)))

    def do_t_start(self) -> None:
        self._start("text", self.fresh("tm"), self.draw(st.sampled_from(LANES)))

    def do_r_reopen(self) -> None:
        mid = self.draw(st.sampled_from(self.closed_reasoning))
        self.closed_reasoning.remove(mid)
        owner = self.messages[mid].tag
        self._start("reasoning", mid, self.cont_tag(owner), reopen=True)
        self.open["reasoning"][mid] = owner

    def _content(self, ns: str) -> None:
        mid = self.draw(st.sampled_from(sorted(self.open[ns])))
        tag = self.cont_tag(self.open[ns][mid])
        delta = self.draw(DELTA)
        event_type = "REASONING_MESSAGE_CONTENT" if ns == "reasoning" else "TEXT_MESSAGE_CONTENT"
        self.touch(tag, event_type)
        content = self.messages[mid].content
        assert content is not None
        content.append(delta)
        self.emit(self.tagged({"type": event_type, "messageId": mid, "delta": delta}, tag),
                  f"content:{ns}")

    def do_reasoning_content(self) -> None:
        self._content("reasoning")

    def do_text_content(self) -> None:
        self._content("text")

    def _end(self, ns: str) -> None:
        mid = self.draw(st.sampled_from(sorted(self.open[ns])))
        tag = self.cont_tag(self.open[ns].pop(mid))
        event_type = "REASONING_MESSAGE_END" if ns == "reasoning" else "TEXT_MESSAGE_END"
        self.touch(tag, event_type)
        if ns == "reasoning":
            self.closed_reasoning.append(mid)
        self.emit(self.tagged({"type": event_type, "messageId": mid}, tag), f"end:{ns}")

    def do_reasoning_end(self) -> None:
        self._end("reasoning")

    def do_text_end(self) -> None:
        self._end("text")

    def _host(self, tag: str | None, call_id: str) -> tuple[str | None, Msg]:
        hosts = [m.id for m in self.messages.values() if m.role == "assistant"]
        parent = self.draw(st.sampled_from([None, *hosts]))
        if parent is None:
            host = Msg(call_id, "assistant", tag)
            self.new_message(host)
            return None, host
        return parent, self.messages[parent]

    def _tool_open(self, call_id: str, tag: str | None) -> tuple[str | None, dict[str, Any]]:
        parent, host = self._host(tag, call_id)
        call = {"id": call_id, "name": self.draw(st.sampled_from(["search", "calc"])),
                "args": [], "enc": None}
        if host.calls is None:
            host.calls = []
        host.calls.append(call)
        self.calls[call_id] = (host.id, call)
        return parent, call

    def do_tc_start(self) -> None:
        tag = self.draw(st.sampled_from(LANES))
        cid = self.fresh("tc")
        self.touch(tag, "TOOL_CALL_START")
        parent, call = self._tool_open(cid, tag)
        event = {"type": "TOOL_CALL_START", "toolCallId": cid, "toolCallName": call["name"]}
        if parent is not None:
            event["parentMessageId"] = parent
        self.open["tool"][cid] = tag
        self.emit(self.tagged(event, tag), "start:tool")

    def do_tc_args(self) -> None:
        cid = self.draw(st.sampled_from(sorted(self.open["tool"])))
        tag = self.cont_tag(self.open["tool"][cid])
        delta = self.draw(DELTA)
        self.touch(tag, "TOOL_CALL_ARGS")
        self.calls[cid][1]["args"].append(delta)
        self.emit(self.tagged({"type": "TOOL_CALL_ARGS", "toolCallId": cid, "delta": delta}, tag),
                  "content:tool")

    def do_tc_end(self) -> None:
        cid = self.draw(st.sampled_from(sorted(self.open["tool"])))
        tag = self.cont_tag(self.open["tool"].pop(cid))
        self.touch(tag, "TOOL_CALL_END")
        self.emit(self.tagged({"type": "TOOL_CALL_END", "toolCallId": cid}, tag), "end:tool")

    def do_tc_result(self) -> None:
        closed = [c for c in sorted(self.calls) if c not in self.open["tool"]
                  and not any(k == "tool" and i == c for k, i in self.lanes.values())]
        if not closed:
            return self.do_custom()
        cid = self.draw(st.sampled_from(closed))
        tag = self.draw(st.sampled_from(LANES))
        mid = self.fresh("res")
        content = self.draw(DELTA)
        self.touch(tag, "TOOL_CALL_RESULT")
        host_id = self.calls[cid][0]
        host_calls = {c["id"] for c in self.messages[host_id].calls or ()}
        position = self.order.index(host_id) + 1
        while position < len(self.order):
            following = self.messages[self.order[position]]
            if following.role != "tool" or following.extra.get("toolCallId") not in host_calls:
                break
            position += 1
        msg = Msg(mid, "tool", tag, [content], extra={"toolCallId": cid})
        self.messages[mid] = msg
        self.order.insert(position, mid)
        self.emit(self.tagged({"type": "TOOL_CALL_RESULT", "messageId": mid, "toolCallId": cid,
                               "content": content}, tag))
        return None

    # chunks -------------------------------------------------------------------------

    def _chunk_new(self, kind: str) -> None:
        lane = self.draw(st.sampled_from(LANES))
        self.lanes.pop(lane, None)  # a chunk with another id closes the pending item
        delta = self.draw(st.one_of(st.none(), DELTA))
        if kind == "tool":
            cid = self.fresh("ktc")
            parent, call = self._tool_open(cid, lane)
            event: dict[str, Any] = {"type": "TOOL_CALL_CHUNK", "toolCallId": cid,
                                     "toolCallName": call["name"]}
            if parent is not None:
                event["parentMessageId"] = parent
            if delta is not None:
                event["delta"] = delta
                call["args"].append(delta)
            self.lanes[lane] = ("tool", cid)
        else:
            mid = self.fresh("k" + kind[0])
            event_type = "REASONING_MESSAGE_CHUNK" if kind == "reasoning" else "TEXT_MESSAGE_CHUNK"
            event = {"type": event_type, "messageId": mid}
            if delta is not None:
                event["delta"] = delta
            role = "reasoning" if kind == "reasoning" else "assistant"
            if kind == "text" and self.draw(st.booleans()):
                event["role"] = role = "user"
            self.new_message(Msg(mid, role, lane, [] if delta is None else [delta]))
            self.lanes[lane] = (kind, mid)
        self.emit(self.tagged(event, lane), f"chunk:{kind}")

    def do_r_chunk_new(self) -> None:
        self._chunk_new("reasoning")

    def do_t_chunk_new(self) -> None:
        self._chunk_new("text")

    def do_tc_chunk_new(self) -> None:
        self._chunk_new("tool")

    def do_chunk_continue(self) -> None:
        lane = self.draw(st.sampled_from(sorted(self.lanes, key=str)))
        kind, item = self.lanes[lane]
        id_key = "toolCallId" if kind == "tool" else "messageId"
        event_type = {"reasoning": "REASONING_MESSAGE_CHUNK", "text": "TEXT_MESSAGE_CHUNK",
                      "tool": "TOOL_CALL_CHUNK"}[kind]
        event: dict[str, Any] = {"type": event_type}
        same_kind = [ln for ln, (k, _) in self.lanes.items() if k == kind]
        untagged_ok = lane is None or (len(same_kind) == 1 and None not in self.lanes)
        style = self.draw(st.sampled_from(["id", "tag", "bare"]))
        if style == "id" or (style == "bare" and not untagged_ok):
            event[id_key] = item
            self.tagged(event, lane)
        elif style == "tag" and lane is not None:
            event["subagentRunId"] = lane
        elif not untagged_ok:
            event[id_key] = item
        delta = self.draw(st.one_of(st.none(), DELTA))
        if delta is not None:
            event["delta"] = delta
            if kind == "tool":
                self.calls[item][1]["args"].append(delta)
            else:
                content = self.messages[item].content
                assert content is not None
                content.append(delta)
        self.emit(event, f"chunk:{kind}")

    # encrypted values ---------------------------------------------------------------

    def do_enc_message(self) -> None:
        candidates = [m for m in sorted(self.messages) if self.messages[m].role != "activity"]
        if not candidates:
            return
        mid = self.draw(st.sampled_from(candidates))
        value = self.draw(VALUE)
        self.messages[mid].encrypted = value
        self.emit(self.tagged({"type": "REASONING_ENCRYPTED_VALUE", "subtype": "message",
                               "entityId": mid, "encryptedValue": value},
                              self.draw(st.sampled_from(LANES))))

    def do_enc_call(self) -> None:
        cid = self.draw(st.sampled_from(sorted(self.calls)))
        value = self.draw(VALUE)
        self.calls[cid][1]["enc"] = value
        self.emit({"type": "REASONING_ENCRYPTED_VALUE", "subtype": "tool-call",
                   "entityId": cid, "encryptedValue": value})

    # other events --------------------------------------------------------------------

    def do_custom(self) -> None:
        tag = self.draw(st.sampled_from(LANES))
        self.touch(tag, "CUSTOM")
        self.emit(self.tagged({"type": "CUSTOM", "name": "n", "value": {"v": 1}}, tag))

    def do_raw(self) -> None:
        self.emit(self.tagged({"type": "RAW", "event": [1, "x"]},
                              self.draw(st.sampled_from(LANES))))

    def do_step_start(self) -> None:
        name = self.fresh("step")
        tag = self.draw(st.sampled_from(LANES))
        self.touch(tag, "STEP_STARTED")
        self.open["step"][name] = tag
        self.emit(self.tagged({"type": "STEP_STARTED", "stepName": name}, tag), "start:step")

    def do_step_end(self) -> None:
        name = self.draw(st.sampled_from(sorted(self.open["step"])))
        tag = self.open["step"].pop(name)
        self.touch(tag, "STEP_FINISHED")
        self.emit(self.tagged({"type": "STEP_FINISHED", "stepName": name}, tag), "end:step")

    def do_sub_start(self) -> None:
        sid = self.draw(st.sampled_from(["A", "B", "C"]))
        if sid in self.open["subagent"] or sid in self.subagents_done:
            return
        self.open["subagent"][sid] = None
        self.emit({"type": "SUBAGENT_STARTED", "subagentRunId": sid, "name": "helper"},
                  "start:subagent")

    def do_sub_end(self) -> None:
        sid = self.draw(st.sampled_from(sorted(self.open["subagent"])))
        del self.open["subagent"][sid]
        self.subagents_done.add(sid)
        self.touch(sid, "SUBAGENT_FINISHED")
        event_type = self.draw(st.sampled_from(["SUBAGENT_FINISHED", "SUBAGENT_ERROR"]))
        event = {"type": event_type, "subagentRunId": sid}
        if event_type == "SUBAGENT_ERROR":
            event["message"] = "failed"
        self.emit(event, "end:subagent")

    def do_activity(self) -> None:
        mid = self.fresh("act")
        content = {"n": self.draw(st.integers(0, 9))}
        self.new_message(Msg(mid, "activity", None, extra={"activityType": "plan"},
                             content_obj=content))
        self.emit({"type": "ACTIVITY_SNAPSHOT", "messageId": mid, "activityType": "plan",
                   "content": content})

    def do_activity_delta(self) -> None:
        mid = self.draw(st.sampled_from(
            [m for m in sorted(self.messages) if self.messages[m].role == "activity"]))
        value = self.draw(st.integers(0, 9))
        self.messages[mid].content_obj["k"] = value
        self.emit({"type": "ACTIVITY_DELTA", "messageId": mid, "activityType": "plan",
                   "patch": [{"op": "add", "path": "/k", "value": value}]})

    def do_snapshot(self) -> None:
        """Restate every message (maybe retracting some values), maybe append a user turn."""
        self.lanes.clear()
        restated = []
        for mid in self.order:
            msg = self.messages[mid]
            if msg.role != "activity" and msg.encrypted is not None and self.draw(st.booleans()):
                msg.encrypted = None  # retracted by the producer
            for call in msg.calls or ():
                if call["enc"] is not None and self.draw(st.booleans()):
                    call["enc"] = None
            restated.append(msg.as_message())
        if self.draw(st.booleans()):
            user = Msg(self.fresh("u"), "user", None, [self.draw(DELTA)])
            self.new_message(user)
            restated.append(user.as_message())
        for msg in self.messages.values():  # the snapshot's text is now the content
            if msg.content is not None:
                msg.content = ["".join(msg.content)]
            for call in msg.calls or ():
                call["args"] = ["".join(call["args"])]
        self.emit({"type": "MESSAGES_SNAPSHOT", "messages": restated})

    # whole run ------------------------------------------------------------------------

    def close_everything(self) -> None:
        closers = ([("reasoning", i) for i in self.open["reasoning"]]
                   + [("text", i) for i in self.open["text"]]
                   + [("tool", i) for i in self.open["tool"]]
                   + [("span", i) for i in self.open["span"]]
                   + [("step", i) for i in self.open["step"]]
                   + [("subagent", i) for i in self.open["subagent"]])
        for ns, item in self.draw(st.permutations(closers)):
            tag = self.open[ns].pop(item)
            if ns in ("reasoning", "text", "span", "tool"):
                tag = self.cont_tag(tag)
            event_type, key = {
                "reasoning": ("REASONING_MESSAGE_END", "messageId"),
                "text": ("TEXT_MESSAGE_END", "messageId"),
                "tool": ("TOOL_CALL_END", "toolCallId"),
                "span": ("REASONING_END", "messageId"),
                "step": ("STEP_FINISHED", "stepName"),
                "subagent": ("SUBAGENT_FINISHED", "subagentRunId"),
            }[ns]
            if ns == "subagent":
                tag = None
                self.touch(item, event_type)
            else:
                self.touch(tag, event_type)
            self.emit(self.tagged({"type": event_type, key: item}, tag), f"end:{ns}")

    def expected(self) -> list[dict[str, Any]]:
        return [self.messages[mid].as_message() for mid in self.order]


@dataclass
class Key:
    emitted: list[Emitted]
    expected: list[list[dict[str, Any]]]  # per run

    @property
    def events(self) -> list[dict[str, Any]]:
        return [e.event for e in self.emitted]


@st.composite
def valid_keys(draw: Any, max_runs: int = 3, max_steps: int = 40) -> Key:
    emitted: list[Emitted] = []
    expected = []
    for run_index in range(draw(st.integers(1, max_runs))):
        run_id = f"run-{run_index}"
        emitted.append(Emitted({"type": "RUN_STARTED", "threadId": "t1", "runId": run_id},
                               "run_started", run_index))
        model = RunModel(draw, run_index, emitted)
        for _ in range(draw(st.integers(0, max_steps))):
            model.step()
        model.close_everything()
        emitted.append(Emitted({"type": "RUN_FINISHED", "threadId": "t1", "runId": run_id},
                               "run_finished", run_index))
        expected.append(model.expected())
    return Key(emitted, expected)


def feed_all(events: list[Any], engine: KeyEngine | None = None) -> list[Step]:
    engine = engine if engine is not None else KeyEngine()
    return [engine.feed(encode(e)) for e in events]


def first_failure(steps: list[Step]) -> tuple[int, str] | None:
    for line, step in enumerate(steps, 1):
        for decision in step.decisions:
            if isinstance(decision, Failed):
                return line, decision.code.value
    return None


# =====================================================================================
# Valid keys are accepted and reassemble exactly
# =====================================================================================


@SETTINGS
@given(valid_keys())
def test_valid_runs_accepted_and_reassembled(key: Key) -> None:
    steps = feed_all(key.events)
    decisions = [d for s in steps for d in s.decisions]
    assert all(isinstance(d, Concluded) for d in decisions), decisions
    concluded = [d for d in decisions if isinstance(d, Concluded)]
    assert [c.outcome.value for c in concluded] == ["success"] * len(key.expected)
    for got, want in zip(concluded, key.expected, strict=True):
        assert got.messages == want
        for message in got.messages:
            MESSAGE.validate_python(message)


@SETTINGS
@given(valid_keys())
def test_valid_runs_escaped_on_the_wire_reassemble_identically(key: Key) -> None:
    """The same key with every non-ASCII character spelled as a \\u escape."""
    plain = feed_all(key.events)
    assert feed_all([json.dumps(e, ensure_ascii=True).encode() for e in key.events]) == plain


# =====================================================================================
# Mutations fail with the expected code
# =====================================================================================


def _run_finished_line(key: Key, run: int) -> int:
    for line, e in enumerate(key.emitted, 1):
        if e.kind == "run_finished" and e.run == run:
            return line
    raise AssertionError(run)


@SETTINGS
@given(valid_keys(max_runs=2), st.data())
def test_mutation_drop_an_end(key: Key, data: st.DataObject) -> None:
    ends = [i for i, e in enumerate(key.emitted) if e.kind.startswith("end:")]
    # the last END of an id (a reasoning message may be re-opened after an END)
    last_ends = [i for i in ends if not any(
        j > i and key.emitted[j].kind.startswith("start:")
        and _item_id(key.emitted[j].event) == _item_id(key.emitted[i].event)
        and key.emitted[j].kind.split(":")[1] == key.emitted[i].kind.split(":")[1]
        for j in range(len(key.emitted)))]
    # An END also closes its lane's pending chunk item; without it a subagent's lane
    # could keep an item pending, and a later untagged id-less chunk would then
    # rightly fail as ambiguous before RUN_FINISHED. Drop only ENDs whose lane never
    # held a chunk item (every untagged END's lane is the parent's: its item, if any,
    # takes the chunk, no ambiguity).
    last_ends = [i for i in last_ends if _lane(key.emitted[i].event) is None or not any(
        e.kind.startswith("chunk:") and _lane(e.event) == _lane(key.emitted[i].event)
        for e in key.emitted[:i])]
    if not last_ends:
        return
    index = data.draw(st.sampled_from(last_ends))
    dropped = key.emitted[index]
    mutated = key.events[:index] + key.events[index + 1:]
    expected_line = _run_finished_line(key, dropped.run) - 1  # one line less before it
    assert first_failure(feed_all(mutated)) == (expected_line, "open_at_finish")


def _lane(event: dict[str, Any]) -> str | None:
    return event.get("subagentRunId")


def _item_id(event: dict[str, Any]) -> str:
    for key in ("messageId", "toolCallId", "stepName", "subagentRunId"):
        if key in event and event["type"] not in ("TOOL_CALL_RESULT",):
            if key == "subagentRunId" and not event["type"].startswith("SUBAGENT"):
                continue
            return str(event[key])
    return ""


ALREADY_OPEN = {"span": "span_already_open", "reasoning": "message_already_open",
                "text": "message_already_open", "tool": "tool_call_already_open",
                "step": "step_already_open", "subagent": "subagent_already_open"}


@SETTINGS
@given(valid_keys(max_runs=2), st.data())
def test_mutation_repeat_a_start(key: Key, data: st.DataObject) -> None:
    starts = [i for i, e in enumerate(key.emitted) if e.kind.startswith("start:")]
    if not starts:
        return
    index = data.draw(st.sampled_from(starts))
    mutated = [*key.events[:index + 1], key.events[index], *key.events[index + 1:]]
    namespace = key.emitted[index].kind.split(":")[1]
    assert first_failure(feed_all(mutated)) == (index + 2, ALREADY_OPEN[namespace])


def _inside_run_positions(key: Key) -> list[int]:
    """Insertion points strictly after a RUN_STARTED and up to its RUN_FINISHED."""
    positions = []
    inside = False
    for index, emitted in enumerate(key.emitted):
        if emitted.kind == "run_started":
            inside = True
            continue
        if inside:
            positions.append(index)
        if emitted.kind == "run_finished":
            inside = False
    return positions


@SETTINGS
@given(valid_keys(max_runs=2), st.data())
def test_mutation_orphan_content(key: Key, data: st.DataObject) -> None:
    index = data.draw(st.sampled_from(_inside_run_positions(key)))
    orphan = data.draw(st.sampled_from([
        ({"type": "REASONING_MESSAGE_CONTENT", "messageId": "orphan", "delta": "x"},
         "message_not_open"),
        ({"type": "TEXT_MESSAGE_CONTENT", "messageId": "orphan", "delta": ""},
         "message_not_open"),
        ({"type": "REASONING_MESSAGE_END", "messageId": "orphan"}, "message_not_open"),
        ({"type": "TOOL_CALL_ARGS", "toolCallId": "orphan", "delta": "{"},
         "tool_call_not_open"),
        ({"type": "REASONING_END", "messageId": "orphan"}, "span_not_open"),
    ]))
    event, code = orphan
    if data.draw(st.booleans()):
        event = {**event, "subagentRunId": data.draw(st.sampled_from(["A", "B"]))}
    mutated = [*key.events[:index], event, *key.events[index:]]
    assert first_failure(feed_all(mutated)) == (index + 1, code)


OPTIONAL_NULLABLE_KEYS = ("timestamp", "metadata")


@SETTINGS
@given(valid_keys(max_runs=2), st.data())
def test_mutation_null_an_optional_field(key: Key, data: st.DataObject) -> None:
    index = data.draw(st.integers(0, len(key.events) - 1))
    event = dict(key.events[index])
    model = EVENT_MODELS[event["type"]]
    present_optional = [k for k, spec in model.fields.items()
                        if not spec.required and k in event and not spec.nullable
                        and not spec.retired_null]
    choices = present_optional + [k for k in OPTIONAL_NULLABLE_KEYS]
    if "subagentRunId" in model.fields and not model.fields["subagentRunId"].required:
        choices.append("subagentRunId")
    name = data.draw(st.sampled_from(choices))
    event[name] = None
    mutated = [*key.events[:index], event, *key.events[index + 1:]]
    assert first_failure(feed_all(mutated)) == (index + 1, "malformed_event")


@SETTINGS
@given(valid_keys(max_runs=2), st.data())
def test_mutation_remove_a_required_field(key: Key, data: st.DataObject) -> None:
    candidates = [i for i, e in enumerate(key.events)
                  if any(spec.required and k != "type"
                         for k, spec in EVENT_MODELS[e["type"]].fields.items())]
    index = data.draw(st.sampled_from(candidates))
    event = dict(key.events[index])
    required = [k for k, spec in EVENT_MODELS[event["type"]].fields.items()
                if spec.required and k != "type"]
    del event[data.draw(st.sampled_from(required))]
    mutated = [*key.events[:index], event, *key.events[index + 1:]]
    assert first_failure(feed_all(mutated)) == (index + 1, "malformed_event")


@SETTINGS
@given(valid_keys(max_runs=2), st.data())
def test_mutation_split_a_run(key: Key, data: st.DataObject) -> None:
    index = data.draw(st.sampled_from(_inside_run_positions(key)))
    mutated = [*key.events[:index], {"type": "RUN_STARTED", "threadId": "t1", "runId": "split"},
               *key.events[index:]]
    steps = feed_all(mutated)
    assert first_failure(steps) == (index + 1, "run_already_active")
    # the failed run publishes nothing; records up to the next RUN_STARTED are discarded
    run = key.emitted[index].run
    concluded = [d for s in steps for d in s.decisions if isinstance(d, Concluded)]
    assert len(concluded) == len(key.expected) - 1
    assert [c.messages for c in concluded] == [m for r, m in enumerate(key.expected) if r != run]


# =====================================================================================
# Robustness: nothing raises out of feed
# =====================================================================================

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False,
                                                                              allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)
EVENT_TYPES = sorted(EVENT_MODELS)
FIELD_NAMES = sorted({k for m in EVENT_MODELS.values() for k in m.fields} | {"unknown", "x"})
IDS = st.sampled_from(["a", "b", "A", "B", "m1", "c1"])
SMART_VALUE = st.one_of(
    IDS, JSON, st.sampled_from(["reasoning", "message", "tool-call", "user", "assistant", "1.0",
                                "function"]),
    st.lists(st.fixed_dictionaries({"id": IDS, "role": st.sampled_from(
        ["user", "assistant", "reasoning", "tool", "activity", "critic"]),
        "content": st.one_of(st.text(max_size=4), JSON)}), max_size=3),
    st.lists(st.fixed_dictionaries({"op": st.sampled_from(
        ["add", "remove", "replace", "move", "copy", "test", "bogus"]),
        "path": st.sampled_from(["", "/", "/a", "/a/0", "/-", "/a/-", "/~1"]),
        "from": st.sampled_from(["", "/a", "/b"]), "value": JSON}), max_size=3),
)


@st.composite
def typed_junk(draw: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"type": draw(st.sampled_from(EVENT_TYPES))}
    model = EVENT_MODELS[event["type"]]
    for name, spec in model.fields.items():
        if name != "type" and (spec.required or draw(st.booleans())) and draw(
                st.integers(0, 9)) > 0:
            event[name] = draw(SMART_VALUE)
    for name in draw(st.lists(st.sampled_from(FIELD_NAMES), max_size=2)):
        event[name] = draw(SMART_VALUE)
    return event


def _primed_engine() -> KeyEngine:
    engine = KeyEngine()
    for event in [
        {"type": "RUN_STARTED", "threadId": "t1", "runId": "r1"},
        {"type": "REASONING_START", "messageId": "a"},
        {"type": "REASONING_MESSAGE_CHUNK", "messageId": "m1", "delta": "x", "subagentRunId": "A"},
        {"type": "TEXT_MESSAGE_START", "messageId": "b"},
        {"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "f",
         "parentMessageId": "b"},
        {"type": "ACTIVITY_SNAPSHOT", "messageId": "A", "activityType": "t",
         "content": {"a": [1, 2]}},
    ]:
        engine.feed(orjson.dumps(event))
    return engine


def _never_raises(records: list[bytes]) -> None:
    for engine in (KeyEngine(), _primed_engine()):
        for raw in records:
            step = engine.feed(raw)
            assert isinstance(step, Step) and isinstance(step.event_type, str)
        engine.abandon()


@settings(deadline=None, max_examples=150)
@given(st.lists(st.binary(max_size=64), max_size=5))
def test_arbitrary_bytes_never_raise(records: list[bytes]) -> None:
    _never_raises(records)


@settings(deadline=None, max_examples=150)
@given(st.lists(JSON, max_size=5))
def test_arbitrary_json_never_raises(values: list[Any]) -> None:
    _never_raises([orjson.dumps(v) for v in values])


@settings(deadline=None, max_examples=300)
@given(st.lists(typed_junk(), min_size=1, max_size=8))
def test_typed_junk_never_raises(events: list[dict[str, Any]]) -> None:
    _never_raises([orjson.dumps(e) for e in events])
    # every record ends in a decision or a clean step, and undecided records are known
    # types that applied cleanly


# =====================================================================================
# State round-trip
# =====================================================================================


def _round_trip_equal(events: list[Any], cut: int) -> None:
    records = [encode(e) for e in events]
    uninterrupted = KeyEngine()
    whole = feed_all(records, uninterrupted)
    content = InMemoryContentStore()
    first = KeyEngine(content=content)
    head = [first.feed(r) for r in records[:cut]]
    restored = KeyEngine(KeyState.from_json(first.state.to_json()), content)
    tail = [restored.feed(r) for r in records[cut:]]
    assert head + tail == whole
    assert restored.state.to_json() == uninterrupted.state.to_json()


@SETTINGS
@given(valid_keys(max_runs=2), st.data())
def test_state_round_trip_valid(key: Key, data: st.DataObject) -> None:
    _round_trip_equal(key.events, data.draw(st.integers(0, len(key.events))))


@SETTINGS
@given(st.lists(typed_junk(), max_size=12), st.data())
def test_state_round_trip_junk(events: list[dict[str, Any]], data: st.DataObject) -> None:
    prefix = [{"type": "RUN_STARTED", "threadId": "t1", "runId": "r1"}]
    events = prefix + events
    _round_trip_equal(events, data.draw(st.integers(0, len(events))))
