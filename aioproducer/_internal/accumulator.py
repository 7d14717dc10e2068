"""RecordAccumulator: records gathered into per-partition batches until the sender drains them.

The Java client keeps `batches` in a copy-on-write map because many threads append while the
sender reads. Everything here runs on one event loop, so a plain dict of deques is enough:
no locks, and an append that finds room in the open batch never suspends. The dict holds only
partitions with batches queued, so a sender round costs what is queued, not every partition
the producer ever wrote to.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import deque
from typing import TYPE_CHECKING, Callable, Iterable

from ..client.ratelimit import LogEvery
from ..errors import DeliveryTimeoutError, ProducerClosedError, TransactionAbortedError
from ..protocol.compression import Codec
from ..protocol.records import BatchWriter, encode_headers, read_batches
from .batch import ProducerBatch
from .buffer_pool import BufferPool

if TYPE_CHECKING:
    from ..client.cluster import Cluster
    from ..config import ProducerConfig
    from .transactions import TransactionManager

TopicPartition = tuple[str, int]
log = logging.getLogger(__name__)


class RecordAccumulator:
    """Per-partition queues of batches; the sender asks which are ready and drains them."""

    def __init__(self, config: ProducerConfig, pool: BufferPool, codec: Codec,
                 txn: TransactionManager | None,
                 wake_sender: Callable[[ProducerBatch | None], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._batch_size = config.batch_size
        self._linger = config.linger_ms / 1000
        self._delivery_timeout = config.delivery_timeout_ms / 1000
        self._compression_level = config.compression_level
        self._codec = codec
        self._pool = pool
        self._txn = txn
        # Called with each new batch (at linger_ms=0 the sender may write it at once), and
        # with None when a queued batch became sendable.
        self._wake_sender = wake_sender
        # The partitions with batches queued, least recently drained first (drain() moves a
        # partition it took from to the end: no partition starves). Empty queues are removed.
        self._batches: dict[TopicPartition, deque[ProducerBatch]] = {}
        # Per topic, each partition's open batch and its writer, for appends without a tuple
        # key (enqueue_many's compiled loop reads them too). A batch leaves these lists when
        # it is closed for appends or leaves its queue.
        self._open: dict[str, tuple[list[ProducerBatch | None], list[BatchWriter | None]]] = {}
        self._batches_created = 0
        self.incomplete: set[ProducerBatch] = set()
        # Final outcomes, for Producer.metrics() (a split batch counts as its pieces).
        self.records_sent = self.records_failed = self.batches_sent = 0
        self.flushing = 0
        self.closing = False
        self._on_delivery_error = config.on_delivery_error
        self._log_failure = LogEvery(log, logging.WARNING, 10)

    # -- appending (the hot path) ----------------------------------------------------------

    def try_append(self, topic: str, partition: int, timestamp: int, key: bytes | None,
                   value: bytes | None, headers: bytes | None) -> ProducerBatch | None:
        """Append to the partition's open batch if it has room (the record is then the
        batch's last); None means a new batch is needed. `headers` come encoded."""
        open_ = self._open.get(topic)
        if open_ is not None and partition < len(open_[0]):
            batch = open_[0][partition]
            if batch is not None and batch.writer.try_append(timestamp, key, value, headers):
                return batch
        return None

    def open_batches(self, topic: str, partitions: int) -> tuple[list[ProducerBatch | None],
                                                                  list[BatchWriter | None]]:
        """Each partition's open batch and its writer (None where there is none): the lists
        the accumulator keeps up to date, as enqueue_many's loop reads them."""
        open_ = self._open.get(topic)
        if open_ is None:
            open_ = self._open[topic] = ([], [])
        batches, writers = open_
        if len(batches) != partitions:  # the topic grew (or, never in Kafka, shrank)
            del batches[partitions:], writers[partitions:]
            batches.extend([None] * (partitions - len(batches)))
            writers.extend([None] * (partitions - len(writers)))
        return open_

    def close_for_appends(self, topic: str, partition: int) -> bool:
        """A record did not fit in the partition's open batch: take no more appends into it
        (the Java client's closeForRecordAppends) and let the sender ship it now. False if
        the partition had no open batch."""
        open_ = self._open.get(topic)
        batch = open_[0][partition] if open_ is not None and partition < len(open_[0]) else None
        if open_ is None or batch is None:
            return False
        open_[0][partition] = open_[1][partition] = None
        batch.full = True
        self._wake_sender(None)
        return True

    def batch_memory(self, record_size: int) -> int:
        """The memory a new batch takes for its first record: batch_size, or the record's
        size if larger."""
        return max(self._batch_size, record_size)

    def reserve_now(self, size: int) -> bool:
        """Reserve a new batch's memory if it is free and nobody waits for memory before us."""
        if self.closing:
            raise closed_while_buffering()
        return self._pool.try_reserve(size)

    async def reserve(self, size: int, max_block: float) -> None:
        """Wait, in arrival order, up to `max_block` for a new batch's memory."""
        if self.closing:
            raise closed_while_buffering()
        await self._pool.reserve(size, max_block)

    def release(self, size: int) -> None:
        """Give back memory reserved for a batch that was not opened after all."""
        self._pool.release(size)

    def begin_closing(self) -> None:
        """No new batch from now on: every append waiting for memory fails at once (as the
        Java client's BufferPool.close() wakes its waiters)."""
        self.closing = True
        self._pool.close(closed_while_buffering)

    def open_batch(self, topic: str, partition: int, timestamp: int, key: bytes | None,
                   value: bytes | None, headers: bytes | None, reserved: int,
                   partitions: int) -> ProducerBatch:
        """Open a batch, with `reserved` bytes of memory already reserved for it, for a record
        that try_append() found no room for; the record is its first."""
        if self.closing:
            raise closed_while_buffering()
        now = self._loop.time()
        self._batches_created += 1
        writer = BatchWriter(timestamp, self._batch_size)
        batch = ProducerBatch((self._batches_created,), topic, partition, writer,
                              self._loop.create_future(), now, now + self._delivery_timeout,
                              reserved)
        writer.try_append(timestamp, key, value, headers)  # a batch's first record always fits
        queue = self._batches.get((topic, partition))
        if queue is None:
            queue = self._batches[(topic, partition)] = deque()
        queue.append(batch)
        batches, writers = self.open_batches(topic, max(partitions, partition + 1))
        batches[partition] = batch
        writers[partition] = writer
        self.incomplete.add(batch)
        if self._txn is not None and self._txn.is_transactional:
            self._txn.add_partition(topic, partition)
        self._wake_sender(batch)  # a new linger deadline, or the previous batch is now full
        return batch

    # -- the sender's side -----------------------------------------------------------------

    def ready(self, cluster: Cluster, now: float) -> tuple[set[int], float, set[str]]:
        """Brokers with a sendable batch, seconds until the next batch may become sendable,
        and the topics with a batch for a partition whose leader is unknown."""
        ready: set[int] = set()
        next_check = float("inf")
        unknown_leader: set[str] = set()
        drain_all = self.flushing > 0 or self.closing or self._pool.queued > 0
        for (topic, partition), queue in self._batches.items():
            leader = cluster.leader_for(topic, partition)
            if leader < 0:
                unknown_leader.add(topic)
                continue
            if leader in ready:
                continue
            batch = queue[0]
            if batch.retry_at > now:
                next_check = min(next_check, batch.retry_at - now)
                continue
            if (drain_all or batch.full or len(queue) > 1
                    or batch.writer.size >= self._batch_size or batch.attempts > 0):
                ready.add(leader)
                continue
            linger_left = batch.created + self._linger - now
            if linger_left <= 0:
                ready.add(leader)
            else:
                next_check = min(next_check, linger_left)
        return ready, next_check, unknown_leader

    def has_queued(self) -> bool:
        """Whether some batch waits to be drained."""
        return bool(self._batches)

    def drain(self, cluster: Cluster, nodes: Iterable[int], max_request_size: int,
              now: float) -> dict[int, list[ProducerBatch]]:
        """Take at most one batch per partition for each broker, up to `max_request_size`,
        partitions least recently drained first (so no partition starves)."""
        by_node: dict[int, list[tuple[TopicPartition, deque[ProducerBatch]]]] = \
            {node: [] for node in nodes}
        for tp, queue in self._batches.items():
            entries = by_node.get(cluster.leader_for(*tp))
            if entries is not None:
                entries.append((tp, queue))
        drained: dict[int, list[ProducerBatch]] = {}
        for node, queues in by_node.items():
            size = 0
            batches: list[ProducerBatch] = []
            for tp, queue in queues:
                batch = queue[0]
                if batch.retry_at > now:
                    continue
                if self._txn is not None and not self._txn.may_send(batch):
                    continue
                if batches and size + batch.writer.size > max_request_size:
                    break
                self._take(tp, queue)
                size += batch.writer.size
                batches.append(batch)
            if batches:
                drained[node] = batches
        return drained

    def drain_lone(self, batch: ProducerBatch) -> bool:
        """Drain `batch` if it is the only batch queued (a send on an idle producer at
        linger_ms=0); False, taking nothing, otherwise."""
        tp = (batch.topic, batch.partition)
        queue = self._batches.get(tp)
        if len(self._batches) != 1 or queue is None or len(queue) != 1:
            return False
        self._take(tp, queue)
        return True

    def _take(self, tp: TopicPartition, queue: deque[ProducerBatch]) -> None:
        """Take the partition's first batch for a request."""
        batch = queue.popleft()
        del self._batches[tp]
        if queue:
            self._batches[tp] = queue  # to the back of the line
        if batch.attempts == 0:  # first send: no more appends; compress once
            self._unlist(batch)
            batch.writer.close(self._codec, self._compression_level)
        if self._txn is not None:
            self._txn.assign_sequence(batch)

    def _unlist(self, batch: ProducerBatch) -> None:
        """The batch left its queue: it is no longer its partition's open batch."""
        batches, writers = self._open.get(batch.topic) or ([], [])
        if batch.partition < len(batches) and batches[batch.partition] is batch:
            batches[batch.partition] = writers[batch.partition] = None

    def reenqueue(self, batch: ProducerBatch, retry_at: float) -> None:
        """Put a failed batch back for a retry."""
        batch.attempts += 1
        batch.retry_at = retry_at
        self._insert(batch)

    def split(self, batch: ProducerBatch) -> None:
        """The broker refused `batch` as too large: queue its records again as two batches,
        each half of them, in its place (its sequence numbers and delivery deadline, its
        memory shared out). Halving ends, at worst, in batches of one record, which then fail
        as too large on their own. (The Java client splits into batch_size pieces, which
        cannot get under a broker limit that is itself below batch_size.)"""
        [read] = read_batches(batch.writer.encode())
        records = read.records
        half = len(records) // 2
        pieces = []
        for index, part in enumerate((records[:half], records[half:])):
            writer = BatchWriter(part[0].timestamp, sys.maxsize)  # no limit: they were one batch
            for record in part:
                writer.try_append(record.timestamp, record.key, record.value,
                                  encode_headers(record.headers) if record.headers else None)
            reserved = batch.reserved // 2 if index == 0 else batch.reserved - batch.reserved // 2
            piece = ProducerBatch(batch.number + (index,), batch.topic, batch.partition, writer,
                                  self._loop.create_future(), batch.created, batch.deadline,
                                  reserved)
            piece.full = True  # sendable now
            pieces.append(piece)
        batch.split_into(pieces)
        if self._txn is not None:
            self._txn.split(batch, pieces)
        self.incomplete.discard(batch)
        for piece in pieces:
            self.incomplete.add(piece)
            self._insert(piece)

    def _insert(self, batch: ProducerBatch) -> None:
        """Queue a batch in creation order among its partition's queued ones (the Java
        client's insertInSequenceOrder: batches are numbered in creation order)."""
        queue = self._batches.setdefault((batch.topic, batch.partition), deque())
        index = 0
        while index < len(queue) and queue[index].number < batch.number:
            index += 1
        queue.insert(index, batch)

    def expire(self, now: float) -> list[ProducerBatch]:
        """Remove and return queued batches whose delivery_timeout_ms has passed."""
        expired: list[ProducerBatch] = []
        for queue in self._batches.values():
            while queue and queue[0].deadline <= now:
                batch = queue.popleft()
                self._unlist(batch)
                batch.writer.seal()
                expired.append(batch)
        if expired:  # rare: the common round copies nothing (the order is kept)
            self._batches = {tp: queue for tp, queue in self._batches.items() if queue}
        return expired

    def next_expiry(self) -> float:
        return min((q[0].deadline for q in self._batches.values()), default=float("inf"))

    def finish(self, batch: ProducerBatch) -> None:
        """A batch has its final outcome: return its memory, and count it."""
        if batch in self.incomplete:
            self.incomplete.discard(batch)
            self._pool.release(batch.reserved)
            failure = batch.future.exception()
            if failure is None:
                self.records_sent += batch.record_count
                self.batches_sent += 1
            else:
                self.records_failed += batch.record_count
                self._report_failure(batch, failure)

    def _report_failure(self, batch: ProducerBatch, failure: BaseException) -> None:
        """Say that records failed for good, to the on_delivery_error hook if there is one,
        else in the log: those nobody awaits would fail unseen."""
        hook = self._on_delivery_error
        if hook is None:
            if not isinstance(failure, TransactionAbortedError):  # (the user's own abort)
                self._log_failure("%d record(s) for %s-%d failed: %r", batch.record_count,
                                  batch.topic, batch.partition, failure)
            return
        try:
            hook(failure, batch.topic, batch.partition, batch.record_count)
        except Exception:
            log.exception("on_delivery_error raised (for %r)", failure)

    def fail_all(self, exc: BaseException, unsent_only: bool = False) -> None:
        """Fail every queued batch (the producer is closing without flushing, or broken), or
        with `unsent_only` those never drained (a failed transaction: what it sent is retried
        until it has an outcome, as in the Java client's abortUndrainedBatches)."""
        queues, self._batches = self._batches, {}
        for tp, queue in queues.items():
            for batch in queue:
                if unsent_only and batch.attempts > 0:
                    self._batches.setdefault(tp, deque()).append(batch)
                    continue
                self._unlist(batch)
                batch.writer.seal()
                if self._txn is not None:
                    self._txn.batch_failed(batch, exc)
                batch.fail(exc)
                self.finish(batch)

    def fail_unresolved(self, exc: BaseException) -> None:
        """Fail every batch still without an outcome, queued or not: the sender is gone, and
        nothing else would resolve them (a batch it was preparing when it failed, say)."""
        self.fail_all(exc)
        for batch in list(self.incomplete):
            batch.fail(exc)
            self.finish(batch)

    def release_topic(self, topic: str) -> bool:
        """Forget a topic (its metadata is being dropped); False, forgetting nothing, while
        it has batches queued or in flight."""
        if any(batch.topic == topic for batch in self.incomplete):
            return False
        self._open.pop(topic, None)
        return True


def delivery_timeout_error(batch: ProducerBatch, timeout_ms: int, cause: str) -> DeliveryTimeoutError:
    return DeliveryTimeoutError(
        f"{batch.record_count} record(s) for {batch.topic}-{batch.partition} not acknowledged "
        f"within delivery_timeout_ms={timeout_ms} ({cause})")


def closed_while_buffering() -> ProducerClosedError:
    """No new batch once close() began: nothing may wait for the stopped sender (the Java
    client's "producer closed while send in progress")."""
    return ProducerClosedError("the producer is closing: this record was not buffered (nor sent)")
