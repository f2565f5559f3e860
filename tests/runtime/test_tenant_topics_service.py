"""Per-tenant topics on a real broker: a worker with AGUI_HISTORY_TOPIC_TEMPLATE and
AGUI_DEADLETTER_TOPIC_TEMPLATE, two tenants provisioned (`create-topics --tenant`)
and one not.

* Each provisioned tenant's history topic holds exactly its runs, each once, through
  a kill -9 and a restart; the thread view answers each tenant's threads (the same
  thread ids in both tenants) from its own topic.
* The unprovisioned tenant's runs are not published anywhere: one
  `tenant_topic_missing` dead letter per run in the shared dead-letter topic, and the
  worker never creates its topics.
* A tenant provisioned while the worker runs is published at once (the worker looks
  its topics up again before deciding), not after the 60 s refresh, even when its
  first record comes within a second of another tenant's look-up. (Its thread
  view answers after a restart: the view reads the topics there were at start.)
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from processors.processing.outputs import Headers
from processors.view.tenant_tokens import token_line
from tests.run_generator import GeneratedRun, interleaved_runs
from tests.runtime.test_service_recovery import assert_exactly_once
from tests.service_harness import (
    AGUI_STREAM,
    Namespace,
    TopicReader,
    Worker,
    assert_view_matches_history,
    produce,
)

pytestmark = pytest.mark.kafka

TENANTS = ("acme", "globex")
UNPROVISIONED = "initech"


def templates(namespace: Namespace) -> dict[str, str]:
    return {"AGUI_HISTORY_TOPIC_TEMPLATE": f"{namespace.prefix}.history.{{tenant}}",
            "AGUI_DEADLETTER_TOPIC_TEMPLATE": f"{namespace.prefix}.deadletter.{{tenant}}"}


def provision(namespace: Namespace, *tenants: str) -> None:
    arguments = [argument for tenant in tenants for argument in ("--tenant", tenant)]
    result = subprocess.run([AGUI_STREAM, "create-topics", *arguments],
                            env=namespace.env(**templates(namespace)), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def tenant_records(seed: int, tenant: str, keys: int,
                   ) -> tuple[list[GeneratedRun], list[tuple[bytes, bytes, Headers]]]:
    runs, records = interleaved_runs(seed=seed, keys=keys, runs_per_key=2)
    return runs, [(key, value, [("tenant", tenant.encode())]) for key, value in records]


def existing_topics(bootstrap: str) -> set[str]:
    async def names() -> set[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            return set(await admin.list_topics())
        finally:
            await admin.close()
    return asyncio.run(names())


def test_each_tenant_s_history_is_in_its_own_topic_exactly_once(kafka_bootstrap: str,
                                                                 tmp_path: Path) -> None:
    namespace = Namespace(kafka_bootstrap, partitions=2)
    namespace.create_topics(**templates(namespace))
    provision(namespace, *TENANTS)
    tokens = tmp_path / "tokens"
    tokens.write_text("".join(f"{token_line(tenant, f'{tenant}-token')}\n"
                              for tenant in TENANTS))
    generated = {tenant: tenant_records(seed, tenant, 12)
                 for seed, tenant in enumerate((*TENANTS, UNPROVISIONED))}
    everything = [record for _, records in generated.values() for record in records]
    half = len(everything) // 2
    produce(kafka_bootstrap, namespace.events, everything[:half])
    worker = Worker(namespace, tmp_path, AGUI_PROCESSING_GUARANTEE="exactly_once",
                    AGUI_GROUP_INSTANCE_ID="w1", AGUI_TOKENS_FILE=str(tokens),
                    **templates(namespace)).start()
    history = {tenant: TopicReader(kafka_bootstrap, f"{namespace.prefix}.history.{tenant}",
                                   namespace.partitions) for tenant in TENANTS}
    history["acme"].wait_until(lambda recs: any(r.value["kind"] == "run" for r in recs), 120,
                               "a first closing record", worker.log_tail)
    worker.kill()
    produce(kafka_bootstrap, namespace.events, everything[half:])
    worker.start()
    for tenant, reader in history.items():
        count = len(generated[tenant][0])
        reader.wait_until(lambda recs, n=count: sum(
            r.value["kind"] == "run" for r in recs) >= n, 120,
            f"{tenant}'s {count} closing records", worker.log_tail)
    dead_letters = TopicReader(kafka_bootstrap, namespace.deadletter, namespace.partitions)
    unpublished = generated[UNPROVISIONED][0]
    dead_letters.wait_until(lambda recs: {
        r.value["runId"] for r in recs if r.value["code"] == "tenant_topic_missing"} >= {
        run.run_id for run in unpublished}, 60, "the unprovisioned tenant's dead letters",
        worker.log_tail)

    for tenant, reader in history.items():
        assert {r.value["tenant"] for r in reader.records} == {tenant}
        assert_exactly_once(generated[tenant][0], reader.records)
        assert_view_matches_history(worker, reader.records, tenant, f"{tenant}-token")
    letters = [r.value for r in dead_letters.records if r.value["code"] == "tenant_topic_missing"]
    assert {letter["tenant"] for letter in letters} == {UNPROVISIONED}
    assert all(f"{namespace.prefix}.history.{UNPROVISIONED}" in letter["reason"]
               and "event" not in letter for letter in letters)
    assert not any(UNPROVISIONED in name for name in existing_topics(kafka_bootstrap))

    # A tenant provisioned now is published at once.
    provision(namespace, "hooli")
    late_runs, late_records = tenant_records(7, "hooli", 2)
    produce(kafka_bootstrap, namespace.events, late_records)
    TopicReader(kafka_bootstrap, f"{namespace.prefix}.history.hooli",
                namespace.partitions).wait_until(
        lambda recs: sum(r.value["kind"] == "run" for r in recs) >= len(late_runs), 30,
        "the newly provisioned tenant's runs", worker.log_tail)
    dead_letters.poll()
    assert not [r for r in dead_letters.records if r.value.get("tenant") == "hooli"]
    worker.stop()
    assert worker.starts == 2
