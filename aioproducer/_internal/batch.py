"""A batch of records for one partition, and the futures users await.

One asyncio future per batch; each record gets only a small slotted handle that remembers
its batch and its offset delta. Holding a future, a closure or a reference cycle per record
is what limits Python producers (see benchmarks/), so the handle holds none of those. The
handle, RecordFuture, still is an asyncio future to asyncio (`asyncio.isfuture()` is true):
gather, wait, as_completed, shield, wait_for and Tasks take it as it is, with no Task per
record, and the callbacks they add are run by one loop callback per batch, not one each.

A batch the broker refuses as too large is split into pieces that are sent in its place
(`split_into`); the handles keep pointing at the original batch, which then answers for each
record from the piece that holds it, and is done when all its pieces are.
"""

from __future__ import annotations

import asyncio
import contextvars
import warnings
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Generator, Iterator, NamedTuple, \
    Sequence, TypeAlias, Union, overload

from .._speedups import BatchFields, RecordFields, new_tuple, run_callbacks, watch_batches

if TYPE_CHECKING:
    from ..protocol.records import BatchWriter


TopicPartition = tuple[str, int]  # (topic, partition)


class RecordMetadata(NamedTuple):
    """Where a record landed. `offset` is -1 when the broker did not say (acks=0, or a
    duplicate the broker already had and answered without its offset)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int

    @property
    def timestamp(self) -> int:
        """`timestamp_ms` by the name aiokafka's RecordMetadata gives it (the Java client's
        `timestamp()`): code moved over reads `md.timestamp`."""
        return self.timestamp_ms

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        """aiokafka's `fut = await producer.send(...)`, then `await fut`: our send() is its
        send_and_wait() and returned this, so awaiting it again returns it (it raised
        "can't be used in 'await' expression", the record sent). Warned once per line:
        that habit waits for the broker once per record."""
        warnings.warn("send() waited for the broker and returned this RecordMetadata: "
                      "awaiting it again returns it. aiokafka's `fut = await "
                      "producer.send(...)` is `fut = await producer.enqueue(...)` here, which "
                      "returns once the record is buffered (a loop of send() waits a round "
                      "trip for each record)", RuntimeWarning, stacklevel=2)
        return self
        yield  # (a generator: what `await` asks for)

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """kafka-python's `producer.send(...).get(timeout=10)`: BlockingProducer's send() is
        that whole line (it waited for the ack and returned this), so get() returns this (it
        raised AttributeError); `timeout` is taken and unused. Warned once per line: a loop
        of send() waits a round trip for each record."""
        warnings.warn("send() waited for the broker and returned this RecordMetadata: get() "
                      "returns it. kafka-python's `future = producer.send(...)` is `future = "
                      "producer.produce(...)` on BlockingProducer (then future.result(timeout)"
                      "; send(..., timeout=10) bounds send()'s own wait): a loop of send() "
                      "waits a round trip for each record", RuntimeWarning, stacklevel=2)
        return self


def _no_such_attribute(metadata: RecordMetadata, name: str) -> Any:
    """Python's AttributeError, saying where callbacks go for kafka-python's future's."""
    message = f"{type(metadata).__name__!r} object has no attribute {name!r}"
    if name in ("add_callback", "add_errback"):
        message += (": send() waited for the broker and returned this metadata. For a "
                    "callback, BlockingProducer.produce(..., on_delivery=cb) calls "
                    "cb(metadata, exception) once the record is acknowledged or failed")
    raise AttributeError(message, name=name, obj=metadata)


# (Set here: a NamedTuple's body takes no `if`, and to mypy a misspelt name stays an error.)
RecordMetadata.__getattr__ = _no_such_attribute  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class RecordFailure:
    """A record of an enqueue_many() (or produce_many()) call that failed: its index in the
    call's records, and its error."""

    index: int
    error: BaseException


# What a done callback runs in: a copy of a snapshot (see _speedups), or, held in a 1-tuple,
# the context it was given.
_HeldContext: TypeAlias = Union[contextvars.Context, tuple[contextvars.Context]]

