"""Creating the service's topics on the broker (`agui-stream create-topics`, the worker's
start, the demo). Which topics and with which settings is `topics.declarations`."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from processors.config import Settings
from processors.runtime.kafka_client import aiokafka_options
from topics.declarations import TopicSpec, service_topics


def topic_specs(settings: Settings, *, include_inputs: bool) -> list[TopicSpec]:
    return service_topics(
        app_id=settings.app_id,
        input_topics=settings.input_topics if include_inputs else (),
        history_topic=settings.history_topic,
        deadletter_topic=settings.deadletter_topic,
        partitions=settings.partitions,
        replication_factor=settings.replication_factor,
        max_record_bytes=settings.max_record_bytes,
    )


async def create_topics(settings: Settings, *, include_inputs: bool) -> list[str]:
    admin = AIOKafkaAdminClient(**aiokafka_options(settings))
    await admin.start()
    try:
        return await ensure_topics(admin, topic_specs(settings, include_inputs=include_inputs))
    finally:
        await admin.close()


async def ensure_topics(admin: AIOKafkaAdminClient, specs: list[TopicSpec]) -> list[str]:
    """Create the topics that do not exist yet; return the names created."""
    existing = set(await admin.list_topics())
    missing = [spec for spec in specs if spec.name not in existing]
    if missing:
        await admin.create_topics(
            [NewTopic(s.name, s.partitions, s.replication_factor, topic_configs=s.configs)
             for s in missing]
        )
    return [spec.name for spec in missing]
