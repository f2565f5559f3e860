"""Instructions per event of the rule engine and of a bare decode (cachegrind).

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
are not time: the engine's own work runs at a lower rate than orjson's (more
cache misses, on code and on the state of thousands of keys), so the timed
ratio of engine_bench.py is lower than this one.
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


def instructions(mode: str, path: str, keys: int) -> int:
    done = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, __file__, "--child", mode, path, "--keys", str(keys)],
        capture_output=True, text=True, check=True, cwd=REPO,
        # A fixed hash seed: string hashes (and so dict probe sequences) vary
        # from run to run otherwise, moving the count by tens per event.
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "0"})
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from cachegrind ({mode})")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=200)
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
        counts = {mode: instructions(mode, path, args.keys) for mode in MODES}
    finally:
        os.unlink(path)
    n = len(records)
    decode = (counts["decode"] - counts["read"]) / n
    engine = (counts["engine"] - counts["read"]) / n
    print(f"{n:,} records as sent over {args.keys:,} keys (seed {args.seed}),"
          " instructions per event (cachegrind):")
    print(f"  bare decode : {decode:8,.0f}")
    print(f"  engine      : {engine:8,.0f}  (its own work: {engine - decode:,.0f})")
    print(f"  ratio       : {decode / engine:.3f} of the engine's instructions are the decode's")


if __name__ == "__main__":
    main()
