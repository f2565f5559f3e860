"""The topics a worker refuses to run on (processors.runtime.topic_admin), without a
broker: partition counts of raw, history and internal topics; replication and
min.insync.replicas where AGUI_REPLICATION_FACTOR says production."""

from __future__ import annotations

from processors.config import Settings
from processors.runtime.topic_admin import (
    TopicFacts,
    configuration_problems,
    input_topics_now,
    output_topics_now,
    record_limit,
)
from topics.declarations import TABLE_NAMES, changelog_topic, idle_ticks_topic

SETTINGS = Settings.from_env({"AGUI_PARTITIONS": "8", "AGUI_APP_ID": "app",
                              "AGUI_INPUT_TOPICS": "events"})
GOOD = TopicFacts(partitions=8, replication=1, max_message_bytes=1_065_536,
                  min_insync_replicas=1)


def every_topic(settings: Settings, facts: TopicFacts = GOOD) -> dict[str, TopicFacts]:
    names = ["events", settings.history_topic, settings.deadletter_topic,
             idle_ticks_topic(settings.app_id),
             *(changelog_topic(settings.app_id, table) for table in TABLE_NAMES)]
    return dict.fromkeys(names, facts)


def outputs(settings: Settings) -> list[str]:
    return [settings.history_topic, settings.deadletter_topic]


def test_topics_as_create_topics_makes_them_are_accepted() -> None:
    assert configuration_problems(SETTINGS, every_topic(SETTINGS), ["events"],
                                  outputs(SETTINGS)) == []


def test_every_raw_history_and_internal_topic_needs_the_partition_count() -> None:
    facts = every_topic(SETTINGS)
    for name in facts:
        wrong = {**facts, name: TopicFacts(4, 1, 1_065_536, 1)}
        problems = configuration_problems(SETTINGS, wrong, ["events"], outputs(SETTINGS))
        assert len(problems) == 1 and f"topic {name} has 4 partitions" in problems[0]
        assert "AGUI_PARTITIONS is 8" in problems[0]


def test_production_replication_needs_replicas_and_min_insync() -> None:
    settings = Settings.from_env({"AGUI_PARTITIONS": "8", "AGUI_APP_ID": "app",
                                  "AGUI_INPUT_TOPICS": "events",
                                  "AGUI_REPLICATION_FACTOR": "3"})
    assert configuration_problems(settings, every_topic(settings, TopicFacts(
        8, 3, 1_065_536, 2)), ["events"], outputs(settings)) == []
    problems = configuration_problems(settings, every_topic(settings, TopicFacts(
        8, 1, 1_065_536, 1)), ["events"], outputs(settings))
    # history, dead letters, ticks and three changelogs: too few replicas, min.insync 1
    assert len(problems) == 12
    assert any("min.insync.replicas=1" in problem for problem in problems)


def test_a_pattern_reads_the_topics_it_matches_but_never_the_services_own() -> None:
    settings = Settings.from_env({"AGUI_APP_ID": "app", "AGUI_INPUT_PATTERN": r"tenant\..*",
                                  "AGUI_INPUT_TOPICS": ""})
    existing = ["tenant.a", "tenant.b", "other", "app-idle-ticks", "agui.history"]
    assert input_topics_now(settings, existing) == ["tenant.a", "tenant.b"]


def test_the_record_limit_is_the_smaller_of_topic_and_producer() -> None:
    assert record_limit(SETTINGS, TopicFacts(8, 1, 50_000, 1)) == 50_000
    assert record_limit(SETTINGS, TopicFacts(8, 1, 9_000_000, 1)) == 1_065_536


def test_a_tenant_topic_needs_the_partition_count_too() -> None:
    settings = Settings.from_env({
        "AGUI_PARTITIONS": "8", "AGUI_APP_ID": "app", "AGUI_INPUT_TOPICS": "events",
        "AGUI_HISTORY_TOPIC_TEMPLATE": "agui.history.{tenant}",
        "AGUI_DEADLETTER_TOPIC_TEMPLATE": "agui.deadletter.{tenant}"})
    existing = ["events", "agui.history.acme", "agui.deadletter.acme", "agui.history",
                "agui.history.a.b"]
    outputs = output_topics_now(settings, existing)
    assert outputs == [settings.deadletter_topic, "agui.history.acme", "agui.deadletter.acme"]
    facts = {**every_topic(settings), "agui.history.acme": TopicFacts(4, 1, 1_065_536, 1)}
    problems = configuration_problems(settings, facts, ["events"], outputs)
    assert len(problems) == 1 and "topic agui.history.acme has 4 partitions" in problems[0]
