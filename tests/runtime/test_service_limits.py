"""Size and configuration on a real broker: every output fits the topic it goes to, as
the broker says at start; a worker refuses topics that would break its guarantees."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.engine_helpers import run_finished, run_started, t_content, t_end, t_start, text
from tests.service_harness import AGUI_STREAM, Namespace, TopicReader, Worker, create_topic, produce
from topics.partitioning import default_partition

pytestmark = pytest.mark.kafka


def a_run(run: str) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    events = [run_started(run), *text(f"m-{run}", "hello"), run_finished(run)]
    return [(run.encode(), orjson.dumps(event), []) for event in events]


def create_sized_topic(bootstrap: str, name: str, partitions: int, max_bytes: int) -> None:
    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, partitions, 1, topic_configs={
                "max.message.bytes": str(max_bytes)})])
        finally:
            await admin.close()

    asyncio.run(run())


def test_a_dead_letter_too_large_only_with_its_headers_is_sent_and_the_worker_goes_on(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    # The record that crash-looped a partition: ~740 KB of undecodable bytes and an
    # 80 KB header. Its dead letter (the bytes base64-copied, the header copied) was
    # 1,067,170 bytes, over the dead-letter topic's limit: the send failed and the
    # worker exited without a commit, replaying the record into the same exit.
    namespace = Namespace(kafka_bootstrap)
    namespace.create_topics()
    worker = Worker(namespace, tmp_path).start()
    try:
        poison = [(b"poison", b"\xff" * 740_000, [("trace", b"t" * 80_000)])]
        produce(kafka_bootstrap, namespace.events, [*a_run("before"), *poison, *a_run("after")])
        history = TopicReader(kafka_bootstrap, namespace.history).wait_until(
            lambda records: sum(r.value["kind"] == "run" for r in records) >= 2, 90,
            "both runs' closing records", worker.log_tail)
        dead = TopicReader(kafka_bootstrap, namespace.deadletter).wait_until(
            lambda records: len(records) >= 1, 60, "the dead letter", worker.log_tail)
        assert worker.process is not None and worker.process.poll() is None
    finally:
        worker.stop()
    assert sorted(r.value["runId"] for r in history if r.value["kind"] == "run") == [
        "after", "before"]
    (letter,) = dead
    assert letter.value["code"] == "undecodable_record" and letter.value["truncated"] is True
    assert letter.headers["trace"] == b"t" * 80_000  # they fit once the copy is left out


def test_a_worker_learns_an_output_topics_own_limit(kafka_bootstrap: str,
                                                    tmp_path: Path) -> None:
    namespace = Namespace(kafka_bootstrap)
    create_sized_topic(kafka_bootstrap, namespace.deadletter, namespace.partitions, 100_000)
    namespace.create_topics()
    worker = Worker(namespace, tmp_path).start()
    try:
        produce(kafka_bootstrap, namespace.events,
                [(b"poison", b"\xff" * 200_000, [("trace", b"t" * 120_000)]), *a_run("after")])
        TopicReader(kafka_bootstrap, namespace.history).wait_until(
            lambda records: any(r.value["kind"] == "run" for r in records), 90,
            "the run after the poison", worker.log_tail)
        dead = TopicReader(kafka_bootstrap, namespace.deadletter).wait_until(
            lambda records: len(records) >= 1, 60, "the dead letter", worker.log_tail)
    finally:
        worker.stop()
    (letter,) = dead
    assert letter.value["truncated"] is True and letter.value["headersDropped"] == 1


def test_a_topic_with_another_partition_count_is_refused_at_start(kafka_bootstrap: str) -> None:
    namespace = Namespace(kafka_bootstrap)
    create_topic(kafka_bootstrap, namespace.history, namespace.partitions // 2)
    namespace.create_topics()
    result = subprocess.run([AGUI_STREAM, "worker"], env=namespace.env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert (f"agui-stream: configuration error: topic {namespace.history} has"
            f" {namespace.partitions // 2} partitions") in result.stderr


def test_runs_past_each_limit_and_a_tenants_flood_fail_and_the_others_go_on(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    namespace = Namespace(kafka_bootstrap)
    namespace.create_topics()
    worker = Worker(namespace, tmp_path, AGUI_RUN_MAX_EVENTS="100",
                    AGUI_RUN_MAX_CONTENT_CHARS="1000", AGUI_RUN_MAX_ITEMS="20",
                    AGUI_TENANT_MAX_OPEN_RUNS="2").start()
    # Keys of one input partition: the tenant limit counts per partition.
    keys = [key for key in (f"flood-{n}".encode() for n in range(200))
            if default_partition(key, namespace.partitions) == 0][:3]
    flood = [(key, orjson.dumps(run_started(key.decode())), [("tenant", b"flood")])
             for key in keys]
    past = {
        "long": [run_started("long"), t_start("m"),
                 *(t_content("m", "x") for _ in range(150)), t_end("m"), run_finished("long")],
        "huge": [run_started("huge"), t_start("m"),
                 *(t_content("m", "x" * 300) for _ in range(5)), t_end("m"),
                 run_finished("huge")],
        "wide": [run_started("wide"), *(e for n in range(25) for e in text(f"m{n}", "a")),
                 run_finished("wide")],
    }
    try:
        produce(kafka_bootstrap, namespace.events, [
            *flood, *a_run("before"),
            *((run.encode(), orjson.dumps(event), []) for run, events in past.items()
              for event in events),
            *a_run("after")])
        history = TopicReader(kafka_bootstrap, namespace.history).wait_until(
            lambda records: sum(r.value["kind"] == "run" for r in records) >= 6, 90,
            "the closing records of the refused run, the runs past a limit, the others",
            worker.log_tail)
        metrics = worker.metrics()
    finally:
        worker.stop()
    closing = {r.value["runId"]: (r.value["outcome"], r.value.get("failure", {}).get("code"))
               for r in history if r.value["kind"] == "run"}
    assert closing == {keys[2].decode(): ("failed", "tenant_open_run_limit"),
                       "long": ("failed", "run_event_limit"),
                       "huge": ("failed", "run_content_limit"),
                       "wide": ("failed", "run_item_limit"),
                       "before": ("success", None), "after": ("success", None)}
    published = {r.value["runId"] for r in history if r.value["kind"] == "message"}
    assert published == {"before", "after"}  # whole, and nothing of the failed runs
    # What the failed runs held is freed: only the two flood runs stay open.
    assert "agui_open_runs 2.0" in metrics
    assert 'agui_tenant_open_runs{tenant="flood"} 2.0' in metrics
    assert "agui_open_run_content_chars 0.0" in metrics
