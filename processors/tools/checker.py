"""The offline checker: one run key's events from a JSON-lines file, judged.

The same engine as the service. It streams: records are judged as they
arrive and each run's result is printed as soon as the run concludes, so
memory follows the open run, not the file.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TextIO

import orjson

from processors.engine.decisions import (
    Concluded,
    Discarded,
    EncryptedLost,
    Failed,
    RunIdentity,
    Warned,
)
from processors.engine.engine import KeyEngine


@dataclass(slots=True)
class RunReport:
    """Everything concluded for one run (or one record that failed on its own)."""

    outcome: str
    first_line: int
    last_line: int
    run: RunIdentity | None = None
    failure: dict[str, Any] | None = None
    failure_reason: str = ""
    warnings: list[dict[str, Any]] = field(default_factory=list)
    warning_reasons: list[str] = field(default_factory=list)
    lost: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The conformance corpus's shape (tests/conformance/README.md)."""
        return {
            "outcome": self.outcome,
            "failure": self.failure,
            "warnings": self.warnings,
            "lostEncrypted": self.lost,
            "messages": self.messages,
        }


@dataclass(slots=True)
class CheckTotals:
    runs: int = 0
    failed: int = 0
    discarded: int = 0
    lines: int = 0


# Read size: large enough that reading costs nothing per line, small enough
# to keep memory flat.
_READ_SIZE = 1 << 20


def read_records(stream: BinaryIO) -> Iterator[bytes]:
    """Record values, one per line (the trailing newline is not part of a value).

    Reads up to a megabyte at a time and splits it, rather than a line at a
    time; `read1` returns what is there, so records from a pipe are not held
    back until a megabyte has arrived.
    """
    read = getattr(stream, "read1", stream.read)
    carried: list[bytes] = []  # the start of a line that continues in the next read
    while chunk := read(_READ_SIZE):
        lines = chunk.split(b"\n")
        if len(lines) == 1:
            carried.append(chunk)
            continue
        if carried:
            carried.append(lines[0])
            lines[0] = b"".join(carried)
            carried.clear()
        carried.append(lines.pop())
        yield from lines
    last = b"".join(carried)
    if last:
        yield last


def check_records(
    records: Iterable[bytes], totals: CheckTotals, progress: TextIO | None = None
) -> Iterator[RunReport]:
    """Feed records to one engine; yield a report as each run concludes."""
    engine = KeyEngine()
    pending = RunReport("open", 1, 0)
    started = time.monotonic()
    next_progress = started + 2.0
    line = 0
    feed = engine.feed
    for line, raw in enumerate(records, start=1):
        for decision in feed(raw).decisions:
            if isinstance(decision, Warned):
                pending.warnings.append({"code": decision.code.value, "line": line})
                pending.warning_reasons.append(decision.reason)
            elif isinstance(decision, EncryptedLost):
                pending.lost.append({"reason": decision.reason.value, "line": line})
            elif isinstance(decision, Discarded):
                totals.discarded += 1
            else:
                pending.last_line = line
                if isinstance(decision, Failed):
                    pending.outcome = "failed"
                    pending.failure = {"code": decision.code.value, "line": line}
                    pending.failure_reason = decision.reason
                    pending.run = decision.run
                    totals.failed += 1
                else:
                    assert isinstance(decision, Concluded)
                    pending.outcome = decision.outcome.value
                    pending.messages = decision.messages
                    pending.run = decision.run
                totals.runs += 1
                yield pending
                pending = RunReport("open", line + 1, line)
        if progress is not None and line % 4096 == 0 and time.monotonic() >= next_progress:
            elapsed = time.monotonic() - started
            progress.write(f"\rchecked {line:,} records ({line / elapsed:,.0f}/s)")
            progress.flush()
            next_progress = time.monotonic() + 2.0
    totals.lines = line
    if progress is not None and line >= 4096:
        progress.write("\n")
    run = engine.state.run
    if run is not None or pending.warnings or pending.lost:
        pending.last_line = line
        if run is not None:
            pending.run = RunIdentity(run.thread_id, run.run_id)
            totals.runs += 1
        yield pending


def write_json(reports: Iterable[RunReport], out: BinaryIO) -> None:
    """One JSON object, written run by run as they conclude."""
    out.write(b'{"runs":[')
    for index, report in enumerate(reports):
        if index:
            out.write(b",")
        out.write(orjson.dumps(report.as_json()))
        out.flush()
    out.write(b"]}\n")


def write_human(reports: Iterable[RunReport], out: TextIO) -> None:
    for report in reports:
        where = f"lines {report.first_line}-{report.last_line}"
        who = "" if report.run is None else (
            f" thread {report.run.thread_id!r} run {report.run.run_id!r}"
        )
        headline = report.outcome.upper()
        if report.outcome in ("finished", "error"):
            headline += f", {len(report.messages)} message(s)"
        elif report.outcome == "open":
            headline += " (no terminal event yet)"
        out.write(f"{headline} —{who} ({where})\n")
        if report.failure is not None:
            out.write(f"  failure at line {report.failure['line']}: {report.failure['code']}:"
                      f" {report.failure_reason}\n")
        for warning, reason in zip(report.warnings, report.warning_reasons, strict=True):
            out.write(f"  warning at line {warning['line']}: {warning['code']}: {reason}\n")
        for loss in report.lost:
            out.write(f"  encrypted value lost at line {loss['line']}: {loss['reason']}\n")


def run_check(path: str, as_json: bool) -> int:
    """`agui-stream check`: exit 0 when no run failed, 1 when one did, 2 on I/O errors."""
    totals = CheckTotals()
    try:
        stream: BinaryIO = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    except OSError as error:
        sys.stderr.write(f"agui-stream check: cannot read {path}: {error.strerror}\n")
        return 2
    progress = sys.stderr if sys.stderr.isatty() else None
    try:
        with stream:
            reports = check_records(read_records(stream), totals, progress)
            if as_json:
                write_json(reports, sys.stdout.buffer)
            else:
                write_human(reports, sys.stdout)
                sys.stdout.write(
                    f"{totals.lines} record(s), {totals.runs} run(s), {totals.failed} failed"
                    + (f", {totals.discarded} discarded after a failure" if totals.discarded
                       else "") + "\n"
                )
    except OSError as error:
        sys.stderr.write(f"agui-stream check: error reading {path}: {error.strerror}\n")
        return 2
    return 1 if totals.failed else 0
