"""The thread API under abuse while a worker processes at full rate.

    PYTHONPATH=. .venv/bin/python benchmarks/api_load.py [--events N] [--waiters W]
                                             [--slow S] [--rounds R] [--seed S]

Uses the broker in ``KAFKA_BOOTSTRAP_SERVERS`` if set, else starts the local KRaft
broker of ``deploy/kafka_local.py``. Each round runs two fresh workers (memory://,
exactly_once, ``AGUI_API_MAX_CONNECTIONS=2000``), one after the other, in
alternating order, on the same input: ten tenants' threads (one run each), then a
backlog of N (``--events``, 200,000) events of interleaved runs
(``interleaved_runs``, ~20 events per run), all produced before the worker starts.

* **quiet:** the worker drains the backlog; a normal caller asks one tenant's
  thread (``GET …/messages``) every 100 ms;
* **loaded:** the same, plus W (``--waiters``, 1,000) waiters, each a keep-alive
  connection asking ``?run=`` for a run that never comes, of its tenant's thread
  (ten tenants, W/10 each), again as soon as it is answered (a 503 after the
  10 s wait); and S (``--slow``, 300) slow connections, each sending half a
  request line and connecting again once the worker closes it.

``--unit-costs`` instead measures an idle worker's CPU per request of each kind.

``--alternate SECONDS`` instead runs one worker on a backlog of N events and
switches the load on and off every SECONDS from 30 % of the backlog on: the
machine's own drift (on this 2-core VM the quiet rate moves by 1.5× from one
minute to the next) then falls on both sides alike. A window's rate and CPU are
taken after its first 2 s if loaded, 11 s if quiet (the worker still answers
the loaded window's waits then); printed per window, then loaded over quiet as
the median of each loaded window against the mean of its two quiet neighbours.

The worker's rate is its ``agui_events_total`` per second between 30 % and 100 %
of the backlog (the load is in place by 30 %), from its /metrics every 0.25 s.
Printed: both rates and their ratio, the worker's CPU per 1,000 events (the load
generator shares the machine: the CPU says what the load costs the worker
itself), the normal caller's answers (statuses, p99),
the waiters' answers by status, and how long the slow connections were held.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from service_bench import broker, cpu_seconds, delete_topics, log_problems, metric_value

from processors.view.tenant_tokens import token_line
from processors.view.thread_api import MAX_WAIT_SECONDS
from tests.run_generator import generate_run, interleaved_runs
from tests.service_harness import Namespace, Worker, produce, wait_for

TENANTS = [f"tenant{n}" for n in range(10)]
START_FRACTION = 0.3


class Load:
    """The abusive callers of one loaded round, on the worker's port."""

    def __init__(self, port: int, waiters: int, slow: int) -> None:
        self.port = port
        self.waiters, self.slow = waiters, slow
        self.waiter_answers: Counter[str] = Counter()
        self.held_seconds: list[float] = []  # slow connections: connected to closed
        self.stop = asyncio.Event()

    async def run(self) -> None:
        tasks = [asyncio.create_task(self.waiter(n)) for n in range(self.waiters)]
        tasks += [asyncio.create_task(self.slow_connection()) for _ in range(self.slow)]
        await self.stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def waiter(self, number: int) -> None:
        tenant = TENANTS[number % len(TENANTS)]
        request = (f"GET /v1/threads/{tenant}-thread/messages?run=never-{number} HTTP/1.1\r\n"
                   f"Host: x\r\nAuthorization: Bearer {tenant}-token\r\n\r\n").encode()
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                while True:
                    writer.write(request)
                    status, _ = await read_answer(reader)
                    self.waiter_answers[status] += 1
            except (OSError, asyncio.IncompleteReadError, ValueError):
                self.waiter_answers["connection closed"] += 1
                await asyncio.sleep(0.1)

    async def slow_connection(self) -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                started = time.monotonic()  # accepted: the request timeout's clock
                writer.write(b"GET /v1/thr")
                await reader.read()  # until the worker closes it
                self.held_seconds.append(time.monotonic() - started)
                writer.close()
            except OSError:
                await asyncio.sleep(0.1)


async def read_answer(reader: asyncio.StreamReader) -> tuple[str, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b" ", 2)[1].decode()
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return status, await reader.readexactly(length)


