"""The service on a real broker: throughput, changelog bytes, memory per open run and
per concluded key.

    .venv/bin/python benchmarks/service_bench.py [--events N] [--repeat R] [--open-runs K]
                                                 [--deltas D] [--seed S] [--no-rocksdb]
                                                 [--no-at-least-once] [--only PART]

Uses the broker in ``KAFKA_BOOTSTRAP_SERVERS`` if set, else starts the local
KRaft broker of ``deploy/kafka_local.py`` for the duration of the run. Every
part uses its own topics and consumer groups (``tests/service_harness.py``),
and every worker it starts is stopped before it exits.

1. **Throughput.** N events of realistic valid runs (``tests/run_generator.py``
   ``interleaved_runs``: ~20 events per run, keys interleaved) are produced to
   the input topic first. Then, on those same records:

   * baselines: a bare aiokafka consume-and-produce passthrough (consumer
     group from the beginning, each value produced unchanged to another topic,
     offsets committed after each fetched batch), and a transactional one
     (transactional producer, ``send_offsets_to_transaction`` + commit every
     100 ms, and again at Faust's own cadence: every 10,000 records or 2.8 s);
     and the Faust floors: the worker's own Faust app with an agent that does
     nothing (``faust_floor.py``), on stock Faust classes and on the worker's
     adapted ones, the best any Faust agent can do here;
   * one ``agui-stream worker`` (exactly_once, memory:// and rocksdb://; and,
     for comparison only, at_least_once), each with its own consumer group,
     The two floors and the memory:// worker run R times (``--repeat``),
     interleaved, and their medians are compared: from one run to the next
     each varies by 20 % or more on a 2-core machine.
     timed from the first processed record (after /healthz answers) until its
     ``agui_events_total`` (scraped from /metrics every 0.25 s) reaches N, and
     until every run's closing history record is visible to a
     ``read_committed`` consumer. Its CPU use over that window is printed too.

   Rates count only the records processed after the clock started (the first
   batch seen is excluded), for the baselines and the worker alike.
2. **Changelog bytes per input byte.** One run, one key: RUN_STARTED,
   REASONING_MESSAGE_START, D (10,000) REASONING_MESSAGE_CONTENT deltas of
   20-200 bytes, REASONING_MESSAGE_END, RUN_FINISHED, produced in ten slices,
   each once the last one's text chunk is committed; after its closing record
   is committed, the key+value bytes of every record of the worker's
   ``run-state`` and ``run-text`` changelogs for that key are summed and divided
   by the key+value bytes of the input records. Again with 5-byte deltas (the
   worst case: fixed per-delta overhead over a tiny payload).
3. **Memory per open run.** One worker (memory://): its RSS (VmRSS) once idle
   and having processed nothing, then after K runs that each start and stream a
   short reasoning message but never finish (each under its own key); the
   difference divided by K. The serialized size per open run (its run-state
   value and run-text entries, from the changelogs) is printed as a lower bound.
   Then K more keys whose runs start, stream the same message and finish: the
   RSS they add, divided by K, is what the worker keeps of a concluded key.
4. **Concurrent runs: changelog records per input, and history latency.** One
   worker (memory://, exactly_once). 200 runs of 100 deltas each, their records
   interleaved and the runs starting staggered, produced at 3,000 records/s
   (``--concurrent``, ``--rate``), twice: a first round on the worker (and, with
   ``--only concurrent``, the broker) that has just started, shown, then a second
   round of 200 new runs, measured (a worker lives for days). Per run, the seconds
   from producing its RUN_FINISHED to its closing history record being readable
   (``read_committed``), p50/p99/max; the changelog records the second round's
   keys wrote per input record; and each round's commits by phase (the worker's
   ``agui_commit_seconds``: mean, and the bucket its p99 falls under).

Target (issue 3): worker >= 0.5 of the passthrough rate; changelog < 2 bytes
per input byte for the 10,000-delta message.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

REPO_ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")
sys.path.insert(0, str(REPO_ROOT))

import engine_bench  # noqa: E402  (benchmarks/ is this script's directory)

from processors.metrics import COMMIT_PHASES  # noqa: E402
from tests.conftest import load_kafka_local  # noqa: E402
from tests.run_generator import interleaved_runs  # noqa: E402
from tests.service_harness import (  # noqa: E402
    Namespace,
    Worker,
    create_topic,
    free_port,
    produce,
    wait_for,
)


@contextlib.contextmanager
def broker() -> Iterator[str]:
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if external:
        print(f"broker: {external} (KAFKA_BOOTSTRAP_SERVERS)")
        yield external
        return
    print("broker: starting the local KRaft broker (deploy/kafka_local.py) ...")
    with load_kafka_local().local_broker() as bootstrap:
        print(f"broker: {bootstrap} (local, stopped at exit)")
        yield bootstrap


def text(rng: random.Random, low: int, high: int) -> str:
    """Like the engine benchmark's deltas, but never shorter than `low` bytes."""
    return engine_bench.text(rng, low, high).encode()[:high].decode("utf-8", "ignore").ljust(
        low, ".")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metric_value(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))


