"""The thread view on a real broker: API latency, state bytes per message, lag at full rate.

    PYTHONPATH=. .venv/bin/python benchmarks/view_bench.py [--events N] [--requests R]
                                              [--sizes 10,100,1000] [--seed S]
                                              [--no-rocksdb] [--only PART] [--keep-topics]

Uses the broker in ``KAFKA_BOOTSTRAP_SERVERS`` if set, else starts the local
KRaft broker of ``deploy/kafka_local.py`` for the duration of the run (as
``service_bench.py`` does). Every part uses its own topics and consumer group,
and every worker it starts is stopped before it exits, on an error or Ctrl-C
too. Each part runs on a memory:// worker and again on a rocksdb:// one (unless
``--no-rocksdb``). Nothing of the messages' content is printed.

Runs are ``tests/run_generator.py``'s (a reasoning message with an encrypted
value, an answer, a tool call: 2 messages each), with 20-60 reasoning deltas
of ~20 B, an encrypted value of 1-4 KB (base64) and a ``timestamp`` on every
event.

1. **GET latency.** Threads of 10, 100 and 1,000 messages (``--sizes``), each
   built from runs on one thread key, are produced; once each thread's last
   run is in the view (``?run=<runId>``), R (``--requests``, 200) rounds, after
   a warm-up, each ``GET /healthz`` (the baseline: a trivial route of the same
   server) and ``GET /v1/threads/{id}/messages`` for every size, and for the
   largest size its first and its newest page of 100 (``limit=100``, with
   ``order=desc``), in turn, on one keep-alive HTTP connection: p50/p99 per
   route.
2. **State bytes per message.** The worker's ``thread-view`` changelog, read
   ``read_committed`` and kept latest per key (compaction), once it holds every
   message of part 1: key+value bytes per message held, by entry kind (H, M,
   I, R, J, P), next to the history topic's key+value bytes per message record
   for the same messages.
3. **The view at full rate.** N (``--events``, 200,000) events of interleaved
   runs (``interleaved_runs``, ~20 events per run, 6 runs per key) are produced
   first; a fresh worker then processes them flat out. Every 0.5 s: its
   /metrics (``agui_events_total``, the sum of ``agui_consumer_lag_records``,
   the max of ``agui_view_lag_records``; both gauges are set by the worker every
   10 s). (``historyOffset`` is a thread's own offset, not its partition's, so
   the API no longer tells the partition's lag.) For the 8
   threads whose runs end last, the time from their last run's closing record
   becoming visible to a ``read_committed`` consumer until the API answers
   ``?run=`` for it. Also the worker's events/s and CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import math
import random
import re
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from service_bench import (  # benchmarks/: this script's directory; puts the repo on sys.path
    broker,
    cpu_seconds,
    delete_topics,
    log_problems,
    metric_value,
    read_topic,
)

from tests.run_generator import generate_run, interleaved_runs
from tests.service_harness import (
    VIEW_TOKEN,
    Namespace,
    Worker,
    produce,
    view_tokens_file,
    wait_for,
)
from topics.declarations import VIEW_TABLE, changelog_topic

TENANT = "default"  # records without a tenant header; VIEW_TOKEN is its token
AUTH = {"Authorization": f"Bearer {VIEW_TOKEN}"}
Record = tuple[bytes, bytes, list[tuple[str, bytes]]]  # key, value, headers: `produce`'s
ENTRY_KINDS = {b"H": "header", b"M": "message", b"I": "message index", b"R": "run",
               b"J": "run index", b"P": "read offset"}


def dressed(rng: random.Random, event: bytes, when_ms: int) -> bytes:
    """`event` as a server sends it: with a timestamp, and an encrypted value of 1-4 KB."""
    fields = orjson.loads(event)
    fields["timestamp"] = when_ms
    if fields["type"] == "REASONING_ENCRYPTED_VALUE":
        fields["encryptedValue"] = base64.b64encode(rng.randbytes(rng.randint(768, 3072))
                                                    ).decode()
    return orjson.dumps(fields)


def thread_records(rng: random.Random, thread: str, runs: int, start_ms: int
                   ) -> tuple[list[Record], str]:
    """A thread of `runs` runs (2 messages each) in sequence; and its last run's id."""
    records: list[Record] = []
    when = start_ms
    run_id = ""
    for number in range(runs):
        run = generate_run(rng, thread, number, deltas=rng.randint(20, 60))
        for event in run.events:
            when += rng.randint(5, 60)
            records.append((run.key, dressed(rng, event, when), []))
        run_id = run.run_id
        when += rng.randint(2_000, 30_000)  # the user's next turn
    return records, run_id


