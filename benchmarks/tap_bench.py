"""What the tap adds: the same AG-UI runs direct to the upstream and through
`agui-stream tap` (publishing to a real broker), in one run of this script.

    python benchmarks/tap_bench.py [--events 2000] [--interval-ms 1] [--streams 8]

The upstream streams a run of `--events` events (reasoning, then text deltas,
each stamped with CLOCK_MONOTONIC, system-wide on Linux, in ns) one every
`--interval-ms`. The client measures the time to the response's first byte and
each event's latency (arrival minus stamp); then `--streams` concurrent runs
without pauses measure the tap's CPU per event (utime + stime from /proc of
its process and its publisher process), as events/s per tap core. Kafka:
KAFKA_BOOTSTRAP_SERVERS, else the local broker of deploy/kafka_local.py.

A second tap runs beside the first with a stand-in publisher process that
acknowledges every record at once, without Kafka ("tap, no Kafka"): the same
proxy, core, pipe and outcomes, so the difference between the two taps is what
the Kafka producer and the broker add on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import aiohttp
import orjson
import uvloop
from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
AGUI_STREAM = str(Path(sys.executable).with_name("agui-stream"))
DELTA = "a token "  # a typical streamed delta


def run_events(run_id: str, count: int) -> Iterator[dict[str, object]]:
    """A run of `count` events (stamps filled in as each is sent)."""
    yield {"type": "RUN_STARTED", "threadId": "bench", "runId": run_id}
    yield {"type": "REASONING_START", "messageId": "r1"}
    yield {"type": "REASONING_MESSAGE_START", "messageId": "r1", "role": "reasoning"}
    half = max((count - 8) // 2, 1)
    for _ in range(half):
        yield {"type": "REASONING_MESSAGE_CONTENT", "messageId": "r1", "delta": DELTA}
    yield {"type": "REASONING_MESSAGE_END", "messageId": "r1"}
    yield {"type": "REASONING_END", "messageId": "r1"}
    yield {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"}
    for _ in range(max(count - 8 - half, 1)):
        yield {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": DELTA}
    yield {"type": "TEXT_MESSAGE_END", "messageId": "m1"}
    yield {"type": "RUN_FINISHED", "threadId": "bench", "runId": run_id}


# The stand-in publisher process: every record acknowledged as soon as it is read.
ACKNOWLEDGING_PUBLISHER = """
import sys
from processors.tap.pipe_frames import FrameReader, decode_records, outcomes_frame, producer_frame
out = sys.stdout.buffer
out.write(producer_frame(True)); out.flush()
frames = FrameReader()
while chunk := sys.stdin.buffer.read1(65536):
    acknowledged = [(record.seq, True) for _, payload in frames.feed(chunk)
                    for record in decode_records(payload)]
    out.write(outcomes_frame(acknowledged)); out.flush()
"""


def serve_tap_without_kafka() -> None:
    from processors.config import TapSettings
    from processors.runtime.tap_server import serve

    async def main() -> None:
        stopping = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
        await serve(TapSettings.from_env(), None, stopping,
                    publisher_command=(sys.executable, "-c", ACKNOWLEDGING_PUBLISHER))

    uvloop.run(main())


def serve_upstream(port: int) -> None:
    async def agent(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        interval = body["forwardedProps"]["intervalMs"] / 1000
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        next_at = time.monotonic()
        for event in run_events(body["runId"], body["forwardedProps"]["events"]):
            if interval:
                next_at += interval
                await asyncio.sleep(max(next_at - time.monotonic(), 0))
            event["timestamp"] = time.monotonic_ns()
            await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
        return response

    app = web.Application()
    app.router.add_post("/agent", agent)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def one_run(session: aiohttp.ClientSession, url: str, run_id: str, events: int,
                  interval_ms: float) -> tuple[float, list[float]]:
    """(time to first byte, per-event latencies), in seconds."""
    body = orjson.dumps({"threadId": "bench", "runId": run_id, "messages": [
        {"id": "u1", "role": "user", "content": "Hi"}], "tools": [], "context": [],
        "forwardedProps": {"events": events, "intervalMs": interval_ms}})
    sent = time.monotonic()
    latencies: list[float] = []
    async with session.post(url, data=body, headers={"Content-Type": "application/json",
                                                     "X-Agui-Tenant": "bench"}) as response:
        first = None
        async for line in response.content:
            now = time.monotonic_ns()
            if first is None:
                first = now / 1e9 - sent
            if line.startswith(b"data: "):
                latencies.append((now - orjson.loads(line[6:])["timestamp"]) / 1e9)
    assert first is not None and len(latencies) == events, (first, len(latencies))
    return first, latencies


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of `pid` and its descendants: the tap and its
    publisher process."""
    pids, total = [pid], 0
    for process in pids:  # (grows as children are found)
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
            for task in Path(f"/proc/{process}/task").iterdir():
                pids += [int(child) for child in (task / "children").read_text().split()]
    return total / os.sysconf("SC_CLK_TCK")


def wait_answering(url: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError as error:
            if getattr(error, "code", None) is not None:
                return
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1] if len(values) > 1 else 0.0