def histogram(text: str, family: str, **labels: str) -> tuple[list[tuple[float, float]], float]:
    """A scraped histogram's cumulative (bound, count) buckets and its sum, for the
    series with `labels`."""
    buckets, total = [], 0.0
    pattern = rf"^{family}_(?:bucket|sum)\{{?([^}}]*)\}}? (\S+)$"
    for label_text, value in re.findall(pattern, text, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', label_text))
        bound = found.pop("le", None)
        if found != labels:
            continue
        if bound is None:
            total = float(value)
        else:
            buckets.append((float(bound), float(value)))
    return sorted(buckets), total


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> str:
    """The bucket bound the q-quantile of a histogram falls under."""
    if not buckets or buckets[-1][1] == 0:
        return "n/a"
    for bound, count in buckets:
        if count >= q * buckets[-1][1]:
            return f"> {buckets[-2][0]:g} s" if math.isinf(bound) else f"<= {bound * 1000:g} ms"
    return "n/a"


def latency_p99(text: str) -> str:
    """p99 of agui_processing_latency_seconds, as the bucket bound it falls under."""
    return bucket_quantile(histogram(text, "agui_processing_latency_seconds")[0], 0.99)


def commit_phases(text: str, since: str = "") -> str:
    """Each commit phase's mean and p99 (as the bucket bound it falls under), of the
    commits timed after the scrape `since`."""
    shown, commits = [], 0.0
    for phase in COMMIT_PHASES:
        buckets, seconds = histogram(text, "agui_commit_seconds", phase=phase)
        earlier, earlier_seconds = histogram(since, "agui_commit_seconds", phase=phase)
        if earlier:
            buckets = [(bound, count - before) for (bound, count), (_, before)
                       in zip(buckets, earlier, strict=True)]
            seconds -= earlier_seconds
        count = buckets[-1][1] if buckets else 0
        commits = max(commits, count)
        mean = f"{seconds / count * 1000:.0f} ms" if count else "n/a"
        shown.append(f"{phase} mean {mean}, p99 {bucket_quantile(buckets, 0.99)}")
    return f"{commits:.0f} commits: " + "; ".join(shown)


def log_problems(log_dir: Path) -> list[str]:
    found = []
    for path in sorted(log_dir.glob("*.log")):
        lines = path.read_bytes().decode("utf-8", "replace").splitlines()
        bad = [line for line in lines
               if re.search(r"\b(ERROR|CRITICAL|Traceback|Exception)\b|\[E\]|\[C\]", line)]
        if bad:
            found.append(f"{path.name}: {len(bad)} error line(s), first: {bad[0].strip()[:300]}")
    return found


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    deadline = time.monotonic() + 30
    while True:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return [TopicPartition(topic, p) for p in sorted(parts)]
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic} has no partitions")
        await consumer._client.force_metadata_update()
        await asyncio.sleep(0.2)


def read_topic(bootstrap: str, topic: str) -> list[tuple[bytes, bytes | None]]:
    """Every committed record of `topic` up to its last stable offset: (key, value)."""
    async def run() -> list[tuple[bytes, bytes | None]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                    isolation_level="read_committed",
                                    auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.subscribe([topic])  # for metadata only
            tps = await _partitions(consumer, topic)
            consumer.unsubscribe()
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            out: list[tuple[bytes, bytes | None]] = []
            deadline = time.monotonic() + 120
            while any([await consumer.position(tp) < ends[tp] for tp in tps]):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not read {topic} to its end")
                for messages in (await consumer.getmany(timeout_ms=500,
                                                        max_records=50_000)).values():
                    out.extend((m.key or b"", m.value) for m in messages)
            return out
        finally:
            await consumer.stop()

    return asyncio.run(run())


# ---------------------------------------------------------------------------------------
# 1. throughput
# ---------------------------------------------------------------------------------------


@dataclass
class Rate:
    name: str
    records: int  # records timed (after the first batch)
    seconds: float
    total_seconds: float  # from start (group join included) to done

    @property
    def per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else float("nan")


async def _passthrough(bootstrap: str, src: str, dst: str, total: int, name: str,
                       group: str, transactional: bool, commit_seconds: float,
                       commit_records: int) -> Rate:
    started = time.perf_counter()
    consumer = AIOKafkaConsumer(src, bootstrap_servers=bootstrap, group_id=group,
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                isolation_level="read_committed", max_poll_records=1000)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=True,
                                transactional_id=f"{group}-tx" if transactional else None)
    await consumer.start()
    await producer.start()
    try:
        done = 0
        first = 0
        clock: float | None = None
        deadline = time.monotonic() + 600
        while done < total:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: only {done} of {total} records after 600 s")
            if transactional:
                await producer.begin_transaction()
                window_end = time.perf_counter() + commit_seconds
                offsets: dict[TopicPartition, int] = {}
                in_txn = 0
                while (done < total and in_txn < commit_records
                       and time.perf_counter() < window_end):
                    wait_ms = max(1, int((window_end - time.perf_counter()) * 1000))
                    batch = await consumer.getmany(timeout_ms=wait_ms)
                    for tp, messages in batch.items():
                        for m in messages:
                            await producer.send(dst, m.value, key=m.key)
                        offsets[tp] = messages[-1].offset + 1
                        done += len(messages)
                        in_txn += len(messages)
                    if clock is None and done:
                        clock, first = time.perf_counter(), done
                if offsets:
                    await producer.send_offsets_to_transaction(offsets, group)
                await producer.commit_transaction()
            else:
                batch = await consumer.getmany(timeout_ms=1000)
                if not batch:
                    continue
                futures = []
                commit: dict[TopicPartition, int] = {}
                for tp, messages in batch.items():
                    for m in messages:
                        futures.append(await producer.send(dst, m.value, key=m.key))
                    commit[tp] = messages[-1].offset + 1
                    done += len(messages)
                await asyncio.gather(*futures)
                await consumer.commit(commit)
                if clock is None:
                    clock, first = time.perf_counter(), done
        end = time.perf_counter()
        assert clock is not None
        return Rate(name, total - first, end - clock, end - started)
    finally:
        await producer.stop()
        await consumer.stop()


