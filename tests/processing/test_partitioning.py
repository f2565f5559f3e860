"""The pure default partitioner places every key where Kafka's clients do."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from topics.partitioning import default_partition, murmur2

# Kafka's own test vectors (Java's Utils.murmur2 returns a signed int).
JAVA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_murmur2_is_javas() -> None:
    for data, signed in JAVA_VECTORS.items():
        assert murmur2(data) == signed & 0xFFFFFFFF


@given(st.binary(max_size=300))
def test_murmur2_agrees_with_aiokafka(data: bytes) -> None:
    assert murmur2(data) & 0x7FFFFFFF == aiokafka_murmur2(data) & 0x7FFFFFFF


@given(st.binary(min_size=1, max_size=100), st.integers(1, 256))
def test_default_partition_is_the_producers(key: bytes, partitions: int) -> None:
    every = list(range(partitions))
    assert default_partition(key, partitions) == DefaultPartitioner()(key, every, every)
