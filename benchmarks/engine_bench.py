"""Throughput of the rule engine, from raw record bytes to decisions.

    .venv/bin/python benchmarks/engine_bench.py [--events N] [--keys K] [--repeat R]
                                                [--memory-events M] [--seed S]

Generates (seeded, deterministic) events the way agent servers send them: many
runs of 10-400 events over many run keys (each key its own KeyEngine, records
of the keys interleaved as on a partition), UUID ids, a `timestamp` on every
event and the provider's raw chunk as `rawEvent` on about one delta in six,
about 60% reasoning deltas of 1-200 bytes, chunks in subagent lanes, text
messages, tool calls with arguments, encrypted values of 1-4 KB, spans, steps.
It then measures, best of R, on those records and on the same events without
`timestamp`/`rawEvent` (bare):

* the engine: `engines[key].feed(raw)` for every record (events/s, MB/s);
* the baseline: a bare `orjson.loads(raw)` loop over the same records;

and reports the ratio. Finally it writes M events as sent (one key, many runs)
to a JSON-lines file and times the whole `agui-stream check FILE --json`
command (as `python -m processors.tools.cli`, so that it runs this checkout's code)
against a child process that only decodes the same lines, and prints
the checker's peak RSS along the file (memory follows the open run, not the
file).

Targets (issue 11): as sent, the engine >= 0.40 of the bare decode rate;
`check --json` >= 350k events/s and >= 0.30 of bare decode.
"""

from __future__ import annotations

import argparse
import base64
import gc
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from processors.engine.engine import KeyEngine

REPO = Path(__file__).resolve().parents[1]

WORDS = (
    "the", "user", "asks", "about", "the", "weather", "so", "I", "should", "call", "the",
    "tool", "first", "and", "then", "summarise", "the", "answer", "carefully", "considering",
    "units", "locale", "and", "caveats", "평가", "단계", "考える", "ünïcödé", "step",
)


def text(rng: random.Random, low: int, high: int) -> str:
    """About `low`..`high` bytes of mixed-script words (at most `high`)."""
    target = rng.randint(low, high)
    parts: list[str] = []
    size = 0
    while size < target:
        word = rng.choice(WORDS)
        parts.append(word)
        size += len(word.encode()) + 1
    return " ".join(parts)[:target]


def _blob(rng: random.Random) -> str:
    return base64.b64encode(rng.randbytes(rng.randint(768, 3072))).decode()  # 1-4 KB