class Api:
    """One keep-alive HTTP connection to a worker, authorized as `TENANT`."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def get(self, path: str) -> tuple[float, int, bytes]:
        """Seconds from sending the request to having read the whole body; status; body."""
        started = time.perf_counter()
        self.connection.request("GET", path, headers=AUTH)
        response = self.connection.getresponse()
        body = response.read()
        return time.perf_counter() - started, response.status, body

    def close(self) -> None:
        self.connection.close()


def get_once(port: int, path: str, timeout: float = 30) -> tuple[int, dict[str, Any]]:
    """One request on a connection of its own (for the part-3 probes, from threads)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=AUTH)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, {}


def wait_for_run(port: int, thread: str, run_id: str, timeout: float) -> dict[str, Any]:
    """The thread's messages once `run_id` is in the view (`?run=` waits 10 s at most:
    asked again until `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        status, body = get_once(port, f"/v1/threads/{thread}/messages?run={run_id}")
        if status == 200:
            return body
        if time.monotonic() > deadline:
            raise RuntimeError(f"{thread}: its last run is not in the view after {timeout} s"
                               f" (last answer {status})")
        time.sleep(0.2)


def quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def metric_max(text: str, name: str) -> float:
    values = [float(v) for v in re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)]
    return max(values, default=math.nan)


@dataclass
class Bench:
    """What main hands every part: where to log, and what to stop and delete at the end."""

    bootstrap: str
    log_dir: Path
    tokens: str
    seed: int
    workers: list[Worker] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)

    def worker(self, name: str, store: str) -> tuple[Namespace, Worker]:
        ns = Namespace(self.bootstrap)
        self.prefixes.append(ns.prefix)
        ns.create_topics()
        worker = Worker(ns, self.log_dir, name=name, AGUI_STORE=store,
                        AGUI_PROCESSING_GUARANTEE="exactly_once",
                        AGUI_TOKENS_FILE=self.tokens)
        self.workers.append(worker)
        return ns, worker

    def close(self, keep_topics: bool) -> None:
        """Stop every worker started (any still running), delete the topics, the stores."""
        for worker in self.workers:
            worker.stop()
        if not keep_topics:
            delete_topics(self.bootstrap, self.prefixes)
        for data in self.log_dir.glob("*-data"):
            shutil.rmtree(data, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# 1. GET latency, and 2. state bytes per message
# ---------------------------------------------------------------------------------------


def part_latency(bench: Bench, store: str, sizes: list[int], requests: int,
                 warmup: int) -> None:
    print(f"\n== 1. GET latency, one worker ({store}) ==")
    rng = random.Random(bench.seed)
    ns, worker = bench.worker(f"latency-{store.split(':')[0]}", store)
    worker.start()
    try:
        start_ms = int(time.time() * 1000) - 3_600_000
        threads: dict[int, tuple[str, str]] = {}
        records: list[Record] = []
        for size in sizes:
            thread = f"thread-{size}"
            made, last_run = thread_records(rng, thread, size // 2, start_ms)
            records += made
            threads[size] = (thread, last_run)
        produce(bench.bootstrap, ns.events, records)
        size_bytes = sum(len(k) + len(v) for k, v, _ in records)
        print(f"  produced {len(records):,} events, {size_bytes / len(records):,.0f} B/event,"
              f" for threads of {', '.join(map(str, sizes))} messages")
        for size, (thread, last_run) in threads.items():
            held = len(wait_for_run(worker.port, thread, last_run, 300)["messages"])
            if held != size:
                raise RuntimeError(f"{thread}: {held} messages in the view,"
                                   f" {size} expected")

        routes = [("/healthz", "GET /healthz (baseline)")] + [
            (f"/v1/threads/{thread}/messages", f"GET messages, {size:,} messages")
            for size, (thread, _) in threads.items()]
        largest, (largest_thread, _) = max(threads.items())
        routes += [(f"/v1/threads/{largest_thread}/messages?limit=100{order}",
                    f"GET {label} 100 of {largest:,} messages")
                   for order, label in (("", "first"), ("&order=desc", "newest"))]
        timings: dict[str, list[float]] = {path: [] for path, _ in routes}
        body_bytes: dict[str, int] = {}
        api = Api(worker.port)
        try:
            for round_number in range(warmup + requests):
                for path, _ in routes:  # interleaved: every route sees the same load
                    seconds, status, body = api.get(path)
                    if status != 200:
                        raise RuntimeError(f"{path}: {status}")
                    body_bytes[path] = len(body)
                    if round_number >= warmup:
                        timings[path].append(seconds)
        finally:
            api.close()
        base = quantile(timings["/healthz"], 0.5)
        print(f"  {requests} requests per route after {warmup} warm-up rounds, one keep-alive"
              " connection, routes interleaved:")
        for path, label in routes:
            p50, p99 = quantile(timings[path], 0.5), quantile(timings[path], 0.99)
            print(f"  {label:34} body {body_bytes[path]:>10,} B  p50 {p50 * 1000:7.2f} ms"
                  f"  p99 {p99 * 1000:7.2f} ms  max {max(timings[path]) * 1000:7.2f} ms"
                  f"  p50 / healthz p50 {p50 / base:6.1f}")
        part_state(bench, ns, sum(sizes))
    finally:
        worker.stop()


def part_state(bench: Bench, ns: Namespace, held: int) -> None:
    print(f"\n== 2. state bytes per message held ({held:,} messages) ==")
    changelog = changelog_topic(ns.app_id, VIEW_TABLE)
    latest: dict[bytes, bytes | None] = {}

    def committed() -> bool:  # the view's entries commit write-behind, a commit later
        latest.clear()
        latest.update(read_topic(bench.bootstrap, changelog))
        return sum(1 for k, v in latest.items() if k[:1] == b"M" and v is not None) >= held

    wait_for(committed, 60, "the view's changelog to hold every message")
    records = len(latest)
    kept = {k: v for k, v in latest.items() if v is not None}
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for key, value in kept.items():
        kind = ENTRY_KINDS.get(key[:1], "other")
        counts[kind] += 1
        sizes[kind] += len(key) + len(value or b"")
    total = sum(sizes.values())
    print(f"  thread-view changelog, latest per key: {len(kept):,} entries ({records:,} keys),"
          f" {total:,} B key+value: {total / held:,.0f} B per message held")
    for kind in ENTRY_KINDS.values():
        if counts[kind]:
            print(f"    {kind:14} {counts[kind]:>6,} entries {sizes[kind]:>12,} B "
                  f"({sizes[kind] / counts[kind]:,.0f} B each, {sizes[kind] / held:,.1f} B per"
                  " message)")
    history: Counter[str] = Counter()
    history_bytes: Counter[str] = Counter()
    for record_key, record in read_topic(bench.bootstrap, ns.history):
        kind = orjson.loads(record or b"{}").get("kind", "other")
        history[kind] += 1
        history_bytes[kind] += len(record_key) + len(record or b"")
    messages = history["message"]
    per_record = history_bytes["message"] / max(1, messages)
    print(f"  history topic: {messages:,} message records, {history_bytes['message']:,} B key+"
          f"value: {per_record:,.0f} B per message record; "
          f"with its {history['run']:,} run records "
          f"{sum(history_bytes.values()) / max(1, messages):,.0f} B per message")
    print(f"  view bytes per message / history bytes per message record: "
          f"{total / held / per_record:.3f} (Kafka record headers not counted)")


# ---------------------------------------------------------------------------------------
# 3. the view at full rate
# ---------------------------------------------------------------------------------------


@dataclass
class Sample:
    at: float  # seconds since the worker started
    events: float
    consumer_lag: float
    view_lag: float  # the metric (set every 10 s)


async def _watch(worker: Worker, bootstrap: str, history: str, partitions: int, total: int,
                 runs: int, last_runs: dict[str, str],
                 started: float) -> tuple[list[Sample], dict[str, float], int]:
    """Samples every 0.5 s until every event is processed, every closing record is
    read_committed, the sampled threads' last runs are in the view and the view's lag
    metric has come back down (or 15 s after the rest): the samples, per sampled
    thread seconds from its closing record read_committed to the API having it,
    closing records seen."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                isolation_level="read_committed", auto_offset_reset="earliest")
    await consumer.start()
    tps = [TopicPartition(history, p) for p in range(partitions)]
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    samples: list[Sample] = []
    seen: dict[str, float] = {}
    in_view: dict[str, float] = {}
    pending: list[asyncio.Task[None]] = []
    closing = 0
    done_at: float | None = None

    async def track(thread: str, run_id: str) -> None:
        await asyncio.to_thread(wait_for_run, worker.port, thread, run_id, 120)
        in_view[thread] = time.monotonic()

    try:
        deadline = time.monotonic() + 900
        next_sample = 0.0
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{closing}/{runs} closing records after 900 s\n"
                                   + worker.log_tail())
            if worker.process is not None and worker.process.poll() is not None:
                raise RuntimeError("the worker exited\n" + worker.log_tail())
            if time.monotonic() >= next_sample:
                next_sample = time.monotonic() + 0.5
                text = await asyncio.to_thread(worker.metrics)
                samples.append(Sample(
                    time.perf_counter() - started, metric_value(text, "agui_events_total"),
                    metric_value(text, "agui_consumer_lag_records"),
                    metric_max(text, "agui_view_lag_records")))
                last = samples[-1]
                if (done_at is None and last.events >= total and closing >= runs
                        and len(in_view) == len(last_runs)):
                    done_at = time.monotonic()
                if done_at is not None and time.monotonic() > done_at + 11:
                    break  # the worker has set its lag gauges once since it was done
            batch = await consumer.getmany(timeout_ms=50, max_records=50_000)
            now = time.monotonic()
            for messages in batch.values():
                for message in messages:
                    record = orjson.loads(message.value)
                    if record.get("kind") != "run":
                        continue
                    closing += 1
                    thread = record.get("threadId")
                    if last_runs.get(thread) == record.get("runId"):
                        seen[thread] = now
                        pending.append(asyncio.create_task(track(thread, record["runId"])))
        await asyncio.gather(*pending)
        return samples, {t: in_view[t] - seen[t] for t in seen}, closing
    finally:
        for task in pending:
            task.cancel()
        await consumer.stop()


