"""The pure-Python implementation of the speed-up's interface (see _c.c, which it mirrors).

It runs where the C module could not be built, or with AIOPRODUCER_PURE_PYTHON=1, and the
tests hold both to the same bytes and partitions: change one, change the other.
"""

from __future__ import annotations

import bisect
import contextvars
import operator
import struct
from collections import deque
from threading import get_ident
from typing import Any, Callable, Generator, Iterable, Iterator, Mapping

import crc32c

from ..protocol.batch_layout import CRC_FROM, HEADER, HEADER_SIZE, TRANSACTIONAL
from ..protocol.primitives import encode_varint as _varint
from ._marks import COROUTINE_MARKS

DONE, NEEDS_BATCH, NEEDS_PYTHON = 0, 1, 2

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_DELTA = struct.Struct("=i")  # an offset delta, native int32 as the C module writes

# Lengths, offset deltas and small timestamp deltas hit this table: one list index instead of
# a loop per varint.
_SMALL_MAX = 1 << 14
_SMALL = [_varint(n) for n in range(-1, _SMALL_MAX)]


def _int64(n: int) -> int:
    """n wrapped to a signed 64-bit int, as the C writer's (and Java's) arithmetic does."""
    return (n + (1 << 63) & (1 << 64) - 1) - (1 << 63)


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


_CACHE_LIMIT = 100_000
_positive_hashes: dict[bytes, int] = {}


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """`toPositive(murmur2(key)) % num_partitions`, with the hash of recent keys cached
    (murmur2 in Python costs microseconds; services reuse a bounded set of keys)."""
    if num_partitions <= 0:
        raise ValueError("num_partitions must be positive")
    h = _positive_hashes.get(key)
    if h is None:
        if len(_positive_hashes) >= _CACHE_LIMIT:
            _positive_hashes.clear()
        h = _positive_hashes[bytes(key)] = murmur2(key) & 0x7FFFFFFF
    return h % num_partitions


new_tuple = tuple.__new__  # (the C one leaves tuples of atomic values untracked)


def same_context(a: Any, b: Any) -> bool:
    """Whether two contextvars.Context hold the very same values (identity, not ==)."""
    return a is b or len(a) == len(b) and all(
        b.get(var, _MISSING) is value for var, value in a.items())


_MISSING = object()


class BatchFields:
    """A ProducerBatch's fields, the rest at their starting values; `reserved` goes to the
    writer, which counts the memory the batch holds; and its acknowledgement (complete). Its
    other methods are batch.py's. In C a batch's fields are set in one call, and complete()
    is one call too (at many partitions a batch may hold one record)."""

    __slots__ = ("number", "topic", "partition", "writer", "future", "created", "deadline",
                 "attempts", "retry_at", "base_sequence", "producer_id", "producer_epoch",
                 "done", "full", "_watchers", "_bulks", "pieces",
                 "parent", "first_delta", "_untracked")

    def __init__(self, number: tuple[int, ...], topic: str, partition: int, writer: Any,
                 future: Any, created: float, deadline: float, reserved: int) -> None:
        writer.reserved = reserved
        self.number = number
        self.topic = topic
        self.partition = partition
        self.writer = writer
        self.future = future
        self.created = created
        self.deadline = deadline
        self.attempts = 0
        self.retry_at = 0.0
        self.base_sequence = -1
        self.producer_id = -1
        self.producer_epoch = -1
        self.done = False
        self.full = False
        self._watchers: Any = None
        self._bulks: Any = None
        self.pieces: Any = None
        self.parent: Any = None
        self.first_delta = 0
        self._untracked: Any = []

    def _untrack(self) -> None:
        """The C one leaves the garbage collector an acknowledged batch (see _c.c)."""

    def _track(self) -> None:
        """The C one hands a batch opened out of the collector's way back to it (_c.c)."""

    def complete(self, base_offset: int, log_append_time: int,
                 woken: list[Any] | None = None) -> None:
        """Acknowledged (unless it failed already: expired in flight). Its records'
        callbacks run soon (given a list `woken`, the batch is added to it instead: its
        caller runs them), its enqueue_many futures count it, a piece tells its batch."""
        if woken is not None and not isinstance(woken, list):
            raise TypeError("complete()'s woken is a list")
        self.done = True
        self._untracked = None
        self.writer.payload = None  # (BatchWriter.free(): its bytes go)
        acked = not self.future.done()
        if acked:
            self.future.set_result((base_offset, log_append_time))
        self._wake_watchers(woken)
        if self.parent is not None:
            self.parent._piece_done()
        elif acked and self.pieces is None:
            # Nothing of it leads back to it now: out of the garbage collector's way (users
            # keep the record futures, which hold their batches: at 10,000 partitions there
            # may be a batch a record, and walking them was most of the collector's work).
            self._untrack()

    def watch(self, record: Any) -> None:
        """Run `record`'s done callbacks once this batch is done, or soon if it is: either
        way in one loop callback for all the records watched meanwhile (asyncio.gather over
        records acknowledged already would otherwise cost a loop callback per record). (In
        C the list of them is kept from the garbage collector: see _c.c.)"""
        if self._watchers is not None:
            self._watchers.append(record)
            return
        self._watchers = [record]
        if self.future.done():
            self.future.get_loop().call_soon(self._run_watchers)  # type: ignore[attr-defined]

    def _take_watchers(self) -> list[Any]:
        """The records watched, in the order they were watched, which are no longer (in C
        an array in the batch: see _c.c)."""
        watchers, self._watchers = self._watchers, None
        return watchers or []

    def _wake_watchers(self, woken: list[Any] | None = None) -> None:
        """The batch is done: run its records' callbacks (the tasks awaiting them wake up in
        one loop callback, the subclass's _run_watchers; or `woken`'s caller's), and tell
        the enqueue_many futures."""
        if self._watchers is not None and woken is not None:
            woken.append(self)
        elif self._watchers is not None:
            self.future.get_loop().call_soon(self._run_watchers)  # type: ignore[attr-defined]
        bulks, self._bulks = self._bulks, None
        for bulk in bulks or ():  # (BulkFuture's count, inline: this is per call and batch)
            bulk._pending -= 1
            if bulk._pending == 0 and not bulk.done():
                bulk._resolve()