async def normal_caller(port: int, stop: asyncio.Event, statuses: Counter[str],
                        seconds: list[float]) -> None:
    request = (f"GET /v1/threads/{TENANTS[0]}-thread/messages HTTP/1.1\r\nHost: x\r\n"
               f"Authorization: Bearer {TENANTS[0]}-token\r\n\r\n").encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    while not stop.is_set():
        started = time.monotonic()
        try:
            writer.write(request)
            status, _ = await asyncio.wait_for(read_answer(reader), 30)
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            status = "no answer"
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        statuses[status] += 1
        seconds.append(time.monotonic() - started)
        await asyncio.sleep(0.1)


async def drive(worker: Worker, total: int, load: Load | None
                ) -> tuple[float, float, Counter[str], list[float]]:
    """Until the backlog is processed: the worker's events/s from START_FRACTION of it,
    and its CPU seconds per 1,000 events over the same span (what the load costs the
    worker itself, whatever the load generator takes from the machine)."""
    assert worker.process is not None
    pid = worker.process.pid
    stop = asyncio.Event()
    statuses: Counter[str] = Counter()
    seconds: list[float] = []
    tasks = [asyncio.create_task(normal_caller(worker.port, stop, statuses, seconds))]
    if load is not None:
        load.stop = stop
        tasks.append(asyncio.create_task(load.run()))
    mark: tuple[float, float, float, float] | None = None
    try:
        while True:
            events = metric_value(await asyncio.to_thread(worker.metrics), "agui_events_total")
            now, cpu = time.perf_counter(), cpu_seconds(pid)
            if mark is None and events >= total * START_FRACTION:
                mark = (now, events, cpu, time.process_time())
            if events >= total and mark is not None:
                done = events - mark[1]
                own = (time.process_time() - mark[3]) / (now - mark[0])
                print(f"          this process (callers, metrics polling): {own:.0%} of a"
                      " core meanwhile")
                return (done / (now - mark[0]), (cpu - mark[2]) / done * 1000, statuses,
                        seconds)
            await asyncio.sleep(0.25)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


SETTLE_SECONDS = 2.0  # the start of an alternating window, not measured
# ... and of a quiet one: the worker answers the last loaded window's waits then.
QUIET_SETTLE_SECONDS = MAX_WAIT_SECONDS + 1.0


class Window(NamedTuple):
    loaded: bool
    rate: float  # events/s
    cpu_per_1000: float  # worker CPU seconds per 1,000 events


class Alternation(NamedTuple):
    windows: list[Window]
    loads: list[Load]  # one per loaded window
    statuses: Counter[str]  # the normal caller's, all along
    seconds: list[float]


async def drive_alternating(worker: Worker, total: int, load_args: tuple[int, int],
                            seconds: float) -> Alternation:
    """Until the backlog is processed: windows of `seconds`, quiet and loaded in
    turn, from START_FRACTION of it (the last, partial one is left out), with a
    normal caller all along."""
    assert worker.process is not None
    pid = worker.process.pid
    result = Alternation([], [], Counter(), [])
    stop_caller = asyncio.Event()
    caller = asyncio.create_task(normal_caller(worker.port, stop_caller, result.statuses,
                                               result.seconds))

    async def sample() -> tuple[float, float, float]:
        events = metric_value(await asyncio.to_thread(worker.metrics), "agui_events_total")
        return time.perf_counter(), events, cpu_seconds(pid)

    windows = result.windows
    load: Load | None = None
    running: asyncio.Task[None] | None = None
    while (await sample())[1] < total * START_FRACTION:
        await asyncio.sleep(0.25)
    try:
        while True:
            started = time.perf_counter()
            if len(windows) % 2:  # quiet first, then loaded, in turn
                load = Load(worker.port, *load_args)
                result.loads.append(load)
                running = asyncio.create_task(load.run())
            await asyncio.sleep(SETTLE_SECONDS if running else QUIET_SETTLE_SECONDS)
            first = await sample()
            while (last := await sample())[0] - started < seconds and last[1] < total:
                await asyncio.sleep(0.25)
            if last[1] >= total:
                return result
            done = last[1] - first[1]
            windows.append(Window(running is not None, done / (last[0] - first[0]),
                                  (last[2] - first[2]) / done * 1000))
            print(f"    {'loaded' if running else 'quiet':7} {windows[-1].rate:>9,.0f} events/s,"
                  f" worker CPU {windows[-1].cpu_per_1000 * 1000:,.0f} ms per 1,000 events")
            if load is not None and running is not None:
                load.stop.set()
                await running
                load, running = None, None
    finally:
        if load is not None and running is not None:
            load.stop.set()
            await running
        stop_caller.set()
        await caller


