"""Sequence numbers of an idempotent producer: pure bookkeeping, no I/O, no asyncio.

The broker keeps, per producer id and partition, the sequence numbers of the last batches it
wrote, so a retried batch it already has is answered DUPLICATE_SEQUENCE_NUMBER instead of
being written twice, and a gap is answered OUT_OF_ORDER_SEQUENCE_NUMBER. The client numbers
each batch when it is first drained, keeps up to `max_in_flight_requests_per_connection` of
them in flight, sends a retried batch only when nothing else of its partition is in flight,
and re-queues retries in sequence order.

A leader that keeps no state for the producer (none yet, or dropped after
producer.id.expiration.ms) takes any sequence: had the first batch then been refused
unwritten while the next went through, the retried first would land after it (or be refused
as out of order). So a partition carries one batch until it has acknowledged one under the
current producer id and epoch, and again after it acknowledged nothing for QUIET_S.

A numbered batch that fails for good without an acknowledgement has used up its sequence
numbers whether or not the broker wrote it; what to do about that (a new epoch) is the
transaction manager's call.
"""

from __future__ import annotations

import time
from typing import Callable

from .batch import ProducerBatch, TopicPartition

_SEQUENCE_WRAP = 1 << 31
# A partition that acknowledged nothing for this long may have been forgotten by its leader
# (Kafka drops a producer's state once its last batch is producer.id.expiration.ms old: a
# day by default, at least a second anywhere sane). Its next batch goes alone until
# acknowledged, which costs a burst after a pause one round trip, nothing in a steady stream.
QUIET_S = 1.0


