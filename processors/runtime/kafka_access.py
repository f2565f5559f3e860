"""What a starting worker checks of its Kafka access, so that a wrong credential or a
missing ACL stops it at once with one sentence naming what is wrong (exit 2).

Left to themselves, aiokafka logs a failed bootstrap and Faust starts again and
again, and an ACL that is missing shows up as an authorization error deep in a
rebalance or a commit. So before Faust starts, the worker

* connects to the bootstrap servers itself and names the reason a connection
  fails: the broker's certificate expired, is for another host or is not signed
  by the configured CA; the broker refused the client certificate; SASL
  authentication failed; nothing answers;
* asks the broker which operations its principal may perform on each topic (a
  Metadata request with the topics' authorized operations, KIP-430), on its
  consumer group (DescribeGroups) and on its transactional ids (an
  InitProducerId of `<AGUI_APP_ID>-access-check`, the one thing that proves
  `WRITE` on them), and names each entry of `topics.acls.worker_acls` that is
  missing, with the command that grants it.

No message carries a secret: the SASL password and key password are never
formatted, and errors are described from their kind, not their text.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka import errors
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.conn import create_conn
from aiokafka.protocol.admin import (
    CreateAclsRequest,
    DeleteAclsRequest,
    DescribeAclsRequest,
    DescribeGroupsResponse_v3,
)
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.transaction import InitProducerIdRequest
from aiokafka.protocol.types import Array, Boolean, Int16, Int32, Schema, String

from processors.config import Settings
from processors.runtime.kafka_client import aiokafka_options
from processors.runtime.kafka_retries import until_settled
from processors.runtime.topic_admin import (
    TopicsNotCreated,
    checked_topics,
    create_topics,
    existing_topics,
    input_topics_now,
    tenant_topics_now,
)
from processors.runtime.worker_transactions import missing_group_fencing
from topics.acls import Acl, Layout, Operation, Pattern, Resource, kafka_acls_commands
from topics.acls import worker_acls as layout_acls

CONNECT_TIMEOUT_MS = 10_000
COORDINATOR_WAIT_SECONDS = 30.0
ACCESS_CHECK_SUFFIX = "access-check"

# Kafka's error codes an access check tells apart (org.apache.kafka.common.protocol.Errors).
UNKNOWN_TOPIC = 3
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53

# OpenSSL's verification results (X509_V_ERR_*) a worker meets on a broker's certificate.
_EXPIRED = 10
_NOT_YET_VALID = 9
_UNTRUSTED = (18, 19, 20, 21)  # self-signed, self-signed in chain, unknown issuer (x2)
_HOST_MISMATCH = (62, 64)  # a DNS name, an IP address


def layout(settings: Settings) -> Layout:
    return Layout(app_id=settings.app_id, input_topics=settings.input_topics,
                  input_pattern=settings.input_pattern,
                  history_topic=settings.history_topic,
                  deadletter_topic=settings.deadletter_topic,
                  tenant_templates=(None if settings.tenant_templates is None
                                    else settings.tenant_templates.both))


def principal(settings: Settings) -> str:
    """The principal the broker most likely sees: the SASL user, else the client
    certificate's (whose name the broker's mapping rules decide)."""
    if settings.security_protocol.startswith("SASL_"):
        return f"User:{settings.sasl_username}"
    if settings.ssl_certfile is not None:
        return "User:<the client certificate's principal>"
    return "User:ANONYMOUS"


def worker_acls(settings: Settings) -> list[Acl]:
    """The ACLs this worker needs: `topics.acls.worker_acls` for its settings (without
    the transactional ids under at-least-once, which makes no transaction)."""
    needed = layout_acls(layout(settings), principal(settings))
    if settings.processing_guarantee != "exactly_once":
        needed = [acl for acl in needed if acl.resource is not Resource.TRANSACTIONAL_ID]
    return needed


# --------------------------------------------------------------------------- connecting


async def connection_problem(settings: Settings) -> str | None:
    """None once one bootstrap server accepts the connection, TLS and SASL included,
    and (AGUI_TRANSACTIONS=worker) takes the requests that fence a worker's
    transactions; else why the first one did not."""
    try:
        options = aiokafka_options(settings)
    except (ssl.SSLError, OSError) as error:  # a CA, certificate or key file unusable
        return (f"cannot use the TLS files (KAFKA_SSL_CAFILE, KAFKA_SSL_CERTFILE,"
                f" KAFKA_SSL_KEYFILE): {getattr(error, 'reason', None) or error.strerror}")
    addresses = options.pop("bootstrap_servers")
    reasons = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            connection = await asyncio.wait_for(
                create_conn(host, int(port), request_timeout_ms=CONNECT_TIMEOUT_MS,
                            **options),
                CONNECT_TIMEOUT_MS / 1000)
        except Exception as error:  # every reason a connection fails is reported
            reasons.append(describe_connection_error(error, settings, host, port))
            continue
        connection.close()
        if settings.one_transaction_per_worker:
            return missing_group_fencing(connection._versions)
        return None
    return reasons[0] if reasons else "KAFKA_BOOTSTRAP_SERVERS names no server"


def describe_connection_error(error: BaseException, settings: Settings, host: str,
                              port: str) -> str:
    """One sentence on why the worker could not connect to `host:port`, from the
    error's kind (never its text, which a library might fill with anything)."""
    where = f"cannot connect to Kafka at {host}:{port}"
    if isinstance(error.__cause__, ssl.SSLError):  # a TLS alert read after the handshake
        error = error.__cause__
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"{where}: {_certificate_problem(error, settings, host)}"
    if isinstance(error, ssl.SSLError):
        reason = error.reason or "TLS error"
        if reason == "WRONG_VERSION_NUMBER":
            return (f"{where}: the port does not speak TLS (is KAFKA_SECURITY_PROTOCOL"
                    f" {settings.security_protocol} right for it?)")
        return (f"{where}: the TLS handshake failed ({reason}): the broker refused the"
                " client certificate (KAFKA_SSL_CERTFILE), or requires one")
    if isinstance(error, errors.SaslAuthenticationFailed):
        return (f"{where}: SASL authentication of user {settings.sasl_username!r} with"
                f" {settings.sasl_mechanism} failed: wrong username or password"
                " (KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD or KAFKA_SASL_PASSWORD_FILE)")
    if isinstance(error, errors.UnsupportedSaslMechanismError):
        return (f"{where}: the listener does not offer KAFKA_SASL_MECHANISM"
                f" {settings.sasl_mechanism}")
    if isinstance(error, TimeoutError | asyncio.TimeoutError):
        return (f"{where}: no answer within {CONNECT_TIMEOUT_MS // 1000} s (a TLS or SASL"
                " listener spoken to with another KAFKA_SECURITY_PROTOCOL stays silent)")
    if isinstance(error, ConnectionError | OSError):
        return f"{where}: {error.strerror or type(error).__name__}"
    return f"{where}: {type(error).__name__}"