def part_full_rate(bench: Bench, store: str, events: int) -> None:
    print(f"\n== 3. the view at full rate, one fresh worker ({store}) ==")
    runs_per_key = 6
    keys = max(1, round(events / (19.5 * runs_per_key)))
    runs, raw = interleaved_runs(bench.seed, keys, runs_per_key)
    rng = random.Random(bench.seed)
    start_ms = int(time.time() * 1000) - 3_600_000
    records: list[Record] = [
        (key, dressed(rng, value, start_ms + index * 10), [])
               for index, (key, value) in enumerate(raw)]
    ns, worker = bench.worker(f"fullrate-{store.split(':')[0]}", store)
    clock = time.perf_counter()
    produce(bench.bootstrap, ns.events, records)
    total = len(records)
    print(f"  input: {total:,} events, {len(runs):,} runs over {keys:,} keys, "
          f"{sum(len(k) + len(v) for k, v, _ in records) / total:,.0f} B/event, "
          f"{ns.partitions} partitions (produced in {time.perf_counter() - clock:.1f} s)")
    last_position = {key: index for index, (key, _, _) in enumerate(records)}
    ending = sorted(last_position, key=last_position.__getitem__)[-8:]
    last_runs = {key.decode(): f"{key.decode()}-run{runs_per_key - 1}" for key in ending}
    started = time.perf_counter()
    worker.start()
    assert worker.process is not None
    cpu_start = cpu_seconds(worker.process.pid)
    try:
        samples, delays, closing = asyncio.run(_watch(
            worker, bench.bootstrap, ns.history, ns.partitions, total, len(runs),
            last_runs, started))
        cpu = cpu_seconds(worker.process.pid) - cpu_start
    finally:
        worker.stop()
    report_full_rate(samples, delays, closing, len(runs), total, cpu)