def generate_run(rng: random.Random, key: int, run: int) -> list[dict[str, Any]]:
    """One finished run, shaped like a reasoning model's turn."""
    events: list[dict[str, Any]] = []
    add = events.append
    rid = f"run-{key}-{run}"
    add({"type": "RUN_STARTED", "threadId": f"thread-{key}", "runId": rid,
         "protocolVersion": "1.0", "timestamp": 1700000000000 + run})
    for block in range(rng.randint(1, 3)):
        span = f"s{block}"
        add({"type": "REASONING_START", "messageId": span})
        mid = f"r{block}"
        if rng.random() < 0.5:
            add({"type": "REASONING_MESSAGE_START", "messageId": mid, "role": "reasoning"})
            for _ in range(rng.randint(2, 50)):
                add({"type": "REASONING_MESSAGE_CONTENT", "messageId": mid,
                     "delta": text(rng, 1, 200)})
            add({"type": "REASONING_MESSAGE_END", "messageId": mid})
        else:
            lane = rng.choice((None, None, "sub-1"))
            first: dict[str, Any] = {"type": "REASONING_MESSAGE_CHUNK", "messageId": mid,
                                     "delta": text(rng, 1, 200)}
            if lane is not None:
                first["subagentRunId"] = lane
            add(first)
            for _ in range(rng.randint(2, 50)):
                chunk: dict[str, Any] = {"type": "REASONING_MESSAGE_CHUNK",
                                         "delta": text(rng, 1, 200)}
                if lane is not None:
                    chunk["subagentRunId"] = lane
                add(chunk)
        add({"type": "REASONING_ENCRYPTED_VALUE", "subtype": "message", "entityId": mid,
             "encryptedValue": _blob(rng)})
        add({"type": "REASONING_END", "messageId": span})
    if rng.random() < 0.6:
        add({"type": "STEP_STARTED", "stepName": "tools"})
        answer = "a0"
        add({"type": "TEXT_MESSAGE_START", "messageId": answer, "role": "assistant"})
        add({"type": "TEXT_MESSAGE_CONTENT", "messageId": answer, "delta": text(rng, 10, 60)})
        add({"type": "TEXT_MESSAGE_END", "messageId": answer})
        for call in range(rng.randint(1, 2)):
            cid = f"call-{call}"
            if rng.random() < 0.5:
                add({"type": "TOOL_CALL_START", "toolCallId": cid, "toolCallName": "search",
                     "parentMessageId": answer})
                for _ in range(rng.randint(1, 4)):
                    add({"type": "TOOL_CALL_ARGS", "toolCallId": cid,
                         "delta": orjson.dumps({"q": text(rng, 5, 30)}).decode()})
                add({"type": "TOOL_CALL_END", "toolCallId": cid})
            else:
                add({"type": "TOOL_CALL_CHUNK", "toolCallId": cid, "toolCallName": "calc",
                     "parentMessageId": answer, "delta": '{"expr":'})
                for _ in range(rng.randint(1, 4)):
                    add({"type": "TOOL_CALL_CHUNK", "delta": orjson.dumps(
                        text(rng, 5, 30)).decode()})
                add({"type": "TOOL_CALL_CHUNK", "delta": "}"})
            if rng.random() < 0.3:
                add({"type": "REASONING_ENCRYPTED_VALUE", "subtype": "tool-call",
                     "entityId": cid, "encryptedValue": _blob(rng)})
            add({"type": "TOOL_CALL_RESULT", "messageId": f"res-{call}", "toolCallId": cid,
                 "content": text(rng, 20, 120), "role": "tool"})
        add({"type": "STEP_FINISHED", "stepName": "tools"})
    final = "final"
    if rng.random() < 0.5:
        add({"type": "TEXT_MESSAGE_START", "messageId": final})
        for _ in range(rng.randint(2, 8)):
            add({"type": "TEXT_MESSAGE_CONTENT", "messageId": final,
                 "delta": text(rng, 10, 80)})
        add({"type": "TEXT_MESSAGE_END", "messageId": final})
    else:
        add({"type": "TEXT_MESSAGE_CHUNK", "messageId": final, "delta": text(rng, 10, 80)})
        for _ in range(rng.randint(1, 7)):
            add({"type": "TEXT_MESSAGE_CHUNK", "delta": text(rng, 10, 80)})
    add({"type": "RUN_FINISHED", "threadId": f"thread-{key}", "runId": rid,
         "usage": [{"model": "m", "inputTokens": 100, "outputTokens": 50,
                    "reasoningTokens": 40}]})
    return events


_ID_FIELDS = ("threadId", "runId", "messageId", "toolCallId", "parentMessageId", "entityId")


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def as_sent(rng: random.Random, events: list[dict[str, Any]],
            thread_ids: dict[str, str]) -> list[dict[str, Any]]:
    """The run as agent servers send it: UUID ids, a `timestamp` on every event and,
    on about one delta in six, the provider's raw chunk as `rawEvent`."""
    ids: dict[str, str] = {}
    clock = 1_700_000_000_000 + rng.randrange(10**9)
    for event in events:
        for field in _ID_FIELDS:
            if field in event:
                names = thread_ids if field == "threadId" else ids
                event[field] = names.setdefault(event[field], _uuid(rng))
        clock += rng.randint(1, 40)
        event["timestamp"] = clock
        if "delta" in event and rng.random() < 0.16:
            event["rawEvent"] = {"id": f"chatcmpl-{rng.getrandbits(64):x}",
                                 "object": "chat.completion.chunk", "created": clock // 1000,
                                 "choices": [{"index": 0, "delta": {"content": event["delta"]}}]}
    return events


def bare(event: dict[str, Any]) -> dict[str, Any]:
    """The same event without the optional fields servers add."""
    return {k: v for k, v in event.items() if k not in ("timestamp", "rawEvent")}


