"""The frames between the tap and its publisher process (`processors.runtime.
tap_publisher`): records one way, their outcomes and the producer's state back.

A frame is its payload's length (4 bytes, big-endian), a kind byte, the payload:

* `R` (tap → publisher): records, each `seq` (8 bytes), the key, the tenant and
  the value, each length-prefixed (4, 2 and 4 bytes).
* `A` (publisher → tap): outcomes, each `seq` (8 bytes) and 1 (Kafka acknowledged
  it) or 0 (Kafka refused it, after the producer's retries).
* `P` (publisher → tap): 1 byte, whether the producer is started (1) or could not
  start (0).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import Final, NamedTuple

RECORDS: Final = b"R"
OUTCOMES: Final = b"A"
PRODUCER: Final = b"P"

_HEADER: Final = struct.Struct(">IB")
_SEQ: Final = struct.Struct(">Q")
_RECORD_HEAD: Final = struct.Struct(">QI")
_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_OUTCOME: Final = struct.Struct(">QB")


class PipeRecord(NamedTuple):
    seq: int
    key: bytes
    tenant: bytes
    value: bytes


class FrameError(ValueError):
    """Bytes that are not frames: the other process is not ours, or broken."""


def frame(kind: bytes, payload: bytes) -> bytes:
    return _HEADER.pack(len(payload), kind[0]) + payload


def records_frame(records: Iterable[PipeRecord]) -> bytes:
    parts: list[bytes] = []
    for record in records:
        parts += [_RECORD_HEAD.pack(record.seq, len(record.key)), record.key,
                  _U16.pack(len(record.tenant)), record.tenant,
                  _U32.pack(len(record.value)), record.value]
    return frame(RECORDS, b"".join(parts))


def outcomes_frame(outcomes: Iterable[tuple[int, bool]]) -> bytes:
    return frame(OUTCOMES, b"".join(_OUTCOME.pack(seq, ok) for seq, ok in outcomes))


def producer_frame(started: bool) -> bytes:
    return frame(PRODUCER, bytes([started]))


def decode_records(payload: bytes) -> Iterator[PipeRecord]:
    view = memoryview(payload)
    at = 0
    try:
        while at < len(view):
            seq, key_length = _RECORD_HEAD.unpack_from(view, at)
            at += _RECORD_HEAD.size
            key = bytes(view[at:at + key_length])
            at += key_length
            (tenant_length,) = _U16.unpack_from(view, at)
            at += _U16.size
            tenant = bytes(view[at:at + tenant_length])
            at += tenant_length
            (value_length,) = _U32.unpack_from(view, at)
            at += _U32.size
            value = bytes(view[at:at + value_length])
            at += value_length
            if at > len(view):
                raise FrameError("a record runs past its frame")
            yield PipeRecord(seq, key, tenant, value)
    except struct.error as error:
        raise FrameError("a record runs past its frame") from error


def decode_outcomes(payload: bytes) -> list[tuple[int, bool]]:
    if len(payload) % _OUTCOME.size:
        raise FrameError("outcomes of a partial length")
    return [(seq, bool(ok)) for seq, ok in _OUTCOME.iter_unpack(payload)]


class FrameReader:
    """Splits a byte stream, in any chunking, into (kind, payload) frames."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        self._buffer += data
        frames: list[tuple[bytes, bytes]] = []
        at = 0
        while len(self._buffer) - at >= _HEADER.size:
            length, kind = _HEADER.unpack_from(self._buffer, at)
            end = at + _HEADER.size + length
            if len(self._buffer) < end:
                break
            frames.append((bytes([kind]), bytes(self._buffer[at + _HEADER.size:end])))
            at = end
        del self._buffer[:at]
        return frames
