"""Where records go: murmur2 for keys (the Java client's choice, so keyed data lands on the
same partitions whichever client wrote it), a sticky partition for keyless records (KIP-480:
fill one batch at a time instead of spreading tiny batches over every partition)."""

from __future__ import annotations

import random

from .._speedups import murmur2, partition_for_key

__all__ = ["StickyPartitioner", "murmur2", "partition_for_key"]


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
