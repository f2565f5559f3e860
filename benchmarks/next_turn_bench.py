"""The next turn: how soon after a run ends its thread's history can start the next one.

    .venv/bin/python benchmarks/next_turn_bench.py [--turns N] [--background R]
                                                   [--deltas-per-second D] [--seed S]
                                                   [--env NAME=VALUE ...]

Uses the broker in ``KAFKA_BOOTSTRAP_SERVERS`` if set, else starts the local KRaft
broker of ``deploy/kafka_local.py``. One worker (exactly_once, memory://, 4
partitions unless ``--partitions``, the settings' defaults unless ``--env``
overrides them); with
``--baseline``, first another with the settings before issue 31 (2.8 s commits,
every key stored with each), on the same broker in the same run.

1. **Readiness, idle.** An agent server's turns, one after another on a few
   threads: each produces a run (RUN_STARTED, a text message of 8 deltas,
   RUN_FINISHED, with the tenant header), waits for the broker's ack of its
   RUN_FINISHED, then at once asks the thread API for the thread with that run
   (``GET /v1/threads/{t}/messages?run={r}``); the next turn starts as soon as the
   answer comes (back to back: the worst case for a commit timer). Readiness is
   the time from the ack to the answer. N turns (``--turns``, 60), p50/p95/p99.
2. **Readiness under load.** The same, while R runs (``--background``, 200)
   stream D deltas a second each (``--deltas-per-second``, 15: 3,000 records/s),
   each run 150 deltas long and followed by the next on its key.
3. **Changelog.** The changelog records and bytes the background runs' keys
   wrote (the run-state, run-text and thread-view changelogs) per background
   input record and input byte.
4. **Recovery after kill -9.** With the background streaming for 8 s, the worker
   (static membership) is killed with SIGKILL and restarted at once; recovery is
   the time from the restart to the answer of a turn produced right after it (the
   worker has then replayed what it had not committed, and caught up with what
   came meanwhile).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiokafka import AIOKafkaProducer

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from service_bench import (  # noqa: E402  (benchmarks/ is this script's directory)
    bench_worker,
    broker,
    commit_phases,
    cpu_seconds,
    delete_topics,
    quantile,
    read_topic,
    text,
)

from processors.view.tenant_tokens import token_line  # noqa: E402
from tests.service_harness import Worker, wait_for  # noqa: E402
from topics.declarations import TABLE_NAMES  # noqa: E402

TENANT, TOKEN = "acme", "next-turn-bench-token"
HEADERS = [("tenant", TENANT.encode())]
RUN_DELTAS = 150  # a background run's length
# The thread API's answers when its wait (10 s) ran out before the run was in the view.
_NOT_IN_TIME = ("wait_timeout", "thread_not_found")


def turn_events(thread: str, run_id: str, rng: random.Random) -> list[bytes]:
    message = f"{run_id}-m"
    events: list[dict[str, Any]] = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": run_id,
         "timestamp": int(time.time() * 1000)},
        {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"},
        *({"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": text(rng, 5, 60)}
          for _ in range(8)),
        {"type": "TEXT_MESSAGE_END", "messageId": message},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": run_id,
         "timestamp": int(time.time() * 1000)},
    ]
    return [orjson.dumps(event) for event in events]


async def turns(bootstrap: str, events_topic: str, port: int, count: int,
                rng: random.Random, name: str) -> list[float]:
    """`count` turns back to back; per turn, seconds from the RUN_FINISHED's ack to
    the thread API's answer with the run."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0,
                                enable_idempotence=True)
    await producer.start()
    readiness: list[float] = []
    try:
        async with aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=aiohttp.ClientTimeout(total=30)) as session:
            for number in range(count):
                thread, run_id = f"{name}-t{number % 5}", f"{name}-run{number}"
                values = turn_events(thread, run_id, rng)
                for value in values[:-1]:
                    await producer.send(events_topic, value, key=thread.encode(),
                                        headers=HEADERS)
                await producer.send_and_wait(events_topic, values[-1], key=thread.encode(),
                                             headers=HEADERS)
                acked = time.monotonic()
                url = f"http://127.0.0.1:{port}/v1/threads/{thread}/messages?run={run_id}"
                async with session.get(url) as answer:
                    body = await answer.json()
                if body.get("code") in _NOT_IN_TIME:  # the API's own wait ran out
                    readiness.append(math.inf)
                    continue
                if answer.status != 200 or body.get("run", {}).get("outcome") != "success":
                    raise RuntimeError(f"turn {run_id}: {answer.status} {body}")
                readiness.append(time.monotonic() - acked)
    finally:
        await producer.stop()
    return sorted(readiness)


