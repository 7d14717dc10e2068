"""A batch of records for one partition, and the per-record handle users await.

One asyncio future per batch; each record gets only a small slotted handle that remembers
its batch and its offset delta. Holding a future, a closure or a reference cycle per record
is what limits Python producers (see benchmarks/), so the handle holds none of those.

A batch the broker refuses as too large is split into pieces that are sent in its place
(`split_into`); the handles keep pointing at the original batch, which then answers for each
record from the piece that holds it, and is done when all its pieces are.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterator, NamedTuple, Sequence, \
    overload

if TYPE_CHECKING:
    from ..protocol.records import BatchWriter


class RecordMetadata(NamedTuple):
    """Where a record landed. `offset` is -1 when the broker did not say (acks=0, or a
    duplicate the broker already had and answered without its offset)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int


_new_metadata = tuple.__new__  # RecordMetadata(...) without NamedTuple's Python-level __new__


class ProducerBatch:
    """Records bound for one partition, sent and acknowledged together."""

    __slots__ = (
        "number", "topic", "partition", "writer", "future", "created", "deadline", "reserved",
        "attempts", "retry_at", "base_sequence", "producer_id", "producer_epoch", "done",
        "full", "_waiters", "pieces", "parent", "first_delta",
    )

    def __init__(self, number: tuple[int, ...], topic: str, partition: int, writer: BatchWriter,
                 future: asyncio.Future, created: float, deadline: float, reserved: int) -> None:
        self.number = number  # creation order (a piece's: its batch's, then its index)
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
        self.full = False  # a record did not fit: closed for appends, sendable now
        self._waiters: list[asyncio.Future] | None = None
        self.pieces: list[ProducerBatch] | None = None  # what it was split into, in order
        self.parent: ProducerBatch | None = None  # the batch this is a piece of
        self.first_delta = 0  # offset delta of this piece's first record in its parent

    def __repr__(self) -> str:
        return (f"<ProducerBatch {self.topic}-{self.partition} records={self.writer.count} "
                f"seq={self.base_sequence} attempts={self.attempts}>")

    @property
    def record_count(self) -> int:
        return self.writer.count

    def metadata(self, offset_delta: int, timestamp: int) -> RecordMetadata:
        """A record's metadata, from its offset in the batch and its own timestamp (used
        unless the topic stamps log-append times); raises the batch's failure if it failed,
        InvalidStateError while pending."""
        if self.pieces is not None:
            if not self.future.done():
                raise asyncio.InvalidStateError("Result is not set.")
            piece = self._piece_of(offset_delta)
            return piece.metadata(offset_delta - piece.first_delta, timestamp)
        base_offset, log_append_time = self.future.result()
        return _new_metadata(RecordMetadata, (
            self.topic,
            self.partition,
            base_offset + offset_delta if base_offset >= 0 else -1,
            log_append_time if log_append_time >= 0 else timestamp,
        ))

    def exception_for(self, offset_delta: int) -> BaseException | None:
        """The failure of one record (None if acknowledged; InvalidStateError while pending)."""
        if self.pieces is not None and self.future.done():
            piece = self._piece_of(offset_delta)
            return piece.exception_for(offset_delta - piece.first_delta)
        return self.future.exception()

    def split_into(self, pieces: list[ProducerBatch]) -> None:
        """Hand this batch's records over to `pieces` (consecutive, in order)."""
        first = 0
        for piece in pieces:
            piece.parent = self
            piece.first_delta = first
            first += piece.record_count
        self.pieces = pieces
        self.writer.free()

    def _piece_of(self, offset_delta: int) -> ProducerBatch:
        assert self.pieces is not None
        return next(p for p in reversed(self.pieces) if p.first_delta <= offset_delta)

    def _piece_done(self) -> None:
        """Done once every piece is: failed with the first piece's failure if any failed
        (what enqueue_many's future reports), else acknowledged."""
        assert self.pieces is not None
        if not all(piece.done for piece in self.pieces):
            return
        failure = next(filter(None, (piece.future.exception() for piece in self.pieces)), None)
        if failure is None:
            self.complete(-1, -1)
        else:
            self.fail(failure)

    def waiter(self) -> asyncio.Future:
        """A future of its own for one awaiting task, done when the batch is: cancelling
        it (the task was cancelled) leaves the batch, which other records share, alone.
        Cheaper than asyncio.shield, and woken by complete()/fail() themselves rather than
        by a callback of the batch's future, which would cost the waiting tasks a loop turn."""
        waiter = self.future.get_loop().create_future()
        if self._waiters is None:
            self._waiters = [waiter]
        else:
            self._waiters.append(waiter)
        return waiter

    def _wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def complete(self, base_offset: int, log_append_time: int) -> None:
        self.done = True
        self.writer.free()
        if not self.future.done():
            self.future.set_result((base_offset, log_append_time))
        self._wake_waiters()
        if self.parent is not None:
            self.parent._piece_done()

    def fail(self, exc: BaseException) -> None:
        self.done = True
        self.writer.free()
        if not self.future.done():
            self.future.set_exception(exc)
            # The batch's error reaches users through their record handles; if nobody awaits
            # them (fire-and-forget), asyncio must not log "exception never retrieved".
            self.future.exception()
        self._wake_waiters()
        if self.parent is not None:
            self.parent._piece_done()


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
        return self.wait().__await__()

    async def wait(self) -> RecordMetadata:
        """The same as `await record_future`."""
        if not self._batch.future.done():
            await self._batch.waiter()
        return self.result()

    def done(self) -> bool:
        return self._batch.future.done()

    def result(self) -> RecordMetadata:
        """The metadata if acknowledged; raises the failure, or InvalidStateError if pending."""
        return self._batch.metadata(self._offset_delta, self._timestamp)

    def exception(self) -> BaseException | None:
        return self._batch.exception_for(self._offset_delta)

    def add_done_callback(self, fn: Callable[["RecordFuture"], object]) -> None:
        """Call `fn(self)` once the record is acknowledged or failed."""
        self._batch.future.add_done_callback(lambda _: fn(self))


