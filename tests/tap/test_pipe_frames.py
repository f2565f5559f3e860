"""The frames between the tap and its publisher process: what is written is read
back whole and in order, in any chunking; bytes that are not frames raise
`FrameError` only."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from processors.tap.pipe_frames import (
    OUTCOMES,
    PRODUCER,
    RECORDS,
    FrameError,
    FrameReader,
    PipeRecord,
    decode_outcomes,
    decode_records,
    outcomes_frame,
    producer_frame,
    records_frame,
)
from tests.tap.chunking import split

records = st.lists(st.builds(PipeRecord, st.integers(0, 2**64 - 1), st.binary(max_size=40),
                             st.binary(max_size=40), st.binary(max_size=300)), max_size=20)
outcomes = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.booleans()), max_size=20)


@given(records, outcomes, st.booleans(), st.lists(st.integers(0, 5000), max_size=30))
def test_frames_are_read_back_whole_in_any_chunking(
        written: list[PipeRecord], answered: list[tuple[int, bool]], started: bool,
        cuts: list[int]) -> None:
    stream = records_frame(written) + outcomes_frame(answered) + producer_frame(started)
    reader = FrameReader()
    frames = [f for chunk in split(stream, cuts) for f in reader.feed(chunk)]
    assert [kind for kind, _ in frames] == [RECORDS, OUTCOMES, PRODUCER]
    assert list(decode_records(frames[0][1])) == written
    assert decode_outcomes(frames[1][1]) == answered
    assert frames[2][1] == bytes([started])


@given(st.binary(max_size=200))
def test_bytes_that_are_not_records_raise_frame_error_only(payload: bytes) -> None:
    try:
        list(decode_records(payload))
        decode_outcomes(payload)
    except FrameError:
        pass


def test_a_record_cut_short_is_refused() -> None:
    payload = records_frame([PipeRecord(1, b"key", b"acme", b"value")])[5:]
    try:
        list(decode_records(payload[:-1]))
    except FrameError:
        return
    raise AssertionError("a record cut short was read")
