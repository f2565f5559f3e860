"""The topics the service reads and writes, and the settings they are created with
(`processors.runtime.topic_admin` creates them).

Raw topics belong to the producers; the service creates them only when asked
(`agui-stream create-topics`, the demo, tests). Output topics are plain
delete-retention logs. The tables' changelogs are compacted; the worker creates
them before Faust starts (Faust would create them itself, but on a fresh
cluster its first assignment could miss a changelog created a moment earlier,
and every write to that table then failed until the next rebalance).
"""

from __future__ import annotations

from dataclasses import dataclass, field

DAY_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    configs: dict[str, str] = field(default_factory=dict)


# The service's Faust tables (processors.runtime.app), each with a changelog topic.
STATE_TABLE = "run-state"  # per key: engine state, partition, replay guard, chunk count
TEXT_TABLE = "run-text"  # per key: the active run's streamed text, one chunk per commit
# The thread view's table (processors.view.thread_view), co-partitioned with the history
# topic: per thread a header, its messages and run summaries; per partition the
# offset read up to.
VIEW_TABLE = "thread-view"
TABLE_NAMES = (STATE_TABLE, TEXT_TABLE, VIEW_TABLE)


def largest_record(max_record_bytes: int) -> int:
    """The largest record an output or changelog topic takes (its max.message.bytes, and
    the producer's request limit): AGUI_MAX_RECORD_BYTES of content with 64 KiB for a
    record's key, headers and framing."""
    return max_record_bytes + 65_536


def changelog_topic(app_id: str, table: str) -> str:
    """The changelog Faust keeps for `table` (its own naming)."""
    return f"{app_id}-{table}-changelog"


def idle_ticks_topic(app_id: str) -> str:
    """The internal topic that wakes every partition for the idle-run sweep."""
    return f"{app_id}-idle-ticks"


def service_topics(
    *,
    app_id: str,
    input_topics: tuple[str, ...],
    history_topic: str | None,
    deadletter_topic: str,
    partitions: int,
    replication_factor: int,
    max_record_bytes: int,
) -> list[TopicSpec]:
    """`history_topic` None: the per-tenant layout, with no shared history."""
    sized = {"max.message.bytes": str(largest_record(max_record_bytes))}
    return [
        *(TopicSpec(t, partitions, replication_factor, {"retention.ms": str(7 * DAY_MS)})
          for t in input_topics),
        *output_topics(history_topic, deadletter_topic, partitions, replication_factor,
                       max_record_bytes),
        TopicSpec(idle_ticks_topic(app_id), partitions, replication_factor,
                  {"retention.ms": str(3_600_000)}),
        *(TopicSpec(changelog_topic(app_id, table), partitions, replication_factor,
                    {"cleanup.policy": "compact", **sized})
          for table in TABLE_NAMES),
    ]


def output_topics(history_topic: str | None, deadletter_topic: str | None, partitions: int,
                  replication_factor: int, max_record_bytes: int) -> list[TopicSpec]:
    """The history and dead-letter topics: the shared ones, or one tenant's (the same
    partitions, so that they are co-partitioned with the raw topics, and settings)."""
    sized = {"max.message.bytes": str(largest_record(max_record_bytes))}
    # History carries its tenants' encrypted values: it is meant for the producers'
    # history service, behind ACLs (docs/operations.md).
    history = [] if history_topic is None else [TopicSpec(
        history_topic, partitions, replication_factor,
        {"retention.ms": str(7 * DAY_MS), **sized})]
    deadletter = [] if deadletter_topic is None else [TopicSpec(
        deadletter_topic, partitions, replication_factor,
        {"retention.ms": str(14 * DAY_MS), **sized})]
    return [*history, *deadletter]