def passthrough(bootstrap: str, ns: Namespace, total: int, name: str, tag: str,
                transactional: bool = False, commit_seconds: float = 0.0,
                commit_records: int = 0) -> Rate:
    dst = f"{ns.prefix}.passthrough-{tag}"
    create_topic(bootstrap, dst, ns.partitions)
    return asyncio.run(_passthrough(bootstrap, ns.events, dst, total, name,
                                    f"{ns.prefix}-pt-{tag}", transactional, commit_seconds,
                                    commit_records))


def faust_floor(ns: Namespace, log_dir: Path, total: int, tag: str, stock: bool) -> Rate:
    """A Faust app with an empty agent (``faust_floor.py``) on the same records: stock
    Faust classes, or the worker's adapted ones, with the worker's settings (stock
    Faust at its own commit interval, 2.8 s: fewer transactions than the worker's
    100 ms, so the stricter baseline)."""
    result_path = log_dir / f"{tag}.json"
    stock_env = {"AGUI_COMMIT_INTERVAL_MS": "2800"} if stock else {}
    env = ns.env(AGUI_APP_ID=f"{ns.prefix}-{tag}", AGUI_DATA_DIR=str(log_dir / f"{tag}-data"),
                 AGUI_METRICS_PORT=str(free_port()), FLOOR_EVENTS=str(total),
                 FLOOR_RESULT=str(result_path), FLOOR_STOCK="1" if stock else "0",
                 **stock_env)
    started = time.perf_counter()
    with (log_dir / f"{tag}.log").open("ab") as log:
        child = subprocess.Popen([sys.executable, str(REPO_ROOT / "benchmarks/faust_floor.py")],
                                 env=env, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    try:
        def finished() -> bool:
            if child.poll() is not None:
                raise RuntimeError(f"faust_floor exited with {child.returncode}; "
                                   f"see {log_dir / tag}.log")
            return result_path.exists()

        wait_for(finished, 600, "the Faust floor to see every record")
        result = orjson.loads(result_path.read_bytes())
        return Rate(f"{'stock' if stock else 'adapted'} Faust floor: empty agent, exactly_once",
                    result["records"],
                    result["seconds"], time.perf_counter() - started)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
            child.wait(60)


@dataclass
class WorkerRun:
    name: str
    events: Rate  # until agui_events_total reaches N
    committed: Rate  # until every closing record is visible to read_committed
    steady: Rate  # from a tenth of the events processed until agui_events_total = N
    p99: str
    finished: int
    deadletters: float
    cpu: float  # worker CPU seconds per wall second while timed (until agui_events_total = N)


async def _time_worker(worker: Worker, bootstrap: str, history: str, total: int,
                       runs: int, name: str, started: float) -> WorkerRun:
    # A short fetch wait: the reader's own delay is not the worker's latency.
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                isolation_level="read_committed",
                                auto_offset_reset="earliest", fetch_max_wait_ms=20)
    await consumer.start()
    try:
        consumer.subscribe([history])
        tps = await _partitions(consumer, history)
        consumer.unsubscribe()
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        clock: float | None = None
        first = 0
        # Past the start's ramp (at 128 partitions a few seconds of seeks and first
        # fetches): where the steady rate is counted from.
        tenth: tuple[float, int] | None = None
        events_done: float | None = None
        closing = finished = 0
        deadline = time.monotonic() + 600

        async def scrape() -> int:
            return await asyncio.to_thread(worker.processed)

        assert worker.process is not None
        pid = worker.process.pid
        cpu_start = cpu_end = 0.0
        next_scrape = 0.0

        while closing < runs or events_done is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: {closing}/{runs} closing records after 600 s\n"
                                   + worker.log_tail())
            if worker.process is not None and worker.process.poll() is not None:
                raise RuntimeError(f"{name}: worker exited\n" + worker.log_tail())
            if events_done is None and time.perf_counter() >= next_scrape:
                # A scrape costs the worker's loop ~2 ms: 4 a second, not 10.
                next_scrape = time.perf_counter() + 0.25
                processed = await scrape()
                now = time.perf_counter()
                if clock is None and processed > 0:
                    clock, first = now, processed
                    cpu_start = cpu_seconds(pid)
                if tenth is None and processed >= total // 10:
                    tenth = now, processed
                if processed >= total:
                    events_done = now
                    cpu_end = cpu_seconds(pid)
            batch = await consumer.getmany(timeout_ms=50, max_records=50_000)
            for messages in batch.values():
                for m in messages:
                    record = orjson.loads(m.value)
                    if record.get("kind") == "run":
                        closing += 1
                        finished += record.get("outcome") == "success"
        committed_done = time.perf_counter()
        assert clock is not None and events_done is not None and tenth is not None
        scraped = await asyncio.to_thread(worker.metrics)
        return WorkerRun(
            name,
            Rate(name, total - first, events_done - clock, events_done - started),
            Rate(name, total - first, committed_done - clock, committed_done - started),
            Rate(name, total - tenth[1], events_done - tenth[0], events_done - started),
            latency_p99(scraped), finished,
            metric_value(scraped, "agui_deadletter_records_total"),
            (cpu_end - cpu_start) / max(1e-9, events_done - clock),
        )
    finally:
        await consumer.stop()


