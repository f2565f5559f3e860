"""The topics a worker refuses to run on (processors.runtime.topic_admin), without a
broker: partition counts of raw, history and internal topics; replication and
min.insync.replicas where AGUI_REPLICATION_FACTOR says production. And how topics
are created: in requests a controller accepts, returned only once listed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from processors.config import Settings
from processors.runtime import topic_admin
from processors.runtime.topic_admin import (
    TopicFacts,
    TopicsNotCreated,
    _batches,
    configuration_problems,
    ensure_topics,
    input_topics_now,
    output_topics_now,
    record_limit,
)
from topics.declarations import TABLE_NAMES, TopicSpec, changelog_topic, idle_ticks_topic

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


def test_topics_are_created_in_requests_a_kraft_controller_accepts() -> None:
    """A controller refuses a request of more than 10,000 records: 1,000 tenants'
    topics at 8 partitions went out as one request and were all refused."""
    specs = [TopicSpec(f"t{n}", 8, 1) for n in range(2_000)]
    batches = _batches(specs)
    assert [spec for batch in batches for spec in batch] == specs
    assert max(sum(spec.partitions for spec in batch) for batch in batches) <= 4_000
    assert _batches([TopicSpec("huge", 5_000, 1)]) == [[TopicSpec("huge", 5_000, 1)]]


def test_a_refusal_names_a_few_topics_and_counts_the_rest() -> None:
    class Admin:
        async def list_topics(self) -> list[str]:
            return []

        async def create_topics(self, topics: list[Any]) -> Any:
            return SimpleNamespace(topic_errors=[(t.name, 44, "too large") for t in topics])

    specs = [TopicSpec(f"t{n}", 1, 1) for n in range(20)]
    with pytest.raises(TopicsNotCreated) as refused:
        asyncio.run(ensure_topics(cast(Any, Admin()), specs))
    assert str(refused.value) == ("could not create 20 topic(s) (t0, t1, t2, t3, t4, …):"
                                  " PolicyViolationError")


class SlowListingAdmin:
    """A broker that answers CreateTopics at once and lists the created topics only
    from its `listed_after`-th list request on (None: never)."""

    def __init__(self, listed_after: int | None) -> None:
        self.listed_after = listed_after
        self.lists = 0
        self.created: list[str] = []

    async def list_topics(self) -> list[str]:
        self.lists += 1
        listed = self.listed_after is not None and self.lists > self.listed_after
        return list(self.created) if listed else []

    async def create_topics(self, topics: list[Any]) -> Any:
        self.created += [topic.name for topic in topics]
        return SimpleNamespace(topic_errors=[(topic.name, 0, None) for topic in topics])


def test_created_topics_are_returned_only_once_the_broker_lists_them() -> None:
    """A worker looking a tenant's topics up just after `create-topics --tenant`
    returned found none, and dead-lettered the tenant's runs until its next refresh."""
    admin = SlowListingAdmin(listed_after=4)
    specs = [TopicSpec("agui.history.hooli", 2, 1), TopicSpec("agui.deadletter.hooli", 2, 1)]
    assert asyncio.run(ensure_topics(cast(Any, admin), specs)) == [s.name for s in specs]
    assert admin.lists == 5


def test_topics_the_broker_never_lists_are_an_error_naming_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topic_admin, "VISIBLE_SECONDS", 0.2)
    specs = [TopicSpec("agui.history.hooli", 2, 1)]
    with pytest.raises(TopicsNotCreated, match=r"agui\.history\.hooli\).*did not list"):
        asyncio.run(ensure_topics(cast(Any, SlowListingAdmin(listed_after=None)), specs))
