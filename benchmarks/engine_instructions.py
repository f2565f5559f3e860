"""Instructions and cache misses per event of the rule engine and of a bare decode
(cachegrind).

    .venv/bin/python benchmarks/engine_instructions.py [--events N] [--keys K] [--seed S]

A deterministic companion to engine_bench.py, whose timed ratio moves with
whatever else the machine runs. It writes N records of engine_bench's
generator (as sent, K keys interleaved) to a file, then runs three children
under `valgrind --tool=cachegrind` that read the file and

* only read it (the floor: interpreter start, imports, reading);
* also `orjson.loads` every record (bare decode);
* also feed every record to its key's `KeyEngine` (the engine);

and prints each one's instructions per event beyond the floor, the engine's
own (beyond the decode), and the decode/engine instruction ratio. Instructions
are not time: the engine's own work runs at a lower rate than orjson's, so the
timed ratio of engine_bench.py is lower than this one. It also prints the
simulated misses per event of a 32 KiB L1 data cache and of a 2 MiB last
level (this machine's L2 per core), which show where that rate goes: with
thousands of keys interleaved, every key's streamed text and run state are
cold when its next record comes (compare `--keys 1`).
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
MODES = ("read", "decode", "engine")


def child(mode: str, path: str, keys: int) -> None:
    """Read the records (key, space, JSON per line); decode or feed them."""
    from processors.engine.engine import KeyEngine

    with open(path, "rb") as stream:
        records = [(int(key), raw) for key, raw in
                   (line.rstrip(b"\n").split(b" ", 1) for line in stream)]
    gc.disable()
    if mode == "decode":
        loads = orjson.loads
        for _key, raw in records:
            loads(raw)
    elif mode == "engine":
        engines = [KeyEngine() for _ in range(keys)]
        for key, raw in records:
            engines[key].feed(raw)


# cachegrind's summary lines, by what this script calls them.
COUNTERS = {"instructions": r"I\s+refs", "L1 data misses": r"D1\s+misses",
            "last-level misses": r"LL misses"}


def counts_of(mode: str, path: str, keys: int) -> dict[str, int]:
    done = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=yes", "--D1=32768,8,64",
         "--LL=2097152,16,64", "--cachegrind-out-file=/dev/null",
         sys.executable, __file__, "--child", mode, path, "--keys", str(keys)],
        capture_output=True, text=True, check=True, cwd=REPO,
        # A fixed hash seed: string hashes (and so dict probe sequences) vary
        # from run to run otherwise, moving the count by tens per event.
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "0"})
    counts = {}
    for name, label in COUNTERS.items():
        found = re.search(label + r":\s+([\d,]+)", done.stderr)
        if found is None:
            raise RuntimeError(f"no {name} count from cachegrind ({mode})")
        counts[name] = int(found.group(1).replace(",", ""))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=2_000)  # as engine_bench.py
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.keys)
        return

    from benchmarks.engine_bench import generate_corpus

    records = generate_corpus(args.events, args.keys, args.seed)
    with tempfile.NamedTemporaryFile("wb", suffix=".records", delete=False) as out:
        path = out.name
        for key, raw in records:
            out.write(b"%d %s\n" % (key, raw))
    try:
        counts = {mode: counts_of(mode, path, args.keys) for mode in MODES}
    finally:
        os.unlink(path)
    n = len(records)
    print(f"{n:,} records as sent over {args.keys:,} keys (seed {args.seed}),"
          " per event beyond reading the file (cachegrind):")
    for name in COUNTERS:
        decode = (counts["decode"][name] - counts["read"][name]) / n
        engine = (counts["engine"][name] - counts["read"][name]) / n
        print(f"  {name:17}: bare decode {decode:8,.1f}   engine {engine:8,.1f}"
              f"  (its own work: {engine - decode:,.1f})")
        if name == "instructions":
            print(f"  {'':17}  {decode / engine:.3f} of the engine's instructions are the decode's")


if __name__ == "__main__":
    main()