def worker_throughput(ns: Namespace, log_dir: Path, workers: list[Worker], total: int,
                      runs: int, store: str, tag: str,
                      guarantee: str = "exactly_once") -> WorkerRun:
    # A fresh consumer group and outputs per worker, on the same input topic.
    app_id = f"{ns.prefix}-{tag}"
    history = f"{ns.prefix}.{tag}.history"
    worker = Worker(ns, log_dir, name=tag, AGUI_STORE=store,
                    AGUI_PROCESSING_GUARANTEE=guarantee, AGUI_APP_ID=app_id,
                    AGUI_HISTORY_TOPIC=history,
                    AGUI_DEADLETTER_TOPIC=f"{ns.prefix}.{tag}.deadletter")
    workers.append(worker)
    started = time.perf_counter()
    worker.start()
    try:
        return asyncio.run(_time_worker(worker, ns.bootstrap, history, total, runs,
                                        f"worker {store}" + (
                                            "" if guarantee == "exactly_once"
                                            else f" {guarantee}"), started))
    finally:
        worker.stop()


def print_rate(rate: Rate) -> None:
    print(f"  {rate.name:48} {rate.per_second:>9,.0f} events/s "
          f"({rate.records:,} in {rate.seconds:.2f} s; {rate.total_seconds:.1f} s with "
          "group join)")


def print_worker(result: WorkerRun, runs: int, guarantee: str, store: str,
                 note: str = "") -> None:
    print(f"  worker {guarantee:13} {store:12}              "
          f"{result.events.per_second:>9,.0f} events/s until agui_events_total = N "
          f"({result.events.seconds:.2f} s) {note}")
    print(f"  {'':48} {result.committed.per_second:>9,.0f} events/s until all "
          f"{runs:,} closing records read_committed ({result.committed.seconds:.2f} s)")
    print(f"  {'':48} {result.steady.per_second:>9,.0f} events/s steady (from a tenth of"
          f" the events processed to all)")
    print(f"  {'':48} runs finished {result.finished:,}/{runs:,}, dead letters "
          f"{result.deadletters:g}, processing latency p99 {result.p99}, worker CPU "
          f"{result.cpu:.0%} of a core (start to done incl. recovery "
          f"{result.committed.total_seconds:.1f} s)")


