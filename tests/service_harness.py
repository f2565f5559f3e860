"""Run real `agui-stream worker` processes against a real broker, and read what they wrote.

Every test gets its own topic names and consumer group (`Namespace`), so tests
never see each other's records. Waiting is always for a condition with a
deadline, never a bare sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from processors.runtime.exits import EXIT_UNSENT
from processors.view.tenant_tokens import token_line

AGUI_STREAM = str(Path(sys.executable).with_name("agui-stream"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Namespace:
    """Topic names and settings for one test."""

    bootstrap: str
    partitions: int = 4
    prefix: str = field(default_factory=lambda: f"t{uuid.uuid4().hex[:10]}")

    @property
    def events(self) -> str:
        return f"{self.prefix}.events"

    @property
    def history(self) -> str:
        return f"{self.prefix}.history"

    @property
    def deadletter(self) -> str:
        return f"{self.prefix}.deadletter"

    @property
    def app_id(self) -> str:
        return f"{self.prefix}-app"

    def env(self, **overrides: str) -> dict[str, str]:
        env = {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "AGUI_APP_ID": self.app_id,
            "AGUI_INPUT_TOPICS": self.events,
            "AGUI_HISTORY_TOPIC": self.history,
            "AGUI_DEADLETTER_TOPIC": self.deadletter,
            "AGUI_PARTITIONS": str(self.partitions),
            "AGUI_STORE": "memory://",
            # AGUI_TEST_LOG_LEVEL=info keeps the workers' rebalance and recovery steps
            "AGUI_LOG_LEVEL": os.environ.get("AGUI_TEST_LOG_LEVEL", "warning"),
        }
        env.update(overrides)
        return env

    def create_topics(self, **env: str) -> None:
        result = subprocess.run([AGUI_STREAM, "create-topics"], env=self.env(**env),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr


# Restarts the worker when it exits with EXIT_UNSENT, as the deployments do
# (StatefulSet, compose `restart: unless-stopped`); a SIGTERM to the process
# group stops the worker and then this loop, once the worker has exited.
# A worker must not outlive its owner, even a SIGKILLed pytest: the kernel kills
# it when its parent dies (util-linux setpriv), as it does the local broker.
_SETPRIV = shutil.which("setpriv")
_DIE_WITH_PARENT = [_SETPRIV, "--pdeathsig", "KILL"] if _SETPRIV else []
_SUPERVISOR = f"""
trap 'wait "$child"; exit' TERM
while :; do
  {" ".join(_DIE_WITH_PARENT)} "{AGUI_STREAM}" worker & child=$!
  wait "$child"; code=$?
  [ "$code" -eq {EXIT_UNSENT} ] || exit "$code"
