"""Where Kafka's default partitioner puts a keyed record: murmur2 of the key, made
non-negative, modulo the partition count (Java's `Utils.murmur2` and `toPositive`,
which every client's default partitioner follows).

The history topic's contract depends on it: a thread's records are keyed
`<tenant>/<threadId>`, so a reader knows which partition holds a thread without
asking a broker. Pure: no client library, so the layers that must not import one
can place a key too.
"""

from __future__ import annotations

import struct
from typing import Final

_SEED: Final = 0x9747B28C
_M: Final = 0x5BD1E995
_MASK: Final = 0xFFFFFFFF
_WORDS: Final = struct.Struct("<I")


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 of `data`, as an unsigned int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for (word,) in _WORDS.iter_unpack(data[:whole]):
        word = (word * _M) & _MASK
        word ^= word >> 24
        h = ((h * _M) & _MASK) ^ ((word * _M) & _MASK)
    tail = length - whole
    if tail == 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h = ((h ^ data[whole]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def default_partition(key: bytes, partitions: int) -> int:
    """The partition of `partitions` the default partitioner gives a record keyed `key`."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