def _median(items: list[T], rate: Callable[[T], float]) -> T:
    return sorted(items, key=rate)[len(items) // 2]


def _median_rate(rates: list[Rate]) -> Rate:
    middle = _median(rates, lambda rate: rate.per_second)
    return Rate(f"{middle.name} (median)", middle.records, middle.seconds,
                middle.total_seconds)


def part_throughput(bootstrap: str, log_dir: Path, workers: list[Worker], prefixes: list[str],
                    events: int, seed: int, rocksdb: bool,
                    at_least_once: bool, repeat: int, partitions: int = 4) -> dict[str, Any]:
    print("\n== 1. end-to-end throughput, one worker vs a bare aiokafka passthrough ==")
    runs_per_key = 6
    keys = max(1, round(events / (19.5 * runs_per_key)))
    runs, records = interleaved_runs(seed, keys, runs_per_key)
    total = len(records)
    input_bytes = sum(len(k) + len(v) for k, v in records)
    ns = Namespace(bootstrap, partitions=partitions)
    prefixes.append(ns.prefix)
    ns.create_topics()
    clock = time.perf_counter()
    produce(bootstrap, ns.events, ((k, v, []) for k, v in records))
    print(f"input: {total:,} events, {len(runs):,} runs over {keys} keys, "
          f"{input_bytes / total:.0f} B/event, {ns.partitions} partitions "
          f"(produced in {time.perf_counter() - clock:.1f} s)")

    baselines = [
        passthrough(bootstrap, ns, total, "passthrough, plain (commit per fetch)", "plain"),
        passthrough(bootstrap, ns, total, "passthrough, transactional (100 ms)", "tx100",
                    transactional=True, commit_seconds=0.1, commit_records=10**9),
        passthrough(bootstrap, ns, total, "passthrough, transactional (10k rec / 2.8 s)",
                    "txfaust", transactional=True, commit_seconds=2.8,
                    commit_records=10_000),
    ]
    for rate in baselines:
        print_rate(rate)

    # The Faust floors and the worker vary by 20 % or more from one run to the next
    # here: they run in rounds, interleaved, and are compared by their medians.
    print(f"Faust floors and the worker (exactly_once, memory://), {repeat} interleaved"
          " rounds:")
    rounds: list[tuple[Rate, Rate, WorkerRun]] = []
    for number in range(1, repeat + 1):
        stock = faust_floor(ns, log_dir, total, f"floor-stock-{number}", stock=True)
        adapted = faust_floor(ns, log_dir, total, f"floor-{number}", stock=False)
        worker = worker_throughput(ns, log_dir, workers, total, len(runs), "memory://",
                                   f"wmemory-{number}")
        rounds.append((stock, adapted, worker))
        print(f"  round {number}: stock floor {stock.per_second:,.0f}, adapted floor "
              f"{adapted.per_second:,.0f}, worker {worker.events.per_second:,.0f} events/s"
              f" (worker / stock floor {worker.events.per_second / stock.per_second:.2f};"
              f" worker steady {worker.steady.per_second:,.0f})")
    median_stock = _median_rate([r[0] for r in rounds])
    median_adapted = _median_rate([r[1] for r in rounds])
    baselines += [median_stock, median_adapted]
    for rate in baselines[-2:]:
        print_rate(rate)

    stores = [("rocksdb://", "exactly_once")] if rocksdb else []
    stores += [("memory://", "at_least_once")] if at_least_once else []
    results = [_median([r[2] for r in rounds], lambda run: run.events.per_second)]
    print_worker(results[0], len(runs), "exactly_once", "memory://", "(the median round)")
    for store, guarantee in stores:
        tag = "w" + store.split(":")[0] + ("" if guarantee == "exactly_once" else "-alo")
        result = worker_throughput(ns, log_dir, workers, total, len(runs), store, tag,
                                   guarantee)
        results.append(result)
        print_worker(result, len(runs), guarantee, store)
    print("ratios (worker rate until agui_events_total = N / baseline; "
          "in brackets until read_committed):")
    for result in results:
        for base in baselines:
            print(f"  {result.name:34} / {base.name:44} "
                  f"{result.events.per_second / base.per_second:5.2f} "
                  f"[{result.committed.per_second / base.per_second:.2f}]")
    print("target >= 0.5, judged against the plain passthrough: it is the issue's 'bare'"
          " baseline and the stricter (faster) one; the transactional ones show what"
          " exactly-once itself costs, the Faust floor what Faust's stream machinery costs"
          " before the worker does anything.")
    return {"total": total, "baselines": baselines, "workers": results}


# ---------------------------------------------------------------------------------------
# 2. changelog bytes per input byte
# ---------------------------------------------------------------------------------------


def bench_worker(bootstrap: str, log_dir: Path, workers: list[Worker], prefixes: list[str],
                 name: str, partitions: int = 4, **env: str) -> tuple[Namespace, Worker]:
    """A part's own topics and a started worker on them (stopped at the end of main)."""
    ns = Namespace(bootstrap, partitions=partitions)
    prefixes.append(ns.prefix)
    ns.create_topics()
    worker = Worker(ns, log_dir, name=name, AGUI_PROCESSING_GUARANTEE="exactly_once", **env)
    workers.append(worker)
    worker.start()
    return ns, worker


def one_message_run(key: str, deltas: int, delta: Callable[[int], str]) -> list[bytes]:
    run_id, message_id = f"{key}-run", f"{key}-m"
    events: list[dict[str, Any]] = [
        {"type": "RUN_STARTED", "threadId": key, "runId": run_id},
        {"type": "REASONING_MESSAGE_START", "messageId": message_id, "role": "reasoning"},
        *({"type": "REASONING_MESSAGE_CONTENT", "messageId": message_id, "delta": delta(i)}
          for i in range(deltas)),
        {"type": "REASONING_MESSAGE_END", "messageId": message_id},
        {"type": "RUN_FINISHED", "threadId": key, "runId": run_id},
    ]
    return [orjson.dumps(e) for e in events]


_SLICES = 10  # the changelog part's message arrives in this many slices, a commit apart


def part_changelog(bootstrap: str, log_dir: Path, workers: list[Worker], prefixes: list[str],
                   deltas: int, seed: int) -> list[dict[str, Any]]:
    print(f"\n== 2. changelog bytes per input byte, one message of {deltas:,} deltas ==")
    rng = random.Random(seed)
    ns, worker = bench_worker(bootstrap, log_dir, workers, prefixes, "changelog")
    out = []
    try:
        cases = [("normal", "20-200 B deltas", lambda i: text(rng, 20, 200)),
                 ("tiny", "5 B deltas", lambda i: f"{i % 100000:05d}")]
        processed = 0
        for name, label, delta in cases:
            key = f"bench-{name}".encode()
            values = one_message_run(key.decode(), deltas, delta)
            input_bytes = sum(len(key) + len(v) for v in values)
            delta_bytes = input_bytes - sum(len(key) + len(v) for v in values[:2] + values[-2:])
            # In slices, each after the last one's text chunk is committed: the message
            # streams across commits as a slow producer's would, not within one.
            size = math.ceil(len(values) / _SLICES)
            for start in range(0, len(values), size):
                produce(bootstrap, ns.events, ((key, v, []) for v in values[start:start + size]))
                processed += len(values[start:start + size])
                wait_for(lambda target=processed: worker.processed() >= target, 300,  # type: ignore[misc]
                         f"worker to process {processed} records", worker.log_tail)
                if start + size < len(values):
                    wait_for(lambda k=key, n=start // size + 1: sum(  # type: ignore[misc]
                        1 for ck, _ in read_topic(bootstrap, f"{ns.app_id}-run-text-changelog")
                        if k in ck) >= n, 60, "the slice's text chunk", worker.log_tail)
            # The closing record commits in the transaction of the last record's changelog
            # writes: once it is readable, so is all of this run's changelog.
            wait_for(lambda k=key: any(k in hk and b'"kind":"run"' in (hv or b"")
                                       for hk, hv in read_topic(bootstrap, ns.history)),
                     60, "the closing record", worker.log_tail)
            closing = [orjson.loads(v or b"{}") for k, v in read_topic(bootstrap, ns.history)
                       if b'"kind":"run"' in (v or b"")
                       and orjson.loads(v or b"{}").get("threadId") == key.decode()]
            tables = {}
            for table in ("run-state", "run-text"):
                records = [(k, v) for k, v in read_topic(bootstrap,
                                                         f"{ns.app_id}-{table}-changelog")
                           if key in k]
                tables[table] = (len(records),
                                 sum(len(k) + len(v or b"") for k, v in records),
                                 sum(1 for _, v in records if v is None))
            changelog = sum(b for _, b, _ in tables.values())
            ratio = changelog / input_bytes
            outcome = closing[0].get("outcome") if closing else "missing"
            print(f"  {label:16} input {len(values):,} records {input_bytes:,} B "
                  f"(deltas {delta_bytes:,} B) -> changelog {changelog:,} B: "
                  f"{ratio:.3f} B per input byte  [run {outcome}]")
            for table, (count, size, tombstones) in tables.items():
                print(f"  {'':16}   {table:9} {count:,} records ({tombstones:,} tombstones), "
                      f"{size:,} B, {size / deltas:.1f} B per delta")
            out.append({"name": name, "ratio": ratio, "input": input_bytes,
                        "changelog": changelog, "outcome": outcome})
    finally:
        worker.stop()
    print("  (key+value bytes, headers not counted; a failed run would show here as not"
          " 'finished')")
    return out