def generate_corpus(events: int, keys: int, seed: int) -> list[tuple[int, bytes]]:
    """At least `events` records of `keys` keys, interleaved run by run."""
    return [(key, orjson.dumps(event)) for key, event in generate_events(events, keys, seed)]


def generate_events(events: int, keys: int, seed: int) -> list[tuple[int, dict[str, Any]]]:
    """At least `events` events (as sent) of `keys` keys, interleaved run by run."""
    rng = random.Random(seed)
    pending: list[Iterator[dict[str, Any]]] = [iter(()) for _ in range(keys)]
    runs = [0] * keys
    thread_ids: dict[str, str] = {}
    out: list[tuple[int, dict[str, Any]]] = []
    while len(out) < events:
        key = rng.randrange(keys)
        # a burst of this key's events (partitions interleave keys, runs stay ordered)
        for _ in range(rng.randint(1, 16)):
            event = next(pending[key], None)
            if event is None:
                pending[key] = iter(as_sent(rng, generate_run(rng, key, runs[key]), thread_ids))
                runs[key] += 1
                event = next(pending[key])
            out.append((key, event))
    return out


def corpus_profile(records: list[tuple[int, bytes]]) -> dict[str, float]:
    total = len(records)
    reasoning_deltas = sum(1 for _, r in records
                           if r.startswith((b'{"type":"REASONING_MESSAGE_CONTENT"',
                                            b'{"type":"REASONING_MESSAGE_CHUNK"')))
    encrypted = sum(1 for _, r in records if r.startswith(b'{"type":"REASONING_ENCRYPTED'))
    return {
        "records": total,
        "bytes": sum(len(r) for _, r in records),
        "reasoning_delta_share": reasoning_deltas / total,
        "encrypted_values": encrypted,
        "runs": sum(1 for _, r in records if r.startswith(b'{"type":"RUN_STARTED"')),
        "keys": len({k for k, _ in records}),
    }


def bench_engine(records: list[tuple[int, bytes]], keys: int) -> tuple[float, int, int]:
    engines = [KeyEngine() for _ in range(keys)]
    decided = concluded = 0
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for key, raw in records:
            step = engines[key].feed(raw)
            if step.decisions:
                decided += len(step.decisions)
        elapsed = time.perf_counter() - start
    finally:
        gc.enable()
    for engine in engines:
        if engine.state.run is not None:
            concluded += 1
    return elapsed, decided, concluded


def bench_baseline(records: list[tuple[int, bytes]]) -> float:
    loads = orjson.loads
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for _key, raw in records:
            loads(raw)
        return time.perf_counter() - start
    finally:
        gc.enable()


# --- memory of the streaming checker (child process) ---------------------------------


