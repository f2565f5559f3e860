"""AGUI_INPUT_PATTERN on a real broker: the worker reads every raw topic the pattern
matches when it starts (it used to read nothing: Faust's aiokafka driver subscribes
to a topic's names only, and a topic made from a pattern has none)."""

from pathlib import Path

import pytest

from tests.run_generator import interleaved_runs
from tests.service_harness import Namespace, TopicReader, Worker, create_topic, produce

pytestmark = pytest.mark.kafka


def test_every_raw_topic_the_pattern_matches_is_read(kafka_bootstrap: str,
                                                     tmp_path: Path) -> None:
    namespace = Namespace(kafka_bootstrap, partitions=2)
    namespace.create_topics()
    second = f"{namespace.events}.more"
    create_topic(kafka_bootstrap, second, namespace.partitions)
    runs, records = interleaved_runs(seed=3, keys=6, runs_per_key=1)
    for topic, parity in ((namespace.events, 0), (second, 1)):  # each key on one topic
        produce(kafka_bootstrap, topic,
                [(k, v, []) for k, v in records if k[-1] % 2 == parity])
    worker = Worker(namespace, tmp_path, AGUI_INPUT_TOPICS="",
                    AGUI_INPUT_PATTERN=namespace.events.replace(".", r"\.")).start()
    history = TopicReader(kafka_bootstrap, namespace.history, namespace.partitions)
    history.wait_until(lambda recs: {r.value["runId"] for r in recs if r.value["kind"] == "run"}
                       >= {run.run_id for run in runs}, 60,
                       "a closing record for every run of both topics", worker.log_tail)
    worker.stop()