async def published(session: aiohttp.ClientSession, health: str) -> None:
    """Wait until Kafka has acknowledged every record the tap handed out."""
    while True:
        async with session.get(f"{health}/readyz") as response:
            if (await response.json())["bufferedBytes"] == 0:
                return
        await asyncio.sleep(0.05)


class Tap(NamedTuple):
    name: str
    url: str
    health: str
    pid: int


async def measure(args: argparse.Namespace, direct: str, taps: list[Tap]) -> None:
    async with aiohttp.ClientSession() as session:
        targets = [("direct", direct), *((tap.name, tap.url) for tap in taps)]
        warmed_until = time.monotonic() + args.warm_up
        for tap in taps:  # connections, producer metadata
            await one_run(session, tap.url, "warm-up", 50, 0)
        while time.monotonic() < warmed_until:  # the same runs, not measured
            for name, url in targets:
                await one_run(session, url, f"warm-up-{name}", args.events, args.interval_ms)
        rows: list[tuple[str, float, list[float]]] = []
        for name, url in targets * args.rounds:
            first, latencies = await one_run(session, url, f"{name}-{len(rows)}", args.events,
                                             args.interval_ms)
            rows.append((name, first, latencies))
        print(f"{args.events} events, one every {args.interval_ms} ms, {args.rounds} runs each,"
              f" alternating, after {args.warm_up:.0f} s of the same runs not measured")
        print(f"{'':14}{'TTFB p50':>10}{'event p50':>11}{'event p99':>11}{'event max':>11}")
        for name in ("direct", *(tap.name for tap in taps)):
            firsts = [f for n, f, _ in rows if n == name]
            lat = [x for n, _, ls in rows if n == name for x in ls]
            print(f"{name:14}{statistics.median(firsts) * 1e3:>8.2f}ms"
                  f"{pct(lat, 0.5) * 1e3:>9.3f}ms{pct(lat, 0.99) * 1e3:>9.3f}ms"
                  f"{max(lat) * 1e3:>9.3f}ms")

        for tap in taps:
            await published(session, tap.health)
            before, started = cpu_seconds(tap.pid), time.monotonic()
            await asyncio.gather(*(one_run(session, tap.url, f"load-{i}", args.events, 0)
                                   for i in range(args.streams)))
            await published(session, tap.health)  # its CPU includes handing every record over
            used, wall = cpu_seconds(tap.pid) - before, time.monotonic() - started
            total = args.streams * args.events
            print(f"load, {tap.name}: {args.streams} streams x {args.events} events unpaced in"
                  f" {wall:.2f}s; tap CPU {used:.2f}s: {total / used:,.0f} events/s per tap core")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--interval-ms", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--warm-up", type=float, default=30.0,
                        help="seconds of paced runs before measuring (a broker seconds old"
                             " adds about 1 ms to the tap's p99 per event)")
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-tap-without-kafka", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return
    if args.serve_tap_without_kafka:
        serve_tap_without_kafka()
        return
    with contextlib.ExitStack() as stack:
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        if not bootstrap:
            spec = importlib.util.spec_from_file_location("kafka_local",
                                                          REPO / "deploy" / "kafka_local.py")
            assert spec is not None and spec.loader is not None
            kafka_local = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(kafka_local)
            bootstrap = stack.enter_context(kafka_local.local_broker())
        up_port, tap_port, health_port = 18901, 18902, 18903
        env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
               "AGUI_TAP_UPSTREAM_URL": f"http://127.0.0.1:{up_port}",
               "AGUI_TAP_PORT": str(tap_port), "AGUI_METRICS_PORT": str(health_port),
               "AGUI_TAP_TOPIC": "tap-bench.events", "AGUI_LOG_LEVEL": "warning"}
        subprocess.run([AGUI_STREAM, "create-topics"], env={**env, "AGUI_INPUT_TOPICS":
                       "tap-bench.events"}, check=True, capture_output=True)
        processes = [subprocess.Popen([sys.executable, __file__, "--serve-upstream",
                                       str(up_port)]),
                     subprocess.Popen([AGUI_STREAM, "tap"], env=env),
                     subprocess.Popen([sys.executable, __file__, "--serve-tap-without-kafka"],
                                      env={**env, "AGUI_TAP_PORT": str(tap_port + 10),
                                           "AGUI_METRICS_PORT": str(health_port + 10)})]
        for process in processes:
            stack.callback(process.wait)
            stack.callback(process.terminate)
        taps = [Tap("tap", f"http://127.0.0.1:{tap_port}/agent",
                    f"http://127.0.0.1:{health_port}", processes[1].pid),
                Tap("tap, no Kafka", f"http://127.0.0.1:{tap_port + 10}/agent",
                    f"http://127.0.0.1:{health_port + 10}", processes[2].pid)]
        wait_answering(f"http://127.0.0.1:{up_port}/agent")
        for tap in taps:
            wait_answering(f"{tap.health}/readyz")
        asyncio.run(measure(args, f"http://127.0.0.1:{up_port}/agent", taps))
        with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/metrics") as scrape:
            for line in scrape.read().decode().splitlines():
                if line.startswith(("agui_tap_publish_lag_seconds_count",
                                    "agui_tap_publish_lag_seconds_sum",
                                    'agui_tap_dropped_runs_total{reason="buffer_full"}')):
                    print(line)


if __name__ == "__main__":
    main()
