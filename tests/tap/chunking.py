"""A byte stream cut into chunks anywhere: how the tap's readers must take it."""

from __future__ import annotations


def split(stream: bytes, cuts: list[int]) -> list[bytes]:
    """`stream` in pieces, cut at each of `cuts` (modulo its length + 1)."""
    points = sorted({c % (len(stream) + 1) for c in cuts})
    return [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
