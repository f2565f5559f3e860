"""Bytes the worker keeps, at their own size.

`orjson.dumps` returns a bytes object that keeps the buffer it was written in:
a 300-byte document holds about 4 KB for as long as it lives (tracemalloc; the
object itself reports 341 B). That is harmless for a record sent and dropped,
not for what the thread view keeps: 13 KB for a run of one message. What is
kept beyond a commit is copied first.
"""


def exact_bytes(data: bytes) -> bytes:
    """`data` in an object of its own size (a copy)."""
    return bytes(memoryview(data))