class RecordFields:
    """The fields of a RecordFuture and the part of asyncio's Future protocol asyncio calls
    on it (gather calls get_loop, add_done_callback, cancelled, exception and result on every
    record's future). Each asks the record's batch, or what stands in for it (a WaitingRecord,
    a _Decided): its asyncio future, its `pieces` (a split batch answers for each record),
    its topic and partition. The C one also keeps a record's future out of the garbage
    collector's sight while it cannot be in a reference cycle (see _c.c); this one is tracked
    like any object, so it need not register with its batch."""

    __slots__ = ("_batch", "_offset_delta", "_timestamp", "_callback", "_context",
                 "_more_callbacks")
    _metadata_type: Any  # the RecordMetadata class, set by the subclass

    def __init__(self, batch: Any, offset_delta: int, timestamp: int) -> None:
        self._batch = batch
        self._offset_delta = offset_delta
        self._timestamp = timestamp
        self._callback: Any = None
        self._context: Any = None
        self._more_callbacks: Any = None

    def _track(self) -> None:
        """Tracked already."""

    # asyncio's mark of a future a Task waits on: always true, as a record's future reaches a
    # Task only from its own await while pending (the Task's reset to False is ignored).
    @property
    def _asyncio_future_blocking(self) -> bool:
        return True

    @_asyncio_future_blocking.setter
    def _asyncio_future_blocking(self, value: bool) -> None:
        """Ignored (see the getter)."""

    def __await__(self) -> Generator[Any, None, Any]:
        """The metadata, or the failure raised. While pending it yields this future, as an
        asyncio future's await does: the Task waits on it through add_done_callback."""
        if not self.done():
            yield self
        return self.result()

    __iter__ = __await__

    def done(self) -> bool:
        return bool(self._batch.future.done())

    def cancelled(self) -> bool:
        return bool(self._batch.future.cancelled())

    def get_loop(self) -> Any:
        return self._batch.future.get_loop()

    def result(self) -> Any:
        """The metadata if acknowledged; raises the failure, CancelledError if cancelled, or
        InvalidStateError if pending."""
        batch = self._batch
        if batch.pieces is not None:
            return batch.metadata(self._offset_delta, self._timestamp)
        base_offset, log_append_time = batch.future.result()
        return new_tuple(self._metadata_type, (
            batch.topic, batch.partition,
            base_offset + self._offset_delta if base_offset >= 0 else -1,
            log_append_time if log_append_time >= 0 else self._timestamp))

    def exception(self) -> BaseException | None:
        """The failure, or None if acknowledged; raises as `result()` does when cancelled or
        pending."""
        batch = self._batch
        if batch.pieces is None:
            return batch.future.exception()  # type: ignore[no-any-return]
        return batch.exception_for(self._offset_delta)  # type: ignore[no-any-return]

    def add_done_callback(self, fn: Callable[[Any], object], /, *,
                          context: contextvars.Context | None = None) -> None:
        """Call `fn(self)` once the record is acknowledged, failed or cancelled (soon, from
        the loop, in `context` or a copy of the current one, as asyncio futures do)."""
        global _snapshot
        held: contextvars.Context | tuple[contextvars.Context]
        if context is None:
            current = contextvars.copy_context()
            if not same_context(current, _snapshot):
                _snapshot = current
            held = _snapshot
        else:
            held = (context,)  # run in that very context, as asyncio does
        if self._callback is None and not self._more_callbacks:
            self._callback, self._context = fn, held
            self._batch.watch(self)  # (watched twice: run once)
        elif self._more_callbacks is None:
            self._more_callbacks = [(fn, held)]
        else:
            self._more_callbacks.append((fn, held))


# The context a done callback added without one runs in a copy of, as with asyncio's futures.
# Records given callbacks in one context share this snapshot, where each would otherwise keep
# a Context of its own, for the garbage collector to walk until its batch is done (gather over
# 500k records: 500k). It is never entered, so it stays as it was copied.
_snapshot = contextvars.copy_context()


def run_callbacks(report: Callable[[Any, Any, BaseException], object],
                  records: list[Any]) -> None:
    """Run the done callbacks of records' futures (a batch's, or a cancelled one), each in
    its own context, in the order they were added; `report(record, fn, exc)` what one raises
    (but SystemExit and KeyboardInterrupt, which propagate)."""
    for record in records:
        fn, more = record._callback, record._more_callbacks
        if fn is not None:
            context = record._context
            record._callback = record._context = None
            _run_callback(report, record, fn, context)
        if more:
            record._more_callbacks = None
            for fn, context in more:
                _run_callback(report, record, fn, context)


def _run_callback(report: Callable[[Any, Any, BaseException], object], record: Any,
                  fn: Any, context: Any) -> None:
    try:
        (context[0] if isinstance(context, tuple) else context.copy()).run(fn, record)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        report(record, fn, exc)


class MemoryPool:
    """The accumulator's buffer_memory: the bytes no batch holds. A writer given one
    (draw_from) raises its own limit from it when a record does not fit, so that the
    compiled loops need not stop for Python at every doubling of a batch's reservation.
    While records wait in line for memory (`paused`), no batch grows: they go first."""

    __slots__ = ("available", "paused")

    def __init__(self, available: int) -> None:
        self.available = available
        self.paused = False


