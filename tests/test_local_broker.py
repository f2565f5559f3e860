"""The broker behind ``kafka_bootstrap`` really works: topics, produce/consume, transactions.

And the secured local broker (``local_secure_broker``) lets in only whom it should.
"""

import asyncio
import shlex
import shutil
import ssl
import stat
import time
import uuid
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from processors.config import Settings
from processors.runtime.kafka_client import aiokafka_options
from tests.conftest import load_kafka_local

pytestmark = pytest.mark.kafka

T = TypeVar("T")
DEADLINE_S = 90.0
kafka_local = load_kafka_local()


def run(coro: Awaitable[T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, DEADLINE_S)

    return asyncio.run(bounded())


async def create_topic(bootstrap: str, partitions: int, **client: Any) -> str:
    """A new topic; ``client``: further aiokafka options (security)."""
    name = f"test-broker-{uuid.uuid4().hex[:12]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(name=name, num_partitions=partitions, replication_factor=1)]
        )
        # Topic metadata reaches the broker's cache shortly after creation
        # (KRaft): wait for it to be listed, bounded by run()'s deadline.
        delay = 0.05
        while name not in await admin.list_topics():
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
    finally:
        await admin.close()
    return name


async def read_to_end(
    bootstrap: str,
    topic: str,
    partitions: int,
    isolation_level: str = "read_uncommitted",
    **client: Any,
) -> list[Any]:
    """All records of ``topic`` up to its current end (the LSO for read_committed)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=isolation_level,
        **client,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        records: list[Any] = []

        async def behind() -> bool:
            return any([await consumer.position(tp) < ends[tp] for tp in tps])

        while await behind():
            batches = await consumer.getmany(*tps, timeout_ms=500)
            for batch in batches.values():
                records.extend(batch)
        return records
    finally:
        await consumer.stop()


def test_produce_and_consume_100_records(kafka_bootstrap: str) -> None:
    async def scenario() -> None:
        topic = await create_topic(kafka_bootstrap, partitions=3)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            futures = [
                await producer.send(topic, key=f"k{i % 7}".encode(), value=f"v{i}".encode())
                for i in range(100)
            ]
            acked = {((m := await fut).partition, m.offset) for fut in futures}
        finally:
            await producer.stop()

        records = await read_to_end(kafka_bootstrap, topic, 3)
        assert len(records) == 100
        assert sorted(r.value for r in records) == sorted(f"v{i}".encode() for i in range(100))
        # Same key -> same partition, in send order.
        by_key: dict[bytes, list[int]] = {}
        for r in records:
            by_key.setdefault(r.key, []).append(int(r.value[1:]))
        for key, values in by_key.items():
            k = int(key[1:])
            assert values == [i for i in range(100) if i % 7 == k]
            assert len({r.partition for r in records if r.key == key}) == 1
        assert {(r.partition, r.offset) for r in records} == acked

    run(scenario())


def test_transactional_producer_read_committed(kafka_bootstrap: str) -> None:
    async def scenario() -> None:
        topic = await create_topic(kafka_bootstrap, partitions=2)
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap,
            transactional_id=f"test-txn-{uuid.uuid4().hex[:8]}",
            enable_idempotence=True,
        )
        await producer.start()
        try:
            await producer.begin_transaction()
            for i in range(5):
                await producer.send(topic, key=b"k", value=f"aborted-{i}".encode())
            await producer.abort_transaction()

            async with producer.transaction():
                for i in range(10):
                    await producer.send(topic, key=b"k", value=f"committed-{i}".encode())
        finally:
            await producer.stop()

        committed = await read_to_end(kafka_bootstrap, topic, 2, "read_committed")
        assert [r.value for r in committed] == [f"committed-{i}".encode() for i in range(10)]

        everything = await read_to_end(kafka_bootstrap, topic, 2, "read_uncommitted")
        assert sorted(r.value for r in everything) == sorted(
            [f"aborted-{i}".encode() for i in range(5)]
            + [f"committed-{i}".encode() for i in range(10)]
        )

    run(scenario())


# --------------------------------------------------------------------- secured broker


@pytest.fixture(scope="module")
def secure_broker() -> Iterator[Any]:
    """One secured broker for all the tests below (it takes ~10 s to start)."""
    if shutil.which("openssl") is None:
        pytest.skip("the secured broker needs the openssl command")
    with kafka_local.local_secure_broker() as info:
        yield info


@pytest.fixture(scope="module")
def foreign_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a CA the broker does not trust (``client_certificate`` issues from it)."""
    path = tmp_path_factory.mktemp("foreign-ca")
    kafka_local.foreign_ca(path)
    return path


def sasl(
    info: Any, user: str, password: str | None = None, cafile: Path | None = None
) -> dict[str, Any]:
    """aiokafka options for SASL_SSL/SCRAM-SHA-512 as ``user`` (its real password by default)."""
    return {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": user,
        "sasl_plain_password": info.password(user) if password is None else password,
        "ssl_context": ssl.create_default_context(cafile=str(cafile or info.ca_file)),
    }


def mtls(info: Any, key: Path | None, cert: Path | None) -> dict[str, Any]:
    """aiokafka options for SSL with the client certificate ``cert`` (none if None)."""
    context = ssl.create_default_context(cafile=str(info.ca_file))
    if cert is not None:
        context.load_cert_chain(cert, key)
    return {"security_protocol": "SSL", "ssl_context": context}