# ---------------------------------------------------------------------------------------
# 4. concurrent runs: changelog records per input record, and history latency
# ---------------------------------------------------------------------------------------


async def _paced_runs(bootstrap: str, events: str, history: str,
                      runs: list[tuple[bytes, list[bytes]]], rate: float) -> list[float]:
    """Produce the runs' records interleaved (one record of each run in turn, the runs
    starting staggered) at `rate` records/s; return, per run, seconds from producing
    its RUN_FINISHED to its closing history record becoming readable
    (read_committed)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=1,
                                enable_idempotence=True)
    # A short fetch wait: the reader's own delay is not the worker's latency.
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                isolation_level="read_committed",
                                auto_offset_reset="earliest", fetch_max_wait_ms=20)
    await producer.start()
    await consumer.start()
    finished_at: dict[str, float] = {}
    readable_at: dict[str, float] = {}
    threads = {key.decode() for key, _ in runs}  # (the history may hold earlier runs')
    try:
        consumer.subscribe([history])

        async def read_history() -> None:
            while len(readable_at) < len(runs):
                for messages in (await consumer.getmany(timeout_ms=100)).values():
                    now = time.monotonic()
                    for message in messages:
                        value = orjson.loads(message.value)
                        if value.get("kind") == "run" and value["threadId"] in threads:
                            readable_at.setdefault(value["threadId"], now)

        reader = asyncio.ensure_future(read_history())
        longest = max(len(values) for _, values in runs)
        # Run i starts i/len(runs) of a run's length late, so the runs finish spread
        # over several commit intervals, not in one burst at one phase of the commit
        # timer (a single sample of the latency, however many runs).
        starts = [number * longest // len(runs) for number in range(len(runs))]
        started = time.monotonic()
        sent = 0
        for step in range(2 * longest):
            for (key, values), start in zip(runs, starts, strict=True):
                index = step - start
                if 0 <= index < len(values):
                    await producer.send(events, values[index], key=key)
                    sent += 1
                    if index == len(values) - 1:
                        await producer.flush()
                        finished_at[key.decode()] = time.monotonic()
                    ahead = sent / rate - (time.monotonic() - started)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
        await producer.flush()
        await asyncio.wait_for(reader, 300)
    finally:
        await consumer.stop()
        await producer.stop()
    return [readable_at[thread] - finished_at[thread] for thread in finished_at]


def quantile(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted values (the value at rank q * n)."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _without_collections(measuring: Coroutine[Any, Any, T]) -> T:
    """Run a measurement with this process's garbage collector off: a full
    collection here stopped the reader for 50-90 ms, not the worker's latency."""
    gc.collect()
    gc.disable()
    try:
        return asyncio.run(measuring)
    finally:
        gc.enable()


