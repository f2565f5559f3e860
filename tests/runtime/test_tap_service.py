"""`agui-stream tap` in front of a real AG-UI agent server (pydantic-ai, a
FunctionModel: no network, no model), on the real broker, with a worker.

A client talks to the agent through the tap: it gets exactly the agent's
stream; the raw topic gets every event (the requested run's RUN_STARTED with the
request's messages); the worker's history and thread view hold the run, the
user's message included; and a second turn built from the view is accepted by
the same agent. A client leaving mid-run and an agent killed mid-run reach the
history at once, as RUN_ERRORs naming what happened. With Kafka unreachable the
clients get the same bytes and the dropped publications are counted; with the
broker stopped in the middle of a run, the client gets the rest at once, and the
run is published whole once the broker is back.
"""

from __future__ import annotations

import asyncio
import http.client
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from processors.tap.runs import CODE_CLIENT_GONE, CODE_INTERRUPTED, CODE_TRUNCATED
from processors.tap.sse import Event, SseFramer
from processors.view.client import fetch_thread_messages
from tests.conftest import load_kafka_local
from tests.service_harness import (
    _DIE_WITH_PARENT,
    AGUI_STREAM,
    VIEW_TOKEN,
    Namespace,
    TopicReader,
    Worker,
    free_port,
    view_tokens_file,
    wait_for,
)

pytestmark = pytest.mark.kafka
TENANT_HEADER = "X-Agui-Tenant"


class Process:
    """A child process that dies with the test process, killed when the test ends."""

    def __init__(self, command: list[str], env: dict[str, str] | None, log: Path,
                 health_url: str) -> None:
        self.log = log
        with log.open("ab") as out:
            self.popen = subprocess.Popen([*_DIE_WITH_PARENT, *command], env=env, stdout=out,
                                          stderr=subprocess.STDOUT)
        wait_for(lambda: self._answers(health_url), 60, f"{command[-1]} to answer",
                 lambda: log.read_text(errors="replace")[-3000:])

    def _answers(self, url: str) -> bool:
        if self.popen.poll() is not None:
            raise AssertionError(f"exited with {self.popen.returncode}\n"
                                 + self.log.read_text(errors="replace")[-3000:])
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError as error:  # a 405 from the agent's POST-only route is an answer
            return getattr(error, "code", None) is not None

    def kill(self) -> None:
        self.popen.kill()
        self.popen.wait(30)


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        process.kill()


def start_agent(processes: list[Process], tmp_path: Path, name: str = "agent") -> int:
    port = free_port()
    processes.append(Process([sys.executable, "-m", "processors.tools.sample_agent", str(port)],
                             None, tmp_path / f"{name}.log", f"http://127.0.0.1:{port}/agent"))
    return port


def start_tap(processes: list[Process], tmp_path: Path, env: dict[str, str],
              upstream_port: int, **settings: str) -> tuple[int, int]:
    port, health = free_port(), free_port()
    env = {**env, "AGUI_TAP_UPSTREAM_URL": f"http://127.0.0.1:{upstream_port}",
           "AGUI_TAP_PORT": str(port), "AGUI_METRICS_PORT": str(health), **settings}
    processes.append(Process([AGUI_STREAM, "tap"], env, tmp_path / "tap.log",
                             f"http://127.0.0.1:{health}/readyz"))
    return port, health


def run_input(thread: str, run: str, messages: list[dict[str, object]]) -> bytes:
    return orjson.dumps({"threadId": thread, "runId": run, "messages": messages, "tools": [],
                         "context": [], "state": None, "forwardedProps": None})


def post(port: int, body: bytes, path: str = "/agent", tenant: str = "default",
         ) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", path, body, {"Content-Type": "application/json",
                                            "Accept": "text/event-stream",
                                            TENANT_HEADER: tenant})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, data


def events_of(stream: bytes) -> list[dict[str, object]]:
    return [orjson.loads(f.data) for f in SseFramer(1 << 20).feed(stream)
            if isinstance(f, Event)]