def _certificate_problem(error: ssl.SSLCertVerificationError, settings: Settings,
                         host: str) -> str:
    code = error.verify_code
    if code == _EXPIRED:
        return "the broker's TLS certificate has expired"
    if code == _NOT_YET_VALID:
        return "the broker's TLS certificate is not valid yet (check the clocks)"
    if code in _HOST_MISMATCH:
        return (f"the broker's TLS certificate is not for {host} (connect by a name the"
                " certificate lists)")
    if code in _UNTRUSTED:
        authority = (f"KAFKA_SSL_CAFILE ({settings.ssl_cafile})" if settings.ssl_cafile
                     else "the system's trusted CAs (set KAFKA_SSL_CAFILE)")
        return f"the broker's TLS certificate is not signed by a CA in {authority}"
    return f"the broker's TLS certificate was refused (OpenSSL verify code {code})"


@dataclass(frozen=True, slots=True)
class StartupFacts:
    """What a starting worker learns of Kafka: the problems that must stop it (one
    sentence each), the largest record each output topic takes, and the raw topics
    AGUI_INPUT_PATTERN matches now."""

    problems: list[str]
    limits: dict[str, int]
    inputs: list[str]


async def startup_facts(settings: Settings) -> StartupFacts:
    """In order: the connection; the ACLs on what exists (an ACL missing on a topic is
    named, not reported as a topic that cannot be created); creating the internal and
    output topics; the ACLs on those just created; the topics' settings
    (`topic_admin.checked_topics`). The topics are listed once."""
    problem = await connection_problem(settings)
    if problem is not None:
        return StartupFacts([problem], {}, [])
    existing = await existing_topics(settings)
    inputs = input_topics_now(settings, existing)
    tenants = tenant_topics_now(settings, existing)
    missing = await missing_acls(settings, inputs, tenants)
    if not missing:
        try:
            created = await create_topics(settings, include_inputs=False)
        except TopicsNotCreated as error:
            return StartupFacts([str(error)], {}, inputs)
        if created:
            existing += created
            missing = await missing_acls(settings, inputs, tenants)
    if missing:
        return StartupFacts(describe_missing(missing), {}, inputs)
    problems, limits = await checked_topics(settings, existing)
    return StartupFacts(problems, limits, inputs)


# ------------------------------------------------------------------------------- ACLs


