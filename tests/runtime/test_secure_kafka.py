"""A worker against a broker that enforces TLS, SASL/SCRAM-SHA-512, mutual TLS and ACLs
(`deploy/kafka_local.py`'s secured broker, `StandardAuthorizer` with
`allow.everyone.if.no.acl.found=false`).

* With exactly the documented ACLs (`topics.acls`, which docs/operations.md shows),
  over SASL_SSL: every run published exactly once through a kill -9 and a restart,
  its dead letters written, its thread view equal to the history; the same over
  mutual TLS, the principal taken from the client certificate.
* Without any one of those ACLs, the worker stops at start with exit 2 and names
  the operation and the resource.
* A wrong password, an untrusted CA, an expired broker certificate or one for
  another host: exit 2 within seconds, naming which, and no secret in what it says.
* The history service may read the history and nothing else; an agent server may
  write raw events and read nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError

from processors.config import Settings
from processors.runtime import kafka_access
from processors.runtime.kafka_client import aiokafka_options
from tests.conftest import load_kafka_local
from tests.run_generator import interleaved_runs
from tests.runtime.test_service_recovery import assert_exactly_once
from tests.service_harness import (
    AGUI_STREAM,
    Namespace,
    TopicReader,
    Worker,
    assert_view_matches_history,
    produce,
    view_tokens_file,
)
from topics.acls import (
    AGENT_SERVER,
    HISTORY_SERVICE,
    Acl,
    Layout,
    deployment_acls,
    worker_acls,
)

pytestmark = pytest.mark.kafka

kafka_local = load_kafka_local()
WORKER_USER = "agui-stream"
START_LIMIT_S = 60  # a worker that cannot start says so well within this


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with kafka_local.local_secure_broker(tmp_path_factory.mktemp("secure-kafka")) as info:
        yield info


def credentials(broker: Any, user: str, *, mtls: bool = False) -> dict[str, str]:
    """The environment of a client of the secured broker, as `user`."""
    return dict(kafka_local.worker_settings(broker, user, mtls=mtls))


def security(env: dict[str, str]) -> dict[str, Any]:
    """aiokafka's options for `env`'s credentials, built as the worker builds them."""
    options = aiokafka_options(Settings.from_env(env))
    options.pop("bootstrap_servers")
    return options


def layout_of(namespace: Namespace) -> Layout:
    return Layout(app_id=namespace.app_id, input_topics=(namespace.events,),
                  input_pattern=None, history_topic=namespace.history,
                  deadletter_topic=namespace.deadletter)


def change_acls(broker: Any, acls: list[Acl], *, grant: bool) -> None:
    admin = Settings.from_env(credentials(broker, "admin"))
    asyncio.run(asyncio.wait_for(kafka_access.change_acls(admin, acls, grant=grant), 60))


def deployment(broker: Any, namespace: Namespace) -> None:
    """One namespace's deployment set up as its administrator would: the topics
    created (`agui-stream create-topics`) and the documented ACLs granted
    (`agui-stream acls --apply`), with the admin's credentials."""
    admin = credentials(broker, "admin")
    namespace.create_topics(**admin)
    result = subprocess.run([AGUI_STREAM, "acls", "--apply"], env=namespace.env(**admin),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"granted {len(deployment_acls(layout_of(namespace)))} ACLs"


def start_worker_expecting_refusal(namespace: Namespace, env: dict[str, str],
                                   tmp_path: Path) -> tuple[str, float]:
    """Run `agui-stream worker` that must not start: its output, and how long it took."""
    began = time.monotonic()
    result = subprocess.run(
        [AGUI_STREAM, "worker"], capture_output=True, text=True, timeout=START_LIMIT_S,
        env=namespace.env(AGUI_DATA_DIR=str(tmp_path / "data"), **env))
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    return output, time.monotonic() - began


def failing_run(thread: str) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """A run with text for a message never started: a failure, so a dead letter."""
    events = [{"type": "RUN_STARTED", "threadId": thread, "runId": f"{thread}-bad"},
              {"type": "TEXT_MESSAGE_CONTENT", "messageId": "nowhere", "delta": "x"},
              {"type": "RUN_FINISHED", "threadId": thread, "runId": f"{thread}-bad"}]
    return [(thread.encode(), orjson.dumps(event), []) for event in events]


# ----------------------------------------------------------------- the documented ACLs


def test_a_worker_with_the_documented_acls_over_scram_is_exactly_once_through_kill_9(
        broker: Any, tmp_path: Path) -> None:
    namespace = Namespace(broker.sasl_bootstrap, partitions=2)
    deployment(broker, namespace)
    agent = security(credentials(broker, "agent-server"))
    runs, records = interleaved_runs(seed=29, keys=40, runs_per_key=3)
    half = len(records) // 2
    produce(broker.sasl_bootstrap, namespace.events,
            [(k, v, []) for k, v in records[:half]], agent)
    worker = Worker(namespace, tmp_path, AGUI_PROCESSING_GUARANTEE="exactly_once",
                    AGUI_GROUP_INSTANCE_ID="w1", AGUI_TOKENS_FILE=view_tokens_file(tmp_path),
                    **credentials(broker, WORKER_USER)).start()
    history = TopicReader(broker.sasl_bootstrap, namespace.history, namespace.partitions,
                          security(credentials(broker, "history-service")))
    history.wait_until(lambda recs: any(r.value["kind"] == "run" for r in recs), 120,
                       "a first closing record", worker.log_tail)
    worker.kill()
    produce(broker.sasl_bootstrap, namespace.events,
            [(k, v, []) for k, v in records[half:]], agent)
    produce(broker.sasl_bootstrap, namespace.events, failing_run("broken-thread"), agent)
    worker.start()
    history.wait_until(lambda recs: sum(r.value["kind"] == "run" for r in recs) >= len(runs),
                       120, f"all {len(runs)} closing records", worker.log_tail)
    assert_view_matches_history(worker, history.records)
    dead_letters = TopicReader(broker.sasl_bootstrap, namespace.deadletter,
                               namespace.partitions, security(credentials(broker, "admin")))
    dead_letters.wait_until(lambda recs: any(r.key == b"broken-thread" for r in recs), 60,
                            "the failing run's dead letter", worker.log_tail)
    worker.stop()
    assert worker.starts == 2
    assert_exactly_once(runs, history.records)


def test_a_worker_over_mutual_tls_is_the_certificates_principal(broker: Any,
                                                                tmp_path: Path) -> None:
    namespace = Namespace(broker.mtls_bootstrap, partitions=2)
    deployment(broker, namespace)  # granted to User:agui-stream, the certificate's CN
    runs, records = interleaved_runs(seed=30, keys=10, runs_per_key=2)
    produce(broker.sasl_bootstrap, namespace.events, [(k, v, []) for k, v in records],
            security(credentials(broker, "agent-server")))
    worker = Worker(namespace, tmp_path, AGUI_PROCESSING_GUARANTEE="exactly_once",
                    **credentials(broker, WORKER_USER, mtls=True)).start()
    history = TopicReader(broker.mtls_bootstrap, namespace.history, namespace.partitions,
                          security(credentials(broker, "history-service", mtls=True)))
    history.wait_until(lambda recs: sum(r.value["kind"] == "run" for r in recs) >= len(runs),
                       120, f"all {len(runs)} closing records", worker.log_tail)
    worker.stop()
    assert_exactly_once(runs, history.records)


def test_each_missing_acl_stops_the_worker_at_start_naming_it(broker: Any,
                                                              tmp_path: Path) -> None:
    namespace = Namespace(broker.sasl_bootstrap, partitions=2)
    deployment(broker, namespace)
    env = credentials(broker, WORKER_USER)
    slowest = 0.0
    for acl in worker_acls(layout_of(namespace)):
        change_acls(broker, [acl], grant=False)
        output, took = start_worker_expecting_refusal(namespace, env, tmp_path)
        slowest = max(slowest, took)
        assert f"Kafka does not allow this worker (User:{WORKER_USER}) {acl}:" in output, (
            acl, output)
        assert output.count("Kafka does not allow this worker") == 1, (acl, output)
        assert "Traceback" not in output, output
        change_acls(broker, [acl], grant=True)
    print(f"slowest refusal: {slowest:.1f} s")


# ------------------------------------------------------------ credentials, certificates


def test_a_wrong_password_is_named_within_seconds_and_not_shown(broker: Any,
                                                                tmp_path: Path) -> None:
    namespace = Namespace(broker.sasl_bootstrap)
    wrong = "not-the-password-0123456789"
    env = {**credentials(broker, WORKER_USER), "KAFKA_SASL_PASSWORD_FILE": "",
           "KAFKA_SASL_PASSWORD": wrong}
    output, took = start_worker_expecting_refusal(namespace, env, tmp_path)
    assert f"SASL authentication of user '{WORKER_USER}' with SCRAM-SHA-512 failed" in output
    assert wrong not in output and broker.password(WORKER_USER) not in output
    assert took < 15, took


def test_an_untrusted_ca_is_named(broker: Any, tmp_path: Path) -> None:
    namespace = Namespace(broker.sasl_bootstrap)
    env = {**credentials(broker, WORKER_USER),
           "KAFKA_SSL_CAFILE": str(kafka_local.foreign_ca(tmp_path))}
    output, took = start_worker_expecting_refusal(namespace, env, tmp_path)
    assert "the broker's TLS certificate is not signed by a CA in KAFKA_SSL_CAFILE" in output
    assert broker.password(WORKER_USER) not in output
    assert took < 15, took


def test_a_client_certificate_from_another_ca_is_refused(broker: Any,
                                                         tmp_path: Path) -> None:
    kafka_local.foreign_ca(tmp_path)
    key, cert = kafka_local.client_certificate(tmp_path, WORKER_USER)
    env = {**credentials(broker, WORKER_USER, mtls=True),
           "KAFKA_SSL_CERTFILE": str(cert), "KAFKA_SSL_KEYFILE": str(key)}
    output, _ = start_worker_expecting_refusal(Namespace(broker.mtls_bootstrap), env,
                                               tmp_path)
    assert "the broker refused the client certificate (KAFKA_SSL_CERTFILE)" in output


@contextlib.contextmanager
def tls_server(key: Path, cert: Path) -> Iterator[int]:
    """A TLS listener on 127.0.0.1 presenting `cert`: a worker's handshake with it
    fails (or not) exactly as with a broker presenting it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            with contextlib.suppress(OSError), connection, context.wrap_socket(
                    connection, server_side=True):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        listener.close()


@pytest.mark.parametrize(("certificate", "named"), [
    ({"days": -1}, "the broker's TLS certificate has expired"),
    ({"hosts": ("elsewhere.example",)}, "the broker's TLS certificate is not for 127.0.0.1"),
])
def test_an_expired_or_wrong_host_broker_certificate_is_named(
        broker: Any, tmp_path: Path, certificate: dict[str, Any], named: str) -> None:
    key, cert = kafka_local.server_certificate(Path(broker.state_dir), "suspect",
                                               **certificate)
    with tls_server(key, cert) as port:
        namespace = Namespace(f"127.0.0.1:{port}")
        env = {**credentials(broker, WORKER_USER),
               "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"}
        output, took = start_worker_expecting_refusal(namespace, env, tmp_path)
    assert named in output, output
    assert broker.password(WORKER_USER) not in output
    assert took < 15, took


# ------------------------------------------------------------- who may read what


def _reads(broker: Any, user: str, topic: str, *, mtls: bool = False) -> bool:
    """True when `user` reads the topic's first record, False when the broker refuses
    (the tests write a record to each topic as the admin first). Subscribed, not
    assigned: an assigned consumer the broker refuses fetches nothing for ever, and
    says nothing. `mtls`: as the principal of a client certificate CN=`user`."""
    async def run() -> bool:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=broker.mtls_bootstrap if mtls else broker.sasl_bootstrap,
            group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
            **security(credentials(broker, user, mtls=mtls)))
        try:
            await consumer.start()
            while not await consumer.getmany(timeout_ms=1000):
                pass
            return True
        except TopicAuthorizationFailedError:
            return False
        finally:
            await consumer.stop()

    return asyncio.run(asyncio.wait_for(run(), 60))


def _writes(broker: Any, user: str, topic: str) -> bool:
    async def run() -> bool:
        producer = AIOKafkaProducer(bootstrap_servers=broker.sasl_bootstrap,
                                    request_timeout_ms=10_000,
                                    **security(credentials(broker, user)))
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"{}", key=b"probe")
            return True
        except TopicAuthorizationFailedError:
            return False
        finally:
            await producer.stop()

    return asyncio.run(asyncio.wait_for(run(), 60))


def test_the_history_service_reads_history_only_and_an_agent_server_reads_nothing(
        broker: Any) -> None:
    namespace = Namespace(broker.sasl_bootstrap, partitions=1)
    deployment(broker, namespace)
    service = HISTORY_SERVICE.removeprefix("User:")
    agent = AGENT_SERVER.removeprefix("User:")
    internal = layout_of(namespace).internal_topics[0]
    for topic in (namespace.events, namespace.history, namespace.deadletter, internal):
        assert _writes(broker, "admin", topic)
    assert _reads(broker, service, namespace.history)
    for topic in (namespace.events, namespace.deadletter, internal):
        assert not _reads(broker, service, topic), topic
    assert not _writes(broker, service, namespace.history)
    assert _writes(broker, agent, namespace.events)
    for topic in (namespace.history, namespace.deadletter, namespace.events):
        assert not _reads(broker, agent, topic), topic


def test_a_tenants_history_service_reads_its_own_topic_only(broker: Any) -> None:
    """Per-tenant topics: `agui-stream acls --apply --tenant T` gives T's history
    service (`User:history-service-T`, here from a client certificate) its own
    history topic, and nothing of another tenant's or of the shared dead letters."""
    namespace = Namespace(broker.sasl_bootstrap, partitions=1)
    admin = {**credentials(broker, "admin"),
             "AGUI_HISTORY_TOPIC_TEMPLATE": f"{namespace.prefix}.history.{{tenant}}",
             "AGUI_DEADLETTER_TOPIC_TEMPLATE": f"{namespace.prefix}.deadletter.{{tenant}}"}
    for command in (["create-topics"], ["create-topics", "--tenant", "acme", "--tenant", "globex"],
                    ["acls", "--apply", "--tenant", "acme", "--tenant", "globex"]):
        result = subprocess.run([AGUI_STREAM, *command], env=namespace.env(**admin),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, (command, result.stderr)
    acme, globex = (f"{namespace.prefix}.history.{tenant}" for tenant in ("acme", "globex"))
    acme_dead_letters = f"{namespace.prefix}.deadletter.acme"
    for topic in (acme, globex, namespace.deadletter, acme_dead_letters):
        assert _writes(broker, "admin", topic)
    service = "history-service-acme"
    assert _reads(broker, service, acme, mtls=True)
    for topic in (globex, namespace.deadletter, acme_dead_letters):
        assert not _reads(broker, service, topic, mtls=True), topic