def part_concurrent(bootstrap: str, log_dir: Path, workers: list[Worker], prefixes: list[str],
                    concurrent: int, deltas: int, rate: float, seed: int) -> dict[str, Any]:
    print(f"\n== 4. {concurrent} concurrent runs streaming {deltas} deltas each, "
          f"{rate:,.0f} records/s, twice ==")
    rng = random.Random(seed)
    ns, worker = bench_worker(bootstrap, log_dir, workers, prefixes, "concurrent",
                              AGUI_STORE="memory://")

    def round_of_runs(name: str) -> list[tuple[bytes, list[bytes]]]:
        return [(f"{name}-{i}".encode(), one_message_run(f"{name}-{i}", deltas,
                                                         lambda _: text(rng, 1, 200)))
                for i in range(concurrent)]

    # The first round meets a worker and a broker that have just started: a worker's
    # first commits start its transactions' producers, and a fresh broker's JVM
    # compiles its hot paths meanwhile. A worker lives for days; the second round
    # is measured (the first is shown).
    first, runs = round_of_runs("first"), round_of_runs("conc")
    total = sum(len(values) for _, values in runs)
    try:
        # Produced into a worker still joining, the first runs would wait for that too.
        wait_for(worker.ready, 120, "the worker to be ready", worker.log_tail)
        first_latencies = sorted(_without_collections(
            _paced_runs(bootstrap, ns.events, ns.history, first, rate)))
        after_first = worker.metrics()
        latencies = sorted(_without_collections(
            _paced_runs(bootstrap, ns.events, ns.history, runs, rate)))
        scraped = worker.metrics()
    finally:
        worker.stop()
    states, texts = ([(key, value) for key, value in read_topic(
        bootstrap, f"{ns.app_id}-{table}-changelog") if b"conc-" in key]
        for table in ("run-state", "run-text"))
    changelog = len(states) + len(texts)

    def quantiles(latencies: list[float]) -> str:
        return (f"{len(latencies)} runs: p50 {quantile(latencies, 0.5):.2f} s, "
                f"p99 {quantile(latencies, 0.99):.2f} s, max {latencies[-1]:.2f} s")

    print(f"  second round: input {total:,} records; changelog {changelog:,} records: "
          f"{changelog / total:.4f} per input record (target <= 0.05); "
          f"{sum(v is not None for _, v in states):,} state entries, "
          f"{sum(v is not None for _, v in texts):,} text chunks, "
          f"{sum(v is None for _, v in states + texts):,} deletions, "
          f"{changelog / len(runs):.1f} records per run")
    print("  RUN_FINISHED produced -> closing record readable (read_committed):")
    print(f"    first round (a new worker):  {quantiles(first_latencies)}; "
          f"{commit_phases(after_first)}")
    print(f"    second round (measured):     {quantiles(latencies)} (target p99 <= the "
          f"commit interval, 2.8 s, + 0.1 s); {commit_phases(scraped, after_first)}")
    return {"changelog_per_input": changelog / total, "p99": quantile(latencies, 0.99)}


# ---------------------------------------------------------------------------------------
# 3. memory per open run
# ---------------------------------------------------------------------------------------


def settle_rss(pid: int, seconds: float = 6.0) -> int:
    """RSS after it stopped moving much: the last of samples over `seconds`."""
    samples = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(rss_bytes(pid))
        time.sleep(0.5)
    return samples[-1]


def reasoning_runs(prefix: str, runs: int, rng: random.Random,
                   finished: bool) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """Runs that each start and stream a short reasoning message under a key of their
    own; `finished`, they also end the message and finish."""
    records: list[tuple[bytes, bytes, list[tuple[str, bytes]]]] = []
    for n in range(runs):
        key = f"{prefix}{n:06d}"
        run_id, message_id = f"{key}-run", f"{key}-m"
        events: list[dict[str, Any]] = [
            {"type": "RUN_STARTED", "threadId": key, "runId": run_id},
            {"type": "REASONING_MESSAGE_START", "messageId": message_id, "role": "reasoning"},
            *({"type": "REASONING_MESSAGE_CONTENT", "messageId": message_id,
               "delta": text(rng, 20, 60)} for _ in range(3)),
        ]
        if finished:
            events += [{"type": "REASONING_MESSAGE_END", "messageId": message_id},
                       {"type": "RUN_FINISHED", "threadId": key, "runId": run_id}]
        records.extend((key.encode(), orjson.dumps(e), []) for e in events)
    return records