def report_full_rate(samples: list[Sample], delays: dict[str, float], closing: int, runs: int,
                     total: int, cpu: float) -> None:
    print("  t (s)   events   consumer lag  view lag (metric)")
    for index, sample in enumerate(samples):
        if index % 4 == 0 or index == len(samples) - 1:
            print(f"  {sample.at:5.1f} {sample.events:>9,.0f} {sample.consumer_lag:>12,.0f}"
                  f" {sample.view_lag:>16,.0f}")
    done = next(s for s in samples if s.events >= total)
    idle = [s for s in samples if s.events == 0]  # before the first record was processed
    first = idle[-1] if idle else samples[0]
    processing = [s for s in samples if s.at <= done.at]
    metric = [s.view_lag for s in processing if not math.isnan(s.view_lag)]
    rate = (total - first.events) / max(1e-9, done.at - first.at)
    print(f"  worker: {rate:,.0f} events/s by agui_events_total ({total - first.events:,.0f}"
          f" events in {done.at - first.at:.1f} s, from the last sample before it processed"
          f" any; {done.at:.1f} s from its start), CPU {cpu:.0f} s (start to end), closing"
          f" records {closing:,}/{runs:,}")
    print(f"  view lag while processing: metric max {max(metric, default=math.nan):,.0f}"
          f" records ({len(metric)} samples set); at the end: {samples[-1].view_lag:,.0f};"
          f" consumer lag max {max(s.consumer_lag for s in processing):,.0f}")
    values = sorted(delays.values())
    print(f"  last run's closing record read_committed -> in the view (?run=), "
          f"{len(values)} threads that end last: p50 {quantile(values, 0.5) * 1000:.0f} ms, "
          f"max {values[-1] * 1000:.0f} ms")