# What a batch holding one record takes on the wire at most, beyond its key, value and
# headers: the batch header, then the record's length, attributes, timestamp and offset
# deltas, key and value lengths and header count as varints at their widest
# (protocol.records.record_size_upper_bound, which this mirrors).
# accumulator.py's: a retry backoff a hair from its end is over (uvloop's clock is in ms).
_CLOCK_SLACK = 1e-6
_RECORD_MOST = HEADER_SIZE + 5 + 1 + 10 + 5 + 5 + 5 + 1
# The attribute of a BaseException (not an Exception: a KeyboardInterrupt in the sender's wake)
# that an opening raised after queueing its batch: that batch, holding the caller's record.
KEPT_BATCH = "_aioproducer_kept_batch"


class AccumulatorFields:
    """The accumulator's state that opening a batch and taking it for a request read and
    write, and those two (see _c.c, where each is one call with no Python frame: at 10,000
    partitions a batch may hold one record). Its subclass (the RecordAccumulator) sets every
    field, and has `open_batches`, `_count_linger_bound`, `_wake_failed` and the
    `wake_sender` and `wake_sender_for` hooks that these call."""

    __slots__ = ("closing", "line", "_pool", "_loop", "_batch_size", "_first_reserve",
                 "_max_request_size", "buffer_memory", "_linger", "_delivery_timeout",
                 "_batches", "appendable", "incomplete", "_txn", "_quiet_until",
                 "_expiry_floor", "_batches_created", "_said_linger_bound", "_lone_acked_at",
                 "_lone_in_a_row", "wake_sender", "wake_sender_for", "touched", "_batch_type",
                 "_writer_type", "_drained_bytes", "_codec", "_compression_level",
                 "_round_by")
    closing: bool
    line: Any  # the records waiting for memory (a deque)
    _pool: MemoryPool
    _loop: Any
    _batch_size: int
    _first_reserve: int
    _max_request_size: int
    buffer_memory: int
    _linger: float
    _delivery_timeout: float
    _batches: Any  # each partition's queued batches (a dict of deques)
    appendable: Any  # each topic's open batches and writers (a dict of two lists)
    incomplete: Any  # the batches without an outcome (a set)
    _txn: Any
    _quiet_until: float
    _expiry_floor: float
    _batches_created: int
    _said_linger_bound: bool
    _lone_acked_at: float | None
    _lone_in_a_row: int
    wake_sender: Callable[[], None]
    wake_sender_for: Callable[[Any, bool], None]
    touched: dict[str, float]
    _batch_type: Any
    _writer_type: Any
    _drained_bytes: dict[tuple[str, int], int]  # each partition's bytes sent (uncompressed)
    _codec: int
    _compression_level: int | None
    _round_by: float  # the sleeping sender's next round is due by then (0.0: not known)

    def open_new(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
                 timestamp: int, partitions: int) -> Any:
        """A new batch holding a record (key and value bytes or None, no headers) placed
        where its partition has no open batch, if nobody waits for memory and its memory is
        free; else None, having done nothing (closing, or another type, too: the caller's
        Python path raises, or waits in line). The topic counts as produced to (`touched`)."""
        if self.closing or self.line or (key is not None and type(key) is not bytes) or \
                (value is not None and type(value) is not bytes):
            return None  # (the Python path checks and takes it)
        size = _RECORD_MOST + (len(key) if key is not None else 0) + \
            (len(value) if value is not None else 0)
        if size > self._max_request_size or size > self.buffer_memory:
            return None
        memory = max(self._first_reserve, size)
        pool = self._pool
        if memory > pool.available:
            return None
        now = self._loop.time()
        self.touched[topic] = now
        pool.available -= memory  # (given back by the opening if it queues nothing)
        return self._open(topic, partition, timestamp, key, value, None, memory, partitions,
                          now)

    def _open(self, topic: str, partition: int, timestamp: int, key: bytes | None,
              value: bytes | None, headers: bytes | None, reserved: int, partitions: int,
              now: float) -> Any:
        """Open a batch at loop time `now`, with `reserved` bytes of memory already reserved
        for it, for a record that found no room in an open one; the record is its first.
        Every step that can fail comes before the batch is queued (failing, it gives
        `reserved` back, having queued nothing: the caller may take the record again), but
        the sender's wake, which needs it queued (at linger_ms=0 it may write it at once):
        what that raises goes to _wake_failed, or, not an Exception (KeyboardInterrupt),
        is raised with the batch kept (and its memory held), named on the exception for
        the caller whose record it holds (`KEPT_BATCH`: see accumulator.take_kept)."""
        pool = self._pool
        try:
            if not self._said_linger_bound:
                if self._lone_acked_at is None:
                    self._lone_in_a_row = 0
                else:
                    self._count_linger_bound(now)  # type: ignore[attr-defined]
            self._batches_created += 1
            batch_size = self._batch_size
            writer = self._writer_type(timestamp, min(reserved, batch_size))
            writer.draw_from(pool, batch_size)
            batch = self._batch_type((self._batches_created,), topic, partition, writer,
                                     self._loop.create_future(), now,
                                     now + self._delivery_timeout, reserved)
            writer.try_append(timestamp, key, value, headers)  # a first record always fits
            tp = (topic, partition)
            queue = self._batches.get(tp)
            fresh = queue is None
            if fresh:
                queue = deque((batch,))  # (queued below by listing it)
            need = max(partitions, partition + 1)
            open_ = self.appendable.get(topic)
            if open_ is None or len(open_[0]) != need or len(open_[1]) != need:
                open_ = self.open_batches(topic, need)  # type: ignore[attr-defined]
            txn = self._txn
            adding = txn is not None and txn.is_transactional and \
                txn.add_partition(topic, partition)  # a round adds it, blocked or not
            unwoken = not adding and self._lingers_unwoken(fresh, writer, now)
            # Queued: incomplete, then in its partition's queue; a Ctrl-C as it does so (here
            # Python checks for one after each call) undoes both.
            try:
                self.incomplete.add(batch)
                if fresh:
                    self._batches[tp] = queue
                else:
                    queue.append(batch)
            except BaseException:
                self.incomplete.discard(batch)
                if self._batches.get(tp) is queue and queue[-1] is batch:
                    queue.pop()
                    if fresh:
                        del self._batches[tp]
                raise
        except BaseException:
            pool.available += reserved  # nothing queued: the pool's again
            raise
        if fresh:
            if now + self._linger < self._quiet_until:
                self._quiet_until = now + self._linger
        else:
            self._quiet_until = 0.0  # the batch before it is sendable now
        if batch.deadline < self._expiry_floor:
            self._expiry_floor = batch.deadline
        open_[0][partition] = batch
        open_[1][partition] = writer
        try:
            try:
                if adding:
                    self.wake_sender()
                elif not unwoken:
                    self.wake_sender_for(batch, True)  # a new linger end, or the one before full
            except Exception as exc:
                # The record is in its queued batch: the call has taken it, and must not fail
                # (the Appender would append it again). See _wake_failed.
                self._wake_failed(exc)  # type: ignore[attr-defined]
        except BaseException as exc:  # (also what _wake_failed raised)
            vars(exc)[KEPT_BATCH] = batch
            raise
        return batch

    def _lingers_unwoken(self, fresh: bool, writer: Any, now: float) -> bool:
        """Whether a batch just opened (`fresh`: alone in its partition; `writer` its
        records) need not wake the sender: it only lingers (RecordAccumulator.lingers, but
        for the flush that `_round_by` rules out), and the sleeping sender's next round is
        due before its linger ends (`_round_by`, which the sender sets only while every
        partition produced to has a leader). Sender.wake_for would only have found its timer
        set early enough, at ~10,000 instructions a batch: at 10,000 partitions, a batch
        every 17 records."""
        if not fresh or self._round_by <= 0.0 or now + self._linger < self._round_by or \
                self.closing or writer.size >= self._batch_size or self.line:
            return False
        txn = self._txn
        return txn is None or txn.has_producer_id and txn.error is None

    def _drain(self, topics: dict[str, Any], nodes: Iterable[int], max_request_size: int,
               now: float) -> dict[int, list[Any]]:
        """Take at most one batch per partition for each broker in `nodes`, up to
        `max_request_size`, partitions least recently drained first (see
        RecordAccumulator.drain); `topics` is the cluster's metadata (TopicInfo by name).
        (_c.c reads an idempotent producer's sequencer once, TransactionManager.drain_view,
        and itself holds every batch without a producer id and lets go and numbers one with
        nothing of its partition in flight, where this asks may_send and Sequencer.assign
        of every batch.)"""
        sizes = dict.fromkeys(nodes, 0)
        chosen: dict[int, list[tuple[tuple[str, int], Any]]] = {node: [] for node in sizes}
        full: set[int] = set()
        last_topic: str | None = None
        leaders: Any = ()
        txn = self._txn
        for tp, queue in self._batches.items():
            topic, partition = tp
            if topic is not last_topic:  # (cluster.leader_for, inline)
                info = topics.get(topic)
                leaders, last_topic = (info.leaders if info is not None else ()), topic
            leader = leaders[partition] if partition < len(leaders) else -1
            size = sizes.get(leader)
            if size is None or leader in full:
                continue
            batch = queue[0]
            if batch.retry_at - now > _CLOCK_SLACK:
                continue
            if txn is not None and not txn.may_send(batch):
                continue
            entries = chosen[leader]
            if entries and size + batch.writer.size > max_request_size:
                full.add(leader)
                if len(full) == len(sizes):
                    break
                continue
            sizes[leader] = size + batch.writer.size
            entries.append((tp, queue))
        drained: dict[int, list[Any]] = {}
        for node, entries in chosen.items():
            if entries:
                drained[node] = [self._take(tp, queue) for tp, queue in entries]
        return drained

    def _take_sendable(self, tp: tuple[str, int], queue: Any) -> Any:
        """`_take` if the partition's first batch may go now (the transaction manager's
        may_send), else None, taking nothing: the lone batch of an idle producer at
        linger_ms=0. (_c.c decides as its _drain does, on drain_view.)"""
        txn = self._txn
        if txn is not None and not txn.may_send(queue[0]):
            return None
        return self._take(tp, queue)

    def _take(self, tp: tuple[str, int], queue: Any) -> Any:
        """Take the partition's first batch for a request (the queue to the back of the
        line); on its first send, closed for appends and sealed (compressed) once."""
        batch = queue.popleft()
        del self._batches[tp]
        if queue:
            self._batches[tp] = queue  # to the back of the line
        if batch.attempts == 0:  # first send: no more appends; compress once
            open_ = self.appendable.get(batch.topic)  # no longer its partition's open batch
            if open_ is not None and batch.partition < len(open_[0]) and \
                    open_[0][batch.partition] is batch:
                open_[0][batch.partition] = open_[1][batch.partition] = None
            self._drained_bytes[tp] = self._drained_bytes.get(tp, 0) + batch.writer.size
            batch.writer.close(self._codec, self._compression_level)
        if self._txn is not None:
            self._txn.sequencer.assign(batch)
        return batch


