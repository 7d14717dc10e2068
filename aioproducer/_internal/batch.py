"""A batch of records for one partition, and the per-record handle users await.

One asyncio future per batch; each record gets only a small slotted handle that remembers
its batch and its offset delta. Holding a future, a closure or a reference cycle per record
is what limits Python producers (see benchmarks/), so the handle holds none of those.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable, Generator, NamedTuple

if TYPE_CHECKING:
    from ..protocol.records import BatchWriter


class RecordMetadata(NamedTuple):
    """Where a record landed. `offset` is -1 when the broker did not say (acks=0, or a
    duplicate the broker already had and answered without its offset)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int


class ProducerBatch:
    """Records bound for one partition, sent and acknowledged together."""

    __slots__ = (
        "number", "topic", "partition", "writer", "future", "created", "deadline", "reserved",
        "attempts", "retry_at", "base_sequence", "producer_id", "producer_epoch", "done",
    )

    def __init__(self, number: int, topic: str, partition: int, writer: BatchWriter,
                 future: asyncio.Future, created: float, deadline: float, reserved: int) -> None:
        self.number = number  # creation order: retries go back in this order
        self.topic = topic
        self.partition = partition
        self.writer = writer
        self.future = future
        self.created = created
        self.deadline = deadline  # delivery_timeout_ms after creation
        self.reserved = reserved  # bytes held in the buffer pool
        self.attempts = 0
        self.retry_at = 0.0
        self.base_sequence = -1
        self.producer_id = -1
        self.producer_epoch = -1
        self.done = False

    def __repr__(self) -> str:
        return (f"<ProducerBatch {self.topic}-{self.partition} records={self.writer.count} "
                f"seq={self.base_sequence} attempts={self.attempts}>")

    @property
    def record_count(self) -> int:
        return self.writer.count

    def complete(self, base_offset: int, log_append_time: int) -> None:
        self.done = True
        if not self.future.done():
            self.future.set_result((base_offset, log_append_time))

    def fail(self, exc: BaseException) -> None:
        self.done = True
        if not self.future.done():
            self.future.set_exception(exc)
            # The batch's error reaches users through their record handles; if nobody awaits
            # them (fire-and-forget), asyncio must not log "exception never retrieved".
            self.future.exception()


class RecordFuture:
    """Awaitable result of `Producer.enqueue()`: resolves to the record's RecordMetadata."""

    __slots__ = ("_batch", "_offset_delta", "_timestamp")

    def __init__(self, batch: ProducerBatch, offset_delta: int, timestamp: int) -> None:
        self._batch = batch
        self._offset_delta = offset_delta
        self._timestamp = timestamp

    def __repr__(self) -> str:
        state = "pending" if not self.done() else "done"
        return f"<RecordFuture {self._batch.topic}-{self._batch.partition} {state}>"

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        future = self._batch.future
        if not future.done():
            # Shielded: a task awaiting this record may be cancelled; the batch, which other
            # records share, must not be.
            yield from asyncio.shield(future).__await__()
        return self.result()

    def done(self) -> bool:
        return self._batch.future.done()

    def result(self) -> RecordMetadata:
        """The metadata if acknowledged; raises the failure, or InvalidStateError if pending."""
        base_offset, log_append_time = self._batch.future.result()
        return RecordMetadata(
            self._batch.topic,
            self._batch.partition,
            base_offset + self._offset_delta if base_offset >= 0 else -1,
            log_append_time if log_append_time >= 0 else self._timestamp,
        )

    def exception(self) -> BaseException | None:
        return self._batch.future.exception()

    def add_done_callback(self, fn: Callable[["RecordFuture"], object]) -> None:
        """Call `fn(self)` once the record is acknowledged or failed."""
        self._batch.future.add_done_callback(lambda _: fn(self))


class BulkFuture:
    """Awaitable result of `Producer.enqueue_many()`: the records' metadata, in input order.

    It remembers runs of consecutive records per batch, not records, so a million buffered
    records cost a few hundred small lists until someone asks for their metadata.
    """

    __slots__ = ("_segments", "_timestamp", "count")

    def __init__(self, segments: list[list[Any]], timestamp: int, count: int) -> None:
        self._segments = segments  # [batch, first offset delta, number of records]
        self._timestamp = timestamp
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"<BulkFuture records={self.count} {'done' if self.done() else 'pending'}>"

    def __await__(self) -> Generator[Any, None, list[RecordMetadata]]:
        pending = {segment[0].future for segment in self._segments
                   if not segment[0].future.done()}
        if pending:
            # asyncio.wait never cancels the futures it waits for: a cancelled caller leaves
            # the batches, which other records share, alone.
            yield from asyncio.wait(pending).__await__()
        return self.result()

    def done(self) -> bool:
        return all(segment[0].future.done() for segment in self._segments)

    def exception(self) -> BaseException | None:
        """The first failure among the records, if any (None while pending or all acked)."""
        for batch, _, _ in self._segments:
            if batch.future.done() and batch.future.exception() is not None:
                return batch.future.exception()
        return None

    def result(self) -> list[RecordMetadata]:
        """Every record's metadata; raises the first failure if any record failed."""
        out: list[RecordMetadata] = []
        for batch, first, n in self._segments:
            base_offset, log_append_time = batch.future.result()
            timestamp = log_append_time if log_append_time >= 0 else self._timestamp
            topic, partition = batch.topic, batch.partition
            out.extend(RecordMetadata(topic, partition,
                                      base_offset + delta if base_offset >= 0 else -1, timestamp)
                       for delta in range(first, first + n))
        return out