def _rss_mb() -> float:
    """Peak resident set size of this process so far (VmHWM; ru_maxrss elsewhere)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def memory_child(path: str, total: int) -> None:
    """Run in a child: stream the file through check_records, report peak RSS."""
    from processors.tools.checker import CheckTotals, check_records, read_records

    checkpoints = {total // 8, total // 4, total // 2, total}
    marks: list[tuple[int, float]] = [(0, _rss_mb())]

    def counted(stream: Any) -> Iterator[bytes]:
        for index, raw in enumerate(read_records(stream), 1):
            if index in checkpoints:
                marks.append((index, _rss_mb()))
            yield raw

    totals = CheckTotals()
    start = time.perf_counter()
    runs = failed = 0
    with open(path, "rb") as stream:
        for report in check_records(counted(stream), totals):
            runs += 1
            failed += report.outcome == "failed"
    elapsed = time.perf_counter() - start
    marks.append((totals.lines, _rss_mb()))
    print(orjson.dumps({"marks": marks, "runs": runs, "failed": failed,
                        "lines": totals.lines, "seconds": elapsed}).decode())


_BARE_DECODE = ("import sys, orjson\n"
                "with open(sys.argv[1], 'rb') as f:\n"
                "    for line in f:\n"
                "        if line.strip():\n"
                "            orjson.loads(line)\n")


def _timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, check=False, cwd=REPO)
    return time.perf_counter() - started


def file_check(events: int, seed: int, repeat: int) -> None:
    """`agui-stream check FILE --json` on a file of runs as sent, against a bare
    decode loop over the same lines (both child processes, best of `repeat`),
    and the checker's peak memory along the file."""
    rng = random.Random(seed + 1)
    thread_ids: dict[str, str] = {}
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as out:
        path = out.name
        written = run = 0
        size = 0
        while written < events:
            for event in as_sent(rng, generate_run(rng, 0, run), thread_ids):
                line = orjson.dumps(event) + b"\n"
                out.write(line)
                size += len(line)
                written += 1
            run += 1
    try:
        print(f"\nthe check command on a file: {written:,} events as sent ({size / 1e6:,.0f}"
              f" MB, {run:,} runs, one key), best of {repeat}")
        # `python -m` from this checkout: the installed `agui-stream` script may
        # import another checkout's code (an editable install).
        cli = [sys.executable, "-m", "processors.tools.cli"]
        command = min(_timed([*cli, "check", path, "--json"]) for _ in range(repeat))
        baseline = min(_timed([sys.executable, "-c", _BARE_DECODE, path])
                       for _ in range(repeat))
        print(f"  check --json : {written / command:>12,.0f} events/s ({command:.2f} s)")
        print(f"  bare decode  : {written / baseline:>12,.0f} events/s ({baseline:.2f} s,"
              " orjson.loads per line in a child)")
        print(f"  ratio        : {baseline / command:.3f} of the bare decode rate"
              " (target >= 350,000 events/s and >= 0.30)")
        done = subprocess.run(
            [sys.executable, __file__, "--memory-child", path, "--memory-events", str(written)],
            capture_output=True, check=True, text=True)
        result = orjson.loads(done.stdout.strip().splitlines()[-1])
        for index, rss in result["marks"]:
            print(f"  checker after {index:>10,} records: peak RSS {rss:7.1f} MB")
    finally:
        os.unlink(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--memory-events", type=int, default=1_000_000,
                        help="events in the file given to the check command (0: skip)")
    parser.add_argument("--memory-child", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.memory_events)
        return

    started = time.perf_counter()
    events = generate_events(args.events, args.keys, args.seed)
    corpora = {
        "as sent (timestamps, rawEvent on some)": [(k, orjson.dumps(e)) for k, e in events],
        "bare (the same events without them)": [(k, orjson.dumps(bare(e))) for k, e in events],
    }
    del events
    profile = corpus_profile(next(iter(corpora.values())))
    print(f"corpus: {profile['records']:,} records, {profile['bytes'] / 1e6:,.1f} MB as sent,"
          f" {profile['runs']:,.0f} runs over {profile['keys']:,.0f} keys (UUID ids),"
          f" {profile['reasoning_delta_share']:.0%} reasoning deltas of 1-200 bytes,"
          f" {profile['encrypted_values']:,.0f} encrypted values of 1-4 KB"
          f" (generated in {time.perf_counter() - started:.1f} s, seed {args.seed})")
    print(f"python {sys.version.split()[0]}, one core, best of {args.repeat}")
    for name, records in corpora.items():
        engine_times = []
        baseline_times = []
        decided = 0
        for _ in range(args.repeat):
            elapsed, decided, _open = bench_engine(records, args.keys)
            engine_times.append(elapsed)
            baseline_times.append(bench_baseline(records))
        n = len(records)
        mb = sum(len(r) for _, r in records) / 1e6
        engine_best, baseline_best = min(engine_times), min(baseline_times)
        print(f"\n{name}:")
        print(f"  engine   : {n / engine_best:>12,.0f} events/s  {mb / engine_best:8.1f} MB/s"
              f"  (best {engine_best:.3f} s; all {', '.join(f'{t:.2f}' for t in engine_times)})"
              f"  {decided:,} decisions")
        print(f"  baseline : {n / baseline_best:>12,.0f} events/s  {mb / baseline_best:8.1f}"
              f" MB/s  (bare orjson.loads; best {baseline_best:.3f} s)")
        print(f"  ratio    : {baseline_best / engine_best:.3f} of the bare decode rate"
              " (target >= 0.40 as sent)")
    del corpora
    gc.collect()
    if args.memory_events:
        file_check(args.memory_events, args.seed, min(args.repeat, 3))

if __name__ == "__main__":
    main()