class BulkFuture:
    """Awaitable result of `Producer.enqueue_many()`: the records' metadata, in input order.

    It holds, per record, a reference to its batch and its offset delta as a 4-byte int:
    no object per record until someone asks for the metadata.
    """

    __slots__ = ("_batches", "_deltas", "_timestamp")

    def __init__(self, batches: list[ProducerBatch], deltas: bytearray, timestamp: int) -> None:
        self._batches = batches  # record i went into batches[i] ...
        self._deltas = deltas  # ... at offset delta deltas[4i:4i+4] (native int32)
        self._timestamp = timestamp

    @property
    def count(self) -> int:
        return len(self._batches)

    def __len__(self) -> int:
        return len(self._batches)

    def __repr__(self) -> str:
        return f"<BulkFuture records={self.count} {'done' if self.done() else 'pending'}>"

    def _futures(self) -> set[asyncio.Future]:
        return {batch.future for batch in set(self._batches)}

    def __await__(self) -> Generator[Any, None, BulkMetadata]:
        pending = {future for future in self._futures() if not future.done()}
        if pending:
            # asyncio.wait never cancels the futures it waits for: a cancelled caller leaves
            # the batches, which other records share, alone.
            yield from asyncio.wait(pending).__await__()
        return self.result()

    def done(self) -> bool:
        return all(future.done() for future in self._futures())

    def exception(self) -> BaseException | None:
        """The first failure among the records, if any (None while pending or all acked)."""
        for batch in dict.fromkeys(self._batches):  # each batch once, in input order
            if batch.future.done():
                failure = self._failure_in(batch)
                if failure is not None:
                    return failure
        return None

    def result(self) -> "BulkMetadata":
        """Every record's metadata (a sequence, built as it is read); raises the first failure
        if any record failed, InvalidStateError if some are pending."""
        batches = dict.fromkeys(self._batches)
        for batch in batches:
            if not batch.future.done():
                raise asyncio.InvalidStateError("Result is not set.")
        for batch in batches:  # the first failure in input order
            failure = self._failure_in(batch)
            if failure is not None:
                raise failure
        return BulkMetadata(self._batches, self._deltas, self._timestamp)

    def _failure_in(self, batch: ProducerBatch) -> BaseException | None:
        """The first failure among these records in `batch` (done). A split batch failed if
        any of its pieces did, maybe a piece holding only other calls' records: ask for ours."""
        failure = batch.future.exception()
        if failure is None or batch.pieces is None:
            return failure
        deltas = memoryview(bytes(self._deltas)).cast("i")
        for held_by, delta in zip(self._batches, deltas):
            if held_by is batch:
                failure = batch.exception_for(delta)
                if failure is not None:
                    return failure
        return None


class BulkMetadata(Sequence[RecordMetadata]):
    """The RecordMetadata of an enqueue_many() call's records, in input order. Each item is
    made when it is read: a bulk load that only needs to know it succeeded pays nothing."""

    __slots__ = ("_batches", "_deltas", "_timestamp")

    def __init__(self, batches: list[ProducerBatch], deltas: bytearray, timestamp: int) -> None:
        self._batches = batches
        self._deltas = memoryview(bytes(deltas)).cast("i")
        self._timestamp = timestamp

    def __len__(self) -> int:
        return len(self._batches)

    @overload
    def __getitem__(self, index: int) -> RecordMetadata: ...
    @overload
    def __getitem__(self, index: slice) -> list[RecordMetadata]: ...

    def __getitem__(self, index: int | slice) -> RecordMetadata | list[RecordMetadata]:
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(len(self._batches)))]
        if index < 0:
            index += len(self._batches)
        if not 0 <= index < len(self._batches):
            raise IndexError("BulkMetadata index out of range")
        return self._item(index)

    def _item(self, index: int) -> RecordMetadata:
        return self._batches[index].metadata(self._deltas[index], self._timestamp)

    def __iter__(self) -> Iterator[RecordMetadata]:
        return map(self._item, range(len(self._batches)))

    def __repr__(self) -> str:
        return f"<BulkMetadata of {len(self._batches)} records>"