def alternating_ratio(windows: list[Window]) -> tuple[float, float, int]:
    """Loaded over quiet, events/s and CPU per event: the median over the loaded
    windows of each against the mean of the quiet windows either side of it; and
    how many loaded windows that is."""
    rates, cpus = [], []
    for i in range(1, len(windows) - 1, 2):
        before, loaded, after = windows[i - 1], windows[i], windows[i + 1]
        rates.append(loaded.rate / ((before.rate + after.rate) / 2))
        cpus.append(loaded.cpu_per_1000 / ((before.cpu_per_1000 + after.cpu_per_1000) / 2))
    return statistics.median(rates), statistics.median(cpus), len(rates)


Record = tuple[bytes, bytes, list[tuple[str, bytes]]]  # key, value, headers


@contextlib.contextmanager
def serving_worker(bootstrap: str, log_dir: Path, tokens: str, records: list[Record],
                   name: str, prefixes: list[str]) -> Iterator[Worker]:
    """A worker of its own topics, `records` produced to them first, once every
    tenant's thread is in its view; stopped at the end."""
    ns = Namespace(bootstrap)
    prefixes.append(ns.prefix)
    ns.create_topics()
    produce(bootstrap, ns.events, records)
    worker = Worker(ns, log_dir, name=name, AGUI_STORE="memory://",
                    AGUI_TOKENS_FILE=tokens, AGUI_API_MAX_CONNECTIONS="2000")
    worker.start()
    try:
        wait_for(lambda: all(_answers(worker, tenant) for tenant in TENANTS), 120,
                 "every tenant's thread in the view", worker.log_tail)
        yield worker
    finally:
        worker.stop()


def one_worker(bootstrap: str, log_dir: Path, tokens: str, records: list[Record], name: str,
               load_args: tuple[int, int] | None,
               prefixes: list[str]) -> tuple[float, float]:
    """One worker's round; its events/s and CPU seconds per 1,000 events."""
    with serving_worker(bootstrap, log_dir, tokens, records, name, prefixes) as worker:
        load = None if load_args is None else Load(worker.port, *load_args)
        rate, cpu, statuses, seconds = asyncio.run(drive(worker, len(records), load))
    print_callers(statuses, seconds, f"{name:7} {rate:>9,.0f} events/s, worker CPU"
                  f" {cpu * 1000:,.0f} ms per 1,000 events   normal caller:")
    if load is not None:
        print_load([load])
    return rate, cpu


def print_callers(statuses: Counter[str], seconds: list[float], heading: str) -> None:
    seconds = sorted(seconds)
    p99 = seconds[int(len(seconds) * 0.99)] if seconds else float("nan")
    print(f"  {heading} {dict(statuses)}, p99 {p99 * 1000:.0f} ms")


def print_load(loads: list[Load]) -> None:
    held = sorted(second for load in loads for second in load.held_seconds)
    answers = sum((load.waiter_answers for load in loads), Counter[str]())
    print(f"          waiters' answers: {dict(answers)}")
    print(f"          slow connections closed: {len(held):,}, held p50"
          f" {held[len(held) // 2] if held else float('nan'):.1f} s, max"
          f" {held[-1] if held else float('nan'):.1f} s")


def alternate(bootstrap: str, log_dir: Path, tokens: str, records: list[Record],
              load_args: tuple[int, int], seconds: float, prefixes: list[str]) -> None:
    """One worker, the load switched on and off (`--alternate`)."""
    with serving_worker(bootstrap, log_dir, tokens, records, "alternate", prefixes) as worker:
        print(f"  windows of {seconds:.0f} s (the first {SETTLE_SECONDS:.0f} s of a loaded one"
              f" and {QUIET_SETTLE_SECONDS:.0f} s of a quiet one not measured):")
        alternation = asyncio.run(drive_alternating(worker, len(records), load_args, seconds))
    windows = alternation.windows
    print_callers(alternation.statuses, alternation.seconds, "normal caller, all along:")
    print_load(alternation.loads)
    if len(windows) < 3:
        print("  too few windows for a ratio: give more --events or a shorter --alternate")
        return
    rate, cpu, count = alternating_ratio(windows)
    print(f"  loaded / quiet (each loaded window against its quiet neighbours, median of"
          f" {count}): events/s {rate:.3f}, worker CPU per event {cpu:.3f}")