class _MetadataResponseV8(Response):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 8
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("brokers", Array(("node_id", Int32), ("host", String("utf-8")), ("port", Int32),
                          ("rack", String("utf-8")))),
        ("cluster_id", String("utf-8")),
        ("controller_id", Int32),
        ("topics", Array(
            ("error_code", Int16),
            ("topic", String("utf-8")),
            ("is_internal", Boolean),
            ("partitions", Array(("error_code", Int16), ("partition", Int32),
                                 ("leader", Int32), ("leader_epoch", Int32),
                                 ("replicas", Array(Int32)), ("isr", Array(Int32)),
                                 ("offline_replicas", Array(Int32)))),
            ("authorized_operations", Int32))),
        ("cluster_authorized_operations", Int32),
    )


class _MetadataRequestV8(RequestStruct):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 8
    RESPONSE_TYPE = _MetadataResponseV8
    SCHEMA = Schema(("topics", Array(String("utf-8"))),
                    ("allow_auto_topic_creation", Boolean),
                    ("include_cluster_authorized_operations", Boolean),
                    ("include_topic_authorized_operations", Boolean))


class _TopicOperations(Request[_MetadataRequestV8]):  # type: ignore[misc]
    """Metadata v8 (Kafka 2.3+; aiokafka sends at most v5): each topic's operations
    the caller's principal may perform."""

    API_KEY = 3

    def __init__(self, topics: list[str]) -> None:
        self._topics = topics

    def build(self, request_struct_class: type[_MetadataRequestV8]) -> _MetadataRequestV8:
        return request_struct_class(self._topics, False, False, True)


class _DescribeGroupsRequestV3(RequestStruct):  # type: ignore[misc]
    API_KEY = 15
    API_VERSION = 3
    RESPONSE_TYPE = DescribeGroupsResponse_v3  # aiokafka's own v3 struct decodes it as v2
    SCHEMA = Schema(("groups", Array(String("utf-8"))),
                    ("include_authorized_operations", Boolean))


class _GroupOperations(Request[_DescribeGroupsRequestV3]):  # type: ignore[misc]
    """DescribeGroups v3 (Kafka 2.3+): the group's operations the caller may perform."""

    API_KEY = 15

    def __init__(self, group: str) -> None:
        self._group = group

    def build(self, request_struct_class: type[_DescribeGroupsRequestV3]
              ) -> _DescribeGroupsRequestV3:
        return request_struct_class([self._group], True)


async def missing_acls(settings: Settings, inputs: list[str],
                       tenants: list[str]) -> list[Acl]:
    """The entries of `worker_acls` the broker does not grant this worker's principal.
    `inputs`: the raw topics it reads now; `tenants`: the tenants' topics that exist.
    A topic that does not exist yet is not judged (the worker creates its internal
    topics before it asks; an administrator, a tenant's)."""
    needed = worker_acls(settings)
    admin = AIOKafkaAdminClient(**aiokafka_options(settings),
                                request_timeout_ms=CONNECT_TIMEOUT_MS)
    await admin.start()
    try:
        topics = await _topic_operations(admin, _topics_of(needed, settings,
                                                           [*inputs, *tenants]))
        missing = [acl for acl in needed if acl.resource is Resource.TOPIC
                   and not _topics_allow(acl, topics, settings, inputs, tenants)]
        group = next(acl for acl in needed if acl.resource is Resource.GROUP)
        if not await _group_allows(admin, group):
            missing.append(group)
        transactional = [acl for acl in needed if acl.resource is Resource.TRANSACTIONAL_ID]
        if transactional and not await _may_write_transactions(admin, settings):
            missing.extend(transactional)
    finally:
        await admin.close()
    return missing


def _topics_of(needed: Iterable[Acl], settings: Settings, existing: list[str]) -> list[str]:
    names = [acl.name for acl in needed
             if acl.resource is Resource.TOPIC and acl.pattern is Pattern.LITERAL]
    return sorted({*names, *existing, *layout(settings).internal_topics})


def _topics_allow(acl: Acl, topics: dict[str, tuple[int, int]], settings: Settings,
                  inputs: list[str], tenants: list[str]) -> bool:
    """Every existing topic the entry stands for allows its operation."""
    templates = settings.tenant_templates
    if acl.pattern is Pattern.LITERAL:
        names = [acl.name]
    elif acl.name == layout(settings).internal_prefix:
        names = layout(settings).internal_topics
    elif templates is not None and acl.name in {t.prefix for t in templates.both}:
        names = [name for name in tenants if name.startswith(acl.name)]
    else:  # the input pattern's prefix: the raw topics it matches now
        names = inputs
    for name in names:
        error_code, operations = topics.get(name, (UNKNOWN_TOPIC, 0))
        if error_code == UNKNOWN_TOPIC:
            continue
        if error_code == TOPIC_AUTHORIZATION_FAILED:
            # Not even DESCRIBE, which READ and WRITE imply: blame those, the others
            # (DESCRIBE_CONFIGS, CREATE) cannot be judged until they are back.
            if acl.operation in (Operation.READ, Operation.WRITE):
                return False
        elif not operations >> acl.operation & 1:
            return False
    return True


