"""Deterministic valid AG-UI runs for the service tests, with what their history must be."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass
class GeneratedRun:
    key: bytes
    thread_id: str
    run_id: str
    events: list[bytes]
    messages: list[dict[str, Any]]  # the history the run must publish


def generate_run(rng: random.Random, key: str, run_number: int, deltas: int = 6) -> GeneratedRun:
    """RUN_STARTED, a span with a reasoning message (+ encrypted value), an
    answer streamed by chunks, a tool call, RUN_FINISHED."""
    run_id = f"{key}-run{run_number}"
    reasoning_id, answer_id, call_id = f"{run_id}-r", f"{run_id}-a", f"{run_id}-tc"
    reasoning = [f"thought {i} {rng.random():.6f} " for i in range(deltas)]
    answer = [f"word{i} " for i in range(rng.randint(1, 4))]
    secret = "enc-" + "".join(rng.choice("ABCDEF0123456789+/=") for _ in range(64))
    events: list[dict[str, Any]] = [
        {"type": "RUN_STARTED", "threadId": key, "runId": run_id},
        {"type": "REASONING_START", "messageId": f"{run_id}-span"},
        {"type": "REASONING_MESSAGE_START", "messageId": reasoning_id, "role": "reasoning"},
        *({"type": "REASONING_MESSAGE_CONTENT", "messageId": reasoning_id, "delta": d}
          for d in reasoning),
        {"type": "REASONING_MESSAGE_END", "messageId": reasoning_id},
        {"type": "REASONING_ENCRYPTED_VALUE", "subtype": "message", "entityId": reasoning_id,
         "encryptedValue": secret},
        {"type": "REASONING_END", "messageId": f"{run_id}-span"},
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": answer_id, "delta": answer[0]},
        *({"type": "TEXT_MESSAGE_CHUNK", "delta": d} for d in answer[1:]),
        {"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": "lookup",
         "parentMessageId": answer_id},
        {"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": '{"q":'},
        {"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": f'"{run_number}"}}'},
        {"type": "TOOL_CALL_END", "toolCallId": call_id},
        {"type": "RUN_FINISHED", "threadId": key, "runId": run_id},
    ]
    messages = [
        {"id": reasoning_id, "role": "reasoning", "content": "".join(reasoning),
         "encryptedValue": secret},
        {"id": answer_id, "role": "assistant", "content": "".join(answer),
         "toolCalls": [{"id": call_id, "type": "function",
                        "function": {"name": "lookup", "arguments": f'{{"q":"{run_number}"}}'}}]},
    ]
    return GeneratedRun(key.encode(), key, run_id, [orjson.dumps(e) for e in events], messages)


def interleaved_runs(seed: int, keys: int, runs_per_key: int
                     ) -> tuple[list[GeneratedRun], list[tuple[bytes, bytes]]]:
    """Runs over many keys, each key's runs in sequence, keys interleaved at random."""
    rng = random.Random(seed)
    runs = [generate_run(rng, f"key{k:05d}", n) for k in range(keys) for n in range(runs_per_key)]
    queues: dict[bytes, list[bytes]] = {}
    for run in runs:
        queues.setdefault(run.key, []).extend(run.events)
    cursors = {key: 0 for key in queues}
    records: list[tuple[bytes, bytes]] = []
    live = list(queues)
    while live:
        key = rng.choice(live)
        records.append((key, queues[key][cursors[key]]))
        cursors[key] += 1
        if cursors[key] == len(queues[key]):
            live.remove(key)
    return runs, records