async def produce(bootstrap: str, topic: str, values: list[bytes], **client: Any) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", **client)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()


async def list_topics(bootstrap: str, **client: Any) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client)
    await admin.start()
    try:
        return sorted(await admin.list_topics())
    finally:
        await admin.close()


async def refused(bootstrap: str, **client: Any) -> None:
    """The client cannot even bootstrap (TLS or SASL authentication failed)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **client)
    try:
        with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
            await producer.start()
    finally:
        await producer.stop()


def test_secure_admin_over_scram_creates_produces_consumes(secure_broker: Any) -> None:
    info = secure_broker
    admin = sasl(info, "admin")
    values = [f"v{i}".encode() for i in range(10)]

    async def scenario() -> None:
        topic = await create_topic(info.sasl_bootstrap, 2, **admin)
        await produce(info.sasl_bootstrap, topic, values, **admin)
        records = await read_to_end(info.sasl_bootstrap, topic, 2, **admin)
        assert sorted(r.value for r in records) == sorted(values)

    run(scenario())


def test_secure_wrong_password_is_refused_at_once(
    secure_broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    t0 = time.monotonic()
    run(refused(secure_broker.sasl_bootstrap, **sasl(secure_broker, "admin", password="wrong")))
    assert time.monotonic() - t0 < 10
    # aiokafka only logs the broker's SASL_AUTHENTICATION_FAILED (error 58) and raises
    # KafkaConnectionError for the bootstrap.
    assert "SaslAuthenticationFailed" in caplog.text


def test_secure_user_without_acls_can_neither_write_nor_read(secure_broker: Any) -> None:
    info = secure_broker
    user = sasl(info, "agui-stream")

    async def scenario() -> None:
        topic = await create_topic(info.sasl_bootstrap, 1, **sasl(info, "admin"))
        assert topic not in await list_topics(info.sasl_bootstrap, **user)  # authenticated
        with pytest.raises(TopicAuthorizationFailedError):
            await produce(info.sasl_bootstrap, topic, [b"x"], **user)
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=info.sasl_bootstrap, group_id=f"test-{topic}", **user
        )
        try:
            with pytest.raises(TopicAuthorizationFailedError):
                await consumer.start()  # (already waits for the topic's metadata)
                await consumer.getone()
        finally:
            await consumer.stop()

    run(scenario())


def test_secure_mtls_admin_certificate_works_foreign_ones_do_not(
    secure_broker: Any, foreign_dir: Path
) -> None:
    info = secure_broker
    env = kafka_local.worker_settings(info, "admin", mtls=True)
    admin = mtls(info, Path(env["KAFKA_SSL_KEYFILE"]), Path(env["KAFKA_SSL_CERTFILE"]))
    foreign = mtls(info, *kafka_local.client_certificate(foreign_dir, "admin"))
    expired = mtls(info, *kafka_local.client_certificate(Path(info.state_dir), "old", days=-1))

    async def scenario() -> None:
        topic = await create_topic(info.mtls_bootstrap, 1, **admin)
        await produce(info.mtls_bootstrap, topic, [b"over mTLS"], **admin)
        records = await read_to_end(info.mtls_bootstrap, topic, 1, **admin)
        assert [r.value for r in records] == [b"over mTLS"]
        # The broker ends the TLS handshake: the client sees the connection closed.
        await refused(info.mtls_bootstrap, **foreign)
        await refused(info.mtls_bootstrap, **expired)
        await refused(info.mtls_bootstrap, **mtls(info, None, None))

    run(scenario())


def test_secure_client_trusting_another_ca_fails_the_handshake(
    secure_broker: Any, foreign_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cafile = foreign_dir / "tls" / "ca.pem"
    run(refused(secure_broker.sasl_bootstrap, **sasl(secure_broker, "admin", cafile=cafile)))
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text


def test_secure_worker_settings_connect_the_worker(
    secure_broker: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    info = secure_broker
    user = "agent-server"
    by_sasl = kafka_local.worker_settings(info, user)
    by_mtls = kafka_local.worker_settings(info, user, mtls=True)
    assert by_sasl["KAFKA_BOOTSTRAP_SERVERS"] == info.sasl_bootstrap
    assert by_sasl["KAFKA_SASL_USERNAME"] == user
    assert by_mtls["KAFKA_BOOTSTRAP_SERVERS"] == info.mtls_bootstrap
    password_file = Path(by_sasl["KAFKA_SASL_PASSWORD_FILE"])
    assert password_file.read_text() == info.password(user)
    for secret in (password_file, Path(by_mtls["KAFKA_SSL_KEYFILE"])):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    for env in (by_sasl, by_mtls):
        for name in ("KAFKA_SSL_CAFILE", "KAFKA_SSL_CERTFILE", "KAFKA_SSL_KEYFILE"):
            assert name not in env or Path(env[name]).is_file()
        # The worker's own settings and client options get in (and, no ACLs, see no topic).
        options = aiokafka_options(Settings.from_env(env))
        bootstrap = ",".join(options.pop("bootstrap_servers"))
        assert run(list_topics(bootstrap, **options)) == []

    # The CLI prints the same settings, for a shell, and no password.
    state = info.state_dir
    assert kafka_local.main(["secure-env", "--state-dir", state, "--user", user]) == 0
    printed = capsys.readouterr().out
    assert info.password(user) not in printed
    exports = dict(shlex.split(line)[1].split("=", 1) for line in printed.splitlines())
    assert exports == by_sasl