async def _topic_operations(admin: AIOKafkaAdminClient,
                            names: list[str]) -> dict[str, tuple[int, int]]:
    response = await admin._send_request(_TopicOperations(names))
    return {topic[1]: (topic[0], topic[4]) for topic in response.topics}


async def _coordinator(admin: AIOKafkaAdminClient, key: str, kind: int) -> int:
    """The coordinator of a group (`kind` 0) or transactional id (1)."""
    # (On a new cluster the coordinators' topics are still being created and loaded.)
    return await until_settled(
        lambda: admin.find_coordinator(key, coordinator_type=kind), COORDINATOR_WAIT_SECONDS)


async def _group_allows(admin: AIOKafkaAdminClient, acl: Acl) -> bool:
    async def attempt() -> bool:
        try:
            node = await _coordinator(admin, acl.name, 0)
        except errors.GroupAuthorizationFailedError:
            return False
        response = await admin._send_request_to_node(node, _GroupOperations(acl.name))
        error_code, operations = response.groups[0][0], response.groups[0][-1]
        if error_code == GROUP_AUTHORIZATION_FAILED:
            return False
        if error_code:  # NOT_COORDINATOR and the like, while the group's coordinator moves
            raise errors.for_code(error_code)()
        return bool(operations >> acl.operation & 1)

    return await until_settled(attempt, COORDINATOR_WAIT_SECONDS)


async def _may_write_transactions(admin: AIOKafkaAdminClient, settings: Settings) -> bool:
    """An InitProducerId of the worker's own prefix: `WRITE` on a transactional id is
    checked by nothing else. It leaves one idle transactional id on the broker (the
    same one every start), which the broker expires."""
    transactional_id = f"{layout(settings).internal_prefix}{ACCESS_CHECK_SUFFIX}"
    try:
        node = await _coordinator(admin, transactional_id, 1)
    except errors.TransactionalIdAuthorizationFailed:
        return False
    response = await admin._send_request_to_node(
        node, InitProducerIdRequest(transactional_id, 60_000))
    return bool(response.error_code != TRANSACTIONAL_ID_AUTHORIZATION_FAILED)


ALLOW = 3  # Kafka's AclPermissionType.ALLOW


def _acl_fields(acl: Acl) -> tuple[int, str, int, str, str, int, int]:
    return (acl.resource, acl.name, acl.pattern, acl.principal, "*", acl.operation, ALLOW)


async def change_acls(settings: Settings, acls: list[Acl], *, grant: bool) -> None:
    """Grant (or revoke) `acls` with the settings' credentials (an administrator's),
    and return once the broker's authorizer holds the change (DescribeAcls answers
    from it): `agui-stream acls --apply` / `--revoke`."""
    admin = AIOKafkaAdminClient(**aiokafka_options(settings),
                                request_timeout_ms=CONNECT_TIMEOUT_MS)
    await admin.start()
    try:
        change = CreateAclsRequest if grant else DeleteAclsRequest
        for acl in acls:
            response = await admin._send_request(change(*_acl_fields(acl)))
            results = (response.creation_responses if grant
                       else [result[:2] for result in response.filter_responses])
            refused = [result for result in results if result[0] != 0]
            if refused:
                raise AclsNotChanged(f"Kafka refused to {'grant' if grant else 'revoke'}"
                                     f" {acl} to {acl.principal}:"
                                     f" {errors.for_code(refused[0][0]).__name__}")
        for acl in acls:
            while bool((await admin._send_request(
                    DescribeAclsRequest(*_acl_fields(acl)))).resources) != grant:
                await asyncio.sleep(0.05)  # the authorizer applies the metadata record
    finally:
        await admin.close()


class AclsNotChanged(Exception):
    """The broker refused to create or delete an ACL (the principal is no admin)."""


def describe_missing(acls: list[Acl]) -> list[str]:
    """One sentence per missing entry, naming the operation and the resource, and the
    command that grants them all."""
    if not acls:
        return []
    sentences = [f"Kafka does not allow this worker ({acl.principal}) {acl}: it {acl.why}"
                 for acl in acls]
    sentences.append("grant what is missing (docs/operations.md, 'Topics and ACLs'):\n"
                     + kafka_acls_commands(acls))
    return sentences
