"""What per-tenant topics cost (issue 29), on the local broker, for 10, 100 and 1,000
tenants (a history and a dead-letter topic each, AGUI_PARTITIONS partitions):

1. creating them (`create-topics --tenant`): the time, and the broker's RSS and the
   size of its data directory (logs and KRaft metadata) before and after;
2. a worker with them (per-tenant layout, exactly_once, memory://): its time to
   ready and its RSS once ready;
3. the same backlog of runs, spread over the N tenants, processed by a worker in the
   shared layout and by one in the per-tenant layout: the per-tenant worker's commits
   write to up to N topics' partitions each (one AddPartitionsToTxn entry and one
   batch per partition written).

    PYTHONPATH=. .venv/bin/python benchmarks/tenant_topics_cost.py [--tenants 10 100 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from processors.config import Settings
from processors.runtime.topic_admin import create_topics
from tests.conftest import load_kafka_local
from tests.run_generator import interleaved_runs
from tests.service_harness import Namespace, Worker, produce, wait_for

RUNS = 600  # the backlog: one run per key, spread over the tenants


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def broker_pid() -> int:
    """The local broker: the java process this one started."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == os.getpid() and b"java" in command:
            return int(entry.name)
    raise RuntimeError("no broker process among this process's children")


def directory_bytes(path: Path) -> int:
    """Disk used, not apparent size: a partition's index files are preallocated
    sparse (20 MiB apparent each segment)."""
    return sum(file.stat().st_blocks * 512 for file in path.rglob("*") if file.is_file())


def mib(size: int) -> str:
    return f"{size / 2**20:.0f} MiB"


def settle_rss(pid: int, seconds: float = 5.0) -> int:
    """The RSS once it stopped moving for a moment (a GC may be under way)."""
    time.sleep(seconds)  # a benchmark's settling time, not a test's wait
    return rss_bytes(pid)


def templates(namespace: Namespace) -> dict[str, str]:
    return {"AGUI_HISTORY_TOPIC_TEMPLATE": f"{namespace.prefix}.h.{{tenant}}",
            "AGUI_DEADLETTER_TOPIC_TEMPLATE": f"{namespace.prefix}.d.{{tenant}}"}


def backlog(tenants: int) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """RUNS runs (one per key), key n's run for tenant n mod `tenants`."""
    _, records = interleaved_runs(seed=29, keys=RUNS, runs_per_key=1)
    return [(key, value, [("tenant", f"t{int(key[3:]) % tenants:04d}".encode())])
            for key, value in records]


def process_backlog(namespace: Namespace, log_dir: Path, records: list, env: dict[str, str],
                    ) -> tuple[float, float, int]:
    """A worker started on the backlog: seconds to ready, seconds from ready until it
    processed every record, RSS once ready."""
    log_dir.mkdir(parents=True)
    produce(namespace.bootstrap, namespace.events, records)
    started = time.monotonic()
    worker = Worker(namespace, log_dir, AGUI_PROCESSING_GUARANTEE="exactly_once", **env)
    worker.start()
    wait_for(worker.ready, 900, "the worker to be ready", worker.log_tail)
    ready = time.monotonic()
    rss = rss_bytes(worker.process.pid)
    wait_for(lambda: worker.processed() >= len(records), 900, "the backlog",
             worker.log_tail)
    done = time.monotonic()
    worker.stop()
    return ready - started, done - ready, rss


def measure(bootstrap: str, state: Path, tenants: int, log_dir: Path) -> None:
    broker = broker_pid()
    names = [f"t{n:04d}" for n in range(tenants)]
    records = backlog(tenants)

    shared = Namespace(bootstrap, partitions=8)
    shared.create_topics()
    shared_ready, shared_seconds, shared_rss = process_backlog(
        shared, log_dir / f"shared-{tenants}", records, {})

    per_tenant = Namespace(bootstrap, partitions=8)
    env = templates(per_tenant)
    per_tenant.create_topics(**env)
    rss_before, size_before = settle_rss(broker), directory_bytes(state)
    began = time.monotonic()
    settings = Settings.from_env(per_tenant.env(**env))
    asyncio.run(create_topics(settings, include_inputs=False, tenants=names))
    created = time.monotonic() - began
    rss_after, size_after = settle_rss(broker), directory_bytes(state)
    ready, seconds, rss = process_backlog(per_tenant, log_dir / f"tenants-{tenants}",
                                          records, env)
    print(f"{tenants} tenants ({2 * tenants} topics, {16 * tenants} partitions):"
          f" created in {created:.1f} s; broker RSS {mib(rss_before)} -> {mib(rss_after)},"
          f" data directory {mib(size_before)} -> {mib(size_after)}")
    print(f"  worker ready in {ready:.1f} s (shared layout {shared_ready:.1f} s),"
          f" RSS when ready {mib(rss)} (shared {mib(shared_rss)})")
    print(f"  backlog of {RUNS} runs ({len(records)} records) over {tenants} tenants:"
          f" {len(records) / seconds:.0f} records/s per-tenant,"
          f" {len(records) / shared_seconds:.0f} records/s shared", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, nargs="+", default=[10, 100, 1000])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tenant-cost-") as scratch:
        state = Path(scratch) / "broker"
        with load_kafka_local().local_broker(state) as bootstrap:
            for tenants in args.tenants:
                measure(bootstrap, state, tenants, Path(scratch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
