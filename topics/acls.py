"""The Kafka ACLs a deployment grants: least privilege, one list for every use.

`docs/operations.md` prints this list (`agui-stream acls` renders it for any
settings), a starting worker checks its own part of it
(`processors.runtime.kafka_access`), and the secured-broker tests grant exactly it
and then take each entry away in turn. So the documented ACLs are the ones proven.

The codes are Kafka's own (`AclOperation`, `ResourceType`, `PatternType`): the
operation code is also the bit an "authorized operations" answer sets.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass

from topics.declarations import TABLE_NAMES, changelog_topic, idle_ticks_topic
from topics.tenant_topics import Template, encode_tenant


class Operation(enum.IntEnum):
    READ = 3
    WRITE = 4
    CREATE = 5
    DESCRIBE = 8
    DESCRIBE_CONFIGS = 10

    @property
    def cli_name(self) -> str:
        """The name `kafka-acls.sh --operation` takes."""
        return "".join(word.capitalize() for word in self.name.split("_"))


class Resource(enum.IntEnum):
    TOPIC = 2
    GROUP = 3
    TRANSACTIONAL_ID = 5

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


class Pattern(enum.IntEnum):
    LITERAL = 3
    PREFIXED = 4


@dataclass(frozen=True, slots=True)
class Acl:
    """One allowed operation of one principal on one resource (or prefix of names)."""

    principal: str
    operation: Operation
    resource: Resource
    name: str
    pattern: Pattern
    why: str

    @property
    def target(self) -> str:
        """`topic agui.history`, `topics prefixed agui-stream-`."""
        if self.pattern is Pattern.PREFIXED:
            return f"{self.resource.label}s prefixed {self.name}"
        return f"{self.resource.label} {self.name}"

    def __str__(self) -> str:
        return f"{self.operation.name} on {self.target}"


@dataclass(frozen=True, slots=True)
class Layout:
    """The names ACLs are granted on: a deployment's settings."""

    app_id: str
    input_topics: tuple[str, ...]
    input_pattern: str | None
    history_topic: str
    deadletter_topic: str
    # (history, dead-letter) templates of the per-tenant layout; None: shared topics.
    tenant_templates: tuple[Template, Template] | None = None

    @property
    def internal_prefix(self) -> str:
        """Every internal topic (changelogs, idle ticks) and transactional id starts so."""
        return f"{self.app_id}-"

    @property
    def internal_topics(self) -> list[str]:
        return [idle_ticks_topic(self.app_id),
                *(changelog_topic(self.app_id, table) for table in TABLE_NAMES)]


WORKER = "User:agui-stream"
HISTORY_SERVICE = "User:history-service"
HISTORY_SERVICE_GROUP = "history-service"
AGENT_SERVER = "User:agent-server"