def part_memory(bootstrap: str, log_dir: Path, workers: list[Worker], prefixes: list[str],
                open_runs: int, seed: int) -> dict[str, Any]:
    print(f"\n== 3. memory per open run, idle ({open_runs:,} runs that never finish) ==")
    rng = random.Random(seed)
    # One tenant holds them all: no tenant limit (a version without one ignores it).
    ns, worker = bench_worker(bootstrap, log_dir, workers, prefixes, "memory",
                              AGUI_STORE="memory://", AGUI_TENANT_MAX_OPEN_RUNS="0")
    try:
        assert worker.process is not None
        pid = worker.process.pid
        idle = settle_rss(pid, 8.0)
        assert worker.processed() == 0
        records = reasoning_runs("open", open_runs, rng, finished=False)
        produce(bootstrap, ns.events, records)
        wait_for(lambda: worker.processed() >= len(records), 300,
                 f"worker to process {len(records)} records", worker.log_tail)
        text_metrics = worker.metrics()
        gauge = metric_value(text_metrics, "agui_open_runs")
        time.sleep(3.5)  # one commit interval (2.8 s): the changelogs are committed
        loaded = settle_rss(pid, 6.0)
        per_run = (loaded - idle) / open_runs
        states = {k: v for k, v in read_topic(bootstrap, f"{ns.app_id}-run-state-changelog")}
        texts = {k: v for k, v in read_topic(bootstrap, f"{ns.app_id}-run-text-changelog")}
        states = {k: v for k, v in states.items() if v is not None}
        texts = {k: v for k, v in texts.items() if v is not None}
        state_bytes = sum(len(k) + len(v or b"") for k, v in states.items())
        text_bytes = sum(len(k) + len(v or b"") for k, v in texts.items())
        print(f"  idle worker RSS (processed nothing)     {idle / 2**20:8.1f} MiB")
        print(f"  after {open_runs:,} open runs ({len(records):,} events; "
              f"agui_open_runs {gauge:g})  {loaded / 2**20:8.1f} MiB")
        print(f"  memory per open run                     {per_run:8,.0f} B  "
              "(RSS difference / open runs, memory:// store)")
        print(f"  serialized per open run (lower bound)   "
              f"{(state_bytes + text_bytes) / open_runs:8,.0f} B  = run-state "
              f"{state_bytes / max(1, len(states)):,.0f} B ({len(states):,} keys) + run-text "
              f"{text_bytes / open_runs:,.0f} B ({len(texts) / open_runs:.1f} entries per run;"
              " key+value, latest per key)")
        concluded = concluded_keys(bootstrap, ns, worker, open_runs, rng)
        after = settle_rss(pid, 6.0)
        print(f"  after {open_runs:,} more keys whose runs concluded  {after / 2**20:8.1f} MiB")
        print(f"  memory per concluded key                {(after - loaded) / open_runs:8,.0f}"
              f" B  (RSS difference / keys, each with its thread in the view; their stored"
              f" state {concluded:,.0f} B each)")
        return {"idle": idle, "loaded": loaded, "per_run": per_run,
                "serialized": (state_bytes + text_bytes) / open_runs,
                "state": state_bytes / max(1, len(states)),
                "per_concluded_key": (after - loaded) / open_runs}
    finally:
        worker.stop()


def concluded_keys(bootstrap: str, ns: Namespace, worker: Worker, keys: int,
                   rng: random.Random) -> float:
    """Runs that start, stream a short reasoning message and finish, each under a key
    of its own: what a worker keeps of a key once its run concluded. Returns the mean
    run-state bytes stored per key (what the store keeps of it)."""
    done = worker.processed()
    records = reasoning_runs("done", keys, rng, finished=True)
    produce(bootstrap, ns.events, records)
    wait_for(lambda: worker.processed() >= done + len(records), 300,
             f"worker to process {len(records)} records", worker.log_tail)
    time.sleep(6.0)  # two commit intervals (2.8 s): the keys' changes are applied
    states = [v for k, v in read_topic(bootstrap, f"{ns.app_id}-run-state-changelog")
              if v is not None and b"done" in k]
    return sum(map(len, states)) / max(1, len(states))


# ---------------------------------------------------------------------------------------


def delete_topics(bootstrap: str, prefixes: list[str]) -> None:
    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            names = [t for t in await admin.list_topics()
                     if any(t.startswith(p + ".") or t.startswith(p + "-") for p in prefixes)]
            if names:
                await admin.delete_topics(names)
        finally:
            await admin.close()

    try:
        asyncio.run(run())
    except Exception as error:  # best effort: a shared broker keeps them otherwise
        print(f"(could not delete the benchmark's topics: {type(error).__name__})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds of the Faust floors and the worker (medians compared)")
    parser.add_argument("--open-runs", type=int, default=20_000)
    parser.add_argument("--deltas", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-rocksdb", action="store_true",
                        help="skip the rocksdb:// worker")
    parser.add_argument("--no-at-least-once", action="store_true",
                        help="skip the at_least_once worker (shown for comparison only)")
    parser.add_argument("--keep-topics", action="store_true")
    parser.add_argument("--concurrent", type=int, default=200)
    parser.add_argument("--rate", type=float, default=3_000.0,
                        help="records/s produced in part 4 (below the worker's capacity)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="partitions of part 1's topics (a partition sweep)")
    parser.add_argument("--only", choices=["throughput", "changelog", "memory", "concurrent"])
    args = parser.parse_args()

    log_dir = Path(tempfile.mkdtemp(prefix="agui-service-bench-"))
    workers: list[Worker] = []
    prefixes: list[str] = []
    started = time.perf_counter()
    print(f"worker logs: {log_dir}")
    with broker() as bootstrap:
        try:
            if args.only in (None, "throughput"):
                part_throughput(bootstrap, log_dir, workers, prefixes, args.events, args.seed,
                                not args.no_rocksdb, not args.no_at_least_once, args.repeat,
                                args.partitions)
            if args.only in (None, "changelog"):
                part_changelog(bootstrap, log_dir, workers, prefixes, args.deltas, args.seed)
            if args.only in (None, "concurrent"):
                part_concurrent(bootstrap, log_dir, workers, prefixes, args.concurrent, 100,
                                args.rate, args.seed)
            if args.only in (None, "memory"):
                part_memory(bootstrap, log_dir, workers, prefixes, args.open_runs, args.seed)
        finally:
            for worker in workers:
                worker.stop()
            if not args.keep_topics:
                delete_topics(bootstrap, prefixes)
            for data in log_dir.glob("*-data"):
                shutil.rmtree(data, ignore_errors=True)
    problems = log_problems(log_dir)
    print("\nworker logs: " + ("no error lines" if not problems else "\n  " + "\n  ".join(
        problems)))
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