class Background:
    """`runs` runs streaming `per_second` deltas a second each, each key's next run
    starting when its last one ends; counts what it produced."""

    def __init__(self, bootstrap: str, topic: str, runs: int, per_second: float,
                 rng: random.Random) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.runs, self.per_second, self.rng = runs, per_second, rng
        self.records = self.bytes = 0
        self.stopping = asyncio.Event()

    def run_values(self, key: int, number: int) -> list[bytes]:
        thread, run_id = f"bg-{key}", f"bg-{key}-run{number}"
        message = f"{run_id}-m"
        events: list[dict[str, Any]] = [
            {"type": "RUN_STARTED", "threadId": thread, "runId": run_id},
            {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"},
            *({"type": "TEXT_MESSAGE_CONTENT", "messageId": message,
               "delta": text(self.rng, 1, 60)} for _ in range(RUN_DELTAS)),
            {"type": "TEXT_MESSAGE_END", "messageId": message},
            {"type": "RUN_FINISHED", "threadId": thread, "runId": run_id},
        ]
        return [orjson.dumps(event) for event in events]

    async def stream(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5,
                                    enable_idempotence=True)
        await producer.start()
        queues = [self.run_values(key, 0) for key in range(self.runs)]
        positions = [0] * self.runs
        # Staggered: key k's first run starts k/runs of a run late, so runs end spread.
        late = [key * len(queues[0]) // self.runs for key in range(self.runs)]
        numbers = [0] * self.runs
        rate = self.runs * self.per_second
        started, sent = time.monotonic(), 0
        try:
            while not self.stopping.is_set():
                for key in range(self.runs):
                    if late[key]:
                        late[key] -= 1
                        continue
                    if positions[key] >= len(queues[key]):
                        numbers[key] += 1
                        queues[key], positions[key] = self.run_values(key, numbers[key]), 0
                    value = queues[key][positions[key]]
                    positions[key] += 1
                    name = f"bg-{key}".encode()
                    await producer.send(self.topic, value, key=name, headers=HEADERS)
                    self.records += 1
                    self.bytes += len(name) + len(value)
                    sent += 1
                    ahead = sent / rate - (time.monotonic() - started)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
            await producer.flush()
        finally:
            await producer.stop()


async def loaded_turns(bootstrap: str, topic: str, port: int, count: int, runs: int,
                       per_second: float, rng: random.Random) -> tuple[list[float], Background]:
    background = Background(bootstrap, topic, runs, per_second, rng)
    streaming = asyncio.ensure_future(background.stream())
    try:
        await asyncio.sleep(5.0)  # the background at its rate before the first turn
        readiness = await turns(bootstrap, topic, port, count, rng, "loaded")
    finally:
        background.stopping.set()
        await streaming
    return readiness, background


async def recovery(bootstrap: str, topic: str, worker: Worker, runs: int, per_second: float,
                   rng: random.Random) -> float:
    background = Background(bootstrap, topic, runs, per_second, rng)
    streaming = asyncio.ensure_future(background.stream())
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        await asyncio.sleep(8.0)  # streaming runs hold text past a checkpoint
        await asyncio.to_thread(worker.kill)
        restarted = time.monotonic()
        await asyncio.to_thread(worker.start)
        thread, run_id = "recovery-t", "recovery-run"
        for value in turn_events(thread, run_id, rng):
            await producer.send_and_wait(topic, value, key=thread.encode(), headers=HEADERS)
        url = (f"http://127.0.0.1:{worker.port}/v1/threads/{thread}/messages?run={run_id}")
        async with aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=aiohttp.ClientTimeout(total=30)) as session:
            while True:
                async with session.get(url) as answer:
                    if answer.status == 200:
                        return time.monotonic() - restarted
                await asyncio.sleep(0.05)  # not ready yet (503): ask again
    finally:
        background.stopping.set()
        await streaming
        await producer.stop()


def summary(readiness: list[float]) -> str:
    ms = [1000 * seconds for seconds in readiness]

    def shown(value: float) -> str:
        return f"{value:.0f} ms" if math.isfinite(value) else "> the API's 10 s wait"

    missed = sum(not math.isfinite(value) for value in ms)
    return (f"{len(ms)} turns: p50 {shown(quantile(ms, 0.5))}, p95 {shown(quantile(ms, 0.95))},"
            f" p99 {shown(quantile(ms, 0.99))}, max {shown(ms[-1])}"
            + (f"; {missed} not answered within the API's wait" if missed else ""))


class WorkerUse:
    """The worker's CPU and commits over one part."""

    def __init__(self, worker: Worker) -> None:
        assert worker.process is not None
        self.worker, self.pid = worker, worker.process.pid
        self.cpu, self.clock, self.scrape = (cpu_seconds(self.pid), time.monotonic(),
                                             worker.metrics())

    def __str__(self) -> str:
        cpu = (cpu_seconds(self.pid) - self.cpu) / (time.monotonic() - self.clock)
        return f"worker CPU {cpu:.0%}; {commit_phases(self.worker.metrics(), self.scrape)}"


# The settings before issue 31: Faust's 2.8 s commits, every key stored with each.
BEFORE = {"AGUI_COMMIT_INTERVAL_MS": "2800", "AGUI_CHECKPOINT_SECONDS": "0"}


def measure(bootstrap: str, scratch: Path, tokens: Path, name: str, env: dict[str, str],
            args: argparse.Namespace, rng: random.Random, workers: list[Worker],
            prefixes: list[str]) -> None:
    """Parts 1-4 on a worker of their own with `env`."""
    ns, worker = bench_worker(bootstrap, scratch, workers, prefixes, name, args.partitions,
                              AGUI_STORE="memory://", AGUI_GROUP_INSTANCE_ID=name,
                              AGUI_TOKENS_FILE=str(tokens), **env)
    wait_for(worker.ready, 120, "the worker to be ready", worker.log_tail)
    print(f"\n== worker settings: {env or 'defaults'}, {args.partitions} partitions ==")
    asyncio.run(turns(bootstrap, ns.events, worker.port, 10, rng, "warm-up"))
    use = WorkerUse(worker)
    idle = asyncio.run(turns(bootstrap, ns.events, worker.port, args.turns, rng, "idle"))
    print(f"1. readiness, idle worker:        {summary(idle)}"
          f" (targets: p50 <= 60 ms, p99 <= 150 ms)\n   {use}")
    use = WorkerUse(worker)
    loaded, background = asyncio.run(loaded_turns(
        bootstrap, ns.events, worker.port, args.turns, args.background,
        args.deltas_per_second, rng))
    print(f"2. readiness, {args.background} runs streaming "
          f"{args.deltas_per_second:g} deltas/s each: {summary(loaded)}"
          f" (target: p99 <= 250 ms)\n   {use}")
    records = size = 0
    for table in TABLE_NAMES:
        for key, value in read_topic(bootstrap, f"{ns.app_id}-{table}-changelog"):
            if b"bg-" in key:
                records += 1
                size += len(key) + len(value or b"")
    print(f"3. changelog of the background: {records:,} records, {size:,} B for "
          f"{background.records:,} input records, {background.bytes:,} B: "
          f"{records / background.records:.4f} records per input record (target"
          f" <= 0.05), {size / background.bytes:.3f} B per input byte (target < 1.2)")
    seconds = asyncio.run(recovery(bootstrap, ns.events, worker, args.background,
                                   args.deltas_per_second, rng))
    print(f"4. recovery after kill -9 under the background: {seconds:.1f} s from"
          " the restart to a new turn's answer")
    worker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--background", type=int, default=200)
    parser.add_argument("--deltas-per-second", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--env", action="append", default=[],
                        help="a worker setting NAME=VALUE (repeatable)")
    parser.add_argument("--baseline", action="store_true",
                        help="first the same parts with the settings before issue 31"
                             " (2.8 s commits, no checkpoints)")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    rng = random.Random(args.seed)
    workers: list[Worker] = []
    prefixes: list[str] = []
    with broker() as bootstrap, tempfile.TemporaryDirectory() as scratch:
        tokens = Path(scratch) / "tokens"
        tokens.write_text(token_line(TENANT, TOKEN) + "\n")
        try:
            if args.baseline:
                measure(bootstrap, Path(scratch), tokens, "before", {**BEFORE, **env}, args,
                        rng, workers, prefixes)
            measure(bootstrap, Path(scratch), tokens, "next-turn", env, args, rng, workers,
                    prefixes)
        finally:
            for worker in workers:
                worker.stop()
            delete_topics(bootstrap, prefixes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