class RecordWriter:
    """Records of one RecordBatch v2, encoded as they are appended."""

    __slots__ = ("_buffer", "base_timestamp", "max_timestamp", "count", "size", "limit",
                 "reserved", "_pool", "_most", "payload", "codec")

    def __init__(self, base_timestamp: int, limit: int) -> None:
        self._buffer: bytearray | None = bytearray()
        self.base_timestamp = base_timestamp
        self.max_timestamp = base_timestamp
        self.count = 0
        self.size = HEADER_SIZE  # the batch on the wire, uncompressed, header included
        self.limit = limit  # raised as the batch's memory grows
        self.reserved = 0  # bytes of buffer memory the batch holds
        self._pool: MemoryPool | None = None
        self._most = 0
        # What goes on the wire once sealed, and its compression codec (BatchWriter.close()).
        self.payload: bytes | memoryview | None = None
        self.codec = 0

    def draw_from(self, pool: MemoryPool, most: int) -> None:
        """Let try_append raise the limit, up to `most`, with memory drawn from `pool` when
        a record does not fit; `reserved` counts what the writer holds."""
        if not isinstance(pool, MemoryPool):
            raise TypeError("draw_from takes a MemoryPool")
        self._pool = pool
        self._most = most

    def _grow(self, need: int) -> bool:
        """Raise the limit so that a batch of `need` bytes fits: to twice the limit (at most
        `most`), or, if that much is not free, to `need`. False, drawing nothing, without a
        pool, while records wait in line, past `most`, or when the memory is not free."""
        pool = self._pool
        if pool is None or pool.paused or need > self._most:
            return False
        limit = max(min(2 * self.limit, self._most), need)
        if limit - self.reserved > pool.available:
            limit = need
            if limit - self.reserved > pool.available:
                return False
        if limit > self.reserved:
            pool.available -= limit - self.reserved
            self.reserved = limit
        self.limit = limit
        return True

    def try_append(self, timestamp: int, key: bytes | None, value: bytes | None,
                   headers: bytes | None) -> bool:
        """Append a record unless it would take the batch past its limit (the first record
        always fits). `headers` is the encoded header section, or None for no headers."""
        buffer = self._buffer
        if buffer is None:  # sealed
            return False
        small = _SMALL
        delta = timestamp - self.base_timestamp
        count = self.count
        t = small[delta + 1] if -1 <= delta < _SMALL_MAX else _varint(_int64(delta))
        o = small[count + 1] if count < _SMALL_MAX else _varint(count)
        if key is None:
            k = b"\x01"
            key_length = 0
        else:
            key_length = len(key)
            k = small[key_length + 1] if key_length < _SMALL_MAX else _varint(key_length)
        if value is None:
            v = b"\x01"
            value_length = 0
        else:
            value_length = len(value)
            v = small[value_length + 1] if value_length < _SMALL_MAX else _varint(value_length)
        h = headers if headers is not None else b"\x00"
        length = 1 + len(t) + len(o) + len(k) + key_length + len(v) + value_length + len(h)
        prefix = small[length + 1] if length < _SMALL_MAX else _varint(length)
        size = self.size + len(prefix) + length
        if size > self.limit and count and not self._grow(size):
            return False
        buffer += prefix
        buffer += b"\x00"  # record attributes
        buffer += t
        buffer += o
        buffer += k
        if key:
            buffer += key
        buffer += v
        if value:
            buffer += value
        buffer += h
        self.size = size
        self.count = count + 1
        if timestamp > self.max_timestamp:
            self.max_timestamp = timestamp
        return True

    def seal(self) -> memoryview:
        """No more appends; the encoded records (not copied)."""
        records = memoryview(self._buffer or b"").toreadonly()
        self._buffer = None
        return records

    def header(self, payload: bytes | memoryview, attributes: int, producer_id: int,
               producer_epoch: int, base_sequence: int) -> bytes:
        """The 61-byte RecordBatch v2 header that goes before `payload` on the wire (count
        and timestamps from this writer, the CRC-32C of both), `payload` being the sealed
        records as sent (compressed or not)."""
        header = bytearray(HEADER.pack(
            0, HEADER_SIZE - 12 + len(payload), -1, 2, 0, attributes, self.count - 1,
            self.base_timestamp, self.max_timestamp, producer_id, producer_epoch,
            base_sequence, self.count))
        crc = crc32c.crc32c(payload, crc32c.crc32c(header[CRC_FROM:]))
        struct.pack_into(">I", header, 17, crc)
        return bytes(header)


