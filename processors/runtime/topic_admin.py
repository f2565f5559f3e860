"""The service's topics on the broker: creating them (`agui-stream create-topics`, the
worker's start, the demo), and reading back what the guarantees depend on: each
topic's partition count, replication, `min.insync.replicas` and largest record.
Which topics and with which settings is `topics.declarations`.

A worker refuses to run (exit 2) on topics that would break its guarantees
(`configuration_problems`): a raw, history or internal topic whose partition count
is not AGUI_PARTITIONS lands in another Faust co-partitioning group, so a commit's
outputs and its offsets would not be one transaction, and the thread view would
look for a thread in another partition than the producer put it in.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Collection
from dataclasses import dataclass

from aiokafka import errors
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from processors.config import Settings
from processors.runtime.kafka_client import aiokafka_options
from topics.declarations import (
    TABLE_NAMES,
    TopicSpec,
    changelog_topic,
    idle_ticks_topic,
    largest_record,
    output_topics,
    service_topics,
)
from topics.tenant_topics import matches_any


def topic_specs(settings: Settings, *, include_inputs: bool) -> list[TopicSpec]:
    return service_topics(
        app_id=settings.app_id,
        input_topics=settings.input_topics if include_inputs else (),
        history_topic=None if settings.tenant_templates else settings.history_topic,
        deadletter_topic=settings.deadletter_topic,
        partitions=settings.partitions,
        replication_factor=settings.replication_factor,
        max_record_bytes=settings.max_record_bytes,
    )


def tenant_topic_specs(settings: Settings, tenants: list[str]) -> list[TopicSpec]:
    """The history and dead-letter topics of each of `tenants` (per-tenant layout)."""
    templates = settings.tenant_templates
    if templates is None:
        raise TopicsNotCreated("--tenant needs per-tenant topics: set"
                               " AGUI_HISTORY_TOPIC_TEMPLATE and AGUI_DEADLETTER_TOPIC_TEMPLATE")
    specs = []
    for tenant in tenants:
        history, deadletter = (template.topic(tenant) for template in templates.both)
        if history is None or deadletter is None:
            raise TopicsNotCreated(f"tenant {tenant!r}: its topics' names would exceed"
                                   " Kafka's 249 characters (the tenant is not routable)")
        specs += output_topics(history, deadletter, settings.partitions,
                               settings.replication_factor, settings.max_record_bytes)
    return specs


async def create_topics(settings: Settings, *, include_inputs: bool,
                        tenants: list[str] | None = None) -> list[str]:
    """The service's topics, or (`tenants`) only those tenants' own."""
    specs = (topic_specs(settings, include_inputs=include_inputs) if tenants is None
             else tenant_topic_specs(settings, tenants))
    admin = AIOKafkaAdminClient(**aiokafka_options(settings))
    await admin.start()
    try:
        return await ensure_topics(admin, specs)
    finally:
        await admin.close()


class TopicsNotCreated(Exception):
    """The broker refused to create a topic; the message names each one and why."""


TOPIC_AUTHORIZATION_FAILED = 29
TOPIC_ALREADY_EXISTS = 36  # another worker created it a moment earlier


# A KRaft controller refuses a request that would make more than 10,000 records
# (POLICY_VIOLATION, "excessively large batch"): 1,000 tenants' topics at 8
# partitions are 16,000. Requests stay well below it.
PARTITIONS_PER_REQUEST = 4_000
NAMES_PER_REFUSAL = 5  # a refusal names this many topics, then counts the rest
# How long created topics may take to show in the broker's metadata. The controller
# answers CreateTopics once it has them; the broker that lists topics learns them a
# moment later, and a worker looking a tenant's topics up in that moment takes them
# for missing until its next refresh (its runs then dead-lettered).
VISIBLE_SECONDS = 30.0
VISIBLE_POLL_SECONDS = 0.05


async def ensure_topics(admin: AIOKafkaAdminClient, specs: list[TopicSpec]) -> list[str]:
    """Create the topics that do not exist yet; return the names created. The broker
    answers each topic with its own error, which the admin client does not raise."""
    existing = set(await admin.list_topics())
    missing = [spec for spec in specs if spec.name not in existing]
    refused: dict[int, list[str]] = {}
    for batch in _batches(missing):
        response = await admin.create_topics(
            [NewTopic(s.name, s.partitions, s.replication_factor, topic_configs=s.configs)
             for s in batch])
        for name, error_code, *_ in response.topic_errors:
            if error_code not in (0, TOPIC_ALREADY_EXISTS):
                refused.setdefault(error_code, []).append(name)
    if refused:
        raise TopicsNotCreated("could not create " + "; ".join(
            f"{len(names)} topic(s) ({', '.join(names[:NAMES_PER_REFUSAL])}"
            f"{', …' if len(names) > NAMES_PER_REFUSAL else ''}): {_refusal(code)}"
            for code, names in refused.items()))
    created = [spec.name for spec in missing]
    await _until_listed(admin, created)
    return created


async def _until_listed(admin: AIOKafkaAdminClient, names: list[str]) -> None:
    """Return once the broker lists every topic of `names`, so that whoever is told
    they exist (an administrator, a worker looking up a tenant) finds them."""
    deadline = time.monotonic() + VISIBLE_SECONDS
    unlisted = set(names)
    while unlisted:
        unlisted -= set(await admin.list_topics())
        if not unlisted:
            return
        if time.monotonic() >= deadline:
            shown = sorted(unlisted)[:NAMES_PER_REFUSAL]
            raise TopicsNotCreated(
                f"created {len(unlisted)} topic(s) ({', '.join(shown)}"
                f"{', …' if len(unlisted) > NAMES_PER_REFUSAL else ''}) that the broker"
                f" did not list within {VISIBLE_SECONDS:.0f} s")
        await asyncio.sleep(VISIBLE_POLL_SECONDS)


def _batches(specs: list[TopicSpec]) -> list[list[TopicSpec]]:
    """`specs` in requests of at most PARTITIONS_PER_REQUEST partitions each (a topic
    with more is a request of its own)."""
    batches: list[list[TopicSpec]] = []
    size = PARTITIONS_PER_REQUEST
    for spec in specs:
        if size + spec.partitions > PARTITIONS_PER_REQUEST:
            batches.append([])
            size = 0
        batches[-1].append(spec)
        size += spec.partitions
    return batches


def _refusal(error_code: int) -> str:
    if error_code == TOPIC_AUTHORIZATION_FAILED:
        return ("Kafka does not allow this principal to CREATE it (or to DESCRIBE it, if it"
                " exists): grant the ACLs of docs/operations.md, or have an administrator"
                " run agui-stream create-topics")
    return str(errors.for_code(error_code).__name__)


@dataclass(frozen=True, slots=True)
class TopicFacts:
    """What the broker says of one topic."""

    partitions: int
    replication: int
    max_message_bytes: int
    min_insync_replicas: int


async def describe_topics(settings: Settings, names: list[str],
                          inputs: Collection[str] = ()) -> dict[str, TopicFacts]:
    """The facts of each topic of `names` that exists; an absent one is left out. Of
    the raw topics (`inputs`) only the partition count is read: the worker has no
    right to their configurations (topics.acls)."""
    admin = AIOKafkaAdminClient(**aiokafka_options(settings))
    await admin.start()
    try:
        metadata = {topic["topic"]: topic for topic in await admin.describe_topics(names)
                    if topic["error_code"] == 0}
        wanted = {"max.message.bytes": None, "min.insync.replicas": None}
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name, dict(wanted))
             for name in metadata if name not in inputs])
    finally:
        await admin.close()
    configs: dict[str, dict[str, str]] = {}
    for response in responses:
        for resource in response.to_object()["resources"]:
            configs[resource["resource_name"]] = {
                entry["config_names"]: entry["config_value"]
                for entry in resource["config_entries"]}
    facts = {}
    for name, topic in metadata.items():
        config = configs.get(name, {})
        partitions = topic["partitions"]
        facts[name] = TopicFacts(
            partitions=len(partitions),
            replication=min((len(p["replicas"]) for p in partitions), default=0),
            max_message_bytes=int(config.get("max.message.bytes", "1048588")),
            min_insync_replicas=int(config.get("min.insync.replicas", "1")))
    return facts


async def existing_topics(settings: Settings) -> list[str]:
    admin = AIOKafkaAdminClient(**aiokafka_options(settings))
    await admin.start()
    try:
        return sorted(await admin.list_topics())
    finally:
        await admin.close()


def tenant_topics_now(settings: Settings, existing: list[str]) -> list[str]:
    """The tenants' topics that exist (per-tenant layout; none otherwise)."""
    templates = settings.tenant_templates
    if templates is None:
        return []
    return [name for name in existing if matches_any(templates.both, name)]