done
"""


class Worker:
    """One `agui-stream worker` process (optionally restarted like a deployment's).

    Every worker started is in `Worker.started` until `reap_all` kills its
    process group (worker and supervisor), which a fixture does after each
    test, passed or failed: no test process outlives its test.
    """

    started: ClassVar[list[Worker]] = []

    @classmethod
    def reap_all(cls) -> None:
        while cls.started:
            cls.started.pop().kill()

    def __init__(self, namespace: Namespace, log_dir: Path, name: str = "worker",
                 restarted: bool = False, wrapper: tuple[str, ...] = (), **env: str) -> None:
        self.port = free_port()
        self.data_dir = log_dir / f"{name}-data"
        self.log_path = log_dir / f"{name}.log"
        self.env = namespace.env(AGUI_METRICS_PORT=str(self.port),
                                 AGUI_DATA_DIR=str(self.data_dir), **env)
        self.process: subprocess.Popen[bytes] | None = None
        self.restarted = restarted
        self.wrapper = wrapper  # runs the worker under it (`prlimit --as=…`, say)
        self.starts = 0

    def start(self) -> Worker:
        self.starts += 1
        log = self.log_path.open("ab")
        command = [*_DIE_WITH_PARENT, *self.wrapper,
                   *(["bash", "-c", _SUPERVISOR] if self.restarted else [AGUI_STREAM, "worker"])]
        self.process = subprocess.Popen(command, env=self.env, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        if self not in Worker.started:
            Worker.started.append(self)
        wait_for(self._healthy, 60, f"worker on port {self.port} to answer /healthz",
                 self.log_tail)
        return self

    def _healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"worker exited with {self.process.returncode}\n"
                                 + self.log_tail())
        return self._answers("/healthz")

    def ready(self) -> bool:
        """Whether the worker's /readyz says ready: in the group, its partitions
        assigned and its tables recovered."""
        return self._answers("/readyz")

    def _answers(self, path: str) -> bool:
        """Whether the worker answers `path` with a success."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2):
                return True
        except OSError:  # an error status (HTTPError is an OSError), or no answer
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def input_partitions(self) -> int:
        """How many input partitions the worker owns (its /healthz)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz",
                                        timeout=2) as response:
                return int(orjson.loads(response.read())["inputPartitions"])
        except OSError:
            return 0

    def processed(self) -> int:
        """Raw records this worker has consumed so far (from its /metrics)."""
        try:
            text = self.metrics()
        except OSError:
            return 0
        return int(sum(float(v) for v in re.findall(r"^agui_events_total\{[^}]*\} (\S+)$",
                                                       text, re.M)))

    def kill(self) -> None:
        """SIGKILL to the whole process group: no shutdown, no commit, no flush.

        Sent even when the group leader has exited: a supervisor's worker may
        outlive it."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_bytes().decode("utf-8", "replace")
        except OSError:
            return ""
        kept = [line.strip() for line in text.splitlines() if line.strip()]
        return "\n".join(kept[-lines:])

    def stuck_report(self) -> str:
        """Where the worker's tasks wait (its SIGUSR1 dump), and its log before that:
        what a test that timed out waiting on the worker shows."""
        if self.process is None or self.process.poll() is not None:
            return self.log_tail()
        pids = [self.process.pid]
        if self.restarted:  # the worker is the supervisor's child
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
            with contextlib.suppress(OSError):
                pids = [int(pid) for pid in children.read_text().split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        time.sleep(2)  # the dump is logged by the worker's event loop
        return self.log_tail(200)


def wait_for(condition: Callable[[], bool], timeout: float, what: str,
             detail: Callable[[], str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                                 + (f"\n{detail()}" if detail else ""))
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


@dataclass(frozen=True)
class Produced:
    key: bytes
    value: bytes
    partition: int
    offset: int


def produce(bootstrap: str, topic: str,
            records: Iterable[tuple[bytes, bytes, list[tuple[str, bytes]]]],
            security: dict[str, Any] | None = None) -> list[Produced]:
    """`security`: aiokafka's TLS and SASL options (`secured_client`), for a secured
    broker."""
    async def run() -> list[Produced]:
        # Idempotent: a retried batch (leader elections) must not duplicate input.
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5,
                                    enable_idempotence=True,
                                    max_request_size=4_000_000, **(security or {}))
        await producer.start()
        try:
            pending = []
            for key, value, headers in records:
                future = await producer.send(topic, value=value, key=key, headers=headers)
                pending.append((key, value, future))
            out = []
            for key, value, future in pending:
                meta = await future
                out.append(Produced(key, value, meta.partition, meta.offset))
            return out
        finally:
            await producer.stop()

    return asyncio.run(run())


@dataclass(frozen=True)
class Consumed:
    key: bytes
    value: dict[str, Any]
    headers: dict[str, bytes]
    partition: int
    offset: int


class TopicReader:
    """Reads a topic from the beginning with read_committed, accumulating records."""

    def __init__(self, bootstrap: str, topic: str, partitions: int = 4,
                 security: dict[str, Any] | None = None) -> None:
        self.bootstrap = bootstrap
        self.security = security or {}
        self.topic = topic
        self.partitions = partitions
        self.records: list[Consumed] = []
        self._positions: dict[int, int] = {}

    def poll(self) -> list[Consumed]:
        async def run() -> list[Consumed]:
            consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap,
                                        isolation_level="read_committed",
                                        enable_auto_commit=False, auto_offset_reset="earliest",
                                        **self.security)
            await consumer.start()
            try:
                tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
                consumer.assign(tps)
                for tp in tps:
                    consumer.seek(tp, self._positions.get(tp.partition, 0))
                ends = await consumer.end_offsets(tps)
                new: list[Consumed] = []
                async def behind() -> bool:
                    return any([await consumer.position(tp) < ends[tp] for tp in tps])

                # read_committed end offsets are the last stable offsets: positions
                # reach them once everything committed before this poll is read.
                deadline = time.monotonic() + 30
                while await behind() and time.monotonic() < deadline:
                    batch = await consumer.getmany(timeout_ms=500)
                    for tp, messages in batch.items():
                        for m in messages:
                            new.append(Consumed(m.key or b"", orjson.loads(m.value),
                                                {k: v for k, v in m.headers}, tp.partition,
                                                m.offset))
                for tp in tps:
                    self._positions[tp.partition] = await consumer.position(tp)
                return new
            finally:
                await consumer.stop()

        fresh = asyncio.run(run())
        self.records.extend(fresh)
        return fresh

    def wait_until(self, condition: Callable[[list[Consumed]], bool], timeout: float,
                   what: str, detail: Callable[[], str] | None = None) -> list[Consumed]:
        def satisfied() -> bool:
            self.poll()
            return condition(self.records)

        wait_for(satisfied, timeout, what, detail)
        return self.records


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, partitions, 1)])
        finally:
            await admin.close()

    asyncio.run(run())


