"""Messages accumulate across the runs of one key (AG-UI 1.1, events/lifecycle): for
random streams of several runs whose later runs act on what earlier ones delivered
(re-streaming text, encrypted values with and without a type, snapshots that restate
and drop), the history the engine publishes, folded as every consumer folds it
(topics/history_fold.py), is the conversation an independent model of the rules
holds."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from processors.engine.decisions import Concluded
from tests.engine_helpers import enc, play, run_finished, run_started, snapshot
from topics.history_fold import fold_history
from topics.records import HistoryMessage, HistoryRemoval, HistoryRun


class Model:
    """The conversation as the rules say it is: text and reasoning messages by id, in
    order, each with its content and encrypted value (and type)."""

    def __init__(self) -> None:
        self.messages: dict[str, dict[str, Any]] = {}

    def stream(self, message_id: str, role: str, text: str) -> None:
        held = self.messages.get(message_id)
        if held is None:
            self.messages[message_id] = {"id": message_id, "role": role, "content": text}
        else:  # re-streamed: appends, the established role stands
            held["content"] += text

    def value(self, message_id: str, value: str, kind: str | None) -> bool:
        held = self.messages.get(message_id)
        if held is None:
            return False
        held["encryptedValue"] = value
        held.pop("encryptedValueType", None)
        if kind is not None:
            held["encryptedValueType"] = kind
        return True

    def snapshot(self, listed: list[dict[str, Any]]) -> None:
        """Restated ones replace in place, new ones are appended, the rest dropped
        unless reasoning while the snapshot carries none."""
        carries_reasoning = any(m["role"] == "reasoning" for m in listed)
        kept = {mid: m for mid, m in self.messages.items()
                if mid in {m["id"] for m in listed}
                or (m["role"] == "reasoning" and not carries_reasoning)}
        for message in listed:
            kept[message["id"]] = dict(message)
        self.messages = kept


IDS = ["m1", "m2", "m3", "m4"]


@st.composite
def streams(draw: Any) -> tuple[list[dict[str, Any]], Model]:
    model = Model()
    events: list[dict[str, Any]] = []
    for run in range(draw(st.integers(1, 4))):
        run_id = f"r{run}"
        events.append(run_started(run_id))
        for _ in range(draw(st.integers(0, 5))):
            action = draw(st.sampled_from(["stream", "stream", "value", "snapshot"]))
            message_id = draw(st.sampled_from(IDS))
            if action == "stream":
                role = draw(st.sampled_from(["reasoning", "assistant"]))
                text = draw(st.text("abc ", min_size=1, max_size=4))
                start = ({"type": "REASONING_MESSAGE_START", "messageId": message_id,
                          "role": "reasoning"} if role == "reasoning"
                         else {"type": "TEXT_MESSAGE_START", "messageId": message_id})
                kind = "REASONING" if role == "reasoning" else "TEXT"
                events += [start,
                           {"type": f"{kind}_MESSAGE_CONTENT", "messageId": message_id,
                            "delta": text},
                           {"type": f"{kind}_MESSAGE_END", "messageId": message_id}]
                model.stream(message_id, role, text)
            elif action == "value":
                value = draw(st.sampled_from(["v1", "v2", "w"]))
                kind = draw(st.sampled_from([None, "anthropic.signature"]))
                extra = {} if kind is None else {"encryptedValueType": kind}
                if model.value(message_id, value, kind):
                    events.append(enc(message_id, value, **extra))
            else:
                listed = [{"id": mid, "role": draw(st.sampled_from(["reasoning", "assistant"])),
                           "content": draw(st.text("xyz", max_size=3))}
                          for mid in draw(st.lists(st.sampled_from(IDS), unique=True,
                                                   max_size=3))]
                events.append(snapshot(*listed))
                model.snapshot(listed)
        events.append(run_finished(run_id))
    return events, model


def published(concluded: list[Concluded]) -> list[dict[str, Any]]:
    """The history records the service would publish for these runs, as dicts."""
    records: list[dict[str, Any]] = []
    for run in concluded:
        assert run.run is not None
        thread, run_id = run.run.thread_id, run.run.run_id
        for seq, entry in enumerate(run.entries):
            if entry.kind == "removal":
                record = HistoryRemoval(tenant="acme", threadId=thread, runId=run_id, seq=seq,
                                        messageId=entry.message["id"]).model_dump(
                                            by_alias=True, exclude_none=True)
            else:
                record = HistoryMessage(tenant="acme", threadId=thread, runId=run_id, seq=seq,
                                        kind=entry.kind,  # type: ignore[arg-type]
                                        message=entry.message).model_dump(
                                            by_alias=True, exclude_none=True)
            records.append(record)
        records.append(HistoryRun(tenant="acme", threadId=thread, runId=run_id,
                                  outcome=run.outcome.value, messageCount=len(run.entries))
                       .model_dump(by_alias=True, exclude_none=True))
    return records


@settings(max_examples=300, deadline=None)
@given(streams())
def test_the_folded_history_of_a_key_is_the_accumulated_conversation(
        stream: tuple[list[dict[str, Any]], Model]) -> None:
    events, model = stream
    replay = play(*events)
    assert replay.failures == [] and replay.warnings == [] and replay.losses == []
    folded = fold_history(published(replay.concluded))
    assert folded.messages == list(model.messages.values())