def _answers(worker: Worker, tenant: str) -> bool:
    request = urllib.request.Request(
        f"http://127.0.0.1:{worker.port}/v1/threads/{tenant}-thread",
        headers={"Authorization": f"Bearer {tenant}-token"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


async def unit_costs(worker: Worker, waiters: int, slow: int) -> None:
    """An idle worker's CPU per request of each kind: a normal GET, a request that
    waits out the 10 s, a slow connection closed by the request timeout; less what
    the idle worker spends meanwhile (its timers, heartbeats)."""
    assert worker.process is not None
    pid = worker.process.pid

    async def measured(work: Any) -> tuple[float, float]:
        before, started = cpu_seconds(pid), time.perf_counter()
        await work
        return cpu_seconds(pid) - before, time.perf_counter() - started

    request = (f"GET /v1/threads/{TENANTS[0]}-thread/messages HTTP/1.1\r\nHost: x\r\n"
               f"Authorization: Bearer {TENANTS[0]}-token\r\n\r\n").encode()

    async def gets(count: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", worker.port)
        for _ in range(count):
            writer.write(request)
            await read_answer(reader)
        writer.close()

    async def waiting(count: int) -> None:
        load = Load(worker.port, 0, 0)
        tasks = [asyncio.create_task(load.waiter(n)) for n in range(count)]
        while sum(load.waiter_answers.values()) < count:
            await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def slow_ones(count: int) -> None:
        load = Load(worker.port, 0, 0)
        tasks = [asyncio.create_task(load.slow_connection()) for _ in range(count)]
        while len(load.held_seconds) < count:
            await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    await gets(200)  # warm-up
    idle_cpu, idle_seconds = await measured(asyncio.sleep(20))
    idle = idle_cpu / idle_seconds
    print(f"  the idle worker itself: {idle:.1%} of a core")
    for what, count, work in (
            ("GET …/messages (one keep-alive connection)", 2000, gets(2000)),
            ("a ?run= request that waits 10 s, then 503", waiters, waiting(waiters)),
            ("a slow connection, closed after 10 s", slow, slow_ones(slow))):
        cpu, seconds = await measured(work)
        print(f"  {what:44} {(cpu - idle * seconds) / count * 1e6:8,.0f} µs of worker CPU"
              f" each ({count:,} in {seconds:.1f} s)")


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--waiters", type=int, default=1000)
    parser.add_argument("--slow", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--unit-costs", action="store_true",
                        help="only an idle worker's CPU per request of each kind")
    parser.add_argument("--alternate", type=float, metavar="SECONDS",
                        help="one worker, the load switched on and off every SECONDS (> 20)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    setup = [generate_run(rng, f"{tenant}-thread", 1) for tenant in TENANTS]
    _, backlog = interleaved_runs(args.seed, max(1, args.events // 117), 6)
    records = [(run.key, event, [("tenant", tenant.encode())])
               for run, tenant in zip(setup, TENANTS, strict=True) for event in run.events]
    records += [(key, value, []) for key, value in backlog]
    log_dir = Path(tempfile.mkdtemp(prefix="agui-api-load-"))
    tokens = log_dir / "tokens"
    tokens.write_text("".join(f"{token_line(t, t + '-token')}\n" for t in TENANTS))
    print(f"worker logs: {log_dir}; {len(records):,} events per worker; {args.waiters}"
          f" waiters, {args.slow} slow connections when loaded")
    prefixes: list[str] = []
    with broker() as bootstrap:
        if args.unit_costs:
            try:
                with serving_worker(bootstrap, log_dir, str(tokens),
                                    records[:sum(len(r.events) for r in setup)], "idle",
                                    prefixes) as worker:
                    asyncio.run(unit_costs(worker, args.waiters, args.slow))
            finally:
                delete_topics(bootstrap, prefixes)
            return 0
        if args.alternate:
            try:
                alternate(bootstrap, log_dir, str(tokens), records, (args.waiters, args.slow),
                          args.alternate, prefixes)
            finally:
                delete_topics(bootstrap, prefixes)
            return 0
        try:
            for round_number in range(args.rounds):
                print(f"round {round_number + 1}:")
                order = [("quiet", None), ("loaded", (args.waiters, args.slow))]
                rates = {name: one_worker(bootstrap, log_dir, str(tokens), records, name,
                                          load_args, prefixes)
                         for name, load_args in (order if round_number % 2 == 0
                                                 else order[::-1])}
                (quiet, quiet_cpu), (loaded, loaded_cpu) = rates["quiet"], rates["loaded"]
                print(f"  loaded / quiet: events/s {loaded / quiet:.3f}, worker CPU per event"
                      f" {loaded_cpu / quiet_cpu:.3f}")
        finally:
            delete_topics(bootstrap, prefixes)
    print("worker logs:", *(log_problems(log_dir) or ["no error lines"]), sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