_new_metadata = new_tuple  # RecordMetadata(...) without NamedTuple's Python-level __new__


class ProducerBatch(BatchFields):
    """Records bound for one partition, sent and acknowledged together. Its fields are
    BatchFields' (`_speedups`: set in one C call where compiled, as at many partitions a
    batch may hold one record): made with (number, topic, partition, writer, future,
    created, deadline, reserved), the rest at their starting values."""

    # Batches failed in this process: a BulkFuture looks for its records' failure only if
    # this moved while they were pending (a scan of its batches per call was per record).
    failures: ClassVar[int] = 0

    __slots__ = ()

    if TYPE_CHECKING:
        number: tuple[int, ...]  # creation order (a piece's: its batch's, then its index)
        topic: str
        partition: int
        writer: BatchWriter
        future: asyncio.Future[tuple[int, int]]
        created: float
        deadline: float  # delivery_timeout_ms after creation
        attempts: int
        retry_at: float
        base_sequence: int
        producer_id: int
        producer_epoch: int
        done: bool
        full: bool  # a record did not fit: closed for appends, sendable now
        # Records' futures with done callbacks (gather's; a Task's awaiting one: its wake-up),
        # in the order they were watched (read only: _take_watchers() takes them).
        _watchers: list[RecordFuture] | None
        _bulks: list[BulkFuture] | None  # enqueue_many futures with records here
        pieces: list[ProducerBatch] | None  # what it was split into, in order
        parent: ProducerBatch | None  # the batch this is a piece of
        first_delta: int  # offset delta of this piece's first record in its parent
        # Its records' futures, kept from the garbage collector until it fails (see _c.c).
        _untracked: list[RecordFuture] | None

        def __init__(self, number: tuple[int, ...], topic: str, partition: int,
                     writer: BatchWriter, future: asyncio.Future[tuple[int, int]],
                     created: float, deadline: float, reserved: int) -> None: ...

    def __repr__(self) -> str:
        return (f"<ProducerBatch {self.topic}-{self.partition} records={self.writer.count} "
                f"seq={self.base_sequence} attempts={self.attempts}>")

    @property
    def record_count(self) -> int:
        return self.writer.count

    @property
    def reserved(self) -> int:
        """Bytes of buffer_memory the batch holds (its writer draws more as it grows)."""
        return self.writer.reserved

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
        self._track()  # (opened out of the collector's way: its pieces lead back to it)
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

    def _run_watchers(self) -> None:
        _run_callbacks(self._take_watchers())

    def fail(self, exc: BaseException) -> None:
        self.done = True
        ProducerBatch.failures += 1
        self._track()  # (opened out of the collector's way, as its records' futures)
        for record in self._untracked or ():
            record._track()  # the failure's traceback may come to hold frames that hold them
        self._untracked = None
        self.writer.free()
        if not self.future.done():
            self.future.set_exception(exc)
            # The batch's error reaches users through their record handles; if nobody awaits
            # them (fire-and-forget), asyncio must not log "exception never retrieved".
            self.future.exception()
        self._wake_watchers()
        if self.parent is not None:
            self.parent._piece_done()


if TYPE_CHECKING:  # to type checkers an asyncio.Future, as asyncio treats it (see below)
    _RecordFutureBase = asyncio.Future[RecordMetadata]
else:
    # Its fields, and the Future protocol asyncio calls (done, result, exception, cancelled,
    # get_loop, add_done_callback): in C where compiled.
    _RecordFutureBase = RecordFields
# An asyncio.Future, with what it resolves to said at run time too (tests/test_docs.py reads
# it: what a public call returns is exported).
_BulkFutureBase = asyncio.Future["BulkMetadata"]


