"""Where records go: murmur2 for keys (the Java client's choice, so keyed data lands on the
same partitions whichever client wrote it), a sticky partition for keyless records (KIP-480:
fill one batch at a time instead of spreading tiny batches over every partition)."""

from __future__ import annotations

import random
import struct

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_CACHE_LIMIT = 100_000


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2` (seed 0x9747b28c), as a signed 32-bit int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end = length - (length & 3)
    for k in struct.unpack_from(f"<{end >> 2}I", data):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    if tail == 3:
        h ^= data[end + 2] << 16
    if tail >= 2:
        h ^= data[end + 1] << 8
    if tail >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


_positive_hashes: dict[bytes, int] = {}


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """`toPositive(murmur2(key)) % num_partitions`, with the hash of recent keys cached
    (murmur2 in Python costs microseconds; services reuse a bounded set of keys)."""
    h = _positive_hashes.get(key)
    if h is None:
        if len(_positive_hashes) >= _CACHE_LIMIT:
            _positive_hashes.clear()
        h = _positive_hashes[key] = murmur2(key) & 0x7FFFFFFF
    return h % num_partitions


class StickyPartitioner:
    """One partition per topic for keyless records, changed when its batch is complete."""

    def __init__(self) -> None:
        self._current: dict[str, int] = {}

    def partition(self, topic: str, num_partitions: int) -> int:
        current = self._current.get(topic)
        if current is None or current >= num_partitions:
            current = self._current[topic] = random.randrange(num_partitions)
        return current

    def on_new_batch(self, topic: str, num_partitions: int, previous: int) -> None:
        """The sticky partition's batch is full: move to another partition."""
        if num_partitions > 1 and self._current.get(topic) == previous:
            choice = random.randrange(num_partitions - 1)
            self._current[topic] = choice + 1 if choice >= previous else choice
