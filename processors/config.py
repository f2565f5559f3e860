"""The service's configuration: environment variables with documented defaults.

A wrong setting fails at start with a `ConfigError` that names the variable;
a worker never starts half-configured. Secrets (SASL password, key files) are
read here and passed to the Kafka client, never logged.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from processors.tap.runs import EchoMode
from topics.tenant_topics import Template, matches_any, templates_problem


class ConfigError(ValueError):
    """A setting is missing or invalid; the message names the variable."""


SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
GUARANTEES: Final = ("exactly_once", "at_least_once")

# (variable, default, meaning) — the README's configuration table is this list.
DOCUMENTED: Final = (
    ("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092", "broker addresses, comma-separated host:port"),
    ("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT", "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
    ("KAFKA_SASL_MECHANISM", "", "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (SASL protocols)"),
    ("KAFKA_SASL_USERNAME", "", "SASL user (SASL protocols)"),
    ("KAFKA_SASL_PASSWORD", "", "SASL password (SASL protocols; never logged)"),
    ("KAFKA_SASL_PASSWORD_FILE", "", "file holding the SASL password, instead of"
     " KAFKA_SASL_PASSWORD (a mounted Kubernetes Secret); one trailing newline ignored"),
    ("KAFKA_SSL_CAFILE", "", "CA bundle to verify the brokers (SSL protocols)"),
    ("KAFKA_SSL_CERTFILE", "", "client certificate for mutual TLS (optional)"),
    ("KAFKA_SSL_KEYFILE", "", "client key for mutual TLS (optional)"),
    ("KAFKA_SSL_KEY_PASSWORD_FILE", "", "file holding the password of an encrypted"
     " KAFKA_SSL_KEYFILE"),
    ("AGUI_APP_ID", "agui-stream", "consumer group id and prefix of internal topics"),
    ("AGUI_INPUT_TOPICS", "agui.events", "raw event topics, comma-separated"),
    ("AGUI_INPUT_PATTERN", "", "regex of raw event topics (instead of AGUI_INPUT_TOPICS):"
     " those that exist when the worker starts"),
    ("AGUI_HISTORY_TOPIC", "agui.history", "history output topic"),
    ("AGUI_DEADLETTER_TOPIC", "agui.deadletter", "dead-letter output topic"),
    ("AGUI_HISTORY_TOPIC_TEMPLATE", "", "per-tenant history topics, e.g."
     " agui.history.{tenant} (set with AGUI_DEADLETTER_TOPIC_TEMPLATE; empty: every"
     " tenant in AGUI_HISTORY_TOPIC). Topics are created per tenant: create-topics --tenant"),
    ("AGUI_DEADLETTER_TOPIC_TEMPLATE", "", "per-tenant dead-letter topics, e.g."
     " agui.deadletter.{tenant} (with AGUI_HISTORY_TOPIC_TEMPLATE)"),
    ("AGUI_PARTITIONS", "8", "partitions of the raw topics (tables are co-partitioned)"),
    ("AGUI_REPLICATION_FACTOR", "1", "replication of created topics (3 in production)"),
    ("AGUI_TENANT_HEADER", "tenant", "record header naming the tenant"),
    ("AGUI_DEFAULT_TENANT", "default", "tenant of records without that header"),
    ("AGUI_IDLE_TIMEOUT_SECONDS", "3600", "a run idle this long is abandoned (run_abandoned)"),
    ("AGUI_RUN_MAX_EVENTS", "1000000", "records one run may have; past it the run fails"
     " (run_event_limit)"),
    ("AGUI_RUN_MAX_CONTENT_CHARS", "16000000", "characters of streamed text and tool-call"
     " arguments one run may hold (about 2 bytes of memory each); past it the run fails"
     " (run_content_limit)"),
    ("AGUI_RUN_MAX_ITEMS", "10000", "messages, tool calls and open spans, steps and subagents"
     " one run may hold; past it the run fails (run_item_limit)"),
    ("AGUI_TENANT_MAX_OPEN_RUNS", "5000", "runs one tenant may have open in one input"
     " partition; a run past it fails (tenant_open_run_limit); 0: no limit"),
    ("AGUI_COMMIT_INTERVAL_MS", "100", "time between two commits: a run's history is"
     " readable (and the thread view answers with it) about this long after its last"
     " event; shorter costs more transactions (docs/capacity.md)"),
    ("AGUI_CHECKPOINT_SECONDS", "5", "longest a streaming run's text waits to be stored; a"
     " crash replays at most about this much input (0: stored with every commit, which"
     " writes a changelog record per streaming run per commit)"),
    ("AGUI_STORE", "rocksdb://", "table store: rocksdb:// (production) or memory://"),
    ("AGUI_DATA_DIR", "/var/lib/agui-stream", "where RocksDB state lives"),
    ("AGUI_ROCKSDB_MEMORY_MIB", "16", "memory RocksDB may use per table and partition a"
     " worker owns (half block cache, half write buffers; three tables)"),
    ("AGUI_PROCESSING_GUARANTEE", "exactly_once", "exactly_once or at_least_once"),
    ("AGUI_TRANSACTIONS", "partition", "exactly_once: partition (a transaction per input"
     " partition per commit, Faust's) or worker (experimental, not for production: one per"
     " worker per commit, fenced by group member, KIP-447; docs/next-turn.md)"),
    ("AGUI_GROUP_INSTANCE_ID", "", "static group membership id (e.g. the pod name): a restart"
     " takes its partitions back at once"),
    ("AGUI_SESSION_TIMEOUT_SECONDS", "30", "a worker silent this long loses its partitions"),
    ("AGUI_SHUTDOWN_TIMEOUT_SECONDS", "20", "a worker still stopping this long after SIGTERM"
     " or SIGINT exits without a commit (as a kill would)"),
    ("AGUI_MAX_RECORD_BYTES", "1000000", "largest output record; larger history is not_storable"),
    ("AGUI_METRICS_PORT", "6066", "HTTP port of /metrics, /livez, /readyz and /healthz"),
    ("AGUI_STALL_SECONDS", "300", "/livez fails when input waits and nothing was processed"
     " this long (keep it well above a rebalance's recovery time)"),
    ("AGUI_VIEW_RETENTION_SECONDS", "2592000", "the thread view removes a thread with no"
     " history record for this long (30 days)"),
    ("AGUI_TOKENS_FILE", "", "tenant tokens of the thread API (docs/thread-view.md); empty:"
     " the API answers every request 401"),
    ("AGUI_API_BIND", "0.0.0.0", "address the HTTP port listens on (127.0.0.1: this host"
     " only)"),
    ("AGUI_API_MAX_CONNECTIONS", "1000", "open HTTP connections a worker keeps; more are"
     " answered 503 and closed"),
    ("AGUI_API_MAX_WAITERS", "1000", "thread API requests that may wait for the view at"
     " once (run= or min_offset=); more are answered 429"),
    ("AGUI_API_MAX_WAITERS_PER_TENANT", "100", "of those, requests of one tenant"),
    ("AGUI_TEST_STALL_AGENT", "", "test only: 1 makes the agent stop before its first record"),
    ("AGUI_TAP_UPSTREAM_URL", "", "tap: the AG-UI agent endpoint's base URL (http or https);"
     " a request's path and query are appended to it (required by `agui-stream tap`)"),
    ("AGUI_TAP_PORT", "8080", "tap: port the proxy listens on (its metrics and health are on"
     " AGUI_METRICS_PORT)"),
    ("AGUI_TAP_TOPIC", "agui.events", "tap: the raw topic it publishes to"),
    ("AGUI_TAP_TENANT_SOURCE", "header", "tap: where a request's tenant comes from: header (the"
     " request header AGUI_TAP_TENANT_REQUEST_HEADER, set by the gateway) or token (its bearer"
     " token in AGUI_TOKENS_FILE); a request without one is forwarded and not published"),
    ("AGUI_TAP_TENANT_REQUEST_HEADER", "X-Agui-Tenant", "tap: the request header naming the"
     " tenant (AGUI_TAP_TENANT_SOURCE=header)"),
    ("AGUI_TAP_ECHO", "messages", "tap: what of the request it puts on the requested run's"
     " RUN_STARTED when the agent did not echo it: messages (threadId, runId, messages) or"
     " input (the whole RunAgentInput)"),
    ("AGUI_TAP_BUFFER_BYTES", "67108864", "tap: bytes of events it holds for Kafka; a run that"
     " finds no room is dropped whole (docs/tap.md)"),
    ("AGUI_TAP_MAX_EVENT_BYTES", "1000000", "tap: largest SSE event it publishes (keep it within"
     " the raw topic's max.message.bytes); a larger one drops its run's publication"),
    ("AGUI_TAP_MAX_REQUEST_BYTES", "16777216", "tap: largest request body it forwards; larger"
     " requests are answered 413"),
    ("AGUI_TAP_CONNECT_TIMEOUT_SECONDS", "10", "tap: time to connect to the upstream and get"
     " its response headers; past it the client gets 504"),
    ("AGUI_LOG_LEVEL", "info", "debug, info, warning or error"),
    ("AGUI_LOG_FORMAT", "text", "text (a plain line per record) or json (a JSON object per"
     " line, for log collectors)"),
)
_DEFAULTS: Final = {name: default for name, default, _ in DOCUMENTED}


@dataclass(frozen=True, slots=True)
class Settings:
    bootstrap_servers: tuple[str, ...]
    security_protocol: str
    sasl_mechanism: str | None
    sasl_username: str | None
    sasl_password: str | None = field(repr=False)  # a secret: never in a repr or a log
    ssl_cafile: str | None
    ssl_certfile: str | None
    ssl_keyfile: str | None
    ssl_key_password: str | None = field(repr=False)  # a secret: never in a repr or a log
    app_id: str
    input_topics: tuple[str, ...]
    input_pattern: str | None
    history_topic: str
    deadletter_topic: str
    # Per-tenant topics (None: every tenant in the shared topics above).
    tenant_templates: TenantTemplates | None
    partitions: int
    replication_factor: int
    tenant_header: str
    default_tenant: str
    idle_timeout_seconds: float
    run_max_events: int
    run_max_content_chars: int
    run_max_items: int
    tenant_max_open_runs: int
    commit_interval_seconds: float
    checkpoint_seconds: float
    store: str
    data_dir: str
    rocksdb_memory_mib: int
    processing_guarantee: str
    transactions: str
    group_instance_id: str | None
    session_timeout_seconds: float
    shutdown_timeout_seconds: float
    max_record_bytes: int
    metrics_port: int
    log_level: str
    log_format: str
    stall_seconds: float
    view_retention_seconds: float
    tokens_file: str | None
    api_bind: str
    api_max_connections: int
    api_max_waiters: int
    api_max_waiters_per_tenant: int
    test_stall_agent: bool

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        source = os.environ if env is None else env

        def get(name: str) -> str:
            return source.get(name, _DEFAULTS[name]).strip()

        def optional(name: str) -> str | None:
            return get(name) or None

        protocol = _choice("KAFKA_SECURITY_PROTOCOL", get("KAFKA_SECURITY_PROTOCOL").upper(),
                           SECURITY_PROTOCOLS)
        mechanism = optional("KAFKA_SASL_MECHANISM")
        username = optional("KAFKA_SASL_USERNAME")
        password = _secret(optional("KAFKA_SASL_PASSWORD"), "KAFKA_SASL_PASSWORD_FILE",
                           optional("KAFKA_SASL_PASSWORD_FILE"))
        if protocol.startswith("SASL_"):
            if mechanism is None:
                raise ConfigError(f"KAFKA_SASL_MECHANISM is required with {protocol}")
            _choice("KAFKA_SASL_MECHANISM", mechanism.upper(), SASL_MECHANISMS)
            if username is None or password is None:
                raise ConfigError(
                    f"KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD (or KAFKA_SASL_PASSWORD_FILE)"
                    f" are required with {protocol}"
                )
        for name in ("KAFKA_SSL_CAFILE", "KAFKA_SSL_CERTFILE", "KAFKA_SSL_KEYFILE",
                     "AGUI_TOKENS_FILE"):
            path = optional(name)
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"{name}={path!r}: no such file")

        pattern = optional("AGUI_INPUT_PATTERN")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as error:
                raise ConfigError(f"AGUI_INPUT_PATTERN is not a valid regex: {error}") from None
        topics = tuple(t.strip() for t in get("AGUI_INPUT_TOPICS").split(",") if t.strip())
        if pattern is None and not topics:
            raise ConfigError("AGUI_INPUT_TOPICS names no topic (or set AGUI_INPUT_PATTERN)")
        names = {
            "AGUI_HISTORY_TOPIC": get("AGUI_HISTORY_TOPIC"),
            "AGUI_DEADLETTER_TOPIC": get("AGUI_DEADLETTER_TOPIC"),
        }
        for name, topic in {**names, **{f"AGUI_INPUT_TOPICS ({t})": t for t in topics}}.items():
            if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", topic):
                raise ConfigError(f"{name}: {topic!r} is not a valid Kafka topic name")
        for name, topic in names.items():  # (the subscription matches the pattern's start)
            if topic in topics or (pattern is not None and re.match(pattern, topic)):
                raise ConfigError(f"{name}={topic!r} is also an input topic (AGUI_INPUT_TOPICS"
                                  " or AGUI_INPUT_PATTERN): the workers would read their own"
                                  " output as agent events")
        templates = _tenant_templates(get("AGUI_HISTORY_TOPIC_TEMPLATE"),
                                      get("AGUI_DEADLETTER_TOPIC_TEMPLATE"))
        if templates is not None:
            _check_tenant_topics_apart(templates, (*names.values(), *topics), pattern,
                                       get("AGUI_DEFAULT_TENANT"))
        servers = tuple(s.strip() for s in get("KAFKA_BOOTSTRAP_SERVERS").split(",") if s.strip())
        if not servers or not all(re.fullmatch(r"[^\s:]+:\d{1,5}", s) for s in servers):
            raise ConfigError("KAFKA_BOOTSTRAP_SERVERS must be host:port[,host:port...]")
        store = get("AGUI_STORE")
        if store not in ("rocksdb://", "memory://"):
            raise ConfigError(f"AGUI_STORE must be rocksdb:// or memory:// (got {store!r})")
        return cls(
            bootstrap_servers=servers,
            security_protocol=protocol,
            sasl_mechanism=None if mechanism is None else mechanism.upper(),
            sasl_username=username,
            sasl_password=password,
            ssl_cafile=optional("KAFKA_SSL_CAFILE"),
            ssl_certfile=optional("KAFKA_SSL_CERTFILE"),
            ssl_keyfile=optional("KAFKA_SSL_KEYFILE"),
            ssl_key_password=_secret(None, "KAFKA_SSL_KEY_PASSWORD_FILE",
                                     optional("KAFKA_SSL_KEY_PASSWORD_FILE")),
            app_id=_non_empty("AGUI_APP_ID", get("AGUI_APP_ID")),
            input_topics=topics,
            input_pattern=pattern,
            history_topic=names["AGUI_HISTORY_TOPIC"],
            deadletter_topic=names["AGUI_DEADLETTER_TOPIC"],
            tenant_templates=templates,
            partitions=_integer("AGUI_PARTITIONS", get("AGUI_PARTITIONS"), 1, 10_000),
            replication_factor=_integer("AGUI_REPLICATION_FACTOR",
                                        get("AGUI_REPLICATION_FACTOR"), 1, 16),
            tenant_header=_non_empty("AGUI_TENANT_HEADER", get("AGUI_TENANT_HEADER")),
            default_tenant=_non_empty("AGUI_DEFAULT_TENANT", get("AGUI_DEFAULT_TENANT")),
            idle_timeout_seconds=float(
                _integer("AGUI_IDLE_TIMEOUT_SECONDS", get("AGUI_IDLE_TIMEOUT_SECONDS"), 1,
                         30 * 86_400)
            ),
            run_max_events=_integer("AGUI_RUN_MAX_EVENTS", get("AGUI_RUN_MAX_EVENTS"), 100,
                                    1_000_000_000),
            run_max_content_chars=_integer("AGUI_RUN_MAX_CONTENT_CHARS",
                                           get("AGUI_RUN_MAX_CONTENT_CHARS"), 1_000,
                                           1_000_000_000),
            run_max_items=_integer("AGUI_RUN_MAX_ITEMS", get("AGUI_RUN_MAX_ITEMS"), 10,
                                   10_000_000),
            tenant_max_open_runs=_integer("AGUI_TENANT_MAX_OPEN_RUNS",
                                          get("AGUI_TENANT_MAX_OPEN_RUNS"), 0, 100_000_000),
            commit_interval_seconds=_integer("AGUI_COMMIT_INTERVAL_MS",
                                             get("AGUI_COMMIT_INTERVAL_MS"), 10, 60_000) / 1000,
            checkpoint_seconds=float(_integer("AGUI_CHECKPOINT_SECONDS",
                                              get("AGUI_CHECKPOINT_SECONDS"), 0, 3_600)),
            store=store,
            data_dir=_non_empty("AGUI_DATA_DIR", get("AGUI_DATA_DIR")),
            rocksdb_memory_mib=_integer("AGUI_ROCKSDB_MEMORY_MIB",
                                        get("AGUI_ROCKSDB_MEMORY_MIB"), 4, 65_536),
            processing_guarantee=_choice("AGUI_PROCESSING_GUARANTEE",
                                         get("AGUI_PROCESSING_GUARANTEE").lower(), GUARANTEES),
            transactions=_choice("AGUI_TRANSACTIONS", get("AGUI_TRANSACTIONS").lower(),
                                 ("partition", "worker")),
            group_instance_id=optional("AGUI_GROUP_INSTANCE_ID"),
            session_timeout_seconds=float(_integer(
                "AGUI_SESSION_TIMEOUT_SECONDS", get("AGUI_SESSION_TIMEOUT_SECONDS"), 6, 1800)),
            shutdown_timeout_seconds=float(_integer(
                "AGUI_SHUTDOWN_TIMEOUT_SECONDS", get("AGUI_SHUTDOWN_TIMEOUT_SECONDS"), 1, 600)),
            max_record_bytes=_integer("AGUI_MAX_RECORD_BYTES", get("AGUI_MAX_RECORD_BYTES"),
                                      10_000, 100_000_000),
            metrics_port=_integer("AGUI_METRICS_PORT", get("AGUI_METRICS_PORT"), 1, 65_535),
            log_level=_choice("AGUI_LOG_LEVEL", get("AGUI_LOG_LEVEL").lower(),
                              ("debug", "info", "warning", "error")),
            log_format=_choice("AGUI_LOG_FORMAT", get("AGUI_LOG_FORMAT").lower(),
                               ("text", "json")),
            stall_seconds=float(_integer("AGUI_STALL_SECONDS", get("AGUI_STALL_SECONDS"), 5,
                                         86_400)),
            view_retention_seconds=float(_integer(
                "AGUI_VIEW_RETENTION_SECONDS", get("AGUI_VIEW_RETENTION_SECONDS"), 1,
                3650 * 86_400)),
            tokens_file=optional("AGUI_TOKENS_FILE"),
            api_bind=_non_empty("AGUI_API_BIND", get("AGUI_API_BIND")),
            api_max_connections=_integer("AGUI_API_MAX_CONNECTIONS",
                                         get("AGUI_API_MAX_CONNECTIONS"), 10, 1_000_000),
            api_max_waiters=_integer("AGUI_API_MAX_WAITERS", get("AGUI_API_MAX_WAITERS"), 0,
                                     1_000_000),
            api_max_waiters_per_tenant=_integer("AGUI_API_MAX_WAITERS_PER_TENANT",
                                                get("AGUI_API_MAX_WAITERS_PER_TENANT"), 0,
                                                1_000_000),
            test_stall_agent=_choice("AGUI_TEST_STALL_AGENT", get("AGUI_TEST_STALL_AGENT"),
                                     ("", "0", "1")) == "1",
        )

    @property
    def broker_url(self) -> str:
        return ";".join(f"kafka://{server}" for server in self.bootstrap_servers)

    @property
    def one_transaction_per_worker(self) -> bool:
        """AGUI_TRANSACTIONS=worker, which only exactly_once has transactions for."""
        return self.processing_guarantee == "exactly_once" and self.transactions == "worker"


TENANT_SOURCES: Final = ("header", "token")


@dataclass(frozen=True, slots=True)
class TapSettings:
    """`agui-stream tap`: the shared Kafka, tenant, tokens, HTTP and logging settings
    (`base`) and the proxy's own `AGUI_TAP_*`."""

    base: Settings
    upstream_url: str
    port: int
    topic: str
    tenant_source: str
    tenant_request_header: str
    echo: EchoMode
    buffer_bytes: int
    max_event_bytes: int
    max_request_bytes: int
    connect_timeout_seconds: float

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TapSettings:
        source = os.environ if env is None else env
        base = Settings.from_env(source)

        def get(name: str) -> str:
            return source.get(name, _DEFAULTS[name]).strip()

        upstream = get("AGUI_TAP_UPSTREAM_URL")
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", upstream):
            raise ConfigError("AGUI_TAP_UPSTREAM_URL must be an http:// or https:// URL without"
                              f" query or fragment (got {upstream!r})")
        topic = get("AGUI_TAP_TOPIC")
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", topic):
            raise ConfigError(f"AGUI_TAP_TOPIC: {topic!r} is not a valid Kafka topic name")
        tenant_source = _choice("AGUI_TAP_TENANT_SOURCE", get("AGUI_TAP_TENANT_SOURCE").lower(),
                                TENANT_SOURCES)
        if tenant_source == "token" and base.tokens_file is None:
            raise ConfigError("AGUI_TAP_TENANT_SOURCE=token needs AGUI_TOKENS_FILE")
        header = get("AGUI_TAP_TENANT_REQUEST_HEADER")
        if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", header):  # an HTTP token
            raise ConfigError(f"AGUI_TAP_TENANT_REQUEST_HEADER: {header!r} is not a header name")
        return cls(
            base=base,
            upstream_url=upstream.rstrip("/"),
            port=_integer("AGUI_TAP_PORT", get("AGUI_TAP_PORT"), 1, 65_535),
            topic=topic,
            tenant_source=tenant_source,
            tenant_request_header=header,
            echo=EchoMode(_choice("AGUI_TAP_ECHO", get("AGUI_TAP_ECHO").lower(),
                                  tuple(EchoMode))),
            buffer_bytes=_integer("AGUI_TAP_BUFFER_BYTES", get("AGUI_TAP_BUFFER_BYTES"),
                                  65_536, 1 << 40),
            max_event_bytes=_integer("AGUI_TAP_MAX_EVENT_BYTES", get("AGUI_TAP_MAX_EVENT_BYTES"),
                                     1_024, 100_000_000),
            max_request_bytes=_integer("AGUI_TAP_MAX_REQUEST_BYTES",
                                       get("AGUI_TAP_MAX_REQUEST_BYTES"), 1_024, 1 << 31),
            connect_timeout_seconds=float(_integer(
                "AGUI_TAP_CONNECT_TIMEOUT_SECONDS", get("AGUI_TAP_CONNECT_TIMEOUT_SECONDS"), 1,
                600)),
        )