class Columns:
    """Records for enqueue_many as two columns in Arrow's variable-size binary layout, read
    where they lie (Arrow's buffers, no object per row: see _c.c); a sequence of (key, value)
    pairs of bytes or None. Each column is (validity, offsets, data, first, offset_size):
    the validity bitmap (None: no null cell), the offsets (int32, or int64 for Arrow's large
    types, native byte order), the data, the first row's index into the offsets and the
    bitmap (an Arrow slice's offset), and 4 or 8. `keys` None: every key is null. The
    buffers are checked here, so that no cell is read outside them."""

    __slots__ = ("_count", "_keys", "_values")

    def __init__(self, count: int, keys: Any, values: Any) -> None:
        count = operator.index(count)
        if count < 0:
            raise ValueError("Columns' count must be >= 0")
        self._count = count
        self._keys = None if keys is None else _BinaryColumn(keys, count, "keys")
        self._values = _BinaryColumn(values, count, "values")

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, row: int) -> tuple[bytes | None, bytes | None]:
        row = operator.index(row)
        if row < 0:
            row += self._count
        if not 0 <= row < self._count:
            raise IndexError("Columns index out of range")
        keys = self._keys
        return (None if keys is None else keys.cell(row)), self._values.cell(row)

    def __iter__(self) -> Iterator[tuple[bytes | None, bytes | None]]:
        return map(self.__getitem__, range(self._count))


