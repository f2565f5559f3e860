"""Server-Sent Events framing: bytes in any chunking, `data` payloads out.

Follows the SSE grammar (WHATWG HTML, *Server-sent events*, event stream
interpretation) for what AG-UI reads: lines end in CRLF, LF or CR (a CRLF may
be split across two chunks); a leading BOM is skipped; `:` lines are comments;
a field's value loses one leading space; `data` lines join with LF; a blank
line dispatches the event if it has data; other fields are ignored (AG-UI 1.1,
basic/transports/http-sse). An event larger than the bound is not kept: its
bytes are skipped up to its blank line and it comes out as `Oversized`, so a
stream without line breaks cannot exhaust memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

_LINE_END: Final = re.compile(rb"[\r\n]")
_BOM: Final = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class Event:
    """One SSE event's `data` (its lines joined with LF), as bytes."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Oversized:
    """An event whose data and pending line exceeded the bound; its content is gone."""


Frame = Event | Oversized


class SseFramer:
    """Feed it the body's chunks as they come; it returns the events they complete."""

    def __init__(self, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self._line = bytearray()
        self._line_seen = False  # the current line has bytes (possibly skipped ones)
        self._comment = False  # the current line is a comment: its bytes are not kept
        self._data: list[bytes] = []
        self._data_bytes = 0
        self._oversized = False
        self._after_cr = False  # the last chunk ended in CR: a leading LF is its pair
        self._at_start = True  # the BOM may only lead the stream

    @property
    def mid_event(self) -> bool:
        """Whether part of an event has arrived without its blank line (a cut stream)."""
        return self._line_seen or bool(self._data) or self._oversized

    def feed(self, chunk: bytes) -> list[Frame]:
        frames: list[Frame] = []
        start = 0
        if self._after_cr and chunk[:1] == b"\n":
            start = 1
        self._after_cr = False
        end = len(chunk)
        while start < end:
            found = _LINE_END.search(chunk, start)
            if found is None:
                self._extend(chunk, start, end)
                break
            stop = found.start()
            self._extend(chunk, start, stop)
            self._end_line(frames)
            if chunk[stop] == 0x0D:  # CR: one terminator with a following LF
                if stop + 1 == end:
                    self._after_cr = True
                    start = end
                else:
                    start = stop + 2 if chunk[stop + 1] == 0x0A else stop + 1
            else:
                start = stop + 1
        return frames

    def _extend(self, chunk: bytes, start: int, stop: int) -> None:
        if start == stop:
            return
        if not self._line_seen and chunk[start] == 0x3A:  # ':' (keep-alives: any length)
            self._comment = True
        self._line_seen = True
        if self._oversized or self._comment:
            return
        if len(self._line) + (stop - start) + self._data_bytes > self.max_event_bytes:
            self._oversized = True
            self._line.clear()
            self._data.clear()
            self._data_bytes = 0
            return
        self._line += chunk[start:stop]

    def _end_line(self, frames: list[Frame]) -> None:
        line = bytes(self._line)
        self._line.clear()
        seen = self._line_seen
        self._line_seen = False
        if self._comment:
            self._comment = self._at_start = False
            return
        if self._at_start:
            self._at_start = False
            if line.startswith(_BOM):  # a line of just the BOM is blank
                line = line[len(_BOM):]
                seen = bool(line)
        if not seen:  # a blank line: dispatch
            if self._oversized:
                frames.append(Oversized())
            elif self._data:
                frames.append(Event(b"\n".join(self._data)))
            self._oversized = False
            self._data.clear()
            self._data_bytes = 0
            return
        if self._oversized or line.startswith(b":"):
            return
        name, colon, value = line.partition(b":")
        if name == b"data":
            if colon and value.startswith(b" "):
                value = value[1:]
            self._data.append(value)
            self._data_bytes += len(value) + 1
