"""Where records go: murmur2 for keys (the Java client's choice, so keyed data lands on the
same partitions whichever client wrote it), a sticky partition for keyless records.

Keyless records fill one partition's batch at a time instead of spreading tiny batches over
every partition (KIP-480), and move on the way KIP-794 has the Java client do it:
- never to a partition without a leader (its records would wait out delivery_timeout_ms);
- after `batch_size` bytes went to the partition, whether they filled one batch or several
  small ones that linger sent early (a batch boundary alone would keep a slow trickle on one
  partition for ever);
- adaptively, when `partitioner_adaptive_partitioning_enable` (the default): less often to
  partitions with more batches queued (a slow broker's), and, with
  `partitioner_availability_timeout_ms`, never to a broker that had data to send but took
  none for that long.
The choice is made once per batch, never per record.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

from .._speedups import murmur2, partition_for_key

__all__ = ["StickyPartitioner", "murmur2", "partition_for_key"]


class _Sticky:
    __slots__ = ("partition", "bytes_before")

    def __init__(self, partition: int, bytes_before: int) -> None:
        self.partition = partition
        self.bytes_before = bytes_before  # the partition's drained bytes when it was chosen


class StickyPartitioner:
    """One partition per topic for keyless records (see the module's docstring)."""

    def __init__(self, batch_size: int, adaptive: bool,
                 queued: Callable[[str, int], int], drained_bytes: Callable[[str, int], int],
                 node_unavailable: Callable[[int], bool]) -> None:
        self._batch_size = batch_size
        self._adaptive = adaptive
        self._queued = queued  # batches waiting for (topic, partition)
        self._drained_bytes = drained_bytes  # bytes of its batches sent so far
        self._node_unavailable = node_unavailable
        self._sticky: dict[str, _Sticky] = {}

    def partition(self, topic: str, leaders: Sequence[int]) -> int:
        """The topic's sticky partition (per record: two lookups and a test)."""
        sticky = self._sticky.get(topic)
        if sticky is None or sticky.partition >= len(leaders) or leaders[sticky.partition] < 0:
            sticky = self._stick(topic, self._choose(topic, leaders, -1))
        return sticky.partition

    def on_new_batch(self, topic: str, leaders: Sequence[int], partition: int,
                     full: bool) -> int:
        """A keyless record for `partition` needs a new batch (`full`: its batch had no room;
        else linger or a flush sent it early): the partition for the record, moved on once
        batch_size bytes went to the partition."""
        sticky = self._sticky.get(topic)
        if sticky is None or sticky.partition != partition:
            return self.partition(topic, leaders)
        produced = self._drained_bytes(topic, partition) - sticky.bytes_before
        if full or produced >= self._batch_size:
            sticky = self._stick(topic, self._choose(topic, leaders, partition))
        return sticky.partition

    def _stick(self, topic: str, partition: int) -> _Sticky:
        self._sticky[topic] = sticky = _Sticky(partition, self._drained_bytes(topic, partition))
        return sticky

    def _choose(self, topic: str, leaders: Sequence[int], previous: int) -> int:
        led = [p for p, leader in enumerate(leaders) if leader >= 0]
        available = [p for p in led if not self._node_unavailable(leaders[p])] or led
        if not available:  # no leader anywhere: the records wait for metadata either way
            return random.randrange(len(leaders))
        if len(available) > 1 and previous in available:
            available.remove(previous)
        if self._adaptive and len(available) > 1:
            queued = [self._queued(topic, p) for p in available]
            most = max(queued)
            if most != min(queued):
                # Fewer batches waiting, more likely (the Java client's weights).
                return random.choices(available, [most + 1 - q for q in queued])[0]
        return random.choice(available)