VIEW_TOKEN = "view-check-token"  # the `default` tenant's token in `view_tokens_file`


def view_tokens_file(directory: Path) -> str:
    """A tokens file giving the `default` tenant (records without a tenant header)
    `VIEW_TOKEN`, for tests that read a worker's thread view."""
    path = directory / "view-tokens"
    path.write_text(f"{token_line('default', VIEW_TOKEN)}\n")
    return str(path)


def history_fold(history: list[Consumed], tenant: str = "default",
                 ) -> dict[str, tuple[list[dict[str, Any]], str]]:
    """What the thread view must hold, folded independently from the history topic:
    per thread of `tenant` its messages in the order their ids first
    came, a message id seen again replacing the earlier one in place; and the
    thread's last run."""
    threads: dict[str, tuple[dict[str, dict[str, Any]], list[str]]] = {}
    for record in sorted(history, key=lambda r: (r.partition, r.offset)):
        value = record.value
        if value.get("threadId") is None or value["tenant"] != tenant:
            continue
        messages, runs = threads.setdefault(value["threadId"], ({}, []))
        if value["kind"] == "message":
            messages[value["message"]["id"]] = value["message"]
        else:
            runs.append(value["runId"])
    return {thread: (list(messages.values()), runs[-1])
            for thread, (messages, runs) in threads.items() if runs}


def assert_view_matches_history(worker: Worker, history: list[Consumed],
                                tenant: str = "default", token: str = VIEW_TOKEN) -> None:
    """Every thread of `tenant` (`token` is its) the history topic has, read through
    the worker's thread API (waiting for its last run), is the independent fold of the
    history topic. A 503 (the thread's partition moving: a worker just left) is
    retried."""
    answers: dict[str, Any] = {}

    def answered(thread: str, last_run: str) -> bool:
        request = urllib.request.Request(
            f"http://127.0.0.1:{worker.port}/v1/threads/{thread}/messages?run={last_run}",
            headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                answers[thread] = orjson.loads(response.read())
                return True
        except urllib.error.HTTPError as error:
            if error.code != 503:
                raise
            return False

    for thread, (messages, last_run) in history_fold(history, tenant).items():
        wait_for(lambda thread=thread, run=last_run: answered(thread, run), 120,
                 f"the view to answer for thread {thread}", worker.log_tail)
        assert answers[thread]["messages"] == messages, f"thread {thread} in the view"