def worker_acls(layout: Layout, principal: str = WORKER) -> list[Acl]:
    """What a worker does, and nothing more. Not needed: `CREATE` on the raw, history
    and dead-letter topics (an administrator creates them: `agui-stream
    create-topics`), `IDEMPOTENT_WRITE` on the cluster (a transactional producer
    needs `WRITE` on its transactional id only)."""
    prefix = layout.internal_prefix

    def acl(operation: Operation, resource: Resource, name: str, why: str,
            pattern: Pattern = Pattern.LITERAL) -> Acl:
        return Acl(principal, operation, resource, name, pattern, why)

    if layout.tenant_templates is None:
        history, history_pattern = layout.history_topic, Pattern.LITERAL
        tenant_deadletters: list[Acl] = []
    else:  # every tenant's topics, by the templates' prefixes; never CREATE
        history_template, deadletter_template = layout.tenant_templates
        history, history_pattern = history_template.prefix, Pattern.PREFIXED
        tenant_deadletters = [] if deadletter_template.prefix == history else [
            acl(operation, Resource.TOPIC, deadletter_template.prefix, why, Pattern.PREFIXED)
            for operation, why in _DEADLETTER_GRANTS]
    return [
        *(acl(Operation.READ, Resource.TOPIC, name, "consumes the raw events", pattern)
          for name, pattern in _input_resources(layout)),
        acl(Operation.READ, Resource.GROUP, layout.app_id,
            "joins its consumer group (raw topics, internal topics, thread view)"),
        acl(Operation.WRITE, Resource.TOPIC, history, "publishes the reassembled messages",
            history_pattern),
        acl(Operation.READ, Resource.TOPIC, history, "reads the history (its thread view)",
            history_pattern),
        acl(Operation.DESCRIBE_CONFIGS, Resource.TOPIC, history,
            "sizes each record to the topic's max.message.bytes", history_pattern),
        *tenant_deadletters,
        *(acl(operation, Resource.TOPIC, layout.deadletter_topic, why)
          for operation, why in _DEADLETTER_GRANTS),
        *(acl(operation, Resource.TOPIC, prefix, why, Pattern.PREFIXED)
          for operation, why in (
              (Operation.CREATE, "creates its changelog and idle-ticks topics"),
              (Operation.READ, "restores its tables, reads its idle ticks"),
              (Operation.WRITE, "writes its changelogs and idle ticks"),
              (Operation.DESCRIBE_CONFIGS, "checks its internal topics' settings"))),
        acl(Operation.WRITE, Resource.TRANSACTIONAL_ID, prefix,
            "commits through one transactional producer per input partition, or one per"
            " worker (AGUI_TRANSACTIONS)",
            Pattern.PREFIXED),
    ]


_DEADLETTER_GRANTS = (
    (Operation.WRITE, "publishes failures and warnings"),
    (Operation.DESCRIBE_CONFIGS, "sizes each record to the topic's max.message.bytes"))


def history_service_acls(layout: Layout, principal: str = HISTORY_SERVICE,
                         group: str = HISTORY_SERVICE_GROUP) -> list[Acl]:
    """The service that hands a producer its conversation back: history, nothing else.
    In the per-tenant layout there is no shared history: see `tenant_service_acls`."""
    if layout.tenant_templates is not None:
        return []
    return [
        Acl(principal, Operation.READ, Resource.TOPIC, layout.history_topic,
            Pattern.LITERAL, "reads the history"),
        Acl(principal, Operation.READ, Resource.GROUP, group, Pattern.LITERAL,
            "joins its own consumer group"),
    ]


def tenant_service_acls(layout: Layout, tenant: str, principal: str | None = None,
                        group: str | None = None) -> list[Acl]:
    """One tenant's history service (per-tenant layout): its own history topic, nothing
    else. Its principal and group default to the history service's, with the tenant
    (as in its topic's name) appended."""
    if layout.tenant_templates is None:
        raise ValueError("a tenant's own history service needs per-tenant topics"
                         " (AGUI_HISTORY_TOPIC_TEMPLATE)")
    topic = layout.tenant_templates[0].topic(tenant)
    if topic is None:
        raise ValueError(f"tenant {tenant!r}: its topic's name would exceed Kafka's limit")
    suffix = f"-{encode_tenant(tenant)}"
    return [
        Acl(principal or HISTORY_SERVICE + suffix, Operation.READ, Resource.TOPIC, topic,
            Pattern.LITERAL, "reads its tenant's history"),
        Acl(principal or HISTORY_SERVICE + suffix, Operation.READ, Resource.GROUP,
            group or HISTORY_SERVICE_GROUP + suffix, Pattern.LITERAL,
            "joins its own consumer group"),
    ]


def agent_server_acls(layout: Layout, principal: str = AGENT_SERVER) -> list[Acl]:
    """An agent server (a producer of raw events): it writes, and reads nothing."""
    return [Acl(principal, Operation.WRITE, Resource.TOPIC, name, pattern,
                "publishes its runs' events")
            for name, pattern in _input_resources(layout)]