class Sequencer:
    """The producer id and epoch, each partition's next sequence number, and its batches
    numbered but not yet acknowledged or failed, in order."""

    def __init__(self, max_in_flight: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._max_in_flight = max_in_flight
        self._clock = clock
        self.producer_id = -1
        self.producer_epoch = -1
        self._next_sequence: dict[TopicPartition, int] = {}
        self._acked_up_to: dict[TopicPartition, int] = {}  # sequence the broker expects next
        # Batches numbered under the current producer id and epoch, neither acknowledged nor
        # failed yet, in sequence order (a dict as an ordered set).
        self._unacked: dict[TopicPartition, dict[ProducerBatch, None]] = {}
        self._in_flight: dict[TopicPartition, list[ProducerBatch]] = {}
        self._acked_at: dict[TopicPartition, float] = {}  # each partition's last ack, by clock
        # Partitions whose leader may keep no state for us: one batch in flight until an ack.
        self._unconfirmed: set[TopicPartition] = set()

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    def start(self, producer_id: int, producer_epoch: int) -> None:
        """A new producer id or epoch: every partition is numbered from 0 again."""
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self._next_sequence.clear()
        self._acked_up_to.clear()
        self._unacked.clear()
        self._acked_at.clear()
        self._unconfirmed.clear()

    def may_send(self, batch: ProducerBatch) -> bool:
        """Whether `batch` may go on the wire now without breaking its partition's order.
        (_c.c's drain gives the first False and the first True below itself, on
        `drain_view`: keep the two in step.)"""
        if self.producer_id < 0:  # (has_producer_id)
            return False
        in_flight = self._in_flight.get((batch.topic, batch.partition))
        if not in_flight:
            return True
        if batch.attempts > 0 or not self.is_current(in_flight[0]):
            # A retry goes only when nothing else of its partition is in flight; after a
            # producer id reset, nothing goes until the old id's batches are resolved.
            return False
        if (batch.topic, batch.partition) in self._unconfirmed:
            # Its leader may have no state for us (see the module's docstring): one at a time.
            return False
        return len(in_flight) < self._max_in_flight

    def assign(self, batch: ProducerBatch) -> None:
        """Number a batch under the current producer id (first send, or after a reset).
        (_c.c's drain does this itself, on `drain_view`: keep the two in step.)"""
        if self.is_current(batch) and batch.base_sequence >= 0:
            return
        tp = (batch.topic, batch.partition)
        sequence = self._next_sequence.get(tp, 0)
        batch.producer_id = self.producer_id
        batch.producer_epoch = self.producer_epoch
        batch.base_sequence = sequence
        self._next_sequence[tp] = (sequence + batch.record_count) % _SEQUENCE_WRAP
        self._unacked.setdefault(tp, {})[batch] = None

    def split(self, batch: ProducerBatch, pieces: list[ProducerBatch]) -> None:
        """`batch` was split (unwritten: the broker refused it as too large): its pieces take
        its sequence numbers, and its place among the partition's unacknowledged batches."""
        if not self.is_current(batch) or batch.base_sequence < 0:
            return  # not numbered yet: the pieces are numbered when drained
        sequence = batch.base_sequence
        for piece in pieces:
            piece.producer_id = batch.producer_id
            piece.producer_epoch = batch.producer_epoch
            piece.base_sequence = sequence
            sequence = (sequence + piece.record_count) % _SEQUENCE_WRAP
        tp = (batch.topic, batch.partition)
        unacked = self._unacked.get(tp, {})
        if batch in unacked:
            self._unacked[tp] = {b: None for old in unacked
                                 for b in (pieces if old is batch else (old,))}

    def drain_view(self) -> tuple[int, int, dict[TopicPartition, list[ProducerBatch]],
                                  dict[TopicPartition, int],
                                  dict[TopicPartition, dict[ProducerBatch, None]]]:
        """What the compiled drain reads once a drain to answer `may_send` without a
        producer id or for a batch with nothing of its partition in flight, and to do
        `assign`, without a Python call per batch (~490 a request at 10,000 partitions):
        the producer id and epoch, and the batches in flight, next sequence numbers and
        unacknowledged batches by partition, the dicts those two read and write."""
        return (self.producer_id, self.producer_epoch, self._in_flight, self._next_sequence,
                self._unacked)

    def sent_all(self, batches: list[ProducerBatch]) -> None:
        """A request's batches went on the wire (told in one call: at 10,000 partitions a
        request holds ~490). A partition never acknowledged under this id, or not for
        QUIET_S, is unconfirmed: one batch in flight until it acknowledges one."""
        in_flights, acked_at, unconfirmed = self._in_flight, self._acked_at, self._unconfirmed
        now = self._clock()
        for batch in batches:
            tp = (batch.topic, batch.partition)
            in_flight = in_flights.get(tp)
            if in_flight is None:
                in_flight = in_flights[tp] = []
            if not in_flight:
                at = acked_at.get(tp)
                if at is None or now - at > QUIET_S:
                    unconfirmed.add(tp)
            in_flight.append(batch)
            if len(in_flight) > 1:
                in_flight.sort(key=_sequence_order)

    def resolved(self, batch: ProducerBatch) -> None:
        """The batch's request came back (any outcome): it is no longer in flight."""
        in_flight = self._in_flight.get((batch.topic, batch.partition))
        if in_flight and batch in in_flight:
            in_flight.remove(batch)

    def acked(self, batch: ProducerBatch) -> bool:
        """The broker wrote `batch`. True if that leaves a gap behind: a younger batch of its
        partition failed while this one was pending (see `gap_left`)."""
        if not self.is_current(batch):
            return False
        tp = (batch.topic, batch.partition)
        self._acked_up_to[tp] = (batch.base_sequence + batch.record_count) % _SEQUENCE_WRAP
        self._acked_at[tp] = self._clock()
        self._unconfirmed.discard(tp)
        self._unacked.get(tp, {}).pop(batch, None)
        return self.gap_left(batch)

    def acked_all(self, batches: list[ProducerBatch]) -> ProducerBatch | None:
        """`resolved` and `acked` for each of a response's batches (all written), in one
        call; the first that leaves a gap behind (see `acked`), if any."""
        in_flights, acked_up_to, acked_at = self._in_flight, self._acked_up_to, self._acked_at
        unacked_of, unconfirmed, next_sequence = (self._unacked, self._unconfirmed,
                                                  self._next_sequence)
        producer_id, epoch = self.producer_id, self.producer_epoch
        now = self._clock()
        gap = None
        for batch in batches:
            tp = (batch.topic, batch.partition)
            in_flight = in_flights.get(tp)
            if in_flight and batch in in_flight:
                in_flight.remove(batch)
            if batch.producer_id != producer_id or batch.producer_epoch != epoch:
                continue
            acked_up_to[tp] = up_to = (batch.base_sequence + batch.record_count) % _SEQUENCE_WRAP
            acked_at[tp] = now
            unconfirmed.discard(tp)
            unacked = unacked_of.get(tp)
            if unacked:
                unacked.pop(batch, None)
            if gap is None and not unacked and up_to != next_sequence.get(tp, 0):
                gap = batch
        return gap

    def failed(self, batch: ProducerBatch) -> bool:
        """`batch` failed for good unacknowledged. True if it was numbered under the current
        id: its sequence numbers are used up, whether or not the broker wrote it."""
        unacked = self._unacked.get((batch.topic, batch.partition), {})
        if batch not in unacked:
            return False
        del unacked[batch]
        return True

    def gap_left(self, batch: ProducerBatch) -> bool:
        """Nothing numbered under this id is pending on the batch's partition, yet not all of
        it was acknowledged: a batch failed after the last acknowledged one. Nothing can show
        now whether the broker wrote it; if it did not, every later batch would be refused as
        out of order. (While others are pending, the oldest of them, refused as out of order,
        shows a gap: is_expected_next.)"""
        tp = (batch.topic, batch.partition)
        return not self._unacked.get(tp) and \
            self._acked_up_to.get(tp, 0) != self._next_sequence.get(tp, 0)

    def is_expected_next(self, batch: ProducerBatch) -> bool:
        """Whether the broker should accept this batch now: it is the oldest of its partition
        not yet acknowledged or failed. If not, an OUT_OF_ORDER answer only means an older
        batch is being retried; if so, the gap is real (an older batch failed unwritten, or
        the broker lost our state)."""
        unacked = self._unacked.get((batch.topic, batch.partition), {})
        return bool(unacked) and next(iter(unacked)) is batch

    def renumber_on_reset(self, batch: ProducerBatch) -> None:
        """A batch from before a producer id reset is numbered again when next drained."""
        if not self.is_current(batch):
            batch.base_sequence = -1

    def is_current(self, batch: ProducerBatch) -> bool:
        """Whether the batch was numbered under the current producer id and epoch."""
        return batch.producer_id == self.producer_id and batch.producer_epoch == self.producer_epoch


def _sequence_order(batch: ProducerBatch) -> tuple[int, int, int]:
    return (batch.producer_id, batch.producer_epoch, batch.base_sequence)
