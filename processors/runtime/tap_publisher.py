"""The tap's Kafka publishing, in a process of its own.

The producer runs in a child process, `python -m processors.runtime.tap_publisher`:
the tap writes each loop turn's records to its stdin and reads their outcomes
from its stdout (`processors.tap.pipe_frames`). Why: a tap that crashes or is
killed takes only its last loop turn's records with it; the child publishes
what it was given, then a RUN_ERROR (`tap_interrupted`) for each run it saw no
end of, and exits, so no half run waits for the workers' idle timeout. (It was
built to take the producer's work off the loop that relays the streams; on the
2-core machine that did not lower the added p99 per event: docs/tap.md,
*Overhead*.)

`Publisher` is the tap's side: it keeps every record until its outcome comes
back (the shared `Budget` bounds them), counts what happened, and restarts the
child when it dies (the records it held are then counted as refused: their runs'
publication is dropped and says so). The child publishes in the order it reads,
through an idempotent producer (acks=all), and exits when its stdin closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import logging.config
import os
import signal
import sys
import time
from typing import Final

import uvloop
from aiokafka import AIOKafkaProducer

from processors.config import ConfigError, TapSettings
from processors.metrics import TapMetrics
from processors.runtime.kafka_client import aiokafka_options
from processors.runtime.worker import worker_logging
from processors.safe_logging import log_exception_kind
from processors.tap.pipe_frames import (
    OUTCOMES,
    PRODUCER,
    RECORDS,
    FrameReader,
    PipeRecord,
    decode_outcomes,
    decode_records,
    outcomes_frame,
    producer_frame,
    records_frame,
)
from processors.tap.runs import Budget, DropReason, OpenRuns, Record, Step

log = logging.getLogger("agui_stream.tap")

PUBLISHER_COMMAND: Final = (sys.executable, "-m", "processors.runtime.tap_publisher")
_READ_BYTES: Final = 1 << 16
_START_RETRY_SECONDS: Final = (0.5, 5.0)  # the producer's (and the child's) retry delays
# Records handed to the producer between two turns of the child's loop, so that
# outcomes go back while a long batch is sent.
_SENDS_PER_YIELD: Final = 8
# How long the producer gathers records into a batch (fewer, larger requests).
_LINGER_MS: Final = 20
# Records waiting this long for Kafka with none answered meanwhile: Kafka is not
# taking them (a broker that stopped leaves the producer retrying, never failing).
_STALLED_SECONDS: Final = 5.0
_CHILD_STOP_SECONDS: Final = 5.0  # the child's time to flush once the tap has waited


class Publisher:
    """Hands the core's records to the publisher process, in order, without ever
    blocking a caller; counts their outcomes."""

    def __init__(self, settings: TapSettings, budget: Budget, metrics: TapMetrics,
                 command: tuple[str, ...] = PUBLISHER_COMMAND) -> None:
        self.settings = settings
        self.budget = budget
        self.metrics = metrics
        self.command = command
        self.publishing = False
        self._seq = 0
        self._waiting: dict[int, tuple[Record, bytes, float]] = {}  # by seq, until answered
        self._outbox: list[PipeRecord] = []  # not written to the child yet
        self._written_through = 0  # the last seq written to the current child
        self._flush_due = False
        self._progress_at = time.monotonic()  # the last outcome (or first record written)
        self._child: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []

    def take(self, step: Step, tenant: bytes, read_at: float) -> None:
        """Queue a step's records and count what it decided."""
        metrics = self.metrics
        for record in step.records:
            self._seq += 1
            self._waiting[self._seq] = (record, tenant, read_at)
            self._outbox.append(PipeRecord(self._seq, record.run.key, tenant, record.value))
            metrics.event_bytes.inc(record.size)
        if step.records:
            metrics.events.labels("published").inc(len(step.records))
            if not self._flush_due:  # one write per loop turn, whatever the streams sent
                self._flush_due = True
                asyncio.get_running_loop().call_soon(self._flush)
        if step.dropped_events:
            metrics.events.labels("dropped").inc(step.dropped_events)
        if step.unattributed_events:
            metrics.events.labels("unattributed").inc(step.unattributed_events)
        for fate in step.fates:
            metrics.runs.labels(fate.value).inc()
        for reason in step.drops:
            metrics.dropped_runs.labels(reason.value).inc()
        metrics.buffered_bytes.set(self.budget.used)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._supervise()), loop.create_task(self._watch())]

    async def stop(self, timeout: float) -> None:
        """Give Kafka up to `timeout` for what is waiting, then stop the child."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self._waiting:
                    await asyncio.sleep(0.05)
        self._stopping = True
        child = self._child
        if child is not None and child.stdin is not None:
            child.stdin.close()
            try:
                async with asyncio.timeout(_CHILD_STOP_SECONDS + 1.0):
                    await child.wait()
            except TimeoutError:
                child.kill()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _flush(self) -> None:
        self._flush_due = False
        child = self._child
        if not self._outbox or child is None or child.stdin is None or child.stdin.is_closing():
            return
        if not self._written_unanswered():
            self._progress_at = time.monotonic()  # nothing was waiting on the child
        child.stdin.write(records_frame(self._outbox))
        self._written_through = self._outbox[-1].seq
        self._outbox = []

    def _written_unanswered(self) -> bool:
        """Whether a record written to the child waits for its outcome (seqs grow in
        the order records are taken: the first waiting is the oldest)."""
        oldest = next(iter(self._waiting), None)
        return oldest is not None and oldest <= self._written_through

    async def _supervise(self) -> None:
        delay = _START_RETRY_SECONDS[0]
        while not self._stopping:
            try:
                child = await asyncio.create_subprocess_exec(
                    *self.command, stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE)
            except OSError as error:
                log_exception_kind(log, logging.ERROR, "could not start the tap's publisher"
                                   " process; retrying", error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _START_RETRY_SECONDS[1])
                continue
            self._child = child
            started = time.monotonic()
            self._written_through = self._seq - len(self._outbox)
            self._flush()
            await self._read_outcomes(child)
            code = await child.wait()
            self._child = None
            if self._stopping:
                return
            log.error("the tap's publisher process exited (code %s); its records' runs are"
                      " dropped and it is started again", code)
            self._fail_written()
            self._set_publishing(False)
            if time.monotonic() - started > _STALLED_SECONDS:  # it had been working
                delay = _START_RETRY_SECONDS[0]
            await asyncio.sleep(delay)
            delay = min(delay * 2, _START_RETRY_SECONDS[1])

    async def _read_outcomes(self, child: asyncio.subprocess.Process) -> None:
        assert child.stdout is not None
        frames = FrameReader()
        try:
            while chunk := await child.stdout.read(_READ_BYTES):
                for kind, payload in frames.feed(chunk):
                    if kind == OUTCOMES:
                        for seq, ok in decode_outcomes(payload):
                            self._answered(seq, ok)
                        self.metrics.buffered_bytes.set(self.budget.used)
                    elif kind == PRODUCER:
                        self._set_publishing(payload == b"\x01")
        except Exception as error:  # a broken child: stopped and started again
            log_exception_kind(log, logging.ERROR, "the tap's publisher process sent"
                               " something unreadable", error)
            child.kill()

    def _fail_written(self) -> None:
        """The child died: what it was given and did not answer is refused."""
        for seq in [seq for seq in self._waiting if seq <= self._written_through]:
            self._answered(seq, False)
        self.metrics.buffered_bytes.set(self.budget.used)

    def _answered(self, seq: int, ok: bool) -> None:
        entry = self._waiting.pop(seq, None)
        if entry is None:
            return
        record, tenant, read_at = entry
        self.budget.give_back(record.size)
        self._progress_at = time.monotonic()
        if ok:
            self.metrics.publish_lag.observe(time.perf_counter() - read_at)
            self._set_publishing(True)
        else:
            self.metrics.publish_errors.inc()
            self._set_publishing(False)
            step = Step()
            record.run.drop(DropReason.PUBLISH_FAILED, step)
            self.take(step, tenant, read_at)

    async def _watch(self) -> None:
        """Say "not publishing" once records have waited `_STALLED_SECONDS` with none
        answered: a broker that stopped makes the producer retry, not fail."""
        while True:
            await asyncio.sleep(1.0)
            if (self._written_unanswered()
                    and time.monotonic() - self._progress_at > _STALLED_SECONDS):
                self._set_publishing(False)

    def _set_publishing(self, publishing: bool) -> None:
        if publishing != self.publishing:
            self.publishing = publishing
            self.metrics.publishing.set(int(publishing))
            if not publishing:
                log.warning("Kafka is not taking the tap's records; runs are forwarded and"
                            " their publication dropped once the buffer is full")


# --- the child ----------------------------------------------------------------------


async def _publish_from_stdin(settings: TapSettings, frames_out: int) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_READ_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(frames_out, "wb"))
    answers: list[tuple[int, bool]] = []

    def send_answers() -> None:
        transport.write(outcomes_frame(answers))
        answers.clear()

    def answer(seq: int, ok: bool) -> None:
        if not answers:
            loop.call_soon(send_answers)
        answers.append((seq, ok))

    chunks: asyncio.Queue[bytes] = asyncio.Queue()  # (bounded by the tap's budget)

    async def read_stdin() -> None:
        while chunk := await reader.read(_READ_BYTES):
            chunks.put_nowait(chunk)
        chunks.put_nowait(b"")  # the tap closed our stdin, or died

    reading = loop.create_task(read_stdin())
    starting = loop.create_task(_started_producer(settings, transport))
    await asyncio.wait({reading, starting}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # the tap stopped while Kafka was unreachable: nothing to do
        starting.cancel()
        return
    producer = starting.result()
    topic, header = settings.topic, settings.base.tenant_header
    frames = FrameReader()
    open_runs = OpenRuns()
    sent = 0
    while chunk := await chunks.get():
        for kind, payload in frames.feed(chunk):
            if kind != RECORDS:
                continue
            for record in decode_records(payload):
                sent += 1
                if sent % _SENDS_PER_YIELD == 0:  # a send that need not wait never yields
                    await asyncio.sleep(0)
                open_runs.handed(record.key, record.tenant, record.value)
                try:
                    delivery = await producer.send(topic, value=record.value, key=record.key,
                                                   headers=[(header, record.tenant)])
                except Exception as error:  # refused before sending
                    log_exception_kind(log, logging.WARNING, "Kafka refused a record", error)
                    answer(record.seq, False)
                    continue
                delivery.add_done_callback(
                    lambda done, seq=record.seq: answer(
                        seq, not done.cancelled() and done.exception() is None))
    # Our stdin closed: the tap stopped, cleanly (every run it relayed is ended then)
    # or not (the runs it was relaying are cut here, as it would have cut them).
    interrupted = open_runs.interrupted()
    if interrupted:
        log.warning("the tap stopped with %d run(s) open; each gets a RUN_ERROR",
                    len(interrupted))
    for key, tenant, value in interrupted:
        with contextlib.suppress(Exception):
            await producer.send(topic, value=value, key=key, headers=[(header, tenant)])
    with contextlib.suppress(Exception):
        async with asyncio.timeout(_CHILD_STOP_SECONDS):
            await producer.stop()
    if answers:
        send_answers()
    transport.close()


async def _started_producer(settings: TapSettings,
                            transport: asyncio.WriteTransport) -> AIOKafkaProducer:
    delay = _START_RETRY_SECONDS[0]
    while True:
        producer = AIOKafkaProducer(
            **aiokafka_options(settings.base), acks="all", enable_idempotence=True,
            linger_ms=_LINGER_MS, max_request_size=settings.max_event_bytes + 65_536)
        try:
            await producer.start()
        except Exception as error:  # Kafka unreachable: the tap keeps forwarding; retry
            log_exception_kind(log, logging.DEBUG, "Kafka unreachable; retrying", error)
            with contextlib.suppress(Exception):
                await producer.stop()
            transport.write(producer_frame(False))
            await asyncio.sleep(delay)
            delay = min(delay * 2, _START_RETRY_SECONDS[1])
            continue
        transport.write(producer_frame(True))
        return producer


def main() -> int:
    """The publisher process: records from stdin, outcomes to stdout, until stdin
    closes. Signals are the tap's to handle: it closes our stdin when it stops."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    frames_out = os.dup(1)
    os.dup2(2, 1)  # anything printed goes to stderr, never into the frames
    try:
        settings = TapSettings.from_env()
    except ConfigError as error:
        sys.stderr.write(f"agui-stream tap publisher: configuration error: {error}\n")
        return 2
    logging.config.dictConfig(worker_logging(settings.base))
    uvloop.run(_publish_from_stdin(settings, frames_out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