class _BinaryColumn:
    __slots__ = ("_validity", "_offsets", "_data", "_first")

    def __init__(self, spec: Any, count: int, name: str) -> None:
        if type(spec) is not tuple or len(spec) != 5:
            raise TypeError(f"Columns' {name} must be (validity, offsets, data, first, "
                            f"offset_size){' or None' if name == 'keys' else ''}")
        validity, offsets, data, first, offset_size = spec
        first, offset_size = operator.index(first), operator.index(offset_size)
        if first < 0 or offset_size not in (4, 8):
            raise ValueError(f"Columns' {name}: first must be >= 0 and offset_size 4 or 8")
        raw = memoryview(offsets).cast("B")
        self._data = memoryview(data).cast("B")
        self._validity = None if validity is None else memoryview(validity).cast("B")
        n = len(raw) // offset_size
        if first >= n or count > n - first - 1 or (
                self._validity is not None and len(self._validity) < (first + count + 7) // 8):
            raise ValueError(f"Columns' {name}: a buffer is too short for {count} rows from "
                             f"row {first}")
        self._offsets = raw[:n * offset_size].cast("i" if offset_size == 4 else "q")
        self._first = first
        window = self._offsets[first:first + count + 1]
        if window[0] < 0 or window[-1] > len(self._data) or \
                any(a > b for a, b in zip(window, window[1:])):
            raise ValueError(f"Columns' {name}: the offsets must rise from 0 or more to at "
                             "most the data's length")

    def cell(self, row: int) -> bytes | None:
        i = self._first + row
        validity = self._validity
        if validity is not None and not validity[i >> 3] >> (i & 7) & 1:
            return None
        return bytes(self._data[self._offsets[i]:self._offsets[i + 1]])


def append_many(records: list[Any] | Columns, start: int, batches: list[Any],
                writers: list[Any], partition: int, sticky: int, timestamp: int,
                out_batches: list[Any], out_deltas: bytearray) -> tuple[int, int, int]:
    """Append records[start:] ((key, value) tuples of bytes or None, or Columns, read where
    they lie) to the writers of their
    partitions: `partition` if it is not -1, else murmur2 of the key, else `sticky`.
    `batches` and `writers` hold each partition's open batch and its writer, or None. For each
    record appended, add its batch to `out_batches` and its offset delta (a native int32) to
    `out_deltas`. Stop at the first record it cannot take: NEEDS_BATCH when its partition has
    no writer or the writer is full, NEEDS_PYTHON when it is not a tuple of bytes or None (or
    is keyless and `sticky` is -1); DONE when every record was appended. Returns (index of
    that record or len(records), status, its partition for NEEDS_BATCH else -1)."""
    partitions = len(writers)
    if not partitions or len(batches) != partitions or partition >= partitions \
            or sticky >= partitions:
        raise ValueError("batches and writers need one entry per partition")
    pack = _DELTA.pack
    for i in range(max(start, 0), len(records)):
        record = records[i]
        if type(record) is not tuple or len(record) != 2:
            return i, NEEDS_PYTHON, -1
        key, value = record
        if (key is not None and type(key) is not bytes) or \
                (value is not None and type(value) is not bytes):
            return i, NEEDS_PYTHON, -1
        if partition >= 0:
            p = partition
        elif key is not None:
            p = partition_for_key(key, partitions)
        elif sticky >= 0:
            p = sticky
        else:
            return i, NEEDS_PYTHON, -1
        writer = writers[p]
        if writer is None:
            return i, NEEDS_BATCH, p
        counted, delta = len(out_batches), writer.count
        try:
            if not writer.try_append(timestamp, key, value, None):
                return i, NEEDS_BATCH, p
            out_batches.append(batches[p])
            out_deltas += pack(delta)
        except BaseException:
            # A Ctrl-C (Python checks for one after each call; the C loop has no such point):
            # the record, if appended, has one entry, as the caller counts what was buffered.
            del out_batches[counted:], out_deltas[4 * counted:]
            if writer.count > delta:
                out_batches.append(batches[p])
                out_deltas += pack(delta)
            raise
    return len(records), DONE, -1


def append_record(batches: list[Any], writers: list[Any], partition: int, timestamp: int,
                  key: bytes | None, value: bytes | None, headers: bytes | None,
                  future_type: Any) -> Any:
    """Append a record (key, value and encoded headers as bytes or None) to its partition's
    open batch and make its future, `future_type(batch, offset_delta, timestamp)`; None when
    the partition has no open batch or the record does not fit in it."""
    if len(batches) != len(writers):
        raise TypeError("append_record takes lists of batches and writers, one entry per "
                        "partition")
    for given in (key, value, headers):
        if given is not None and type(given) is not bytes:
            raise TypeError("append_record takes key, value and headers as bytes or None")
    if not 0 <= partition < len(writers):
        return None
    writer = writers[partition]
    if writer is None or not writer.try_append(timestamp, key, value, headers):
        return None
    return future_type(batches[partition], writer.count - 1, timestamp)


class Ready:
    """What enqueue() returns for a record it appended at once: an awaitable that is already
    complete, and a coroutine to asyncio (send, throw, close: create_task() takes it)."""

    __slots__ = ("_result",)

    def __init__(self, result: Any) -> None:
        self._result = result

    def __await__(self) -> Generator[Any, None, Any]:
        return self._result
        yield  # (a generator)

    __iter__ = __await__

    def send(self, value: Any) -> Any:
        raise StopIteration(self._result)

    def throw(self, exc: Any, value: Any = None, traceback: Any = None) -> Any:
        """Raise the exception given (nothing to clean up)."""
        if isinstance(exc, BaseException):
            raise exc
        if isinstance(value, BaseException):
            raise value
        raise exc() if value is None else exc(value)

    def close(self) -> None:
        """Nothing to stop."""


class Appender:
    """enqueue()'s and send()'s common case in one call (see _c.c): append the record (to
    its partition's open batch, or, keyed or given its partition, to a new one from
    `open_new` where none is open) and return its future (in a Ready if `ready`), or, for
    anything else, `later(*args, **kwargs)`, the Python path, which checks everything
    again."""

    def __init__(self, later: Callable[..., Any], future_type: Any, ready: bool,
                 lifecycle: Any, started: Any, clock: Callable[[], float], python_only: bool,
                 partition_in_python: bool) -> None:
        self._later = later
        self._future_type = future_type
        self._ready = ready
        self._lifecycle = lifecycle
        self._started = started
        self._clock = clock
        self._python_only = python_only
        self._partition_in_python = partition_in_python
        self._cluster: Any = None
        self._accumulator: Any = None
        self._check_can_send: Callable[[], None] | None = None
        self._sticky: Callable[[str, Any], int] | None = None
        self._open_new: Callable[..., Any] | None = None

    def attach(self, cluster: Any, accumulator: Any, check_can_send: Callable[[], None] | None,
               sticky: Callable[[str, Any], int], open_new: Callable[..., Any] | None) -> None:
        """The parts of a started producer; `open_new(topic, partition, key, value,
        timestamp, partitions)` opens a batch holding a record whose partition has none open
        (None: it did nothing, and `later` takes the record)."""
        self._cluster, self._accumulator = cluster, accumulator
        self._check_can_send, self._sticky = check_can_send, sticky
        self._open_new = open_new

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        future = self._append(args, kwargs)
        if future is None:
            return self._later(*args, **kwargs)
        return Ready(future) if self._ready else future

    def _append(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The record's future if it is the common case, else None."""
        if not 2 <= len(args) <= 3 or self._cluster is None or self._python_only:
            return None
        topic, value = args[0], args[1]
        key = args[2] if len(args) > 2 else _UNSET
        partition = timestamp = None
        for name, given in kwargs.items():
            if name == "key" and key is _UNSET:
                key = given
            elif name == "partition":
                partition = given
            elif name == "timestamp_ms":
                timestamp = given
            elif not (name == "headers" and given is None):
                return None
        if key is _UNSET:
            key = None
        if type(topic) is not str or (key is not None and type(key) is not bytes) or \
                (value is not None and type(value) is not bytes):
            return None
        lifecycle = self._lifecycle
        if lifecycle.state is not self._started or lifecycle.thread != get_ident() or \
                lifecycle.loop_running() is not True:
            return None
        if self._check_can_send is not None:
            try:
                self._check_can_send()
            except Exception:  # the Python path raises it
                return None
        info = self._cluster.topics.get(topic)
        leaders = info.leaders if info is not None else ()
        count = len(leaders) if type(leaders) is tuple else 0
        if count == 0:
            return None
        if timestamp is None:
            timestamp = int(self._clock() * 1000)
        else:
            if type(timestamp) is not int:
                timestamp = _index(timestamp)
            if timestamp is None or not 0 <= timestamp < 1 << 63 or \
                    0 < timestamp < SECONDS_LIKE_BELOW:
                return None  # (`later` refuses it, or warns of a time in seconds)
        sticky = False
        if partition is not None:
            if type(partition) is not int:
                partition = _index(partition)
            if partition is None or not 0 <= partition < count:
                return None
        elif self._partition_in_python:
            return None
        elif key is not None:
            partition = partition_for_key(key, count)
        else:
            assert self._sticky is not None
            partition, sticky = self._sticky(topic, leaders), True
        accumulator = self._accumulator
        if accumulator.line:
            return None
        open_ = accumulator.appendable.get(topic)
        if type(open_) is not tuple or len(open_) != 2:
            return None
        future = append_record(open_[0], open_[1], partition, timestamp, key, value, None,
                               self._future_type)
        writers = open_[1]
        if future is not None or sticky or self._open_new is None or \
                type(writers) is not list or not 0 <= partition < len(writers) or \
                writers[partition] is not None:
            return future  # (None: a full batch to close first, or no opener: `later`)
        try:
            batch = self._open_new(topic, partition, key, value, timestamp, count)
        except Exception as exc:  # (raised having queued nothing) `later` raises it ...
            if KEPT_BATCH in vars(exc):  # ... but with its batch queued (see _open): raised
                raise
            return None
        return None if batch is None else self._future_type(batch, 0, timestamp)


_UNSET: Any = object()  # (a key not given)

# A given timestamp above 0 and below this many ms (1973-03-03) is likely in seconds
# (`int(time.time())`): the intake warns of it once per producer.
SECONDS_LIKE_BELOW = 100_000_000_000


for _name, _mark in COROUTINE_MARKS.items():  # (a coroutine function: see _marks.py)
    setattr(Appender, _name, _mark)


def _index(number: Any) -> int | None:
    """An int-like given as a partition or timestamp (numpy's and pandas' integers) as the
    int it stands for; None for anything else (a bool included), which `later` refuses."""
    if isinstance(number, bool) or not hasattr(type(number), "__index__"):
        return None
    try:
        return operator.index(number)
    except Exception:  # `later` refuses it
        return None


def watch_batches(batches: list[Any], bulk: Any) -> int:
    """Add `bulk` to the `_bulks` list of each distinct batch in `batches` that is not
    `done`, in order of first appearance; how many there were."""
    pending = 0
    for batch in dict.fromkeys(batches):
        if not batch.done:
            bulks = batch._bulks
            if bulks is None:
                batch._bulks = [bulk]
            else:
                bulks.append(bulk)
            pending += 1
    return pending


def produce_parts(batches: list[Any], in_flight: dict[Any, None], now: float,
                  sequenced: bool, transactional: bool
                  ) -> tuple[list[dict[str, Any]], int, float, float, float]:
    """A Produce request's topic_data for `batches` (sealed), a batch's records its (header,
    payload), topics in order of first appearance: the header carries the batch's producer
    id, epoch and base sequence if `sequenced` (idempotent; else -1 for each), and the
    transactional bit if `transactional`. Each batch is put in `in_flight`. With the bytes
    of their record batches, the earliest delivery deadline, and the sum and the longest of
    their times queued (loop time `now` less their creation). (In C one call a request: at
    10,000 partitions ~490 batches.)"""
    if type(batches) is not list or type(in_flight) is not dict:
        raise TypeError("produce_parts takes a list of batches and a dict")
    transactional_bit = TRANSACTIONAL if transactional else 0
    by_topic: dict[str, list[dict[str, Any]]] = {}
    size = 0
    earliest, waited, most = float("inf"), 0.0, 0.0
    for batch in batches:
        if not isinstance(batch, BatchFields):
            raise TypeError("produce_parts takes a list of batches")
        deadline, queued = float(batch.deadline), now - float(batch.created)
        if deadline < earliest:
            earliest = deadline
        waited += queued
        if queued > most:
            most = queued
        writer = batch.writer
        if not isinstance(writer, RecordWriter):
            raise TypeError("a batch's writer is a RecordWriter")
        payload = writer.payload
        if payload is None:
            raise ValueError("a batch in a request is closed (sealed) first")
        producer_id, epoch, sequence = (batch.producer_id, batch.producer_epoch,
                                        batch.base_sequence) if sequenced else (-1, -1, -1)
        header = writer.header(payload, writer.codec | transactional_bit, producer_id, epoch,
                               sequence)
        size += len(header) + len(payload)
        by_topic.setdefault(batch.topic, []).append(
            {"index": batch.partition, "records": (header, payload)})
        in_flight[batch] = None
    return ([{"name": t, "partition_data": p} for t, p in by_topic.items()], size, earliest,
            waited, most)


def settle_produce(batches: list[Any], responses: list[dict[str, Any]],
                   in_flight: dict[Any, None], run_watchers: Callable[[list[Any]], object],
                   all_or_none: bool) -> tuple[list[Any], list[tuple[Any, Any]]]:
    """Match a Produce response's answers (its topics: name and partition_responses) to the
    request's batches. Each batch answered without an error leaves `in_flight` and is
    completed, and their records' callbacks run in one loop callback, run_watchers(batches)
    (a loop handle, a context and a bound method a batch were promoted by the garbage
    collector mid-response at 10,000 partitions); `rest` holds (batch, its answer or None)
    for the others, in order (with `all_or_none`, every batch unless all are answered
    without an error: an idempotent producer's errors are handled in order with its
    acknowledgements)."""
    if type(batches) is not list or not isinstance(responses, list) or \
            type(in_flight) is not dict:
        raise TypeError("settle_produce takes a list of batches, a list of topics' answers "
                        "and a dict")
    answers: dict[str, dict[int, dict[str, Any]]] = {}
    for topic in responses:
        listed = answers.setdefault(topic["name"], {})
        for given in topic["partition_responses"]:
            listed[given["index"]] = given
    complete = not all_or_none or all(_answered_ok(answers, batch) for batch in batches)
    acked: list[Any] = []
    rest: list[tuple[Any, Any]] = []
    woken: list[Any] = []
    for batch in batches:
        if not isinstance(batch, BatchFields):
            raise TypeError("settle_produce takes a list of batches")
        by_index = answers.get(batch.topic)
        answer = by_index.get(batch.partition) if by_index is not None else None
        code = answer["error_code"] if answer is not None and complete else None
        if answer is None or not (type(code) is int and code == 0):
            rest.append((batch, answer))
            continue
        base_offset, log_append_time = answer["base_offset"], answer["log_append_time_ms"]
        in_flight.pop(batch, None)
        batch.complete(base_offset, log_append_time, woken)
        acked.append(batch)
    if woken:
        woken[0].future.get_loop().call_soon(run_watchers, woken)
    return acked, rest


def _answered_ok(answers: dict[str, dict[int, dict[str, Any]]], batch: Any) -> bool:
    """Whether `batch` (a batch with its fields set) is answered with error code 0."""
    if not isinstance(batch, BatchFields):
        return False
    by_index = answers.get(batch.topic)
    answer = by_index.get(batch.partition) if by_index is not None else None
    if answer is None:
        return False
    code = answer["error_code"]
    return type(code) is int and code == 0


def take_acked(batches: list[Any], incomplete: set[Any]) -> tuple[list[Any], int, int, int]:
    """Of `batches` (acknowledged: most often a response's), those still in `incomplete`,
    taken out of it; with the memory they hold, their records, and the newest one's creation
    number (number[0]: flush() counts them off by it). (In C one call a response.)"""
    if type(batches) is not list or not isinstance(incomplete, set):
        raise TypeError("take_acked takes a list of batches and a set")
    counted: list[Any] = []
    freed = records = newest = 0
    for batch in batches:
        if not isinstance(batch, BatchFields) or not isinstance(batch.writer, RecordWriter):
            raise TypeError("takes a list of batches (with their writers)")
        if batch in incomplete:  # (else it had its outcome already: expired in flight)
            incomplete.discard(batch)
            writer = batch.writer
            freed += writer.reserved
            records += writer.count
            newest = max(newest, batch.number[0])
            counted.append(batch)
    return counted, freed, records, newest


def count_acked(batches: list[Any], now: float, bounds: tuple[float, ...], buckets: list[int]
                ) -> tuple[dict[str, list[int]], float]:
    """Per topic, the records, batches and bytes of `batches` (acknowledged); each one's time
    since its creation (loop time `now` less its `created`) counted into the histogram
    `buckets` (bisect_left over `bounds`), and their sum. (In C one call a response.)"""
    if type(batches) is not list or not isinstance(bounds, tuple) or \
            not isinstance(buckets, list) or len(buckets) != len(bounds) + 1 or len(bounds) > 64:
        raise TypeError("count_acked takes a list of batches, a tuple of at most 64 bounds "
                        "and a list of one bucket more")
    by_topic: dict[str, list[int]] = {}
    total = 0.0
    for batch in batches:
        if not isinstance(batch, BatchFields) or not isinstance(batch.writer, RecordWriter):
            raise TypeError("takes a list of batches (with their writers)")
        writer = batch.writer
        counts = by_topic.get(batch.topic)
        if counts is None:
            counts = by_topic[batch.topic] = [0, 0, 0]
        counts[0] += writer.count
        counts[1] += 1
        counts[2] += writer.size
        latency = now - batch.created
        buckets[bisect.bisect_left(bounds, latency)] += 1
        total += latency
    return by_topic, total


def encode_produce(version: int, correlation_id: int, client_id: str | None,
                   body: Mapping[str, Any]) -> bytes | list[bytes | memoryview] | None:
    """The C module writes common Produce requests in one call; here None leaves every one
    to the generated codec of protocol/messages.py, which is the pure-Python twin."""
    return None


def decode_produce(version: int, frame: bytes | memoryview) -> dict[str, Any] | None:
    """As encode_produce, for Produce responses."""
    return None
