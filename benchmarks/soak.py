"""A worker under a memory limit, fed for minutes with what hurts a shared worker.

    .venv/bin/python benchmarks/soak.py [--minutes M] [--rate R] [--limit-mib L]
                                        [--store rocksdb://|memory://]

Uses the broker in ``KAFKA_BOOTSTRAP_SERVERS`` if set, else starts the local KRaft
broker. One worker (``--store``, default ``rocksdb://`` as in production; 4
partitions) runs under ``prlimit --as`` (its
address space capped at ``--limit-mib``, default 3 GiB) with small limits:
``AGUI_RUN_MAX_CONTENT_CHARS`` 200,000, ``AGUI_TENANT_MAX_OPEN_RUNS`` 150 (per
partition) and an idle timeout of 60 s. For ``--minutes`` (default 10) it is fed, at
about ``--rate`` records per second (default 2,000):

* normal runs (``tests/run_generator.py``: a span, a reasoning message with an
  encrypted value, a chunked answer, a tool call) of four tenants;
* runs that never end (a tenant ``idle``): each is held until the idle timeout
  abandons it;
* runs far over the content limit (a tenant ``huge``: 400,000 characters each);
* a flood from one tenant (``flood``: runs that never end, ten times the rate of
  the others), which its open-run limit stops.

Every 5 s it samples the worker's RSS (VmRSS), its open runs and the threads its
view holds (every run makes or touches a thread, kept for the view's retention:
with ``memory://`` the view's table is in memory too). At the end it waits for
every normal run's closing record and checks each published whole; it prints RSS
minute by minute (min, max) and what each kind of run became. The worker must not
exit (one start) and its RSS must level off, not grow with the runs sent.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from service_bench import broker, rss_bytes  # noqa: E402  (benchmarks/ is this directory)

from tests.run_generator import generate_run  # noqa: E402
from tests.service_harness import Namespace, TopicReader, Worker, wait_for  # noqa: E402

NORMAL_TENANTS = ("acme", "globex", "initech", "umbrella")
_OPEN = re.compile(r"^agui_open_runs (\S+)$", re.M)
_THREADS = re.compile(r"^agui_view_threads (\S+)$", re.M)


def dumps(event: dict[str, Any]) -> bytes:
    return orjson.dumps(event)


class Sampler(threading.Thread):
    """RSS, open runs and view threads of the worker every 5 s."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(daemon=True)
        self.worker = worker
        self.samples: list[tuple[float, int, float, float]] = []
        self.done = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while not self.done.wait(5.0):
            assert self.worker.process is not None
            try:
                rss = rss_bytes(self.worker.process.pid)
                scraped = self.worker.metrics()
            except (OSError, RuntimeError):
                continue
            self.samples.append((time.monotonic() - started, rss, gauge(_OPEN, scraped),
                                 gauge(_THREADS, scraped)))


def gauge(pattern: re.Pattern[str], scraped: str) -> float:
    found = pattern.search(scraped)
    return float(found.group(1)) if found else -1.0