class RecordFuture(_RecordFutureBase):
    """The result of `Producer.enqueue()`: an asyncio future of the record's RecordMetadata.

    It follows asyncio's Future protocol (`asyncio.isfuture()` is true, and type checkers see
    an `asyncio.Future[RecordMetadata]`), so gather, wait, as_completed, shield, wait_for,
    ensure_future and Tasks take it as it is, but it is not an `asyncio.Future` subclass at
    run time: that would cost an asyncio future per record. It cannot be resolved by hand.

    `cancel()` (or `wait_for`'s timeout, a cancelled `gather`, or a task cancelled while
    awaiting it, under `asyncio.timeout` or a TaskGroup: all as with an asyncio future)
    stops this future following the record: the record is still sent, other records are
    untouched. `asyncio.shield()` keeps it following.
    """

    __slots__ = ()  # the fields are RecordFields' (in C: out of the garbage collector's way)
    _metadata_type = RecordMetadata  # what RecordFields.result() makes

    if TYPE_CHECKING:
        _batch: ProducerBatch | WaitingRecord | _Decided
        _offset_delta: int
        _timestamp: int
        # The first done callback inline, as asyncio's own Future keeps it; others in a list.
        _callback: Callable[[Any], object] | None
        _context: _HeldContext | None
        _more_callbacks: list[tuple[Callable[[Any], object], _HeldContext]] | None

        def __init__(self, batch: ProducerBatch | WaitingRecord, offset_delta: int,
                     timestamp: int) -> None: ...

        def _track(self) -> None: ...

    def __repr__(self) -> str:
        state = "cancelled" if self.cancelled() else "done" if self.done() else "pending"
        return f"<RecordFuture {self._batch.topic}-{self._batch.partition} {state}>"

    async def wait(self) -> RecordMetadata:
        """The same as `await record_future`."""
        return await self

    def cancel(self, msg: Any | None = None) -> bool:
        """Stop following the record (it is still sent if buffered); False if already done.
        Tasks awaiting it get CancelledError(msg), after its callbacks, as from an asyncio
        future."""
        batch = self._batch
        if batch.future.done():
            return False
        self._batch = _Decided.cancelled(batch, msg)
        self._track()
        self.get_loop().call_soon(_run_callbacks, [self])
        if isinstance(batch, WaitingRecord):
            batch.unfollowed()
        return True

    def remove_done_callback(self, fn: Callable[["RecordFuture"], object]) -> int:
        """Remove every `fn` callback not yet run; return how many were removed."""
        removed = 0
        if self._callback is not None and self._callback == fn:
            self._callback = self._context = None
            removed = 1
        if self._more_callbacks:
            kept = [(f, c) for f, c in self._more_callbacks if f != fn]
            removed += len(self._more_callbacks) - len(kept)
            self._more_callbacks = kept
        return removed

    def set_result(self, result: Any) -> None:
        """Refused: the producer resolves a record's future."""
        raise RuntimeError("a RecordFuture is resolved by the producer, not by hand")

    def set_exception(self, exception: type | BaseException) -> None:
        """Refused: the producer resolves a record's future."""
        raise RuntimeError("a RecordFuture is resolved by the producer, not by hand")

    # asyncio.gather reads these two of a cancelled child (the only parts of asyncio's
    # private Future protocol it needs besides _asyncio_future_blocking).
    @property
    def _cancel_message(self) -> Any:
        batch = self._batch
        return batch.message if isinstance(batch, _Decided) else None

    def _make_cancelled_error(self) -> asyncio.CancelledError:
        msg = self._cancel_message
        return asyncio.CancelledError() if msg is None else asyncio.CancelledError(msg)


class Sending(RecordFuture):
    """What `Producer.send()` returns for a record it buffered at once: a RecordFuture, so
    asyncio.gather takes it with no Task, that is also a coroutine (send/throw/close), so
    `create_task()`, TaskGroups and `asyncio.run()` take it as they take `async def` calls.
    Cancelling the task that runs or awaits it cancels it; the record is still sent."""

    __slots__ = ()

    def send(self, value: None) -> Any:
        """One step as a coroutine (create_task() drives it so): this future, for the Task to
        wait on, while the record is pending; else its metadata (StopIteration) or its
        failure."""
        if not self._batch.future.done():
            return self
        raise StopIteration(self.result())

    def throw(self, exc: Any, value: Any = None, traceback: Any = None) -> Any:
        raise exc if value is None else value  # nothing to clean up: the record stays sent

    def close(self) -> None:
        """Nothing to stop: the record is buffered and will be sent."""