def output_topics_now(settings: Settings, existing: list[str]) -> list[str]:
    """The topics the worker may publish to now: the shared ones and the tenants'."""
    shared = [settings.deadletter_topic] if settings.tenant_templates else [
        settings.history_topic, settings.deadletter_topic]
    return [*shared, *tenant_topics_now(settings, existing)]


def input_topics_now(settings: Settings, existing: list[str]) -> list[str]:
    """The raw topics a worker reads: those named, or those the pattern matches now
    (the subscription matches a topic's name from its start)."""
    if settings.input_pattern is None:
        return list(settings.input_topics)
    pattern = re.compile(settings.input_pattern)
    internal = {idle_ticks_topic(settings.app_id), settings.history_topic,
                settings.deadletter_topic,
                *(changelog_topic(settings.app_id, table) for table in TABLE_NAMES)}
    return [name for name in existing if pattern.match(name) and name not in internal]


def configuration_problems(settings: Settings, facts: dict[str, TopicFacts],
                           inputs: list[str], outputs: list[str]) -> list[str]:
    """What in the topics would break the worker's guarantees, one sentence each.

    Every raw, history and internal topic has AGUI_PARTITIONS partitions (one Faust
    co-partitioning group: a commit's outputs and offsets are one transaction per
    partition number; the view finds a thread where the producer put it). Where
    AGUI_REPLICATION_FACTOR says production (3 or more), the service's own topics are
    replicated that far and acknowledge a write on at least two replicas."""
    problems = []
    internal = [idle_ticks_topic(settings.app_id),
                *(changelog_topic(settings.app_id, table) for table in TABLE_NAMES)]
    for name in [*inputs, *outputs, *internal]:
        topic = facts.get(name)
        if topic is not None and topic.partitions != settings.partitions:
            problems.append(
                f"topic {name} has {topic.partitions} partitions; AGUI_PARTITIONS is"
                f" {settings.partitions}, and every raw, history and internal topic must have"
                " that many (otherwise a commit's outputs and offsets are not one"
                " transaction, and the thread view looks in the wrong partition)")
    if settings.replication_factor >= 3:
        for name in [*outputs, *internal]:
            topic = facts.get(name)
            if topic is None:
                continue
            if topic.replication < settings.replication_factor:
                problems.append(
                    f"topic {name} is replicated {topic.replication} times;"
                    f" AGUI_REPLICATION_FACTOR is {settings.replication_factor}")
            if topic.min_insync_replicas < 2:
                problems.append(
                    f"topic {name} has min.insync.replicas={topic.min_insync_replicas}; with"
                    " AGUI_REPLICATION_FACTOR 3 or more it must be at least 2 (a write"
                    " acknowledged by one replica can be lost with it)")
    return problems