def deployment_acls(layout: Layout, *, worker: str = WORKER,
                    history_service: str = HISTORY_SERVICE,
                    history_group: str = HISTORY_SERVICE_GROUP,
                    agent_server: str = AGENT_SERVER,
                    tenants: Iterable[str] = ()) -> list[Acl]:
    """Every principal's ACLs: the workers', the history service's (per-tenant layout:
    each of `tenants`' own), the agent servers'."""
    return [*worker_acls(layout, worker),
            *history_service_acls(layout, history_service, history_group),
            *(acl for tenant in tenants for acl in tenant_service_acls(layout, tenant)),
            *agent_server_acls(layout, agent_server)]


def acl_document(layout: Layout, *, markdown: bool = False, tenants: Iterable[str] = (),
                 **principals: str) -> str:
    """The ACLs of a deployment: `kafka-acls.sh` commands, or (`markdown`) the table and
    the commands that `docs/operations.md` shows."""
    acls = deployment_acls(layout, tenants=tenants, **principals)
    commands = kafka_acls_commands(acls)
    if not markdown:
        return commands
    return f"{acl_table(acls)}\n\n```\n{commands}\n```"


def _input_resources(layout: Layout) -> list[tuple[str, Pattern]]:
    """The raw topics by name, or the literal start of AGUI_INPUT_PATTERN as a prefix
    (a subscription by pattern reads every topic that appears and matches it)."""
    if layout.input_pattern is None:
        return [(name, Pattern.LITERAL) for name in layout.input_topics]
    prefix = literal_prefix(layout.input_pattern)
    if not prefix:  # a prefix ACL on "" would grant every topic of the cluster
        raise ValueError(f"AGUI_INPUT_PATTERN {layout.input_pattern!r} starts with no"
                         " literal characters: grant the raw topics by name instead")
    return [(prefix, Pattern.PREFIXED)]


_REGEX_SYNTAX = re.compile(r"[\\.^$*+?{}\[\]|()]")


def literal_prefix(pattern: str) -> str:
    """The characters every name the pattern matches starts with: up to its first
    regex syntax (an escaped dot counts as a dot), less a character a quantifier
    makes optional."""
    prefix = []
    position = 1 if pattern.startswith("^") else 0
    while position < len(pattern):
        char = pattern[position]
        if char == "\\" and pattern[position + 1:position + 2] in (".", "-", "_"):
            prefix.append(pattern[position + 1])
            position += 2
            continue
        if _REGEX_SYNTAX.match(char):
            if char in "*?{" and prefix:
                prefix.pop()
            break
        prefix.append(char)
        position += 1
    return "".join(prefix)


def kafka_acls_commands(acls: Iterable[Acl], bootstrap: str = "$BOOTSTRAP",
                        admin_config: str = "admin.properties") -> str:
    """The `kafka-acls.sh` commands that grant `acls`: one per principal and resource,
    with its operations."""
    grouped: dict[tuple[str, Resource, str, Pattern], list[Acl]] = {}
    for acl in acls:
        grouped.setdefault((acl.principal, acl.resource, acl.name, acl.pattern),
                           []).append(acl)
    lines = []
    for (principal, resource, name, pattern), entries in grouped.items():
        operations = " ".join(f"--operation {acl.operation.cli_name}" for acl in entries)
        pattern_option = ("--resource-pattern-type prefixed "
                          if pattern is Pattern.PREFIXED else "")
        lines.append(f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config"
                     f" {admin_config} --add --allow-principal {principal} {operations}"
                     f" {pattern_option}--{resource.label} {name}")
    return "\n".join(lines)


def acl_table(acls: Iterable[Acl]) -> str:
    """A Markdown table of `acls`, one row per entry, with why it is needed."""
    rows = ["| principal | operation | resource | why |", "| --- | --- | --- | --- |"]
    rows += [f"| `{acl.principal}` | `{acl.operation.name}` | {acl.target} | {acl.why} |"
             for acl in acls]
    return "\n".join(rows)