async def feed(bootstrap: str, topic: str, minutes: float, rate: float,
               sent: dict[str, list[Any]]) -> None:
    """Produce the mix for `minutes`, paced to about `rate` records per second."""
    rng = random.Random(11)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20,
                                max_request_size=4_000_000, enable_idempotence=True)
    await producer.start()
    try:
        deadline = time.monotonic() + minutes * 60
        second, sequence = time.monotonic(), 0
        budget = 0.0
        while time.monotonic() < deadline:
            sequence += 1
            records: list[tuple[bytes, bytes, str]] = []
            tenant = NORMAL_TENANTS[sequence % len(NORMAL_TENANTS)]
            run = generate_run(rng, f"{tenant}-thread-{sequence % 500}", sequence)
            run.key = f"{tenant}-{sequence}".encode()
            sent["normal"].append((tenant, run))
            records += [(run.key, event, tenant) for event in run.events]
            if sequence % 8 == 0:  # a run that never ends (fewer than its tenant may open)
                key = f"idle-{sequence}".encode()
                records += [(key, dumps(e), "idle") for e in (
                    {"type": "RUN_STARTED", "threadId": f"idle-{sequence}", "runId": "r"},
                    {"type": "REASONING_MESSAGE_START", "messageId": "m", "role": "reasoning"},
                    {"type": "REASONING_MESSAGE_CONTENT", "messageId": "m", "delta": "hmm"})]
                sent["idle"].append(key)
            if sequence % 40 == 0:  # a run far over the content limit
                key = f"huge-{sequence}".encode()
                records += [(key, dumps(e), "huge") for e in (
                    {"type": "RUN_STARTED", "threadId": f"huge-{sequence}", "runId": "r"},
                    {"type": "TEXT_MESSAGE_START", "messageId": "m"},
                    *({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "x" * 40_000}
                      for _ in range(10)),
                    {"type": "TEXT_MESSAGE_END", "messageId": "m"},
                    {"type": "RUN_FINISHED", "threadId": f"huge-{sequence}", "runId": "r"})]
                sent["huge"].append(key)
            for flood in range(10):  # one tenant opening runs it never ends
                key = f"flood-{sequence}-{flood}".encode()
                records.append((key, dumps({"type": "RUN_STARTED",
                                            "threadId": key.decode(), "runId": "r"}), "flood"))
                sent["flood"].append(key)
            for key, value, who in records:
                await producer.send(topic, value=value, key=key,
                                    headers=[("tenant", who.encode())])
            budget += len(records)
            if budget >= rate:  # a second's worth sent: wait for the second to pass
                budget = 0.0
                await asyncio.sleep(max(0.0, second + 1.0 - time.monotonic()))
                second = time.monotonic()
        await producer.flush()
    finally:
        await producer.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=2_000.0)
    parser.add_argument("--limit-mib", type=int, default=3072)
    parser.add_argument("--store", default="rocksdb://", choices=["rocksdb://", "memory://"])
    args = parser.parse_args()
    prlimit = shutil.which("prlimit")
    wrapper = (prlimit, f"--as={args.limit_mib * 1024 * 1024}") if prlimit else ()
    print(f"memory limit: {'prlimit --as=' + str(args.limit_mib) + ' MiB' if prlimit else 'none'}"
          " on the worker")
    with broker() as bootstrap, tempfile.TemporaryDirectory() as scratch:
        namespace = Namespace(bootstrap)
        namespace.create_topics()
        worker = Worker(namespace, Path(scratch), wrapper=wrapper, AGUI_STORE=args.store,
                        AGUI_RUN_MAX_CONTENT_CHARS="200000", AGUI_TENANT_MAX_OPEN_RUNS="150",
                        AGUI_IDLE_TIMEOUT_SECONDS="60").start()
        sampler = Sampler(worker)
        sampler.start()
        sent: dict[str, list[Any]] = defaultdict(list)
        started = time.monotonic()
        asyncio.run(feed(bootstrap, namespace.events, args.minutes, args.rate, sent))
        print(f"fed {args.minutes:g} min in {time.monotonic() - started:.0f} s:"
              f" {len(sent['normal'])} normal runs, {len(sent['idle'])} never ending,"
              f" {len(sent['huge'])} over the content limit, {len(sent['flood'])} flood")
        expected = {(tenant, run.run_id): run for tenant, run in sent["normal"]}
        history = TopicReader(bootstrap, namespace.history)

        def every_normal_run_closed() -> bool:
            history.poll()
            closed = {(r.value["tenant"], r.value.get("runId")) for r in history.records
                      if r.value["kind"] == "run" and r.value["tenant"] in NORMAL_TENANTS}
            return expected.keys() <= closed

        wait_for(every_normal_run_closed, 600, "every normal run's closing record",
                 worker.log_tail)
        sampler.done.set()
        alive = worker.process is not None and worker.process.poll() is None
        deadletters = TopicReader(bootstrap, namespace.deadletter)
        deadletters.poll()
        worker.stop()

    messages: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    endings: Counter[tuple[str, str]] = Counter()
    for record in history.records:
        value = record.value
        if value["kind"] == "message":
            messages[(value["tenant"], value["runId"])].append(value)
        elif value["kind"] == "run":
            endings[(value["tenant"], value.get("failure", {}).get("code", value["outcome"]))] += 1
    whole = sum(1 for key, run in expected.items()
                if [m["message"] for m in sorted(messages[key], key=lambda m: m["seq"])]
                == run.messages)
    print(f"worker alive at the end: {alive}, started {worker.starts} time(s)")
    print(f"normal runs published whole: {whole}/{len(expected)}")
    for (tenant, ending), count in sorted(endings.items()):
        print(f"  {tenant:9} {ending:24} {count}")
    codes = Counter(r.value["code"] for r in deadletters.records)
    print("dead letters: " + ", ".join(f"{code} {n}" for code, n in codes.most_common()))
    print(f"RSS of the worker ({args.store}), minute by minute (MiB, min-max); open runs"
          " and view threads at the minute's end:")
    by_minute: dict[int, list[tuple[int, float, float]]] = defaultdict(list)
    for at, rss, open_runs, threads in sampler.samples:
        by_minute[int(at // 60)].append((rss, open_runs, threads))
    for minute, samples in sorted(by_minute.items()):
        sizes = [rss for rss, _, _ in samples]
        print(f"  minute {minute:2}: {min(sizes) / 2**20:7.1f} - {max(sizes) / 2**20:7.1f}"
              f"   open runs {samples[-1][1]:6.0f}   view threads {samples[-1][2]:8.0f}")
    return 0 if alive and worker.starts == 1 and whole == len(expected) else 1


if __name__ == "__main__":
    sys.exit(main())