# ---------------------------------------------------------------------------------------


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000,
                        help="events produced for part 3 (default 200,000)")
    parser.add_argument("--requests", type=int, default=200,
                        help="timed requests per route in part 1 (default 200)")
    parser.add_argument("--warmup", type=int, default=20,
                        help="untimed rounds before them (default 20)")
    parser.add_argument("--sizes", default="10,100,1000",
                        help="messages per thread in part 1, even numbers (default 10,100,1000)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-rocksdb", action="store_true", help="memory:// workers only")
    parser.add_argument("--only", choices=["latency", "full-rate"],
                        help="part 1 and 2 (latency), or part 3 (full-rate) only")
    parser.add_argument("--keep-topics", action="store_true")
    args = parser.parse_args(None if argv is None else list(argv))
    sizes = [int(size) for size in args.sizes.split(",")]
    stores = ["memory://"] + ([] if args.no_rocksdb else ["rocksdb://"])

    log_dir = Path(tempfile.mkdtemp(prefix="agui-view-bench-"))
    started = time.perf_counter()
    print(f"worker logs: {log_dir}")
    with broker() as bootstrap:
        bench = Bench(bootstrap, log_dir, view_tokens_file(log_dir), args.seed)
        try:
            if args.only in (None, "latency"):
                for store in stores:
                    part_latency(bench, store, sizes, args.requests, args.warmup)
            if args.only in (None, "full-rate"):
                for store in stores:
                    part_full_rate(bench, store, args.events)
        finally:
            bench.close(args.keep_topics)
    print("\nworker logs:", *(log_problems(log_dir) or ["no error lines"]), sep="\n  ")
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
