"""How long a second worker joining, and then leaving, stops each partition.

    .venv/bin/python benchmarks/rebalance_pause.py [--events N] [--partitions P]
                                                   [--stay SECONDS]

Uses the broker in ``KAFKA_BOOTSTRAP_SERVERS`` if set, else starts the local
KRaft broker. N events of valid runs are produced to a P-partition input topic
first, so every partition always has records waiting. One worker starts; once
it has processed for a while a second joins, stays ``--stay`` seconds, and is
stopped (SIGTERM). Both workers' ``agui_partition_records_total`` are scraped
every 0.1 s. For the join and for the leave, per partition: the longest time
with no record processed, split into the partitions that moved between the
workers and those that did not. The join's window starts one second before
the second worker starts, counting both workers; the leave's starts when the
second worker is told to stop and counts only the first (the leaving worker
processes records after its last commit that the first processes again).
Target (issue 9): under 10 s with 8 partitions.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from service_bench import broker  # noqa: E402  (benchmarks/ is this script's directory)

from tests.run_generator import interleaved_runs  # noqa: E402
from tests.service_harness import Namespace, Worker, produce, wait_for  # noqa: E402

_SERIES = re.compile(r'^agui_partition_records_total\{partition="(\d+)"\} (\S+)$', re.M)


class Scraper(threading.Thread):
    """Samples every worker's per-partition counts until stopped."""

    def __init__(self, workers: list[Worker]) -> None:
        super().__init__(daemon=True)
        self.workers = workers
        self.samples: list[tuple[float, list[dict[int, float]]]] = []
        self.done = threading.Event()

    def run(self) -> None:
        last: list[dict[int, float]] = [{} for _ in self.workers]
        while not self.done.is_set():
            now = time.monotonic()
            for index, worker in enumerate(self.workers):
                try:
                    text = worker.metrics()
                except OSError:
                    continue  # not started, or stopped: keep its last counts
                last[index] = {int(p): float(v) for p, v in _SERIES.findall(text)}
            self.samples.append((now, [dict(counts) for counts in last]))
            self.done.wait(0.1)

    def progress(self, partition: int, workers: list[int] | None = None,
                 ) -> list[tuple[float, float]]:
        """(time, records processed of the partition by all workers, or by those listed)."""
        chosen = range(len(self.workers)) if workers is None else workers
        return [(at, sum(per_worker[index].get(partition, 0.0) for index in chosen))
                for at, per_worker in self.samples]

    def owned_by(self, index: int, start: float, end: float) -> set[int]:
        """Partitions worker `index` processed records of between start and end."""
        window = [per_worker[index] for at, per_worker in self.samples if start <= at <= end]
        if len(window) < 2:
            return set()
        first, last = window[0], window[-1]
        return {p for p, count in last.items() if count > first.get(p, 0.0)}


class Pause(NamedTuple):
    seconds: float
    begins: float  # monotonic
    ends: float


def longest_pause(progress: list[tuple[float, float]], start: float, end: float,
                  produced: float) -> Pause:
    """Longest time in [start, end] between two samples where the count grew (or
    the window's start). A growth before the window counts as the start: a
    partition the counted workers last processed before the window (it was
    elsewhere) pauses from the window's start, not from that growth.

    Measured only while records remained for the partition."""
    longest = Pause(0.0, start, start)
    last_growth = start
    previous = None
    for at, count in progress:
        if previous is not None and count > previous:
            if at >= start and at - max(last_growth, start) > longest.seconds:
                longest = Pause(at - max(last_growth, start), max(last_growth, start), at)
            last_growth = at
        previous = count
        if at > end:
            if end - max(last_growth, start) > longest.seconds:
                longest = Pause(end - max(last_growth, start), max(last_growth, start), end)
            return longest
        if count >= produced:
            return longest  # nothing left to process: not a pause
    return longest


def wall_clock(monotonic: float) -> str:
    at = time.time() - (time.monotonic() - monotonic)
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at % 1 * 1000):03d}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--stay", type=float, default=25.0)
    parser.add_argument("--store", default="rocksdb://", choices=["rocksdb://", "memory://"])
    parser.add_argument("--static", action="store_true",
                        help="static membership (AGUI_GROUP_INSTANCE_ID): a worker that"
                        " stops does not leave the group; its partitions wait out the"
                        " session timeout (10 s here)")
    parser.add_argument("--timeline", action="store_true",
                        help="print each partition's longest pause as wall-clock times,"
                        " to line it up with the workers' logs")
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="agui-rebalance-pause-"))
    print(f"worker logs: {log_dir}")
    with broker() as bootstrap:
        namespace = Namespace(bootstrap, partitions=args.partitions)
        namespace.create_topics()
        runs_per_key = 6
        keys = max(1, round(args.events / (19.5 * runs_per_key)))
        _, records = interleaved_runs(11, keys, runs_per_key)
        produced = produce(bootstrap, namespace.events, ((k, v, []) for k, v in records))
        per_partition = {p: float(sum(1 for r in produced if r.partition == p))
                         for p in range(args.partitions)}
        print(f"input: {len(records):,} events on {args.partitions} partitions;"
              f" store {args.store}; {'static' if args.static else 'dynamic'} membership")
        membership = (lambda name: {"AGUI_GROUP_INSTANCE_ID": name}) if args.static else (
            lambda name: {})
        first, second = (Worker(namespace, log_dir, name=name, AGUI_STORE=args.store,
                                AGUI_SESSION_TIMEOUT_SECONDS="10", **membership(name))
                         for name in ("first", "second"))
        scraper = Scraper([first, second])
        try:
            first.start()
            scraper.start()
            wait_for(lambda: first.processed() > 20_000, 120, "the first worker to get going")
            joined = time.monotonic()
            second.start()
            wait_for(lambda: second.processed() > 0, 120, "the second worker to process")
            time.sleep(args.stay)
            left = time.monotonic()
            second.stop()
            time.sleep(args.stay)
            finished = time.monotonic()
        finally:
            scraper.done.set()
            scraper.join(5)
            second.stop()
            first.stop()
    moved = scraper.owned_by(1, joined, left)
    print(f"the second worker took partitions {sorted(moved)}")
    # A leaving worker goes on processing records after its last commit until it
    # stops; the next owner processes them again, so for the leave only the staying
    # worker's progress counts, from the moment the other was told to stop.
    windows = (("join", joined - 1.0, left, None), ("leave", left, finished, [0]))
    for event, start, end, counted in windows:
        pauses = {p: longest_pause(scraper.progress(p, counted), start, end, per_partition[p])
                  for p in range(args.partitions)}
        for group, members in (("moved", moved), ("stayed", set(pauses) - moved)):
            if members:
                worst = max(pauses[p].seconds for p in members)
                listed = ", ".join(f"{p}: {pauses[p].seconds:.1f}" for p in sorted(members))
                print(f"  {event:5} {group:6} partitions: longest pause {worst:5.1f} s"
                      f" ({listed})")
        if args.timeline:  # to line the pauses up with the workers' logs
            for p, pause in sorted(pauses.items()):
                begins, ends = (wall_clock(pause.begins), wall_clock(pause.ends))
                print(f"    {event} partition {p}: no record from {begins} to {ends}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