class WaitingRecord:
    """A record of send() or enqueue() waiting in line for buffer memory (see the
    accumulator's line), and until it is appended the stand-in for the batch its
    RecordFuture follows: it answers "pending", and the record's done callbacks (the wake-up
    of a Task awaiting it among them) move to its batch with it. A send() waits so with no
    Task, so `asyncio.gather` over sends that outrun buffer_memory costs what gather over
    buffered ones does."""

    __slots__ = ("topic", "partition", "timestamp", "key", "value", "headers", "memory",
                 "partitions", "deadline", "future", "record", "turn", "granted", "failure",
                 "awaiter")
    pieces = None
    _untracked = None  # the futures of records in line are tracked from the start (see _c.c)

    def __init__(self, topic: str, partition: int, timestamp: int, key: bytes | None,
                 value: bytes | None, headers: bytes | None, memory: int, partitions: int,
                 deadline: float, pending: asyncio.Future[Any]) -> None:
        self.topic = topic
        self.partition = partition
        self.timestamp = timestamp
        self.key = key
        self.value = value
        self.headers = headers
        self.memory = memory  # what a new batch for it takes
        self.partitions = partitions
        self.deadline = deadline  # max_block_ms after it joined the line
        self.future = pending  # never resolved: "not done yet" to the record's future
        self.record: RecordFuture | None = None  # send()'s future (None once cancelled), or
        # enqueue()'s wait for its turn: its task appends the record itself when it runs
        # (so a cancelled enqueue() has buffered nothing); meanwhile the entry holds the memory.
        self.turn: asyncio.Future[None] | None = None
        self.granted = False
        self.failure: BaseException | None = None  # (failed after its turn came)
        self.awaiter: Any = None  # enqueue()'s: a weak reference to the coroutine that appends it

    def watch(self, record: RecordFuture) -> None:
        """Nothing to do now: the record's callbacks are read when it leaves the line."""

    def unfollowed(self) -> None:
        """send()'s future was cancelled (by hand, or by a Task cancelled while awaiting
        it): the record leaves the line, unsent."""
        self.record = None

    def abandoned(self) -> bool:
        """Nobody follows the record any more: send()'s future was cancelled, or enqueue()
        was: like a coroutine cancelled before it buffered, the record is then not sent."""
        return self.record is None and (self.turn is None or self.turn.cancelled())

    def append_to(self, batch: ProducerBatch, offset_delta: int) -> None:
        """send()'s record went into `batch`: its future follows the batch from now on."""
        record = self.record
        assert record is not None
        record._batch, record._offset_delta = batch, offset_delta
        if record._callback is not None or record._more_callbacks:
            batch.watch(record)

    def fail(self, exc: BaseException) -> None:
        """The record is not buffered, nor sent: max_block_ms passed, or the producer closed."""
        record = self.record
        if record is None:
            if self.granted:
                self.granted, self.failure = False, exc
            elif self.turn is not None and not self.turn.done():
                self.turn.set_exception(exc)
            return
        record._batch = _Decided.failed(self, exc)
        if record._callback is not None or record._more_callbacks:
            self.future.get_loop().call_soon(_run_callbacks, [record])


class _Decided:
    """The stand-in for the batch of a RecordFuture whose outcome is decided apart from any
    batch: cancelled (it stops following its record), or failed before it was buffered."""

    __slots__ = ("future", "topic", "partition", "message")
    pieces = None

    def __init__(self, batch: ProducerBatch | WaitingRecord | _Decided,
                 future: asyncio.Future[Any], message: Any = None) -> None:
        self.future = future
        self.topic: str = batch.topic
        self.partition: int = batch.partition
        self.message = message  # cancel()'s msg

    @classmethod
    def cancelled(cls, batch: ProducerBatch | WaitingRecord | _Decided, msg: Any) -> _Decided:
        future: asyncio.Future[Any] = batch.future.get_loop().create_future()
        future.cancel(msg)
        return cls(batch, future, msg)

    @classmethod
    def failed(cls, batch: WaitingRecord, exc: BaseException) -> _Decided:
        future: asyncio.Future[Any] = batch.future.get_loop().create_future()
        future.set_exception(exc)
        future.exception()  # retrieved: the record's future reports it
        return cls(batch, future)

    def watch(self, record: RecordFuture) -> None:
        self.future.get_loop().call_soon(_run_callbacks, [record])