@dataclass(frozen=True, slots=True)
class TenantTemplates:
    """AGUI_HISTORY_TOPIC_TEMPLATE and AGUI_DEADLETTER_TOPIC_TEMPLATE."""

    history: Template
    deadletter: Template

    @property
    def both(self) -> tuple[Template, Template]:
        return self.history, self.deadletter


def _tenant_templates(history: str, deadletter: str) -> TenantTemplates | None:
    if not history and not deadletter:
        return None
    if not history or not deadletter:
        raise ConfigError("set both AGUI_HISTORY_TOPIC_TEMPLATE and"
                          " AGUI_DEADLETTER_TOPIC_TEMPLATE, or neither")
    templates = TenantTemplates(Template(history), Template(deadletter))
    for name, template in (("AGUI_HISTORY_TOPIC_TEMPLATE", templates.history),
                           ("AGUI_DEADLETTER_TOPIC_TEMPLATE", templates.deadletter)):
        problem = template.problem()
        if problem is not None:
            raise ConfigError(f"{name}: {problem}")
    problem = templates_problem(*templates.both)
    if problem is not None:
        raise ConfigError(problem)
    return templates


def _check_tenant_topics_apart(templates: TenantTemplates, named: tuple[str, ...],
                               pattern: str | None, default_tenant: str) -> None:
    """No shared or raw topic is a tenant's topic (the thread view would read it as
    history), and the raw topics' pattern matches no tenant's topic (the workers would
    read their own output as agent events). The pattern is tried on sample tenants:
    a regex's overlap with a template is not decidable in general."""
    for topic in named:
        if matches_any(templates.both, topic):
            raise ConfigError(f"topic {topic!r} (AGUI_HISTORY_TOPIC, AGUI_DEADLETTER_TOPIC or"
                              " AGUI_INPUT_TOPICS) is also a name the tenant topic templates"
                              " give")
    if pattern is None:
        return
    for template in templates.both:
        for tenant in (default_tenant, "tenant", "a"):
            sample = template.topic(tenant)
            if sample is not None and re.match(pattern, sample):
                raise ConfigError(f"AGUI_INPUT_PATTERN matches {sample!r}, a tenant's topic of"
                                  f" {template.text!r}: the workers would read their own"
                                  " output as agent events")


def read_setting_file(variable: str, path: str) -> str:
    """The text of the file a setting names; a `ConfigError` naming the variable, the
    path and the kind of failure, never the content."""
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{variable}={path!r}: cannot be read"
                          f" ({type(error).__name__})") from None


def _secret(value: str | None, file_name: str, path: str | None) -> str | None:
    """A secret given in the environment, or in the file `path` names (what a mounted
    Kubernetes Secret gives): its text less one trailing newline. Errors name the
    variable and the path, never the content."""
    if path is None:
        return value
    variable = file_name.removesuffix("_FILE")
    if value is not None:
        raise ConfigError(f"set {variable} or {file_name}, not both")
    text = read_setting_file(file_name, path).removesuffix("\n").removesuffix("\r")
    if not text:
        raise ConfigError(f"{file_name}={path!r}: the file is empty")
    return text


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)} (got {value!r})")
    return value


def _integer(name: str, value: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{name} must be an integer (got {value!r})") from None
    if not low <= number <= high:
        raise ConfigError(f"{name} must be between {low} and {high} (got {number})")
    return number


def _non_empty(name: str, value: str) -> str:
    if not value:
        raise ConfigError(f"{name} must not be empty")
    return value
