"""A worker's real log, as a log collector reads it: plain lines without terminal
escapes, or one JSON object per line (AGUI_LOG_FORMAT=json); never content."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.engine_helpers import reasoning, run_finished, run_started
from tests.service_harness import Namespace, TopicReader, Worker, produce, wait_for

pytestmark = pytest.mark.kafka

SECRET = "reasoning-SECRET-logged-nowhere"


def run_a_worker(kafka_bootstrap: str, tmp_path: Path, **env: str) -> str:
    """A worker's whole log after it processed one run and stopped."""
    namespace = Namespace(kafka_bootstrap)
    namespace.create_topics()
    worker = Worker(namespace, tmp_path, AGUI_LOG_LEVEL="info", **env).start()
    try:
        events = [run_started(), *reasoning("m", SECRET), run_finished(),
                  {"type": "REASONING_MESSAGE_CONTENT", "messageId": "x", "delta": SECRET}]
        produce(kafka_bootstrap, namespace.events,
                [(b"k", orjson.dumps(e), []) for e in events])
        TopicReader(kafka_bootstrap, namespace.history).wait_until(
            lambda records: len(records) >= 2, 60, "the run's history", worker.log_tail)
        wait_for(lambda: worker.processed() >= len(events), 60, "every record", worker.log_tail)
    finally:
        worker.stop()
    return worker.log_path.read_text()


def test_a_text_log_is_plain_lines(kafka_bootstrap: str, tmp_path: Path) -> None:
    log = run_a_worker(kafka_bootstrap, tmp_path)
    assert "\x1b" not in log  # no spinner, no colours
    lines = [line for line in log.splitlines() if line.strip()]
    assert any(" INFO " in line for line in lines)
    assert SECRET not in log


def test_a_json_log_is_one_object_per_line(kafka_bootstrap: str, tmp_path: Path) -> None:
    log = run_a_worker(kafka_bootstrap, tmp_path, AGUI_LOG_FORMAT="json")
    assert "\x1b" not in log
    lines = [line for line in log.splitlines() if line.strip()]
    assert lines
    for line in lines:
        record = orjson.loads(line)
        assert {"time", "level", "logger", "message"} <= record.keys(), line
    assert SECRET not in log
