"""/livez and /readyz of a running worker on a real broker."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.service_harness import Namespace, TopicReader, Worker, produce, wait_for

pytestmark = pytest.mark.kafka

STALL_SECONDS = 5


def get(worker: Worker, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{worker.port}{path}",
                                    timeout=5) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())


def runs(count: int) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    records = []
    for n in range(count):
        for event in ({"type": "RUN_STARTED", "threadId": "t", "runId": f"r{n}"},
                      {"type": "RUN_FINISHED", "threadId": "t", "runId": f"r{n}"}):
            records.append((b"k%d" % (n % 8), orjson.dumps(event), []))
    return records


def test_a_worker_with_waiting_input_that_processes_nothing_is_not_alive(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    namespace = Namespace(kafka_bootstrap)
    namespace.create_topics()
    produce(kafka_bootstrap, namespace.events, runs(50))
    worker = Worker(namespace, tmp_path, AGUI_TEST_STALL_AGENT="1",
                    AGUI_STALL_SECONDS=str(STALL_SECONDS)).start()
    try:
        wait_for(lambda: get(worker, "/readyz")[0] == 200, 60, "the worker to be ready",
                 worker.log_tail)
        wait_for(lambda: get(worker, "/livez")[0] == 503, 60,
                 "liveness to fail", worker.log_tail)
        status, body = get(worker, "/livez")
        assert status == 503 and not body["alive"]
        assert "no record processed" in body["reason"]
        assert get(worker, "/healthz")[0] == 503
        assert get(worker, "/readyz")[0] == 200  # ready, yet stuck: a restart is the remedy
    finally:
        worker.stop()


def test_an_idle_worker_with_no_lag_stays_alive(kafka_bootstrap: str, tmp_path: Path) -> None:
    namespace = Namespace(kafka_bootstrap)
    namespace.create_topics()
    produce(kafka_bootstrap, namespace.events, runs(20))
    worker = Worker(namespace, tmp_path, AGUI_STALL_SECONDS=str(STALL_SECONDS)).start()
    try:
        TopicReader(kafka_bootstrap, namespace.history).wait_until(
            lambda recs: sum(r.value["kind"] == "run" for r in recs) >= 20, 120,
            "every run to conclude", worker.log_tail)
        wait_for(lambda: get(worker, "/readyz")[0] == 200, 60, "the worker to be ready",
                 worker.log_tail)
        # Idle for three stall periods: liveness never fails (observed, not slept).
        until = time.monotonic() + 3 * STALL_SECONDS
        while time.monotonic() < until:
            status, body = get(worker, "/livez")
            assert status == 200, body
            time.sleep(0.5)
        assert get(worker, "/livez")[1]["reason"] == "no lag"
    finally:
        worker.stop()
