"""The SSE framer: the grammar AG-UI reads, any chunking, a bound on an event."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from processors.tap.sse import Event, Frame, Oversized, SseFramer
from tests.tap.chunking import split


def frames_of(chunks: list[bytes], bound: int = 1_000) -> list[Frame]:
    framer = SseFramer(bound)
    return [frame for chunk in chunks for frame in framer.feed(chunk)]


def test_the_grammar_agui_reads() -> None:
    stream = (b"\xef\xbb\xbfdata: {\"a\":1}\n\n"   # a BOM, one space after the colon dropped
              b": keep-alive\n\n"                  # a comment dispatches nothing
              b"event: x\r\nid: 7\r\ndata:one\r\ndata:  two\r\n\r\n"  # CRLF; other fields
              b"data\rdata: last\r\r"              # CR only; `data` without colon: empty
              b"retry: 5\n\n"                       # no data: nothing
              b"data: cut")                         # never finished: not an event
    assert frames_of([stream]) == [Event(b'{"a":1}'), Event(b"one\n two"), Event(b"\nlast")]


def test_a_crlf_split_across_chunks_is_one_line_end() -> None:
    assert frames_of([b"data: a\r", b"\n\r", b"\ndata: b\n\n"]) == [Event(b"a"), Event(b"b")]


def test_an_event_over_the_bound_is_skipped_to_its_end() -> None:
    framer = SseFramer(10)
    assert framer.feed(b"data: " + b"x" * 50) == []
    assert framer.mid_event
    assert framer.feed(b"x" * 10_000 + b"\ndata: more\n\ndata: ok\n\n") == [Oversized(),
                                                                         Event(b"ok")]
    assert not framer.mid_event


def test_a_long_comment_is_not_kept_and_not_an_event() -> None:
    assert frames_of([b":" + b"k" * 5_000, b"\n\ndata: 1\n\n"], bound=10) == [Event(b"1")]


_LINES = st.lists(st.sampled_from([
    b"data: {\"type\":\"RUN_STARTED\"}", b"data:x", b"data", b": ping", b"id: 1", b"event: e",
    b"", b"data: \xff\xfe", b"\xef\xbb\xbfdata: bom", b"data: " + b"y" * 40]), max_size=30)
_ENDS = st.sampled_from([b"\n", b"\r\n", b"\r"])


@given(lines=_LINES, ends=st.lists(_ENDS, min_size=1), cuts=st.lists(st.integers(0, 10_000)),
       tail=st.binary(max_size=20))
def test_any_chunking_gives_the_same_events(lines: list[bytes], ends: list[bytes],
                                            cuts: list[int], tail: bytes) -> None:
    stream = b"".join(line + ends[i % len(ends)] for i, line in enumerate(lines)) + tail
    whole = frames_of([stream], bound=30)
    assert frames_of(split(stream, cuts), bound=30) == whole
    assert frames_of([bytes([b]) for b in stream], bound=30) == whole


@given(st.binary(max_size=2_000), st.lists(st.integers(0, 4_000)))
def test_arbitrary_bytes_never_raise_and_stay_bounded(stream: bytes, cuts: list[int]) -> None:
    framer = SseFramer(64)
    for chunk in split(stream, cuts):
        for frame in framer.feed(chunk):
            assert isinstance(frame, Oversized) or len(frame.data) <= 64
    assert len(framer._line) <= 64
