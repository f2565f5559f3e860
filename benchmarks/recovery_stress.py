"""Run the recovery tests again and again, and print passes/runs.

    .venv/bin/python benchmarks/recovery_stress.py [--runs N] [--kills K] [--only NAME]
                                                   [--transactions worker] [--keep-going]

Each round runs, in one pytest process with its own broker: the kill -9 test
with the memory:// and the rocksdb:// store (with K kills instead of 4), the
join/leave test, the rolling restart of three workers (each stopped with
SIGTERM in turn, then one killed with -9; its pauses are printed) and the zombie
worker (stopped past its session timeout while another takes its partitions,
then continued). It stops
at the first failure (its pytest output and its workers' logs are kept and
their paths printed) unless --keep-going, and
prints one line per round and the totals: how many consecutive rounds passed
from the start, and passes/runs per test. A stress run is not a test: it takes
about 4 minutes a round.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RECOVERY = "tests/runtime/test_service_recovery.py::"


def recovery_tests(transactions: str) -> dict[str, str]:
    """The tests a round runs, each with AGUI_TRANSACTIONS=`transactions`."""
    return {
        "kill-memory": f"{RECOVERY}test_kill_9_and_restart_publishes_every_run_exactly_once"
                       f"[memory://-{transactions}]",
        "kill-rocksdb": f"{RECOVERY}test_kill_9_and_restart_publishes_every_run_exactly_once"
                        f"[rocksdb://-{transactions}]",
        "join-leave": f"{RECOVERY}test_second_worker_joining_and_leaving_changes_nothing"
                      f"[{transactions}]",
        "rolling-restart": f"{RECOVERY}test_a_rolling_restart_of_three_workers_under_load"
                           f"_changes_nothing[{transactions}]",
        "zombie": f"{RECOVERY}test_a_zombie_worker_continued_after_its_partitions_moved"
                  f"_publishes_nothing_twice[{transactions}]",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--kills", type=int, default=4, help="kills per kill test")
    parser.add_argument("--only", choices=sorted(recovery_tests("partition")),
                        action="append")
    parser.add_argument("--transactions", choices=("partition", "worker"),
                        default="partition", help="AGUI_TRANSACTIONS of the workers")
    parser.add_argument("--keep-going", action="store_true")
    args = parser.parse_args()
    tests = recovery_tests(args.transactions)
    chosen = args.only or list(tests)
    logs = Path(tempfile.mkdtemp(prefix="agui-recovery-stress-"))
    env = {**os.environ, "AGUI_TEST_KILLS": str(args.kills)}
    passes: Counter[str] = Counter()
    runs: Counter[str] = Counter()
    consecutive = 0
    broken = False
    print(f"logs: {logs}; tests: {', '.join(chosen)}; kills per kill test: {args.kills};"
          f" AGUI_TRANSACTIONS={args.transactions}")
    for round_number in range(1, args.runs + 1):
        log = logs / f"round-{round_number}.log"
        workers = logs / f"round-{round_number}"  # the tests' files: worker logs and data
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
             f"--basetemp={workers}", *(tests[name] for name in chosen)],
            cwd=REPO_ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        text = log.read_text(errors="replace")
        outcome = {}
        for name in chosen:
            test_id = tests[name].split("::", 1)[1]
            # (XPASS: a test marked as a known failure that passed; its line goes on
            # with the reason. A parametrized id ends in "]": no word boundary there.)
            passed = re.search(rf"^(PASSED|XPASS) \S*::{re.escape(test_id)}(?!\S)", text,
                               re.M)
            outcome[name] = bool(passed)
            runs[name] += 1
            passes[name] += bool(passed)
        round_ok = result.returncode == 0 and all(outcome.values())
        if round_ok:
            shutil.rmtree(workers, ignore_errors=True)
        if round_ok and not broken:
            consecutive += 1
        broken = broken or not round_ok
        summary = " ".join(f"{name}={'pass' if ok else 'FAIL'}" for name, ok in outcome.items())
        print(f"round {round_number:3}: {summary} ({time.monotonic() - started:.0f} s)"
              + ("" if round_ok else f"  log: {log}, workers: {workers}"), flush=True)
        for pauses in re.findall(r"^rolling restart pauses: (.*)$", text, re.M):
            print(f"           {pauses}", flush=True)
        if not round_ok and not args.keep_going:
            break
    print(f"consecutive passing rounds from the start: {consecutive}")
    for name in chosen:
        print(f"  {name:13} {passes[name]}/{runs[name]} passed")
    return 0 if not broken else 1


if __name__ == "__main__":
    sys.exit(main())
