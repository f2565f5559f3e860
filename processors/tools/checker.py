"""The offline checker: one run key's events from a JSON-lines file, judged.

The same engine as the service. It streams: records are judged as they
arrive and each run's result is printed as soon as the run concludes (a run
that finished, once the next record shows no late RUN_ERROR turns it into an
error), so memory follows the open run, not the file.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TextIO

import orjson

from processors.engine.decisions import (
    CONTINUATION,
    REMOVAL,
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
    # AG-UI 1.1: how the run ended as its closing record says, and what goes with it.
    ending: str | None = None
    detail: dict[str, Any] | None = None  # pendingToolCallIds or interrupts
    input_echoed: bool | None = None
    late_line: int | None = None  # the late RUN_ERROR that turned it into an error
    updates: list[dict[str, Any]] = field(default_factory=list)  # continuations, removals

    def as_json(self) -> dict[str, Any]:
        """The conformance corpus's shape (tests/conformance/README.md)."""
        report: dict[str, Any] = {
            "outcome": self.outcome,
            "failure": self.failure,
            "warnings": self.warnings,
            "lostEncrypted": self.lost,
            "messages": self.messages,
        }
        if self.ending is not None:
            report["ending"] = self.ending
        if self.detail:
            report.update(self.detail)
        if self.input_echoed is not None:
            report["inputEchoed"] = self.input_echoed
        if self.late_line is not None:
            report["lateError"] = {"line": self.late_line}
        if self.updates:
            report["updates"] = self.updates
        return report

    def conclude(self, concluded: Concluded) -> None:
        self.outcome = "error" if concluded.outcome.value == "error" else "finished"
        self.ending = concluded.outcome.value
        self.detail = concluded.detail
        self.input_echoed = concluded.input_echoed
        self.run = concluded.run
        self.messages = concluded.messages
        self.updates = [
            {"kind": entry.kind, "messageId": entry.message["id"]} if entry.kind == REMOVAL
            else {"kind": entry.kind, "message": entry.message}
            for entry in concluded.entries if entry.kind in (CONTINUATION, REMOVAL)
        ]


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
    finished: RunReport | None = None  # held back until no late RUN_ERROR can follow
    started = time.monotonic()
    next_progress = started + 2.0
    line = 0
    feed = engine.feed
    for line, raw in enumerate(records, start=1):
        decisions = feed(raw).decisions
        if finished is not None:
            if any(isinstance(d, Concluded) and d.late for d in decisions):
                _late_error(finished, decisions, line)
                yield finished
                finished = None
                continue
            yield finished
            finished = None
        for decision in decisions:
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
                    # A run that fails ends with a closing record; a record that fails
                    # on its own, outside any run, ends no run.
                    pending.ending = None if decision.run is None else "failed"
                    pending.failure = {"code": decision.code.value, "line": line}
                    pending.failure_reason = decision.reason
                    pending.run = decision.run
                    totals.failed += 1
                else:
                    assert isinstance(decision, Concluded)
                    pending.conclude(decision)
                totals.runs += 1
                if pending.outcome == "finished":
                    finished = pending
                else:
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
    if finished is not None:
        yield finished
    run = engine.state.run
    if run is not None or pending.warnings or pending.lost:
        pending.last_line = line
        if run is not None:
            pending.run = RunIdentity(run.thread_id, run.run_id)
            totals.runs += 1
        yield pending


def _late_error(report: RunReport, decisions: Iterable[Any], line: int) -> None:
    """A late RUN_ERROR (events/lifecycle): the finished run is an error run now."""
    for decision in decisions:
        if isinstance(decision, Warned):
            report.warnings.append({"code": decision.code.value, "line": line})
            report.warning_reasons.append(decision.reason)
    report.outcome = report.ending = "error"
    report.late_line = report.last_line = line


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
        if report.ending in ("interrupt", "cancelled"):
            headline += f" ({report.ending})"
        if report.outcome in ("finished", "error"):
            headline += f", {len(report.messages)} message(s)"
            if report.updates:
                headline += f", {len(report.updates)} update(s) to earlier runs' messages"
            if report.late_line is not None:
                headline += f"; failed after it finished (late RUN_ERROR, line {report.late_line})"
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