def _report(record: RecordFuture, fn: Callable[[Any], object], exc: BaseException) -> None:
    record.get_loop().call_exception_handler({
        "message": f"Exception in callback {fn!r}", "exception": exc, "future": record})


# Run the done callbacks of a batch's records (or of a cancelled one): one loop callback for
# them all, each in its own context, in the order they were added; an error is reported as
# the loop reports those of its own callbacks. (In C where compiled: this is per record.)
_run_callbacks: Callable[[list[RecordFuture]], None] = partial(run_callbacks, _report)


def run_watchers_of(batches: list[ProducerBatch]) -> None:
    """The records' callbacks of the batches a response acknowledged (the speed-up's
    settle_produce), in one loop callback: a loop handle per batch, with its context and
    bound method, was promoted by the garbage collector mid-response at 10,000 partitions,
    and those set off a full collection."""
    records: list[RecordFuture] = []
    for batch in batches:
        records += batch._take_watchers()
    _run_callbacks(records)


class BulkFuture(_BulkFutureBase):
    """The result of `Producer.enqueue_many()`: an asyncio future of the records' metadata
    (a BulkMetadata, in input order), or of the first failure among them in input order;
    `failures()` then names every record that failed (the others were written).

    It holds, per record, a reference to its batch and its offset delta as a 4-byte int:
    no object per record until someone asks for the metadata. Cancelling it stops following
    the records, which are still sent. It counts its pending batches, each of which counts
    it down when done; `failures` is ProducerBatch.failures when the records' call began.
    """

    def __init__(self, batches: list[ProducerBatch], deltas: bytearray, timestamp: int,
                 failures: int) -> None:
        super().__init__()
        self._batches = batches  # record i went into batches[i] ...
        self._deltas = deltas  # ... at offset delta deltas[4i:4i+4] (native int32)
        self._timestamp = timestamp
        self._failures = failures
        self._pending = pending = watch_batches(batches, self)  # (in C: per call and batch)
        if not pending:
            self._resolve()

    @property
    def count(self) -> int:
        return len(self._batches)

    def __len__(self) -> int:
        return len(self._batches)

    def __iter__(self) -> Any:
        """Not its records' metadata: asyncio's Future iterates as its own await, so
        `for md in await producer.enqueue_many(...)` (one await short) gave the BulkFuture
        itself as `md`. (`await` uses `__await__`, untouched.)"""
        raise TypeError(
            "a BulkFuture is a future of the records' metadata, not the metadata: await it: "
            "`for md in await bulk` (or `bulk.result()` once done)")

    def __repr__(self) -> str:
        state = "cancelled" if self.cancelled() else "done" if self.done() else "pending"
        return f"<BulkFuture records={self.count} {state}>"

    def failures(self) -> list[RecordFailure]:
        """Once done, each of the records that failed, by its index in the call's records,
        with its error, in input order: the records not listed were written (none listed:
        all were). Raises as exception() does while pending (InvalidStateError) or once
        cancelled (CancelledError)."""
        if self.exception() is None:
            return []
        deltas = memoryview(bytes(self._deltas)).cast("i")
        return [RecordFailure(index, error)
                for index, (batch, delta) in enumerate(zip(self._batches, deltas))
                if (error := batch.exception_for(delta)) is not None]

    def _resolve(self) -> None:
        if ProducerBatch.failures != self._failures:  # a batch failed: maybe one of ours
            for batch in dict.fromkeys(self._batches):  # the first failure in input order
                failure = self._failure_in(batch)
                if failure is not None:
                    self.set_exception(failure)
                    # Reported as the records' failure (and by the producer's error hook),
                    # not again as "Future exception was never retrieved".
                    self.exception()
                    return
        self.set_result(BulkMetadata(self._batches, self._deltas, self._timestamp))

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