def post_and_leave(port: int, body: bytes, events: int) -> None:
    """POST, read `events` events of the stream, then close the connection."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", "/agent", body, {"Content-Type": "application/json",
                                                TENANT_HEADER: "default"})
    response = connection.getresponse()
    seen = 0
    while seen < events:
        seen += response.readline() == b"\n"
    connection.close()


def closing_record(history: TopicReader, run: str, log: Path) -> dict[str, object]:
    records = history.wait_until(
        lambda rs: any(r.value.get("runId") == run and r.value["kind"] == "run" for r in rs),
        60, f"the closing record of {run}", lambda: log.read_text(errors="replace")[-3000:])
    return next(r.value for r in records
                if r.value.get("runId") == run and r.value["kind"] == "run")


def metric(health_port: int, series: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(series + " "):
                return float(line.split()[1])
    raise AssertionError(f"no series {series}")


def test_a_run_through_the_tap_reaches_the_view_and_the_next_turn(
        kafka_bootstrap: str, tmp_path: Path, processes: list[Process]) -> None:
    namespace = Namespace(kafka_bootstrap)
    namespace.create_topics()
    worker = Worker(namespace, tmp_path, AGUI_TOKENS_FILE=view_tokens_file(tmp_path)).start()
    agent = start_agent(processes, tmp_path)
    tap, health = start_tap(processes, tmp_path, namespace.env(), agent,
                            AGUI_TAP_TOPIC=namespace.events)

    user = {"id": "u1", "role": "user", "content": "What is the weather in Paris?"}
    status, stream = post(tap, run_input("t1", "r1", [user]))
    assert status == 200
    events = events_of(stream)
    assert [e["type"] for e in events][-1] == "RUN_FINISHED"
    assert {"REASONING_MESSAGE_CONTENT", "REASONING_ENCRYPTED_VALUE", "TOOL_CALL_ARGS",
            "TOOL_CALL_RESULT", "TEXT_MESSAGE_CONTENT"} <= {e["type"] for e in events}

    # The raw topic holds the client's events in order; RUN_STARTED with the input.
    raw = TopicReader(kafka_bootstrap, namespace.events).wait_until(
        lambda rs: len(rs) >= len(events), 30, "the run's events on the raw topic")
    assert {(r.key, r.headers["tenant"]) for r in raw} == {(b"t1/r1", b"default")}
    published = [r.value for r in sorted(raw, key=lambda r: r.offset)]
    assert published[0].pop("input") == {"threadId": "t1", "runId": "r1", "messages": [user]}
    assert published == events

    base = f"http://127.0.0.1:{worker.port}"
    messages = fetch_thread_messages(base, VIEW_TOKEN, "t1", run="r1")
    held = [m.model_dump(by_alias=True, exclude_none=True) for m in messages]
    assert held[0] == user
    assert [m["role"] for m in held] == ["user", "reasoning", "assistant", "tool", "assistant"]

    # The next turn, from the view, through the tap to the same agent.
    follow_up = {"id": "u2", "role": "user", "content": "And tomorrow?"}
    status, stream = post(tap, run_input("t1", "r2", [*held, follow_up]))
    second = events_of(stream)
    assert status == 200 and second[-1]["type"] == "RUN_FINISHED", second[-3:]
    assert [m.id for m in fetch_thread_messages(base, VIEW_TOKEN, "t1", run="r2")][
        :len(held) + 1] == [*(m["id"] for m in held), "u2"]
    assert metric(health, 'agui_tap_runs_total{fate="finished"}') == 2


def test_a_client_leaving_or_an_agent_dying_mid_run_reaches_the_history_at_once(
        kafka_bootstrap: str, tmp_path: Path, processes: list[Process]) -> None:
    namespace = Namespace(kafka_bootstrap)
    namespace.create_topics()
    Worker(namespace, tmp_path).start()
    agent = start_agent(processes, tmp_path)
    tap, _ = start_tap(processes, tmp_path, namespace.env(), agent,
                       AGUI_TAP_TOPIC=namespace.events)
    history = TopicReader(kafka_bootstrap, namespace.history)
    slow = [{"id": "u1", "role": "user", "content": "slow please"}]

    post_and_leave(tap, run_input("t1", "left", slow), events=5)
    closing = closing_record(history, "left", tmp_path / "tap.log")
    assert closing["outcome"] == "error" and closing["error"]["code"] == CODE_CLIENT_GONE

    dying = start_agent(processes, tmp_path, "dying")
    tap2, _ = start_tap(processes, tmp_path, namespace.env(), dying,
                        AGUI_TAP_TOPIC=namespace.events)
    connection = http.client.HTTPConnection("127.0.0.1", tap2, timeout=60)
    connection.request("POST", "/agent", run_input("t2", "cut", slow),
                       {"Content-Type": "application/json", TENANT_HEADER: "default"})
    response = connection.getresponse()
    while response.readline() != b"\n":  # RUN_STARTED is through
        pass
    processes[-2].kill()  # the agent
    with pytest.raises((http.client.IncompleteRead, ConnectionError)):
        response.read()  # the client sees the stream break, as it would without the tap
    closing = closing_record(history, "cut", tmp_path / "tap.log")
    assert closing["outcome"] == "error" and closing["error"]["code"] == CODE_TRUNCATED


# A stream an agent could send: CRLF and CR line ends, a comment, a multi-line data
# field, a non-JSON payload and an event far over the tap's bound.
ODD_STREAM = (b": hello\r\n\r\ndata: {\"type\":\"RUN_STARTED\",\"threadId\":\"t\",\"runId\":\"r\"}"
              b"\r\rdata: {\"type\":\"CUSTOM\",\r\ndata: \"name\":\"n\",\"value\":1}\n\n"
              b"data: not json\n\ndata: " + b"x" * 300_000 + b"\n\n"
              b"data: {\"type\":\"RUN_FINISHED\",\"threadId\":\"t\",\"runId\":\"r\"}\n\n")
GATED_FIRST = b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in [
    {"type": "RUN_STARTED", "threadId": "t-gated", "runId": "r-gated"},
    {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"},
    *({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f"a{n} "} for n in range(5))])
GATED_REST = b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in [
    *({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f"b{n} "} for n in range(5)),
    {"type": "TEXT_MESSAGE_END", "messageId": "m"},
    {"type": "RUN_FINISHED", "threadId": "t-gated", "runId": "r-gated"}])
BIG_RUN = b"".join(b"data: {\"type\":\"CUSTOM\",\"name\":\"n\",\"value\":\"" + b"v" * 1000
                   + b"\"}\n\n" for _ in range(200))


class OddUpstream:
    """An agent endpoint in a thread: fixed answers, written in small pieces."""

    def __init__(self) -> None:
        self.port = free_port()
        self.gate = threading.Event()  # `/gated` sends its second half once it is set
        self._ready = threading.Event()
        threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True).start()
        assert self._ready.wait(10)

    async def _serve(self) -> None:
        async def answer(request: web.Request) -> web.StreamResponse:
            if request.path == "/missing":
                return web.Response(status=404, text="no such agent")
            if request.path == "/json":
                return web.json_response({"not": "a stream"})
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            if request.path == "/gated":
                await response.write(GATED_FIRST)
                await asyncio.to_thread(self.gate.wait, 120)
                await response.write(GATED_REST)
                return response
            body = BIG_RUN if request.path == "/big" else ODD_STREAM
            for start in range(0, len(body), 7_001):
                await response.write(body[start:start + 7_001])
            return response

        app = web.Application()
        app.router.add_route("*", "/{path:.*}", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._ready.set()
        await asyncio.Event().wait()


def test_with_kafka_unreachable_clients_get_the_same_bytes_and_drops_are_counted(
        tmp_path: Path, processes: list[Process]) -> None:
    upstream = OddUpstream()
    closed = free_port()  # nothing listens there
    tap, health = start_tap(processes, tmp_path, Namespace(f"127.0.0.1:{closed}").env(),
                            upstream.port, AGUI_TAP_BUFFER_BYTES="65536",
                            AGUI_TAP_MAX_EVENT_BYTES="100000")
    body = run_input("t", "r", [])
    for path in ("/odd", "/missing", "/json", "/big", "/big"):
        direct = post(upstream.port, body, path)
        assert post(tap, body, path) == direct, path
    assert metric(health, 'agui_tap_dropped_runs_total{reason="buffer_full"}') >= 1
    assert metric(health, 'agui_tap_dropped_runs_total{reason="event_too_large"}') == 1
    assert metric(health, 'agui_tap_responses_total{kind="not_sse"}') == 1
    assert metric(health, 'agui_tap_responses_total{kind="upstream_error"}') == 1
    assert metric(health, "agui_tap_publishing") == 0
    with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=5) as ready:
        assert orjson.loads(ready.read())["publishing"] is False
    assert_tap_queries_are_live(health)


def assert_tap_queries_are_live(health_port: int) -> None:
    """Every tap metric the dashboard and the alert rules query is on the tap's live
    /metrics."""
    from tests.deploy.queried_metrics import live_metric_names, queried_metric_names

    with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/metrics", timeout=5) as r:
        live = live_metric_names(r.read().decode())
    tap_metrics = {name for name in queried_metric_names() if name.startswith("agui_tap_")}
    assert tap_metrics and tap_metrics - live == set()


def test_kafka_stopped_mid_run_the_client_is_unaffected_and_the_run_published_once_back(
        tmp_path: Path, processes: list[Process]) -> None:
    """A broker of the test's own, stopped while a run streams through the tap and
    started again later: the client gets the rest of the run at once; a run larger
    than the buffer, sent meanwhile, is forwarded whole and its publication dropped;
    the tap says Kafka is not taking records; once the broker is back, the first
    run is on the raw topic whole, in order, once, and the dropped one ends with
    its RUN_ERROR."""
    kafka_local = load_kafka_local()
    state = tmp_path / "broker"
    bootstrap = kafka_local.start(state).bootstrap
    upstream = OddUpstream()
    try:
        namespace = Namespace(bootstrap)
        namespace.create_topics()
        tap, health = start_tap(processes, tmp_path, namespace.env(), upstream.port,
                                AGUI_TAP_BUFFER_BYTES="65536", AGUI_TAP_TOPIC=namespace.events)
        raw = TopicReader(bootstrap, namespace.events)
        replies: list[tuple[int, bytes]] = []
        client = threading.Thread(target=lambda: replies.append(
            post(tap, run_input("t-gated", "r-gated", []), "/gated")))
        client.start()
        raw.wait_until(lambda rs: any(r.value.get("delta") == "a4 " for r in rs), 60,
                       "the run's first half on the raw topic")
        kafka_local.stop(state, keep=True)
        upstream.gate.set()
        released = time.monotonic()
        client.join(60)
        assert replies == [(200, GATED_FIRST + GATED_REST)]
        assert time.monotonic() - released < 5.0  # not held by Kafka (it never returns)
        assert post(tap, run_input("t", "r", []), "/big") == (200, BIG_RUN)
        assert metric(health, 'agui_tap_dropped_runs_total{reason="buffer_full"}') == 1
        wait_for(lambda: metric(health, "agui_tap_publishing") == 0, 30,
                 "the tap to say Kafka is not taking its records")

        kafka_local.start(state)
        wait_for(lambda: metric(health, "agui_tap_publishing") == 1
                 and metric(health, "agui_tap_buffered_bytes") == 0, 120,
                 "the tap to publish what it held")
        records = raw.wait_until(lambda rs: any(r.value.get("type") == "RUN_FINISHED"
                                                for r in rs), 60, "the run's end")
        gated = [r.value for r in records if r.key == b"t-gated/r-gated"]
        assert [(e["type"], e.get("delta")) for e in gated] == [
            (e["type"], e.get("delta")) for e in events_of(GATED_FIRST + GATED_REST)]
        big = [r.value for r in records if r.key == b"t/r"]
        assert big and big[-1]["type"] == "RUN_ERROR"
        assert big[-1]["code"] == "tap_publication_dropped"
        assert all(e["type"] == "CUSTOM" for e in big[:-1]) and len(big) < 200
    finally:
        upstream.gate.set()
        kafka_local.stop(state)


def test_a_tap_killed_mid_run_publishes_what_it_relayed_and_says_the_run_was_cut(
        kafka_bootstrap: str, tmp_path: Path, processes: list[Process]) -> None:
    """kill -9 of the tap while a run streams: its publisher process publishes what
    it was given, then a RUN_ERROR `tap_interrupted` for the run; the worker ends
    the run as an error at once, not after the idle timeout."""
    namespace = Namespace(kafka_bootstrap)
    namespace.create_topics()
    upstream = OddUpstream()
    try:
        tap, _ = start_tap(processes, tmp_path, namespace.env(), upstream.port,
                           AGUI_TAP_TOPIC=namespace.events)
        connection = http.client.HTTPConnection("127.0.0.1", tap, timeout=60)
        connection.request("POST", "/gated", run_input("t-gated", "r-gated", []),
                           {"Content-Type": "application/json", TENANT_HEADER: "default"})
        response = connection.getresponse()  # and stays connected
        raw = TopicReader(kafka_bootstrap, namespace.events)
        raw.wait_until(lambda rs: any(r.value.get("delta") == "a4 " for r in rs), 60,
                       "the run's first half on the raw topic")
        processes[-1].kill()  # the tap: SIGKILL, nothing of it runs after
        records = raw.wait_until(lambda rs: any(r.value.get("type") == "RUN_ERROR"
                                                for r in rs), 60, "the run's RUN_ERROR")
        run = [r.value for r in records if r.key == b"t-gated/r-gated"]
        assert [e["type"] for e in run] == [e["type"] for e in events_of(GATED_FIRST)] + [
            "RUN_ERROR"]
        assert run[-1]["code"] == CODE_INTERRUPTED
        response.close()
        worker = Worker(namespace, tmp_path).start()
        history = TopicReader(kafka_bootstrap, namespace.history)
        assert closing_record(history, "r-gated", worker.log_path)["outcome"] == "error"
        worker.stop()
    finally:
        upstream.gate.set()
