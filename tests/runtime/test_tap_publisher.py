"""The tap's side of its publisher process (`processors.runtime.tap_publisher.
Publisher`), without Kafka: a stand-in child that answers every record, refuses
those valued `refuse` and dies on one valued `die`. Outcomes give the budget
back and are counted; a child that dies has its unanswered records refused
(their runs dropped, with a RUN_ERROR) and is started again."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from processors.config import TapSettings
from processors.metrics import TapMetrics
from processors.runtime.tap_publisher import Publisher
from processors.tap.runs import Budget, RunPublication, Step

CHILD = """
import sys
from processors.tap.pipe_frames import (RECORDS, FrameReader, decode_records,
                                        outcomes_frame, producer_frame)
out = sys.stdout.buffer
out.write(producer_frame(True)); out.flush()
frames = FrameReader()
while chunk := sys.stdin.buffer.read1(65536):
    for kind, payload in frames.feed(chunk):
        for record in decode_records(payload):
            if record.value == b"die":
                sys.exit(3)
            out.write(outcomes_frame([(record.seq, record.value != b"refuse")])); out.flush()
"""


class Scene:
    def __init__(self) -> None:
        self.budget = Budget(1 << 20)
        self.metrics = TapMetrics()
        settings = TapSettings.from_env({"AGUI_TAP_UPSTREAM_URL": "http://127.0.0.1:1"})
        self.publisher = Publisher(settings, self.budget, self.metrics,
                                   command=(sys.executable, "-c", CHILD))

    def publish(self, key: bytes, *values: bytes) -> None:
        run, step = RunPublication(key, self.budget), Step()
        for value in values:
            run.publish(value, step)
        self.publisher.take(step, b"acme", time.perf_counter())

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    async def until(self, condition: Callable[[], bool], what: str) -> None:
        try:
            async with asyncio.timeout(30):
                while not condition():
                    await asyncio.sleep(0.01)
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}") from None


def test_records_are_answered_and_a_dying_child_drops_its_runs_and_is_replaced() -> None:
    async def scenario() -> None:
        scene = Scene()
        scene.publisher.start()
        scene.publish(b"t/ok", b"a", b"b")
        await scene.until(lambda: scene.sample("agui_tap_publish_lag_seconds_count") == 2,
                          "two records acknowledged")
        assert scene.budget.used == 0 and scene.publisher.publishing

        scene.publish(b"t/refused", b"a", b"refuse")
        await scene.until(lambda: scene.sample("agui_tap_dropped_runs_total",
                                               reason="publish_failed") == 1,
                          "the refused run dropped")
        assert scene.sample("agui_tap_publish_errors_total") == 1

        scene.publish(b"t/dies", b"a", b"die", b"b")
        await scene.until(lambda: scene.sample("agui_tap_dropped_runs_total",
                                               reason="publish_failed") == 2,
                          "the run the child died on dropped")
        assert not scene.publisher.publishing
        # The next child takes the dropped runs' RUN_ERRORs and what comes later.
        scene.publish(b"t/later", b"a")
        await scene.until(lambda: scene.budget.used == 0 and scene.publisher.publishing,
                          "everything answered by the new child")
        # a, b; a + RUN_ERROR; a (answered before the death) + RUN_ERROR; a
        assert scene.sample("agui_tap_publish_lag_seconds_count") == 7
        await scene.publisher.stop(5.0)

    asyncio.run(scenario())


def test_the_real_publisher_process_exits_when_the_tap_goes_while_kafka_is_unreachable(
        ) -> None:
    """A tap killed while Kafka is unreachable must not leave its publisher behind,
    retrying for ever: the child exits as soon as its stdin closes."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    port = closed.getsockname()[1]
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
           "AGUI_TAP_UPSTREAM_URL": "http://127.0.0.1:1"}
    child = subprocess.Popen([sys.executable, "-m", "processors.runtime.tap_publisher"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout is not None and child.stdin is not None
        header = child.stdout.read(6)  # its first word: the producer could not start
        assert header[4:6] == b"P\x00"
        child.stdin.close()
        assert child.wait(10) == 0
    finally:
        child.kill()
        closed.close()