def record_limit(settings: Settings, facts: TopicFacts) -> int:
    """The largest record the worker may send to a topic: the topic's limit, or the
    producer's request limit when smaller."""
    return min(facts.max_message_bytes, largest_record(settings.max_record_bytes))


async def checked_topics(settings: Settings,
                         existing: list[str]) -> tuple[list[str], dict[str, int]]:
    """What a starting worker learns of its topics (`existing`: the names it sees): the
    problems that must stop it, and the largest record each output topic that exists
    takes (the tenants' among them)."""
    inputs = input_topics_now(settings, existing)
    outputs = output_topics_now(settings, existing)
    internal = [idle_ticks_topic(settings.app_id),
                *(changelog_topic(settings.app_id, table) for table in TABLE_NAMES)]
    facts = await describe_topics(settings, [*inputs, *outputs, *internal], inputs)
    limits = {name: record_limit(settings, facts[name]) for name in outputs if name in facts}
    return configuration_problems(settings, facts, inputs, outputs), limits


async def output_limits(settings: Settings, existing: list[str]) -> dict[str, int]:
    """The largest record each output topic of `existing` (the names the worker sees
    now) takes (an operator may change it; per-tenant layout: and create or delete a
    tenant's topics)."""
    outputs = output_topics_now(settings, existing)
    facts = await describe_topics(settings, outputs)
    return {name: record_limit(settings, facts[name]) for name in outputs if name in facts}
