"""Throughput of the rule engine, from raw record bytes to decisions.

    .venv/bin/python benchmarks/engine_bench.py [--events N] [--keys K] [--repeat R]
                                                [--memory-events M] [--seed S]

Generates (seeded, deterministic) a realistic corpus of record values: many
runs over many run keys (each key its own KeyEngine, records of the keys
interleaved as on a partition), about 60% reasoning deltas of 20-200 bytes,
chunks, text messages, tool calls with arguments, encrypted values of 1-4 KB,
spans and steps. It then measures, best of R, on the same records:

* the engine: `engines[key].feed(raw)` for every record (events/s, MB/s);
* the baseline: a bare `orjson.loads(raw)` loop;

and reports the ratio. Finally it streams a generated JSON-lines file of M
events (one key, many runs) through `processors.checker.check_records` in a
child process and prints its peak RSS at several points, to show that memory
follows the open run, not the file.

Targets (issue 2): >= 300k events/s on one core, >= 0.25 of the bare decode rate.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from processors.engine.engine import KeyEngine

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
            for _ in range(rng.randint(8, 30)):
                add({"type": "REASONING_MESSAGE_CONTENT", "messageId": mid,
                     "delta": text(rng, 20, 200)})
            add({"type": "REASONING_MESSAGE_END", "messageId": mid})
        else:
            lane = rng.choice((None, None, "sub-1"))
            first: dict[str, Any] = {"type": "REASONING_MESSAGE_CHUNK", "messageId": mid,
                                     "delta": text(rng, 20, 200)}
            if lane is not None:
                first["subagentRunId"] = lane
            add(first)
            for _ in range(rng.randint(8, 30)):
                chunk: dict[str, Any] = {"type": "REASONING_MESSAGE_CHUNK",
                                         "delta": text(rng, 20, 200)}
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


def generate_corpus(events: int, keys: int, seed: int) -> list[tuple[int, bytes]]:
    """At least `events` records of `keys` keys, interleaved run by run."""
    rng = random.Random(seed)
    pending: list[Iterator[dict[str, Any]]] = [iter(()) for _ in range(keys)]
    runs = [0] * keys
    records: list[tuple[int, bytes]] = []
    dumps = orjson.dumps
    while len(records) < events:
        key = rng.randrange(keys)
        # a burst of this key's events (partitions interleave keys, runs stay ordered)
        for _ in range(rng.randint(1, 16)):
            event = next(pending[key], None)
            if event is None:
                pending[key] = iter(generate_run(rng, key, runs[key]))
                runs[key] += 1
                event = next(pending[key])
            records.append((key, dumps(event)))
    return records


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
    from processors.checker import CheckTotals, check_records, read_records

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


def memory_check(events: int, seed: int) -> None:
    rng = random.Random(seed + 1)
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as out:
        path = out.name
        written = run = 0
        size = 0
        while written < events:
            for event in generate_run(rng, 0, run):
                line = orjson.dumps(event) + b"\n"
                out.write(line)
                size += len(line)
                written += 1
            run += 1
    try:
        print(f"\nchecker memory: streaming {written:,} events ({size / 1e6:,.0f} MB,"
              f" {run:,} runs, one key) through processors.checker.check_records")
        done = subprocess.run(
            [sys.executable, __file__, "--memory-child", path, "--memory-events", str(written)],
            capture_output=True, check=True, text=True)
        result = orjson.loads(done.stdout.strip().splitlines()[-1])
        for index, rss in result["marks"]:
            print(f"  after {index:>10,} records: peak RSS {rss:7.1f} MB")
        print(f"  {result['runs']:,} runs reported ({result['failed']} failed),"
              f" {result['lines'] / result['seconds']:,.0f} records/s end to end")
    finally:
        os.unlink(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--memory-events", type=int, default=2_000_000,
                        help="events in the file streamed through the checker (0: skip)")
    parser.add_argument("--memory-child", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.memory_events)
        return

    started = time.perf_counter()
    records = generate_corpus(args.events, args.keys, args.seed)
    profile = corpus_profile(records)
    mb = profile["bytes"] / 1e6
    print(f"corpus: {profile['records']:,} records, {mb:,.1f} MB, {profile['runs']:,.0f} runs"
          f" over {profile['keys']:,.0f} keys, {profile['reasoning_delta_share']:.0%} reasoning"
          f" deltas, {profile['encrypted_values']:,.0f} encrypted values"
          f" (generated in {time.perf_counter() - started:.1f} s, seed {args.seed})")
    print(f"python {sys.version.split()[0]}, one core, best of {args.repeat}")

    engine_times = []
    baseline_times = []
    decided = 0
    for _ in range(args.repeat):
        elapsed, decided, _open = bench_engine(records, args.keys)
        engine_times.append(elapsed)
        baseline_times.append(bench_baseline(records))
    n = len(records)
    engine_best = min(engine_times)
    baseline_best = min(baseline_times)
    engine_rate = n / engine_best
    baseline_rate = n / baseline_best
    ratio = engine_rate / baseline_rate
    print(f"\nengine   : {engine_rate:>12,.0f} events/s  {mb / engine_best:8.1f} MB/s"
          f"  (best {engine_best:.3f} s; all {', '.join(f'{t:.2f}' for t in engine_times)})"
          f"  {decided:,} decisions")
    print(f"baseline : {baseline_rate:>12,.0f} events/s  {mb / baseline_best:8.1f} MB/s"
          f"  (bare orjson.loads; best {baseline_best:.3f} s)")
    print(f"ratio    : {ratio:.3f} of the bare decode rate")
    print(f"targets  : >= 300,000 events/s {'MET' if engine_rate >= 300_000 else 'MISSED'};"
          f" >= 0.25 of decode {'MET' if ratio >= 0.25 else 'MISSED'}")
    del records
    gc.collect()
    if args.memory_events:
        memory_check(args.memory_events, args.seed)


if __name__ == "__main__":
    main()
